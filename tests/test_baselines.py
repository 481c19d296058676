"""Each baseline policy's defining behaviour on tiny hand-made routing, driven like the engine drives it
(tests/policy_driver.py: infinitely fast copy link)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moespac.trace import load_trace
from policy_driver import context, counts_of, drive, random_steps, step

from baselines.accelerate import Accelerate
from baselines.fate import Fate, upstream_budgets
from baselines.fiddler import Fiddler
from baselines.hybrimoe import HybriMoE, greedy_split
from baselines.ktransformers import KTransformers
from baselines.lfu import LFU
from baselines.llamacpp import LlamaCpp, LlamaCppSD
from baselines.lru import LRU
from baselines.mixtral_offloading import MixtralOffloading
from baselines.moe_infinity import MoEInfinity
from baselines.moe_speq import MoESpeQ
from baselines.sp_moe import SPMoE
from baselines.specexp import SpecExp
from baselines.vllm_offload import VLLMOffload
from moespac.cache import ExpertCache
from moespac.cli import main
from moespac.errors import MoespacError
from moespac.policy import SIGNALS, Topology, UnitCosts
from moespac.registry import make_policy, policies

ALL_SIGNALS = tuple(SIGNALS)
BASELINES = ("accelerate", "vllm-offload", "llamacpp", "llamacpp-sd", "mixtral-offloading", "moe-infinity",
        "fiddler", "ktransformers", "hybrimoe", "fate", "sp-moe", "moe-speq", "specexp", "lfu", "lru", "all-host")


def single_layer_trace(E: int, experts: list[int]):
    """One layer, one token per step, activating `experts[s]` at step s."""
    return [(step(s), counts_of(1, E, {0: [e]})) for s, e in enumerate(experts)]


def resident_set(run, layer: int = 0) -> set:
    return set(np.flatnonzero(run.cache.resident[layer]).tolist())


# -- references ------------------------------------------------------------------------------------

def test_lru_evicts_least_recent():
    run = drive(LRU(), context(1, 4, 1, 2), single_layer_trace(4, [0, 1, 0, 2]))
    assert resident_set(run) == {0, 2}  # 1 was used longest ago


def test_lfu_evicts_least_frequent_and_in_cache_forgets_counts():
    trace = [0, 0, 0, 1, 2, 3, 3, 3, 3, 4, 1, 0, 4]
    assert resident_set(drive(LRU(), context(1, 5, 1, 2), single_layer_trace(5, [0, 0, 1, 2]))) == {1, 2}
    assert resident_set(drive(LFU(), context(1, 5, 1, 2), single_layer_trace(5, [0, 0, 1, 2]))) == {0, 2}
    # by hand: at the last step expert 0 (back since step 12) ties 3 at four uses per request and
    # loses on recency; counting only since it re-entered, it has one use and goes instead
    assert resident_set(drive(LFU(), context(1, 5, 1, 2), single_layer_trace(5, trace))) == {0, 4}
    assert resident_set(drive(LFU(in_cache=True), context(1, 5, 1, 2), single_layer_trace(5, trace))) == {3, 4}


# -- static and streamed placements ---------------------------------------------------------------

def layer_steps(n: int, experts):
    """n identical one-token steps, layer l activating experts[l]."""
    return [(step(s), counts_of(len(experts), 4, {l: [e] for l, e in enumerate(experts)})) for s in range(n)]


def test_accelerate_keeps_first_layers_and_reloads_the_rest_every_step():
    # 6 slots, staging 2 -> one whole layer resident; three streamed layers share the two staging slots
    run = drive(Accelerate(staging=2), context(4, 4, 1, 6), layer_steps(3, (2, 1, 3, 0)))
    assert run.placement.sum(axis=1).tolist() == [4, 0, 0, 0]
    assert all(log[0].hits == {2} for log in run.layers)
    # least recently used staged expert goes: nothing survives until its layer's next use (evicting the
    # most recently loaded one would keep layer 1's expert and hit it every step)
    assert all([log[l].loaded for l in (1, 2, 3)] == [[1], [3], [0]] for log in run.layers)
    assert run.cache.resident[0].all()
    # default staging is one layer (Accelerate reserves the largest layer): 8 slots -> layer 0 + staging
    assert drive(Accelerate(), context(3, 4, 1, 8), []).placement.sum(axis=1).tolist() == [4, 0, 0]


def test_accelerate_moves_whole_layers_and_vllm_only_the_routed_experts():
    """transformers 5 fuses a layer's experts, so Accelerate's hook copies all E of an offloaded layer per
    forward; vLLM's UVA reads touch the routed ones. Same routing, same cache: the bytes differ by E / routed."""
    steps = layer_steps(3, (2, 1, 3, 0))
    acc = drive(Accelerate(), context(4, 4, 1, 8), steps).cache.counters  # layer 0 + a 4-slot staging area
    vllm = drive(VLLMOffload(staging=2), context(4, 4, 1, 6), steps).cache.counters  # layer 3 + 2 staging slots
    assert (acc.loads, acc.carried, acc.bytes_copied) == (9, 27, 36)  # 3 streamed layers x 3 steps x (1 + 3)
    assert (vllm.loads, vllm.carried, vllm.bytes_copied) == (9, 0, 9)  # the same layers' routed experts only
    assert acc.hits == vllm.hits == 3 and acc.host == vllm.host == 0


