"""The 'warmup_counts' signal outside tests (simulator and `moespac bench`), and Fate's lossy INT4 copies
(simulator: bytes and copy time x transfer_scale; engine: a real INT4 round trip into the device slots)."""

import numpy as np
import pytest
import torch

from baselines.fate import Fate
from moespac.bench.record_files import validate_record
from moespac.cli import main
from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.engine.store import int4_pack, int4_unpack
from moespac.errors import MoespacError
from moespac.models.micro import build_micro
from moespac.policy import Topology
from moespac.sim.cost import Timing
from moespac.sim.replay import replay, warmup_window
from moespac.sim.simulate import SimConfig, simulate
from moespac.sim.synthetic import hand_trace, synthetic_trace, toy_spec
from moespac.sim.workload import make_workload
from moespac.trace import load_trace


def top(counts: np.ndarray, n: int) -> np.ndarray:
    """The n largest counts as a mask, ties to the lower flat index (as Fiddler / kTransformers rank)."""
    mask = np.zeros(counts.size, dtype=bool)
    mask[np.argsort(-counts.ravel(), kind="stable")[:n]] = True
    return mask.reshape(counts.shape)


def static_hits(trace, steps, mask) -> int:
    """Hits of a placement that never moves: activated experts it holds, summed over `steps`."""
    return sum(int(np.count_nonzero((trace.step_counts(s) > 0) & mask)) for s in steps)


def request_steps(trace, r: int) -> np.ndarray:
    return np.flatnonzero(trace.steps["step_request"] == r)


# -- the shared window ---------------------------------------------------------------------------------------

def test_warmup_window_takes_the_first_steps_of_the_first_request():
    counts = np.arange(4 * 2 * 3).reshape(4, 2, 3)
    req = np.array([5, 5, 5, 6])
    c, w = warmup_window(counts, req, 2)
    assert c.tolist() == (counts[0] + counts[1]).tolist() and w == dict(request=5, steps=2, entries=int(c.sum()))
    c, w = warmup_window(counts, req, 16)  # never past the first request
    assert c.tolist() == counts[:3].sum(0).tolist() and w["steps"] == 3
    c, w = warmup_window(counts, req)
    assert w["steps"] == 3


# -- simulator -------------------------------------------------------------------------------------------------

TOPO = Topology(3, 8, 2)


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_trace(TOPO, new_tokens=40, gamma=3, prompt_tokens=8, requests=2, seed=1, model_spec=toy_spec(TOPO))


def test_static_placements_run_in_the_simulator_from_the_stated_window(synthetic):
    W, slots = 5, 6
    first = request_steps(synthetic, 0)
    assert len(first) > W
    expected = sum(synthetic.step_counts(s) for s in first[:W])
    mask = top(expected, slots)
    records = {}
    for policy in ("fiddler", "ktransformers:strategy=frequency"):
        rec = simulate(SimConfig(trace="", policy=policy, hardware="rtx4090-pcie4", cache_ratio=slots / 24,
                                 warmup_steps=W), synthetic)
        assert rec["cache"]["slots"] == slots and rec["config"]["warmup_steps"] == W
        w = rec["warmup_window"]
        assert (w["request"], w["steps"], w["entries"]) == (0, W, int(expected.sum()))
        c = rec["metrics"]["counters"]
        # the placement is the window's top counts and never moves: hits are exactly its activations
        assert c["hits"] == static_hits(synthetic, range(synthetic.num_steps), mask)
        assert c["loads"] == c["evictions"] == c["bytes_copied"] == 0 and c["host"] == c["activations"] - c["hits"]
        records[policy] = c
    assert records["fiddler"] == records["ktransformers:strategy=frequency"]  # both rank all layers at once
    with pytest.raises(MoespacError, match="'warmup_counts'"):
        simulate(SimConfig(trace="", policy="fiddler", hardware="rtx4090-pcie4", warmup_steps=0), synthetic)
    with pytest.raises(MoespacError, match="warmup_steps"):
        SimConfig(trace="", policy="fiddler", hardware="h200", warmup_steps=-1)


# Fate on 2 layers x 4 experts, top-2: prefill (1 token), two verify steps of gamma=1.
HAND = [
    ("prefill", 0, 1, [[[0, 1], [2, 3]]]),
    ("verify", 1, 2, [[[0, 1], [2, 3]], [[0, 2], [2, 1]]]),
    ("verify", 1, 1, [[[0, 1], [3, 0]], [[0, 1], [3, 0]]]),
]
HAND_TOPO = Topology(2, 4, 2)


