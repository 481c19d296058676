"""Every registered policy runs in the simulator on a trace the real engine recorded (draft, cross-layer
predictions, the self-draft lookahead and the warm-up window all present), and accounts for every activation
exactly once."""

import pytest

from moespac.cli import main
from moespac.registry import policies
from moespac.sim.simulate import SimConfig, simulate
from moespac.trace import load_trace


@pytest.fixture(scope="module")
def engine_trace(micro_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("every")
    trace = d / "t.npz"
    assert main(["bench", "--model-pair", str(micro_dir), "--benchmark", "gsm8k", "--limit", "2",
                 "--max-new-tokens", "12", "--gamma", "3", "--warmup", "0", "--no-progress", "--self-draft-lookahead",
                 "--trace", str(trace), "--out", str(d / "r.json")]) == 0
    return str(trace)


@pytest.mark.parametrize("name", sorted(policies()))
def test_policy_runs_in_the_simulator(engine_trace, name):
    t = load_trace(engine_trace)
    assert {"draft", "cross_layer_topk", "self_draft_topk"} <= t.signals()
    rec = simulate(SimConfig(engine_trace, name, "rtx4090-pcie4", cache_ratio=0.25, bounds=False), t)
    c = rec["metrics"]["counters"]
    routed = sum(int((t.step_counts(s) > 0).sum()) for s in range(t.num_steps))  # (step, layer, expert) activations
    # every activation runs once: resident, loaded, on the host, or (a lossy policy) in a speculated expert's place
    assert c["hits"] + c["loads"] + c["host"] + c["substituted"] == routed > 0
    assert rec["timing"] == "simulated" and rec["metrics"]["tokens_per_s"] > 0