def test_accelerate_and_vllm_differ_on_the_table_workload():
    """On Table 1's setting (Qwen3-30B-A3B's shape and expert sizes, the RTX 4090 profile, 25 % cache) the two
    rows differ for the reason the systems do: Accelerate copies E = 128 experts per offloaded layer per
    forward, vLLM the routed ones."""
    from moespac.policy import Topology
    from moespac.sim.simulate import SimConfig, simulate
    from moespac.sim.synthetic import synthetic_trace

    trace = synthetic_trace(Topology(48, 128, 8), new_tokens=16, gamma=0, prompt_tokens=8, seed=0)
    out, resident = {}, {}
    for name in ("accelerate", "vllm-offload"):
        rec = simulate(SimConfig("synthetic", name, "rtx4090-pcie4", model_spec="qwen3-30b-a3b", cache_ratio=0.25,
                                 bounds=False, warmup_steps=0), trace)
        out[name], resident[name] = rec["metrics"], rec["policy"]["stats"]["resident_layers"]
    acc, vllm = out["accelerate"]["counters"], out["vllm-offload"]["counters"]
    assert resident["accelerate"] == resident["vllm-offload"] > 0 and acc["carried"] > 0 == vllm["carried"]
    # every forward of every offloaded layer moves that whole layer: the staging holds one layer at a time
    assert acc["loads"] + acc["carried"] == 128 * (48 - resident["accelerate"]) * trace.num_steps
    assert acc["bytes_copied"] > 10 * vllm["bytes_copied"]
    assert out["accelerate"]["tokens_per_s"] < out["vllm-offload"]["tokens_per_s"]


def _table_cell(policy, trace, profile=()):
    """A simulated Table 1 cell: Qwen3-30B-A3B's expert sizes on the RTX 4090 profile, 25 % cache."""
    from moespac.sim.simulate import SimConfig, simulate

    return simulate(SimConfig("replayed", policy, "rtx4090-pcie4", model_spec="qwen3-30b-a3b", cache_ratio=0.25,
                              allow_topology_mismatch=True, bounds=False, profile_traces=tuple(profile)), trace)


def test_moe_infinity_matches_a_profiling_run_of_other_prompts_on_a_one_request_cell(tmp_path):
    """A Table 1 cell replays one request: the EAM variant's activation-matrix collection must come from elsewhere
    (other prompts, as MoE-Infinity collects offline), else it never predicts and is LFU. With the profiling
    traces it prefetches and differs from LFU; the record names the traces, not the replayed one. The row runs
    the released decode path: on-demand fetches into the in-cache LFU, profile or not."""
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace

    topo = Topology(8, 128, 8)
    replayed = synthetic_trace(topo, new_tokens=48, gamma=0, prompt_tokens=8, seed=0)
    others = []
    for seed in (1, 2):  # other prompts: other traces
        path = tmp_path / f"other{seed}.npz"
        synthetic_trace(topo, new_tokens=32, gamma=0, prompt_tokens=6, seed=seed).save(path)
        others.append(str(path))
    eam = "moe-infinity:prefetch=eam"
    alone, lfu = _table_cell(eam, replayed), _table_cell("lfu:in_cache=true", replayed)
    assert alone["metrics"]["counters"]["prefetched"] == 0  # one request, nothing to match: LFU
    assert alone["metrics"]["tokens_per_s"] == lfu["metrics"]["tokens_per_s"]
    row = _table_cell("moe-infinity", replayed, others)
    assert row["metrics"]["counters"]["prefetched"] == 0
    assert row["metrics"]["counters"] == lfu["metrics"]["counters"]
    profiled = _table_cell(eam, replayed, others)
    assert profiled["metrics"]["counters"]["prefetched"] > 0
    assert profiled["metrics"]["tokens_per_s"] != lfu["metrics"]["tokens_per_s"]
    window = profiled["warmup_window"]
    assert window["requests"] == 2 and "not replayed" in window["source"]
    assert profiled["config"]["profile_traces"] == [load_trace(p).trace_id() for p in others]