def hand_workload(predict: bool):
    trace = hand_trace(HAND_TOPO, HAND, trace_id="fate-hand")
    cross = np.full_like(trace.topk_ids, -1)
    if predict:  # a perfect cross-layer predictor: layer 0's row names layer 1's experts
        cross[:, 0] = trace.topk_ids[:, 1]
    trace.cross_topk = cross
    return make_workload(trace, toy_spec(HAND_TOPO))


def hand_timing(load: float = 4.0) -> Timing:
    S = len(HAND)
    return Timing(draft=np.array([0.0, 2.0, 2.0]), attention=np.ones(S), other=np.full(S, 0.5),
                  device_by_count=np.array([0.0, 1.0, 1.5]), host_by_count=np.array([0.0, 3.0, 5.0]),
                  hidden=np.full(S, 0.5), load=load, expert_bytes=100)


def test_lossy_fate_copies_int4_bytes_and_time_in_the_simulator():
    # No predictions: every copy is a blocking on-demand load on an idle link, so residency does not depend on
    # time, each load stalls exactly one copy time (4 s; INT4 4.5/16 of it) and moves 100 (INT4 28.125) bytes.
    # The INT4 row's 2 slots hold 16/4.5 as many experts: 7, as the full-precision variant's 7 slots do. It also
    # copies every used expert of layer 1 again after it runs (upstream's post_comp): traffic, no residency.
    w, t = hand_workload(predict=False), hand_timing()
    full = replay(w, t, Fate(lossy_transfer=False), 7)
    lossy = replay(w, t, Fate(), 2)
    cf, cl = full.summary()["counters"], lossy.summary()["counters"]
    loads = cf["loads"]
    assert loads > 0 and cf["prefetched"] == cf["restored"] == 0 and cl["restored"] > 0
    same = lambda c: {k: v for k, v in c.items() if k not in ("bytes_copied", "restored")}
    assert same(cl) == same(cf)
    # round(100 x 4.5/16)
    assert cf["bytes_copied"] == 100 * loads and cl["bytes_copied"] == 28 * (loads + cl["restored"])
    assert full.step_time["stall"].sum() == 4.0 * loads
    assert lossy.step_time["stall"].sum() == pytest.approx(4.0 * 4.5 / 16 * loads)  # restores wait for no layer
    assert lossy.link_busy_s >= 4.0 * 4.5 / 16 * (loads + cl["restored"])
    # with predictions the prefetched copies are INT4 too
    lp = replay(hand_workload(predict=True), t, Fate(), 2).summary()["counters"]
    assert lp["prefetched"] > 0 and lp["bytes_copied"] == 28 * (lp["loads"] + lp["prefetched"] + lp["restored"])


def test_transfer_scale_outside_zero_one_is_refused():
    policy = Fate()
    policy.transfer_scale = 0.0
    with pytest.raises(MoespacError, match="transfer_scale"):
        replay(hand_workload(False), hand_timing(), policy, 3)


# -- engine: INT4 copies ---------------------------------------------------------------------------------------

def int4_reference(w: np.ndarray) -> np.ndarray:
    """Per-row symmetric 4-bit round trip, in float32 (numpy, independent of the engine's torch code)."""
    scale = np.abs(w).max(axis=1, keepdims=True).astype(np.float32) / np.float32(7)
    return np.clip(np.round(w.astype(np.float32) / scale), -8, 7) * scale


def test_int4_pack_round_trip_odd_sizes():
    w = torch.randn(3, 5, dtype=torch.float64)
    codes, scale = int4_pack(w)
    assert codes.dtype == torch.uint8 and codes.numel() == 8 and scale.shape == (3, 1, 1)  # 15 codes, two a byte
    assert np.array_equal(int4_unpack(codes, scale, w.shape).numpy(), int4_reference(w.numpy()))


def test_int4_pack_groups_of_columns():
    """group=4 over 8 columns: each half-row is its own per-row problem; a group that does not divide the row
    falls back to one scale per row."""
    w = torch.randn(3, 8, dtype=torch.float32)
    codes, scale = int4_pack(w, group=4)
    assert scale.shape == (3, 2, 1)
    halves = np.concatenate([int4_reference(w[:, :4].numpy()), int4_reference(w[:, 4:].numpy())], axis=1)
    assert np.array_equal(int4_unpack(codes, scale, w.shape).numpy(), halves)
    codes, scale = int4_pack(w, group=3)
    assert scale.shape == (3, 1, 1)
    assert np.array_equal(int4_unpack(codes, scale, w.shape).numpy(), int4_reference(w.numpy()))


@pytest.fixture(scope="module")
def micro():
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=7)
    return target, draft, tok.encode("def quicksort(items):")


