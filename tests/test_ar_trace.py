"""An AR trace derived from a speculative one routes as the AR run of the same tokens does."""

import json

import numpy as np
import pytest

from moespac.ar_trace import ar_from_speculative
from moespac.bench.record_files import validate_record
from moespac.cli import main
from moespac.errors import MoespacError
from moespac.trace import load_trace


def record(d, name, *models_and_gamma):
    """A greedy mt-bench trace of the micro target (2 prompts, two turns each, 24 new tokens)."""
    trace = d / f"{name}.npz"
    assert main(["bench", *models_and_gamma, "--benchmark", "mt-bench", "--limit", "2", "--max-new-tokens", "24",
                 "--ignore-eos", "--temperature", "0", "--warmup", "0", "--policy", "all-host", "--cache-ratio", "0",
                 "--no-progress", "--trace", str(trace), "--out", str(d / f"{name}.json")]) == 0
    return load_trace(trace)


@pytest.fixture(scope="module")
def traces(micro_dir, tmp_path_factory, one_torch_thread):
    d = tmp_path_factory.mktemp("ar")
    pair, target = ["--model-pair", str(micro_dir)], str(micro_dir / "target")
    return dict(
        ar=record(d, "ar", *pair, "--gamma", "0"),
        # the micro draft is random: most drafts are rejected; the target drafting for itself keeps all of them
        rejecting=record(d, "sd", *pair, "--gamma", "4"),
        accepting=record(d, "self", "--target", target, "--draft", target, "--gamma", "4"),
        dir=d,
    )


@pytest.mark.parametrize("sd", ["rejecting", "accepting"])
def test_derived_trace_equals_the_recorded_ar_trace(traces, sd):
    # greedy speculative decoding is lossless, so both runs keep the same tokens; each kept token's routing row
    # must then be the AR step's, expert for expert (the verify pass runs it beside other rows: float rounding only)
    ar, spec = traces["ar"], traces[sd]
    derived = ar_from_speculative(spec)
    accepted, drafted = spec.steps["step_accepted"].sum(), spec.steps["step_gamma"].sum()
    assert 0 < accepted < drafted if sd == "rejecting" else accepted == drafted
    for name in ar.steps:
        assert np.array_equal(derived.steps[name], ar.steps[name]), name
    assert np.array_equal(derived.topk_ids, ar.topk_ids)
    assert np.array_equal(derived.cross_topk, ar.cross_topk)
    np.testing.assert_allclose(derived.topk_weights.astype(np.float32), ar.topk_weights.astype(np.float32), atol=2e-3)
    assert derived.self_draft_topk is None
    assert derived.meta["bench"]["rows"] == ar.meta["bench"]["rows"]
    cfg = dict(derived.meta["bench"]["config"])
    assert cfg.pop("derived_from") == spec.trace_id()
    assert cfg == ar.meta["bench"]["config"] | {"draft_id": None}  # what an AR recording names, and its source
    assert derived.trace_id() not in (ar.trace_id(), spec.trace_id())


def test_cli_writes_the_trace_and_a_record_and_the_bench_replays_it(traces, tmp_path, capsys):
    d = traces["dir"]
    out, rec = tmp_path / "ar.npz", tmp_path / "ar.json"
    assert main(["derive-ar-trace", str(d / "sd.npz"), "--out", str(out), "--json", str(rec)]) == 0
    summary = json.loads(rec.read_text())
    assert summary["kind"] == "derive-ar-trace" and summary["trace_id"] == load_trace(out).trace_id()
    assert summary["rows_dropped"] == traces["rejecting"].topk_ids.shape[0] - traces["ar"].topk_ids.shape[0]
    sim = tmp_path / "sim.json"
    assert main(["bench", "--timing", "simulated", "--from-trace", str(out), "--benchmark", "mt-bench",
                 "--policy", "lru", "--hardware", "rtx4090-pcie4", "--model-spec", "trace", "--no-progress",
                 "--out", str(sim)]) == 0
    r = validate_record(sim)
    assert r["config"]["gamma"] == 0 and r["config"]["derived_from"] == traces["rejecting"].trace_id()
    assert r["counts"]["requests"] == 4 and all(q["new_tokens"] == 24 and q["steps"] == 23 for q in r["requests"])


def test_refuses_what_it_cannot_derive_from(traces, tmp_path, capsys):
    with pytest.raises(MoespacError, match="not a speculative trace"):
        ar_from_speculative(traces["ar"])
    batched = load_trace(traces["dir"] / "sd.npz")
    batched.meta["batch_size"] = 2
    with pytest.raises(MoespacError, match="batch size 2"):
        ar_from_speculative(batched)
    assert main(["derive-ar-trace", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "x.npz")]) == 2
    assert "missing.npz" in capsys.readouterr().err and not (tmp_path / "x.npz").exists()