def test_static_placements_profile_on_other_prompts_not_the_replayed_request(tmp_path):
    """Fiddler places by popularity: given a profiling run of other prompts it never looks at the request it
    serves. Its placement then follows the profile, whatever the replayed request routes."""
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace

    topo = Topology(4, 32, 2)
    replayed = synthetic_trace(topo, new_tokens=24, gamma=0, prompt_tokens=4, seed=3)
    path = tmp_path / "other.npz"
    synthetic_trace(topo, new_tokens=24, gamma=0, prompt_tokens=4, seed=4).save(path)
    peek, profiled = _table_cell("fiddler", replayed), _table_cell("fiddler", replayed, [str(path)])
    assert "also replayed" in peek["warmup_window"]["source"]  # the fallback says that it sees the future
    assert "not replayed" in profiled["warmup_window"]["source"]
    assert profiled["metrics"]["counters"]["hits"] != peek["metrics"]["counters"]["hits"]
    mismatched = tmp_path / "wide.npz"
    synthetic_trace(Topology(4, 16, 2), new_tokens=8, gamma=0, prompt_tokens=4, seed=4).save(mismatched)
    with pytest.raises(MoespacError, match="profile trace .*wide.npz: topology"):
        _table_cell("fiddler", replayed, [str(mismatched)])


def test_vllm_offload_streams_the_first_layers():
    run = drive(VLLMOffload(staging=1), context(3, 4, 1, 5), layer_steps(2, (2, 1, 3)))
    assert run.placement.sum(axis=1).tolist() == [0, 0, 4]  # --cpu-offload-gb takes the first layers
    assert all(log[0].loaded == [2] and log[1].loaded == [1] and log[2].hits == {3} for log in run.layers)


def test_llamacpp_host_layers_never_move():
    steps = random_steps(3, 4, 2, 6, cross=False)
    run = drive(LlamaCpp(), context(3, 4, 2, 9), steps)
    assert run.placement.sum(axis=1).tolist() == [0, 4, 4]  # n_cpu_moe = 3 - 9 // 4 = 1
    c = run.cache.counters
    assert c.loads == c.evictions == c.prefetched == 0
    assert c.host == sum(int((counts[0] > 0).sum()) for _, counts in steps)  # exactly layer 0's experts
    assert drive(LlamaCpp(n_cpu_moe=2), context(3, 4, 2, 9), []).placement.sum(axis=1).tolist() == [0, 0, 4]
    with pytest.raises(MoespacError, match="n_cpu_moe=0"):
        LlamaCpp(n_cpu_moe=0).reset(context(3, 4, 2, 9))
    assert (drive(LlamaCppSD(), context(3, 4, 2, 9, signals=["draft"]), []).placement == run.placement).all()
    # --cpu-moe (-ot exps=CPU): no expert on the device, whatever the cache could hold
    every = drive(LlamaCpp(cpu_moe=True), context(3, 4, 2, 9), steps)
    assert not every.placement.any() and every.cache.counters.hits == 0
    assert every.cache.counters.host == sum(int((counts > 0).sum()) for _, counts in steps) > c.host
    with pytest.raises(MoespacError, match="not both"):
        LlamaCpp(n_cpu_moe=1, cpu_moe=True)


def test_fiddler_places_by_popularity_and_never_moves():
    warm = np.array([[5, 1, 0, 3], [0, 4, 2, 0]])
    ctx = context(2, 4, 2, 3, signals=["warmup_counts"], warmup_counts=warm)
    run = drive(Fiddler(), ctx, random_steps(2, 4, 2, 8, cross=False))
    assert run.placement.tolist() == [[True, False, False, True], [False, True, False, False]]
    assert all((r == run.placement).all() for r in run.residency)
    c = run.cache.counters
    assert c.loads == c.evictions == c.prefetched == 0 and c.host > 0


def test_ktransformers_strategies():
    ctx = context(2, 4, 1, 3)
    placed = lambda s, c=ctx: drive(KTransformers(strategy=s), c, []).placement.astype(int).tolist()
    assert placed("uniform") == [[1, 1, 0, 0], [1, 0, 0, 0]]  # round-robin over layers, expert-major
    assert placed("front-loading") == [[1, 1, 1, 0], [0, 0, 0, 0]]
    warm = np.array([[0, 9, 0, 1], [8, 0, 7, 0]])
    freq_ctx = context(2, 4, 1, 3, signals=["warmup_counts"], warmup_counts=warm)
    assert placed("frequency", freq_ctx) == [[0, 1, 0, 0], [1, 0, 1, 0]]
    assert sum(map(sum, placed("random"))) == 3 and placed("random") == placed("random")
    with pytest.raises(MoespacError, match="warmup_counts"):
        KTransformers(strategy="frequency").reset(ctx)
    with pytest.raises(MoespacError, match="strategy"):
        KTransformers(strategy="hottest")


# -- caches ----------------------------------------------------------------------------------------