@pytest.mark.parametrize("lossy", [False, True])
def test_engine_fate_copies_int4_when_lossy(micro, lossy):
    target, draft, prompt = micro
    rt = HybridRuntime(target, Fate(lossy_transfer=lossy), RuntimeConfig(cache_ratio=0.5, copy_mode="sync"))
    try:
        rt.start_request(gamma=4, signals={"draft"})
        res = generate(target, prompt, draft=draft, gamma=4, max_new_tokens=8, runtime=rt, ignore_eos=True)
        st, store, cache = rt.stats(), rt.store, rt.cache
        assert len(res.tokens) == 8 and st["loads"] + st["prefetched"] > 0
        assert store.copy_bytes == (round(store.expert_bytes * 4.5 / 16) if lossy else store.expert_bytes)
        assert st["bytes_copied"] == (st["loads"] + st["prefetched"]) * store.copy_bytes
        resident = list(zip(*np.nonzero(cache.resident)))
        assert resident
        for layer, e in resident:
            slot = cache.slot_of[layer, e]
            for name in ("gate_up_proj", "down_proj"):
                dev, host = store.slots[name][slot], store.host[layer][name][e]
                want = int4_reference(host.numpy()) if lossy else host.numpy()
                assert np.array_equal(dev.numpy(), want)
                assert np.array_equal(dev.numpy(), host.numpy()) is not lossy  # genuinely lossy
    finally:
        rt.close()


def test_engine_refuses_other_compression_ratios(micro):
    target, *_ = micro
    policy = Fate()
    policy.transfer_scale = 0.5
    with pytest.raises(MoespacError, match="INT4"):
        HybridRuntime(target, policy, RuntimeConfig(cache_ratio=0.5))


# -- `moespac bench` ---------------------------------------------------------------------------------------------

def bench(pair, out, *extra):
    return main(["bench", "--model-pair", str(pair), "--gamma", "2", "--no-progress", "--benchmark", "gsm8k",
                 "--limit", "2", "--max-new-tokens", "6", "--cache-ratio", "0.5", "--out", str(out), *map(str, extra)])


def check_static_calls(rec, trace, mask):
    for call in rec["calls"]:
        c = call["counters"]
        assert c["hits"] == static_hits(trace, request_steps(trace, call["call"]), mask)
        assert c["loads"] == c["evictions"] == 0


def test_bench_gives_static_placements_the_warmup_counts(micro_dir, tmp_path):
    # measured, 1 warm-up call: it profiles on a prompt of the benchmark that is not measured (a real system
    # profiles on other data), so the placement never saw the requests it serves
    out, path = tmp_path / "fiddler.json", tmp_path / "t.npz"
    assert bench(micro_dir, out, "--policy", "fiddler", "--trace", path) == 0
    rec, trace = validate_record(out), load_trace(path)
    first = request_steps(trace, 0)
    w = rec["policy"]["warmup_window"]
    measured_ids = {r["prompt_id"] for r in rec["requests"]}
    assert w["source"] == "1 warm-up call(s) on other prompts, not measured" and w["request"] == -1
    assert len(w["prompts"]) == 1 and not set(w["prompts"]) & measured_ids and w["entries"] > 0
    # the placement is static: every call's hits are those of one fixed mask, no loads, no evictions
    for call in rec["calls"]:
        assert call["counters"]["loads"] == call["counters"]["evictions"] == 0

    # warm-up 0: one prefill of another prompt, run once before the measured calls
    out0 = tmp_path / "ktf.json"
    assert bench(micro_dir, out0, "--policy", "ktransformers:strategy=frequency", "--warmup", 0) == 0
    rec0 = validate_record(out0)
    w = rec0["policy"]["warmup_window"]
    assert (w["request"], w["steps"]) == (-1, 1) and w["prompts"] == rec["policy"]["warmup_window"]["prompts"]
    assert "prefill on other prompts" in w["source"] and rec0["counts"]["warmup"] == 0
    slots = round(0.5 * trace.topology.num_layers * trace.topology.num_experts)

    # simulated from the trace: the first 16 steps of its first request
    sim = tmp_path / "sim.json"
    assert main(["bench", "--benchmark", "gsm8k", "--timing", "simulated", "--hardware", "rtx4090-pcie4",
                 "--from-trace", str(path), "--policy", "fiddler", "--cache-ratio", "0.5", "--out", str(sim)]) == 0
    rs = validate_record(sim)
    n = min(16, len(first))
    w = rs["simulation"]["warmup_window"]
    assert rs["policy"]["warmup_window"] == w and (w["request"], w["steps"]) == (0, n)
    check_static_calls(rs, trace, top(sum(trace.step_counts(s) for s in first[:n]), slots))
