"""MoE-SpeQ's self-draft lookahead: the target with INT4 experts routes the drafted tokens, in the engine and in
the trace, and changes nothing else (tokens, routing, KV cache); MoE-SpeQ prefetches from it in the engine and
in the simulator."""

import json

import numpy as np
import pytest
import torch

from moespac.cli import main
from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.selfdraft import SelfDraftExperts
from moespac.engine.speculative import generate_batch
from moespac.lossless import hf_greedy
from moespac.models.micro import build_micro
from moespac.registry import make_policy
from moespac.trace import TraceRecorder, load_trace

GAMMA = 3


@pytest.fixture(scope="module")
def micro(one_torch_thread):
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float32, seed=7)
    prompts = [tok.encode("def quicksort(items):"), tok.encode("The capital of France is")]
    return target, draft, prompts, hf_greedy(target, prompts, 16)


def run(micro, batch, policy="lru", self_draft=False, spy=None):
    """Greedy speculative decoding of `batch` prompts, recording the trace; (tokens, trace, runtime stats)."""
    target, draft, prompts, _ = micro
    rt = HybridRuntime(target, make_policy(policy), RuntimeConfig(cache_ratio=0.25, copy_mode="sync"))
    try:
        if spy is not None:
            spy(rt.policy)
        rt.recorder = TraceRecorder(rt.topology, {}, self_draft=self_draft)
        rt.start_request(gamma=GAMMA, batch_size=batch, signals={"draft"})
        res = generate_batch(target, prompts[:batch], draft=draft, gamma=GAMMA, max_new_tokens=16, runtime=rt,
                             ignore_eos=True)
        return [r.tokens for r in res], rt.recorder.finish(), rt.stats(), res
    finally:
        rt.close()


@pytest.mark.parametrize("batch", [1, 2])
def test_the_lookahead_pass_changes_nothing_but_its_own_rows(micro, batch):
    """Tokens equal transformers' greedy generate() with the pass on; every other array of the trace is the same
    as without it; its rows line up with the verify rows: exactly equal at the first MoE layer (whose router
    reads no expert output yet), -1 on prefill and on each sequence's last drafted token."""
    ref = micro[3][:batch]
    plain_tokens, plain, _, _ = run(micro, batch)
    tokens, trace, _, res = run(micro, batch, self_draft=True)
    assert tokens == plain_tokens == ref
    assert res[0].lookahead_s > 0 and plain.self_draft_topk is None and "self_draft_topk" in trace.signals()
    assert np.array_equal(trace.topk_ids, plain.topk_ids) and np.array_equal(trace.topk_weights, plain.topk_weights)
    assert np.array_equal(trace.cross_topk, plain.cross_topk)
    assert all(np.array_equal(trace.steps[k], plain.steps[k]) for k in plain.steps)
    verify_steps = 0
    for s in range(trace.num_steps):
        la, ids = trace.step_self_draft(s), trace.step_ids(s)
        if trace.kind(s) != "verify":
            assert (la == -1).all()
            continue
        verify_steps += 1
        cols = la.reshape(batch, -1, *la.shape[1:])  # [sequence, column, L, k]
        assert (cols[:, -1] == -1).all() and (cols[:, :-1] >= 0).all()
        ran = (la >= 0).all(axis=(1, 2))
        assert np.array_equal(la[ran, 0], ids[ran, 0])
    assert verify_steps > 1


def test_self_draft_experts_are_int4_groups_of_the_host_weights(micro):
    """Each matrix is its host weights through group-wise symmetric INT4 (checked against numpy), genuinely lossy."""
    target = micro[0]
    rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.25))
    try:
        experts = SelfDraftExperts(rt.store, group=16)
        got = experts.weights(1, np.array([5, 2]))
        for name in experts.names:
            for i, e in enumerate((5, 2)):
                w = rt.store.host[1][name][e].numpy().astype(np.float32)
                g = w.reshape(w.shape[0], -1, 16)
                scale = np.abs(g).max(axis=-1, keepdims=True) / np.float32(7)
                want = (np.clip(np.round(g / scale), -8, 7) * scale).reshape(w.shape)
                assert np.array_equal(got[name][i].numpy(), want) and not np.array_equal(want, w)
    finally:
        rt.close()


def test_moe_speq_prefetches_its_self_draft_buffer_in_the_engine(micro):
    """At every verify step MoE-SpeQ's prefetches are experts its self-draft routed to in that step's layer;
    reading the previous forward instead (the old stand-in) asks for different experts."""
    asked = {}

    def spy(policy):
        begin = policy.begin_step

        def wrapped(step, cache):
            out = begin(step, cache)
            asked.setdefault(policy.elb, []).append((step.signals.get("self_draft_topk"),
                                                     [(r.layer, r.expert) for r in out]))
            return out
        policy.begin_step = wrapped

    tokens, _, stats, _ = run(micro, 1, policy="moe-speq", spy=spy)
    assert tokens == micro[3][:1] and stats["prefetched"] > 0
    for elb, wanted in asked["self-draft"]:
        for layer, expert in wanted:
            assert expert in elb[layer]
    run(micro, 1, policy="moe-speq:elb=previous", spy=spy)
    assert [w for _, w in asked["self-draft"]] != [w for _, w in asked["previous"]]


def test_the_simulator_replays_moe_speq_from_the_recorded_buffer(micro_dir, tmp_path):
    """`bench --self-draft-lookahead` keeps the signal in the trace; replayed, MoE-SpeQ prefetches from it and
    differs from its stand-in and from SP-MoE; a trace without it is refused naming the signal."""
    common = ["--benchmark", "gsm8k", "--cache-ratio", "0.25", "--no-progress"]
    traces = {}
    for flag in ([], ["--self-draft-lookahead"]):
        traces[bool(flag)] = tmp_path / f"t{len(flag)}.npz"
        assert main(["bench", "--model-pair", str(micro_dir), *common, "--policy", "all-host", "--limit", "2",
                     "--max-new-tokens", "16", "--gamma", "3", "--warmup", "0", *flag,
                     "--trace", str(traces[bool(flag)]), "--out", str(tmp_path / f"m{len(flag)}.json")]) == 0
    with_la, without = load_trace(traces[True]), load_trace(traces[False])
    assert "self_draft_topk" in with_la.signals() and "self_draft_topk" not in without.signals()
    assert np.array_equal(with_la.topk_ids, without.topk_ids)
    assert "lookahead_s" in json.loads((tmp_path / "m1.json").read_text())["calls"][0]

    def simulate(policy, trace):
        out = tmp_path / f"{policy.replace(':', '_')}.json"
        code = main(["bench", *common, "--policy", policy, "--timing", "simulated", "--hardware", "h200",
                     "--from-trace", str(trace), "--no-bounds", "--out", str(out)])
        return code, json.loads(out.read_text()) if code == 0 else None

    runs = {p: simulate(p, traces[True])[1] for p in ("moe-speq", "moe-speq:elb=previous", "sp-moe")}
    counters = {p: [c["counters"] for c in r["calls"]] for p, r in runs.items()}
    assert sum(c["prefetched"] for c in counters["moe-speq"]) > 0
    assert counters["moe-speq"] != counters["moe-speq:elb=previous"] and counters["moe-speq"] != counters["sp-moe"]
    code, _ = simulate("moe-speq", traces[False])
    failure = json.loads((tmp_path / "moe-speq.failure.json").read_text())
    assert code != 0 and "needs signal 'self_draft_topk'" in json.dumps(failure)