def test_mixtral_offloading_lru_within_each_layer():
    # layer 0 walks 0, 3, 1; layer 1 keeps using 3 and never touches its expert 2
    steps = [(step(s), counts_of(2, 4, {0: [e], 1: [3]})) for s, e in enumerate([0, 3, 1])]
    run = drive(MixtralOffloading(), context(2, 4, 1, 4), steps)
    assert run.placement.astype(int).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]  # 2 slots/layer, high ids first
    assert resident_set(run, 0) == {1, 3}  # 0 was its layer's least recent when 1 came
    assert resident_set(run, 1) == {2, 3}  # the globally oldest expert (1, 2) is in another group: kept
    # a batch wanting 3 experts of a 2-slot layer: the third finds no slot of its own layer -> host
    batch = counts_of(2, 4, {0: [0, 1, 2], 1: [3]})
    run = drive(MixtralOffloading(), context(2, 4, 1, 4), [(step(0, "verify", 3), batch)])
    layer0 = run.layers[0][0]
    assert (layer0.device, layer0.host, layer0.loaded) == ({0, 2}, {1}, [0])
    assert resident_set(run, 1) == {2, 3}


def test_moe_infinity_prefetches_the_best_matching_past_request():
    policy = MoEInfinity(trace_capacity=2, prefetch="eam")
    ctx = context(2, 4, 1, 2)
    req = lambda first, second: [(step(0), counts_of(2, 4, {0: [first], 1: [second]}))]
    assert drive(policy, ctx, req(0, 1)).prefetched == []  # nothing to match yet
    drive(policy, ctx, req(2, 3))
    run = drive(policy, ctx, req(2, 3))  # starts like the second request
    assert run.prefetched == [((0, 1), (1, 3))]  # after layer 0: the match's layer-1 expert
    assert run.layers[0][1].hits == {3}
    assert policy.access == [2, 2]  # stored with 1; the first matched in request 2, the second in 3
    drive(policy, ctx, req(0, 1))  # stores the third EAM over the least-accessed (the first)
    assert [np.argwhere(m).tolist() for m in policy.collection] == [[[0, 2], [1, 3]]] * 2


def test_moe_infinity_files_requests_by_step_signal_when_kept_warm():
    policy = MoEInfinity(prefetch="eam")
    steps = [(step(s, request=r), counts_of(2, 4, {0: [a], 1: [b]}))
             for s, (r, a, b) in enumerate([(0, 0, 1), (1, 2, 3), (2, 2, 3)])]
    run = drive(policy, context(2, 4, 1, 2), steps)  # one reset: requests told apart by their id
    assert len(policy.collection) == 2 and ((2, 1), (1, 3)) in run.prefetched
    assert run.layers[2][1].hits == {3}


def test_hybrimoe_score_update():
    policy = HybriMoE()
    policy.reset(context(1, 8, 3, 2))
    assert policy.p == 6  # upstream refreshes 2 top_k scores per router call
    policy = HybriMoE(top_p=12)
    drive(policy, context(1, 4, 1, 2), [(step(0), counts_of(1, 4, {0: {0: 2, 1: 1, 3: 1}})),
                                        (step(1), counts_of(1, 4, {0: {2: 4}}))])
    # s = counts / 4; S = 0.5 s, then S = 0.5 S + 0.5 s'
    assert policy.scores[0].tolist() == [0.125, 0.0625, 0.5, 0.0625]
    policy = HybriMoE(top_p=2)
    drive(policy, context(1, 4, 1, 2), [(step(0), counts_of(1, 4, {0: {0: 3, 1: 2, 2: 1}}))])
    assert policy.scores[0].tolist() == [0.25, 0.5 * (2 / 6), 0.0, 0.0]  # expert 2 is outside the top 2


def test_hybrimoe_two_ended_split_matches_hand_computation():
    costs = UnitCosts(t_io=0.25, t_gpu=0.5, t_cpu=1.0)
    # queue [0 | 1, 2, 3]: GPU 0 (0.5 <= 1), GPU 1 (load 0.25, 1.0 <= 1.0), CPU 3 (1.5 > 1), GPU 2 (1.5 <= 2)
    assert greedy_split(np.array([1, 3, 1, 1]), np.array([True, False, False, False]), costs) == ([0, 1, 2], [3])
    # equal finish times go to the GPU (HybriMoE compares with <=): GPU 0, CPU 2, then 1 ties at 2 -> GPU
    assert greedy_split(np.ones(3, int), np.ones(3, bool), UnitCosts(t_gpu=1.0, t_cpu=1.0)) == ([0, 1], [2])
    # a copy that takes longer than the CPU work keeps both experts on the host
    assert greedy_split(np.array([1, 1]), np.zeros(2, bool), UnitCosts(t_io=2.0, t_gpu=0.5, t_cpu=1.0)) == ([], [1, 0])
    run = drive(HybriMoE(slots_per_layer=2), context(1, 4, 1, 3, costs=costs),
                [(step(0, "verify", 3, 2), counts_of(1, 4, {0: {0: 1, 1: 3, 2: 1, 3: 1}}))])
    layer = run.layers[0][0]  # residents 0, 1 (the first 2 ids); queue [1, 0 | 2, 3]
    assert (layer.device, layer.host, layer.loaded) == ({0, 1, 2}, {3}, [2])


