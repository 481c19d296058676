"""Every registered policy runs end to end in the real engine; lossless ones leave greedy output unchanged."""

import numpy as np
import pytest
import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.lossless import hf_greedy
from moespac.models.micro import build_micro
from moespac.registry import make_policy, policies

# The oracle reads the future of a recorded trace: it exists only in the simulator (its reset names the signal).
ENGINE_POLICIES = sorted(n for n, cls in policies().items() if "future" not in cls.requires)


@pytest.fixture(scope="module")
def micro():
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=7)
    prompt = tok.encode("def quicksort(items):")
    return target, draft, prompt, hf_greedy(target, [prompt], 16)[0]


@pytest.mark.parametrize("name", ENGINE_POLICIES)
def test_policy_runs_in_engine(micro, name):
    target, draft, prompt, ref = micro
    policy = make_policy(name)
    rt = HybridRuntime(target, policy, RuntimeConfig(cache_ratio=0.5))
    L, E = rt.topology.num_layers, rt.topology.num_experts
    warm = np.random.default_rng(0).integers(0, 5, size=(L, E))  # static placements (Fiddler, kTransformers) need it
    try:
        rt.start_request(gamma=4, signals={"draft"}, warmup_counts=warm)
        res = generate(target, prompt, draft=draft, gamma=4, max_new_tokens=16, runtime=rt, ignore_eos=True)
        stats = rt.stats()
        rt.cache.check()
    finally:
        rt.close()
    assert stats["hits"] + stats["loads"] + stats["host"] == stats["activations"] > 0
    if policy.lossless:
        assert res.tokens == ref


@pytest.mark.parametrize("spec, on_device", [("llamacpp", True), ("llamacpp:cpu_moe=true", False)])
def test_llamacpp_flags_in_the_engine(micro, spec, on_device):
    """The two llama.cpp placements of Table 1 in the real engine: --n-cpu-moe keeps whole layers' experts on
    the device (hits, nothing copied); -ot exps=CPU runs every routed expert on the host."""
    target, draft, prompt, ref = micro
    rt = HybridRuntime(target, make_policy(spec), RuntimeConfig(cache_ratio=0.5))
    try:
        rt.start_request(gamma=0)
        res = generate(target, prompt, max_new_tokens=8, runtime=rt, ignore_eos=True)
        stats = rt.stats()
    finally:
        rt.close()
    assert stats["loads"] == stats["bytes_copied"] == 0 and res.tokens == ref[:len(res.tokens)]
    assert (stats["hits"] > 0) == on_device and (stats["host"] == stats["activations"]) == (not on_device)


def test_accelerate_copies_whole_layers_in_the_engine(micro):
    """The engine copies what Accelerate's hooks copy: each forward of an offloaded layer brings all E experts
    (the routed ones run, the rest are carried); vLLM's offload brings only the routed ones."""
    target, draft, prompt, ref = micro
    stats = {}
    for name in ("accelerate", "vllm-offload"):
        rt = HybridRuntime(target, make_policy(name), RuntimeConfig(cache_ratio=0.5))
        try:
            rt.start_request(gamma=0)
            res = generate(target, prompt, max_new_tokens=6, runtime=rt, ignore_eos=True)
            stats[name] = rt.stats()
            E = rt.topology.num_experts
        finally:
            rt.close()
        assert res.tokens == ref[:len(res.tokens)]  # lossless either way
    acc, vllm = stats["accelerate"], stats["vllm-offload"]
    assert acc["carried"] > 0 == vllm["carried"] and (acc["loads"] + acc["carried"]) % E == 0
    assert acc["bytes_copied"] > vllm["bytes_copied"]


def test_moe_infinity_prefetches_from_a_profiling_run_in_the_engine(micro):
    """In the engine as in the simulator: one request and no profiling run, MoE-Infinity's EAM variant has
    nothing to match and never prefetches; given the activation matrix of another prompt's run it prefetches from
    the start."""
    target, draft, prompt, ref = micro
    other = np.random.default_rng(1).integers(0, 4, size=(1, *target_shape(target)))
    prefetched = []
    for history in (None, other):
        rt = HybridRuntime(target, make_policy("moe-infinity:prefetch=eam"), RuntimeConfig(cache_ratio=0.25))
        try:
            rt.start_request(gamma=0, history=history)
            res = generate(target, prompt, max_new_tokens=8, runtime=rt, ignore_eos=True)
            prefetched.append(rt.stats()["prefetched"])
        finally:
            rt.close()
        assert res.tokens == ref[:len(res.tokens)]
    assert prefetched[0] == 0 < prefetched[1]


def target_shape(target) -> tuple[int, int]:
    """(MoE layers, experts) of a micro target."""
    c = target.config
    return c.num_hidden_layers, c.num_experts


def test_oracle_refuses_the_real_engine(micro):
    target, *_ = micro
    rt = HybridRuntime(target, make_policy("oracle"), RuntimeConfig(cache_ratio=0.5))
    try:
        with pytest.raises(Exception, match="future"):
            rt.start_request(gamma=4, signals={"draft"})
    finally:
        rt.close()


@pytest.mark.parametrize("name", ["lru", "lfu", "mixtral-offloading", "accelerate", "all-host"])
def test_the_simulator_replays_the_engines_cache_decisions_exactly(micro_dir, tmp_path, name):
    """With no prefetch timing in play (on-demand policies, synchronous copies), the simulator replaying the
    engine's own trace makes the very same hits, loads, carried copies, host runs and evictions per request:
    both reserve a layer's slots the same way (the runs, then what comes along; ExpertCache.reserve_many)."""
    import json

    from moespac.cli import main

    common = ["--benchmark", "gsm8k", "--policy", name, "--cache-ratio", "0.25", "--no-progress"]
    trace, measured, simulated = tmp_path / "t.npz", tmp_path / "m.json", tmp_path / "s.json"
    assert main(["bench", "--model-pair", str(micro_dir), *common, "--limit", "2", "--max-new-tokens", "16",
                 "--gamma", "2", "--copy-mode", "sync", "--warmup", "0", "--trace", str(trace),
                 "--out", str(measured)]) == 0
    assert main(["bench", *common, "--timing", "simulated", "--hardware", "h200", "--from-trace", str(trace),
                 "--no-bounds", "--out", str(simulated)]) == 0
    keys = ("hits", "loads", "carried", "host", "evictions")
    engine, sim = ([{k: c["counters"][k] for k in keys} for c in json.loads(p.read_text())["calls"]]
                   for p in (measured, simulated))
    assert engine == sim and sum(c["hits"] + c["host"] for c in engine) > 0
    if name != "all-host":
        assert sum(c["loads"] for c in engine) > 0 and sum(c["evictions"] for c in engine) > 0
    if name == "accelerate":
        assert sum(c["carried"] for c in engine) > 0  # the whole fused layer moves
