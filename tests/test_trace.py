"""Trace recording invariants and a reader that rejects bad files."""

import json

import numpy as np
import pytest

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.errors import MoespacError
from moespac.models.micro import build_micro
from moespac.models.specs import spec_from_config
from moespac.registry import make_policy
from moespac.trace import TraceRecorder, load_trace


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    target, draft, tok = build_micro("qwen3_moe", seed=1)
    rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.5, copy_mode="sync"))
    rt.recorder = TraceRecorder(rt.topology, spec_from_config(target.config, "micro").to_dict(), meta=dict(gamma=4))
    rt.start_request(gamma=4, signals={"draft"})
    res = generate(target, tok.encode("hello world, this is"), draft=draft, gamma=4, max_new_tokens=20, runtime=rt)
    rt.close()
    trace = rt.recorder.finish(trace_id="t")
    path = tmp_path_factory.mktemp("trace") / "t.npz"
    trace.save(path)
    return trace, res, path


def test_every_step_has_tokens_times_k_entries(recorded):
    trace, res, _ = recorded
    k = trace.topology.top_k
    assert trace.num_steps == res.steps + 1  # prefill + verify steps
    for s in range(trace.num_steps):
        ids = trace.step_ids(s)
        assert ids.shape == (trace.steps["step_tokens"][s], trace.topology.num_layers, k)
        assert (ids >= 0).all()
        assert trace.step_counts(s).sum() == trace.steps["step_tokens"][s] * trace.topology.num_layers * k
        assert trace.steps["step_accepted"][s] <= trace.steps["step_gamma"][s]
    verify = trace.steps["step_kind"] == 1
    assert (trace.steps["step_tokens"][verify] == 5).all()  # 1 pending + gamma 4
    assert trace.steps["step_accepted"][verify].tolist() == res.accepted_per_step


def test_cross_layer_prediction_recorded(recorded):
    trace, _, _ = recorded
    assert trace.cross_topk is not None
    assert (trace.cross_topk[:, :-1] >= 0).all() and (trace.cross_topk[:, -1] == -1).all()


def test_roundtrip(recorded):
    trace, _, path = recorded
    back = load_trace(path)
    assert np.array_equal(back.topk_ids, trace.topk_ids)
    assert back.meta["model_spec"]["name"] == "micro"


def test_truncated_trace_rejected(recorded, tmp_path):
    _, _, path = recorded
    bad = tmp_path / "trunc.npz"
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(MoespacError, match="truncated|unreadable"):
        load_trace(bad)


def test_wrong_version_rejected(recorded, tmp_path):
    _, _, path = recorded
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["schema_version"] = 99
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    bad = tmp_path / "v99.npz"
    np.savez(bad, **arrays)
    with pytest.raises(MoespacError, match="schema_version 99"):
        load_trace(bad)


def test_missing_rows_rejected(recorded, tmp_path):
    _, _, path = recorded
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["topk_ids"] = arrays["topk_ids"][:-1]
    bad = tmp_path / "rows.npz"
    np.savez(bad, **arrays)
    with pytest.raises(MoespacError, match="topk_ids shape"):
        load_trace(bad)