def test_hybrimoe_prefetches_next_layer_top_score_and_evicts_lowest():
    costs = UnitCosts(t_io=10.0, t_gpu=0.5, t_cpu=1.0)  # on-demand copies never pay: only prefetch brings experts in
    steps = [(step(s), counts_of(2, 4, {0: [0], 1: [3]})) for s in range(2)]
    run = drive(HybriMoE(prefetch_size=1), context(2, 4, 1, 4, costs=costs), steps)
    assert run.layers[0][1].host == {3}  # step 0: (1, 3) runs on the CPU ...
    assert run.prefetched == [((1, 1), (1, 3))]  # ... is layer 1's best score when layer 0 ends ...
    assert run.layers[1][1].hits == {3}  # ... and hits in step 1
    assert resident_set(run, 1) == {1, 3}  # it replaced the lowest score (expert 0, tie with 1: lower id)
    row = drive(HybriMoE(), context(2, 4, 1, 4, costs=costs), steps)  # the row: upstream's prefetch_size 0
    assert row.prefetched == [] and row.layers[1][1].host == {3}


def test_hybrimoe_prefill_runs_everything_on_the_device():
    run = drive(HybriMoE(), context(1, 4, 1, 4), [(step(0, "prefill", 4), counts_of(1, 4, {0: [0, 1, 2, 3]}))])
    assert run.layers[0][0].device == {0, 1, 2, 3} and run.cache.counters.host == 0


def cross_step(s, routed, predicted, k=1):
    """One token; `predicted[l]` = layer l+1's expert that layer l's cross-layer router names (-1: none)."""
    cross = np.array([[[p]] for p in predicted] + [[[-1]]])
    return step(s, cross_layer_topk=cross), counts_of(len(routed), 4, {l: [e] for l, e in enumerate(routed)})


def test_fate_placement_is_upstreams_four_whole_layers_then_an_even_split():
    assert upstream_budgets(40, 8, 8, 8).tolist() == [8, 8, 8, 8, 2, 2, 2, 2]  # (40 - 32) // 4 each
    assert upstream_budgets(43, 8, 8, 8).tolist() == [8, 8, 8, 8, 2, 2, 2, 2]  # the remainder stays unused
    assert upstream_budgets(10, 4, 4, 4).tolist() == [4, 4, 2, 0]  # fewer than 4 whole layers: in order
    fate = Fate(lossy_transfer=False)
    placement = fate.reset(context(8, 8, 1, 40, signals=["cross_layer_topk"]))
    assert placement.sum(axis=1).tolist() == [8, 8, 8, 8, 2, 2, 2, 2] and placement[4, :2].all()


def test_fate_int4_row_caches_more_experts_in_the_same_memory():
    qwen3 = Topology(48, 128, 8)
    assert Fate().device_slots(qwen3, 1536) == 5461  # 1536 * 16 / 4.5: 89 % of the model, not 25 %
    assert Fate(lossy_transfer=False).device_slots(qwen3, 1536) == 1536
    assert Fate().device_slots(qwen3, 6000) == 48 * 128


def test_fate_prefetches_the_predicted_experts_up_to_its_decode_budget():
    # 5 layers of 4 experts, 18 slots: layers 0-3 whole, layer 4 holds experts 0 and 1
    ctx = context(5, 4, 1, 18, signals=["cross_layer_topk"], costs=UnitCosts(t_io=1.0, t_layer=1.0, t_gpu=0.0))
    routed, predicted = [0, 1, 2, 3, 2], [1, 2, 3, 2]
    run = drive(Fate(lossy_transfer=False), ctx, [cross_step(0, routed, predicted)])
    assert run.prefetched == [((0, 4), (4, 2))]  # only layer 4 is not whole
    assert [log.hits for log in run.layers[0]] == [{0}, {1}, {2}, {3}, {2}]
    # decode budget floor(t_layer / copy time): one layer's time fits no full-precision copy of 1.5 s
    slow = context(5, 4, 1, 18, signals=["cross_layer_topk"], costs=UnitCosts(t_io=1.5, t_layer=1.0, t_gpu=0.0))
    run = drive(Fate(lossy_transfer=False), slow, [cross_step(0, routed, predicted)])
    assert run.prefetched == [] and run.layers[0][4].loaded == [2]
    # the INT4 row copies each used expert of layers >= 1 again after it runs (post_comp); layer 0 it keeps
    int4 = drive(Fate(), dataclasses.replace(ctx, capacity=5), [cross_step(0, routed, predicted)])
    assert [r for _, r in int4.restored] == [(1, 1), (2, 2), (3, 3), (4, 2)]


def test_fate_arc_keeps_a_reused_expert_through_a_scan_and_adapts():
    ctx = context(1, 6, 1, 2, signals=["cross_layer_topk"])
    scan = [2, 2, 3, 4, 5]  # Fate starts holding experts 0 and 1 (T1)
    fate = Fate(lossy_transfer=False)  # 2 full-precision slots (the INT4 row would hold all 6 experts)
    assert resident_set(drive(fate, ctx, single_layer_trace(6, scan))) == {2, 5}  # 2 is in T2
    assert resident_set(drive(LRU(), ctx, single_layer_trace(6, scan))) == {4, 5}
    run = drive(fate, ctx, single_layer_trace(6, scan + [4]))  # 4 is a ghost in B1: p grows, T2 gives
    assert fate.arc[0].p == 1.0 and resident_set(run) == {4, 5}


def test_fate_and_specexp_need_the_per_step_signal():
    ctx = context(2, 4, 1, 4, signals=["cross_layer_topk"])
    for policy in (Fate(), SpecExp()):
        with pytest.raises(MoespacError, match="cross_layer_topk"):
            drive(policy, ctx, [(step(0), counts_of(2, 4, {0: [0], 1: [1]}))])


def test_lossy_flags():
    exact = make_policy("fate:lossy_transfer=false")
    assert exact.lossless and exact.transfer_scale == 1.0
    assert not Fate().lossless and Fate().transfer_scale == 4.5 / 16  # the row copies INT4
    assert make_policy("specexp:lossy_execution=false").lossless and not SpecExp().lossless  # the row is lossy
    # only a Fate instance's INT4 row compresses its copies: every policy class declares full precision
    assert [n for n, cls in policies().items() if cls.transfer_scale != 1.0] == []


def test_specexp_runs_its_speculation_and_streams_through_two_buffer_sets():
    """Upstream's decode path: layer 0 loads what its router picks, every later layer runs the experts the
    previous layer speculated (a routed expert that was not speculated has its tokens run by a speculated one),
    and the device holds (num_prefetch_layers + 1) x E rows, not the run's cache."""
    policy = SpecExp()
    ctx = context(3, 4, 1, 12, signals=["cross_layer_topk"])
    run = drive(policy, ctx, [cross_step(0, [0, 2, 3], [2, 1])])
    assert run.cache.capacity == 8  # two buffer sets of 4 rows, though the run offers 12 slots
    assert run.prefetched == [((0, 1), (1, 2)), ((0, 2), (2, 1))]
    assert [log.loaded for log in run.layers[0]] == [[0], [], []]  # only layer 0 loads on demand
    assert [log.substitute for log in run.layers[0]] == [set(), set(), {3}]  # 1 was speculated, 3 routed
    stats = policy.describe()
    assert (stats["ran_as_predicted"], stats["ran_as_substitute"], stats["buffer_slots"]) == (1, 1, 8)
    exact = drive(SpecExp(lossy_execution=False), ctx, [cross_step(0, [0, 2, 3], [2, 1])])
    assert [log.loaded for log in exact.layers[0]] == [[0], [], [3]]  # the variant loads the routed expert


def test_specexp_copies_every_row_again_each_forward():
    """Nothing survives to the next forward: with 5 layers of one token, the two buffer sets (2 x 2 rows)
    hold only the last layers' rows when the next forward starts, so every row is copied again."""
    routed, predicted = [0, 1, 0, 1, 0], [1, 0, 1, 0]
    steps = [cross_step(s, routed, predicted) for s in range(3)]
    run = drive(SpecExp(), context(5, 2, 1, 10, signals=["cross_layer_topk"]), [(s, c[:, :2]) for s, c in steps])
    assert run.cache.capacity == 4
    assert [len([p for p in run.prefetched if p[0][0] == s]) for s in range(3)] == [4, 4, 4]
    assert [log[0].loaded for log in run.layers] == [[0], [0], [0]]
    assert run.cache.counters.hits == 3 * 4  # each speculated row, copied this forward, is what runs


# -- speculative-decoding baselines -----------------------------------------------------------------

def test_sp_moe_prefetches_up_to_the_cutoff_layer_during_drafting():
    ctx = context(6, 4, 1, 3, signals=["draft"], costs=UnitCosts(t_io=1.0, t_draft=1.5))
    routing = counts_of(6, 4, {l: [l % 4] for l in range(6)})
    policy = SPMoE(predictor="previous")
    run = drive(policy, ctx, [(step(0, "prefill", 1), routing), (step(1, "verify", 3, gamma=2), routing)])
    # T_draft = 2 * 1.5 = 3 -> L* = 3 layers; LRU had kept only layers 3..5 of step 0
    assert run.prefetched == [((1, 0), (0, 0)), ((1, 0), (1, 1)), ((1, 0), (2, 2))]
    assert [log.hits for log in run.layers[1]] == [{0}, {1}, {2}, set(), set(), set()]
    assert policy.cutoff(step(2, "verify", 2, gamma=1)) == 1 and policy.cutoff(step(2, "ar")) == 0


def test_sp_moe_row_predicts_from_the_draft_phase_not_the_previous_forward():
    """The row reads the target's routers over this step's drafted tokens: it fetches what the verification will
    use even where the previous forward routed elsewhere (the previous-forward variant fetches the old ones)."""
    ctx = context(2, 4, 1, 2, signals=["draft", "self_draft_topk"], costs=UnitCosts(t_io=1.0, t_draft=1.0))
    before = counts_of(2, 4, {0: [0], 1: [1]})
    now = counts_of(2, 4, {0: [2], 1: [3]})
    drafted = np.array([[[2], [2], [-1]], [[3], [3], [-1]]])  # two drafted tokens; the bonus row has none
    steps = [(step(0, "prefill", 1), before), (step(1, "verify", 3, gamma=2, self_draft_topk=drafted), now)]
    run = drive(SPMoE(), ctx, steps)
    assert [p for p in run.prefetched if p[0][0] == 1] == [((1, 0), (0, 2)), ((1, 0), (1, 3))]
    assert [log.hits for log in run.layers[1]] == [{2}, {3}]
    old = drive(SPMoE(predictor="previous"), dataclasses.replace(ctx, signals=frozenset(["draft"])), steps)
    assert [log.hits for log in old.layers[1]] == [set(), set()]
    with pytest.raises(MoespacError, match="'self_draft_topk'"):
        SPMoE().reset(context(2, 4, 1, 2, signals=["draft"]))


def test_moe_speq_phases():
    ctx = context(2, 4, 1, 8, signals=["draft"], costs=UnitCosts(t_io=1.0, t_draft=1.0))
    policy = MoESpeQ(elb="previous")  # the buffer is the previous forward's routing
    policy.reset(ctx)
    cache = ExpertCache(ctx.topology, 8)
    prev = counts_of(2, 4, {0: {0: 3, 1: 1}, 1: {2: 2, 3: 2}})  # 4 tokens: confidences .75 .25 | .5 .5
    for layer in range(2):
        policy.plan_layer(layer, prev[layer], cache)
    verify = step(1, "verify", 4, gamma=2)  # T_draft = 2 -> two copies while drafting
    assert [(r.layer, r.expert, r.priority) for r in policy.begin_step(verify, cache)] == [(0, 0, 0.75), (1, 2, 0.5)]
    policy.reset(ctx)
    for layer in range(2):
        policy.plan_layer(layer, prev[layer], cache)
    mask = np.zeros((2, 4), bool)
    mask[1, 2] = True
    cache.place(mask)  # phase I: (1, 2) is already resident, so the budget goes further down the buffer
    assert [(r.layer, r.expert) for r in policy.begin_step(verify, cache)] == [(0, 0), (1, 3)]


def test_moe_speq_leaves_verification_what_the_int4_draft_experts_do_not_take():
    qwen3 = Topology(48, 128, 8)  # its INT4 experts: ceil(6144 x 4.5 / 16) = 1728 full-precision slots' worth
    assert MoESpeQ().device_slots(qwen3, 4000) == 4000 - 1728
    assert MoESpeQ().device_slots(qwen3, 1536) == 128  # Table 1's 25 %: one layer of staging is left
    assert MoESpeQ(int4_resident=False).device_slots(qwen3, 1536) == 1536
    ctx = context(2, 4, 1, 8, signals=["draft", "self_draft_topk"])
    run = drive(MoESpeQ(), ctx, [])
    assert run.cache.capacity == 8 - 3 and MoESpeQ().variants


def test_moe_speq_reads_the_self_draft_buffer_not_the_previous_forward():
    """The ELB is the self-draft's routing of this step's drafted tokens (rows of -1: tokens it never ran),
    whatever the previous forward routed; without the signal the policy refuses to start."""
    ctx = context(2, 4, 1, 8, signals=["draft", "self_draft_topk"], costs=UnitCosts(t_io=1.0, t_draft=1.0))
    policy = MoESpeQ()
    policy.reset(ctx)
    cache = ExpertCache(ctx.topology, 8)
    prev = counts_of(2, 4, {0: {0: 3}, 1: {2: 3}})
    for layer in range(2):
        policy.plan_layer(layer, prev[layer], cache)
    # 3 verify rows: the self-draft ran the first two (layer 0 -> 1, 1; layer 1 -> 3, 0), not the last
    elb = np.array([[[1], [1], [-1]], [[3], [0], [-1]]])
    verify = step(1, "verify", 3, gamma=2, self_draft_topk=elb)  # T_draft = 2 -> two copies
    assert [(r.layer, r.expert, r.priority) for r in policy.begin_step(verify, cache)] == [(0, 1, 1.0), (1, 0, 0.5)]
    assert MoESpeQ(elb="previous").requires == () and MoESpeQ.requires == ("self_draft_topk",)
    with pytest.raises(MoespacError, match="'self_draft_topk'"):
        MoESpeQ().reset(context(2, 4, 1, 8, signals=["draft"]))
    with pytest.raises(MoespacError, match="elb 'draft'"):
        MoESpeQ(elb="draft")


# -- every policy ------------------------------------------------------------------------------------

PARTITIONED = ("mixtral-offloading", "hybrimoe", "fate", "lru", "lfu", "moe-infinity", "sp-moe", "specexp")


@pytest.mark.parametrize("per_layer", [None, 3])
def test_every_policy_runs_exactly_once_per_activation(per_layer):
    L, E, k = 4, 8, 2
    steps = random_steps(L, E, k, 8, seed=1)
    warm = np.random.default_rng(2).integers(0, 9, (L, E))
    for name in BASELINES if per_layer is None else PARTITIONED:
        ctx = context(L, E, k, 12, signals=ALL_SIGNALS, warmup_counts=warm, per_layer_capacity=per_layer)
        run = drive(make_policy(name), ctx, steps)  # the driver checks the cache invariants every layer
        c = run.cache.counters
        assert run.placement.sum() <= 12, name
        assert c.activations == sum(int((counts > 0).sum()) for _, counts in steps), name
        assert all(log.device.isdisjoint(log.host) for s in run.layers for log in s), name


def test_missing_signals_fail_in_reset_naming_the_signal():
    checked = 0
    for name in BASELINES:
        policy = make_policy(name)
        needed = list(policy.requires) + (["draft"] if policy.needs_draft else [])
        for signal in needed:
            ctx = context(2, 4, 1, 4, signals=[s for s in ALL_SIGNALS if s != signal],
                          warmup_counts=np.ones((2, 4)))
            with pytest.raises(MoespacError, match=f"'{signal}'"):
                policy.reset(ctx)
            checked += 1
    # llamacpp-sd, sp-moe, moe-speq (draft); fiddler (warmup); fate, specexp (cross); sp-moe, moe-speq (self-draft)
    assert checked == 8
    with pytest.raises(MoespacError, match="'warmup_counts'"):
        make_policy("ktransformers:strategy=frequency").reset(context(2, 4, 1, 4))


def test_policy_list_prints_every_policy_aligned(capsys):
    assert main(["policy", "list"]) == 0
    lines = capsys.readouterr().out.split("\n\n")[0].splitlines()  # the table, without the legend
    assert lines[0].split() == ["NAME", "LOSSLESS", "NEEDS_DRAFT", "REQUIRES"]
    rows = [line for line in lines[1:] if not line.startswith(" ")]  # detail lines under a row are indented
    names = [row.split()[0] for row in rows]
    assert names == sorted(policies()) and set(BASELINES) <= set(names)
    col = lines[0].index("REQUIRES")
    for row in rows:
        assert row[col - 2:col] == "  " and row[col] != " "
    flat = " ".join(" ".join(lines).split())  # the wrapped detail lines back as one line
    for name in names:
        assert f"source: {' '.join((policies()[name].source or '-').split())}" in flat
    fate = next(line for line in lines if line.startswith("fate "))
    assert fate.split()[1:4] == ["no", "no", "cross_layer_topk"]  # the row copies INT4


def test_the_registry_names_every_policy_class_in_the_tree_once():
    """The explicit map (moespac/registry.py) and the files agree: every Policy subclass defined in baselines/ or
    the scheduler is registered under its own name, and every entry resolves to it."""
    import importlib
    import inspect
    import pkgutil

    import baselines
    from moespac.policy import Policy
    from moespac.registry import POLICIES

    defined = {}
    modules = [f"baselines.{m.name}" for m in pkgutil.iter_modules(baselines.__path__) if not m.name.startswith("_")]
    for modname in modules + ["moespac.scheduler.policy"]:
        mod = importlib.import_module(modname)
        for obj in vars(mod).values():
            if (inspect.isclass(obj) and issubclass(obj, Policy) and obj.__module__ == modname
                    and not obj.name.startswith("_")):
                defined[obj.name] = (modname, obj.__name__)
    assert defined == POLICIES
    assert all(cls.name == name for name, cls in policies().items())
