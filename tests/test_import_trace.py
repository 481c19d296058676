"""`moespac import-trace`: routing written by a fake SGLang server and a fake plain-JSONL hook comes back exactly
(ids per token per layer, step structure), a hand-computed case gives the step arrays worked out below, bad
input fails in one line naming file and line, and the imported trace replays through every policy."""

import base64
import hashlib
import json
from fractions import Fraction

import numpy as np
import pytest

from moespac.cli import main
from moespac.errors import MoespacError
from moespac.registry import make_policy, policies
from moespac.sim.simulate import SimConfig, simulate
from moespac.workflow_checks import ENGINE_ONLY_SIGNALS
from moespac.trace import load_trace


# -- fake writers ------------------------------------------------------------------------------------------
def sglang_response(rid: str, routing: np.ndarray, prompt: int, accept_rate=None, verify_ct: int = 0) -> dict:
    """A /generate response as SGLang writes it for a request with return_routed_experts: routing holds the
    rows of positions [0, prompt + completion - 1), every decoder layer, num_experts_per_tok ids, and goes out
    as base64 of the int32 array's bytes (detokenizer_manager._extract_routed_experts)."""
    completion = len(routing) - prompt + 1
    meta = {"id": rid, "finish_reason": {"type": "length", "length": completion}, "prompt_tokens": prompt,
            "completion_tokens": completion, "cached_tokens": 0,
            "routed_experts": base64.b64encode(np.ascontiguousarray(routing, dtype="<i4").tobytes()).decode("utf-8")}
    if accept_rate is not None:  # a server running speculative decoding adds these
        meta.update(spec_accept_rate=accept_rate, spec_verify_ct=verify_ct)
    return {"text": "...", "output_ids": list(range(completion)), "meta_info": meta}


def write_lines(path, objs) -> str:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return str(path)


def plain_records(requests: dict) -> list[dict]:
    """Our JSONL from {name: (prompt, ids [T, L, k], weights or None)}, requests interleaved token by token as
    a hook in a batched server writes them."""
    out = []
    for t in range(max(len(ids) for _, ids, _ in requests.values())):
        for name, (prompt, ids, w) in requests.items():
            if t < len(ids):
                rec = {"request": name, "token": t, "prefill": t < prompt, "layers": ids[t].tolist()}
                if w is not None:
                    rec["weights"] = w[t].tolist()
                out.append(rec)
    return out


def routing(rng, tokens: int, layers: int, k: int, experts: int) -> np.ndarray:
    return np.stack([[rng.choice(experts, k, replace=False) for _ in range(layers)] for _ in range(tokens)])


def request_ids(trace, r: int) -> np.ndarray:
    steps = np.flatnonzero(trace.steps["step_request"] == r)
    return np.concatenate([trace.step_ids(int(s)) for s in steps])


def expected_tokens(prompt: int, decoded: int, gamma: int) -> list[int]:
    """Prefill, then groups of gamma + 1 decoded tokens in order (the last shorter)."""
    return [prompt] + [min(gamma + 1, decoded - s) for s in range(0, decoded, gamma + 1)]


def run_import(args: list[str]) -> int:
    return main(["import-trace", *args])


# -- round trips -------------------------------------------------------------------------------------------
def test_sglang_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    L, k, E = 4, 2, 16
    shapes = {"a": (5, 12), "b": (2, 1), "c": (4, 7)}  # (prompt, completion); b decodes one token: no decode row
    rows = {rid: routing(rng, p + c - 1, L, k, E) for rid, (p, c) in shapes.items()}
    resp = {rid: sglang_response(rid, rows[rid], p) for rid, (p, _) in shapes.items()}
    src = write_lines(tmp_path / "responses.jsonl", [resp["a"], [resp["b"], resp["c"]]])  # b, c: one batched call
    out = tmp_path / "t.npz"
    assert run_import([src, "--format", "sglang", "--out", str(out), "--num-experts", str(E), "--top-k", str(k),
                       "--gamma", "3", "--acceptance", "0.5", "--json", str(tmp_path / "r.json")]) == 0
    t = load_trace(out)
    assert (t.topology.num_layers, t.topology.num_experts, t.topology.top_k) == (L, E, k)
    gamma = 3
    for r, (rid, (p, c)) in enumerate(shapes.items()):
        np.testing.assert_array_equal(request_ids(t, r), rows[rid])
        mine = t.steps["step_request"] == r
        assert t.steps["step_tokens"][mine].tolist() == expected_tokens(p, c - 1, gamma)
        assert t.steps["step_kind"][mine].tolist() == [0] + [1] * (len(expected_tokens(p, c - 1, gamma)) - 1)
        assert t.steps["step_gamma"][mine].tolist() == [0] + [gamma] * (len(expected_tokens(p, c - 1, gamma)) - 1)
    np.testing.assert_array_equal(t.topk_weights, np.float16(1 / k))
    m = t.meta
    assert m["imported"] is True and m["source"] == "sglang-routed-experts" and m["model_spec"] is None
    assert m["source_sha256"] == hashlib.sha256((tmp_path / "responses.jsonl").read_bytes()).hexdigest()
    assert (m["gamma"], m["acceptance"], m["acceptance_source"]) == (3, 0.5, "given")
    assert ("SGLang returns no router weights" in m["weights"]
            and "rejected tokens are not in this trace" in m["structure"])
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["requests"] == ["a", "b", "c"] and record["realized_acceptance"] == pytest.approx(0.5, abs=0.1)


def test_limit_and_length_cut_the_served_requests_and_name_the_trace(tmp_path):
    rng = np.random.default_rng(1)
    shapes = [(5, 12), (3, 4), (4, 9)]  # (prompt, completion)
    rows = [routing(rng, p + c - 1, 3, 2, 8) for p, c in shapes]
    src = write_lines(tmp_path / "r.jsonl", [sglang_response(f"q{i}", rows[i], p) for i, (p, _) in enumerate(shapes)])

    def imported(*extra):
        out = tmp_path / f"t{len(list(tmp_path.iterdir()))}.npz"
        assert run_import([src, "--format", "sglang", "--out", str(out), "--num-experts", "8", "--top-k", "2",
                           "--gamma", "2", "--acceptance", "0.5", *extra]) == 0
        return load_trace(out)

    t = imported("--limit", "2", "--max-new-tokens", "6")
    assert t.meta["requests"] == 2 and (t.meta["limit"], t.meta["max_new_tokens"]) == (2, 6)
    np.testing.assert_array_equal(request_ids(t, 0), rows[0][:5 + 5])  # 6 new tokens: the prompt + 5 rows
    np.testing.assert_array_equal(request_ids(t, 1), rows[1])  # 4 served: shorter than the cut, kept whole
    ids = {imported().trace_id(), t.trace_id(), imported("--limit", "2").trace_id()}
    assert len(ids) == 3 and all(i.startswith("import-sglang-") for i in ids)  # one file, three traces


def test_a_trace_imported_for_a_benchmark_replays_as_a_pipeline_cell(tmp_path):
    """--benchmark adds the per-request facts `moespac bench --timing simulated` reads (the pipeline's cells)."""
    rng = np.random.default_rng(2)
    shapes = [(6, 20), (3, 9)]
    src = write_lines(tmp_path / "r.jsonl", [sglang_response(f"q{i}", routing(rng, p + c - 1, 27, 6, 64), p)
                                             for i, (p, c) in enumerate(shapes)])
    out = tmp_path / "t.npz"
    assert run_import([src, "--format", "sglang", "--out", str(out), "--model-spec", "deepseek-v2-lite", "--gamma", "4",
                       "--acceptance", "0.75", "--benchmark", "humaneval",
                       "--model", "deepseek-ai/DeepSeek-V2-Lite"]) == 0
    t = load_trace(out)
    facts = t.meta["bench"]
    assert (facts["config"]["target_id"] == "deepseek-ai/DeepSeek-V2-Lite"
            and facts["config"]["benchmark"] == "humaneval")
    for r, row in enumerate(facts["rows"]):  # the facts are the steps' own counts
        mine = t.steps["step_request"] == r
        assert row["new_tokens"] == int(t.steps["step_emitted"][mine].sum())
        assert row["drafted"] == 4 * row["steps"] and row["accepted"] == int(t.steps["step_accepted"][mine].sum())
    rec_path = tmp_path / "cell.json"
    assert main(["bench", "--timing", "simulated", "--from-trace", str(out), "--hardware", "rtx4090-pcie4",
                 "--model-spec", "deepseek-v2-lite", "--benchmark", "humaneval", "--policy", "lru", "--cache-ratio",
                 "0.25", "--no-bounds", "--no-progress", "--out", str(rec_path)]) == 0
    rec = json.loads(rec_path.read_text())
    assert rec["counts"]["requests"] == 2 and rec["benchmark"]["source"] == "imported"
    assert rec["metrics"]["acceptance_rate"] == pytest.approx(0.75, abs=0.05)


def test_plain_jsonl_round_trip_with_weights(tmp_path):
    rng = np.random.default_rng(1)
    L, k, E = 3, 2, 8
    reqs = {}
    for name, (p, d) in {"x": (4, 6), 7: (1, 3)}.items():  # request names may be strings or integers
        ids = routing(rng, p + d, L, k, E)
        reqs[name] = (p, ids, rng.dirichlet(np.ones(k), size=(p + d, L)).astype(np.float32))
    src = write_lines(tmp_path / "hook.jsonl", plain_records(reqs))
    out = tmp_path / "t.npz"
    assert run_import([src, "--format", "jsonl", "--out", str(out), "--num-experts", str(E), "--gamma", "0"]) == 0
    t = load_trace(out)
    for r, (p, ids, w) in enumerate(reqs.values()):
        np.testing.assert_array_equal(request_ids(t, r), ids)
        mine = np.flatnonzero(t.steps["step_request"] == r)
        np.testing.assert_array_equal(np.concatenate([t.topk_weights[t.offsets()[s]:t.offsets()[s + 1]] for s in mine]),
                                      w.astype(np.float16))
        assert t.steps["step_tokens"][mine].tolist() == [p] + [1] * (len(ids) - p)  # gamma 0: one token per step
        assert t.steps["step_kind"][mine].tolist() == [0] + [2] * (len(ids) - p)
        assert t.steps["step_emitted"][mine].tolist() == [1] * (1 + len(ids) - p)
    assert t.meta["weights"] == "given" and t.meta["acceptance"] is None and "draft" not in t.signals()


def test_sglang_openai_compatible_response(tmp_path):
    """/v1/chat/completions carries the same string as sglext.routed_experts and the counts in usage."""
    rows = routing(np.random.default_rng(5), 7, 2, 2, 8)
    meta = sglang_response("c", rows, 3)["meta_info"]
    chat = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
            "sglext": {"routed_experts": meta["routed_experts"]}}
    src = write_lines(tmp_path / "chat.jsonl", [chat])
    assert run_import([src, "--format", "sglang", "--out", str(tmp_path / "t.npz"), "--num-experts", "8",
                       "--top-k", "2", "--gamma", "1", "--acceptance", "1"]) == 0
    t = load_trace(tmp_path / "t.npz")
    np.testing.assert_array_equal(t.topk_ids, rows)
    assert t.steps["step_tokens"].tolist() == [3, 2, 2]


def test_sglang_dense_first_layers_are_dropped_with_a_spec(tmp_path):
    """SGLang has a row slot for every decoder layer; DeepSeek-V2-Lite's layer 0 is dense (its slot stays 0)."""
    rng = np.random.default_rng(2)
    rows = routing(rng, 9, 27, 6, 64)
    rows[:, 0] = 0
    src = write_lines(tmp_path / "r.jsonl", [sglang_response("q", rows, 4)])
    out = tmp_path / "t.npz"
    assert run_import([src, "--format", "sglang", "--out", str(out), "--model-spec", "deepseek-v2-lite",
                       "--gamma", "2", "--acceptance", "1"]) == 0
    t = load_trace(out)
    np.testing.assert_array_equal(t.topk_ids, rows[:, 1:])
    assert t.meta["dense_layers_dropped"] == 1 and t.meta["model_spec"]["name"] == "deepseek-v2-lite"
    assert t.steps["step_accepted"].tolist() == [0, 2, 2] and t.steps["step_emitted"].tolist() == [1, 3, 3]


# -- the step rule, by hand ----------------------------------------------------------------------------------
# Verify step j accepts floor((j+1) A gamma + 1/2) - floor(j A gamma + 1/2) drafts and emits one more.
HAND = [
    # prompt 3, 5 decoded, gamma 2, A 0.5: A gamma = 1 per step; groups of 3 decoded tokens: 3, 2
    (5, 2, "0.5", dict(step_kind=[0, 1, 1], step_tokens=[3, 3, 2], step_gamma=[0, 2, 2], step_accepted=[0, 1, 1],
                       step_emitted=[1, 2, 2])),
    # A 0.25: A gamma = 1/2; cumulative floor(0.5 + 0.5) = 1, floor(1.0 + 0.5) = 1 -> 1, 0
    (5, 2, "0.25", dict(step_kind=[0, 1, 1], step_tokens=[3, 3, 2], step_gamma=[0, 2, 2], step_accepted=[0, 1, 0],
                        step_emitted=[1, 2, 1])),
    # 8 decoded, A 0.8: A gamma = 8/5; cumulative round(1.6) = 2, round(3.2) = 3, round(4.8) = 5 -> 2, 1, 2
    (8, 2, "0.8", dict(step_kind=[0, 1, 1, 1], step_tokens=[3, 3, 3, 2], step_gamma=[0, 2, 2, 2],
                       step_accepted=[0, 2, 1, 2], step_emitted=[1, 3, 2, 3])),
    # gamma 0: one autoregressive step per decoded token
    (5, 0, None, dict(step_kind=[0, 2, 2, 2, 2, 2], step_tokens=[3, 1, 1, 1, 1, 1], step_gamma=[0] * 6,
                      step_accepted=[0] * 6, step_emitted=[1] * 6)),
]


@pytest.mark.parametrize("decoded, gamma, acceptance, expected", HAND)
def test_hand_computed_steps(tmp_path, decoded, gamma, acceptance, expected):
    pos = np.arange(3 + decoded)[:, None] + np.arange(2)[None, :]  # [tokens, 2 layers]
    ids = np.stack([pos % 4, (pos + 1) % 4], axis=2)  # top-2 of 4 experts, distinct per token and layer
    src = write_lines(tmp_path / "h.jsonl", plain_records({"only": (3, ids, None)}))
    extra = ["--acceptance", acceptance] if acceptance else []
    assert run_import([src, "--format", "jsonl", "--out", str(tmp_path / "t.npz"), "--num-experts", "4",
                       "--gamma", str(gamma), *extra]) == 0
    t = load_trace(tmp_path / "t.npz")
    assert {name: t.steps[name].tolist() for name in expected} == expected
    np.testing.assert_array_equal(t.topk_ids, ids)


def test_acceptance_is_taken_from_sglang_speculative_fields(tmp_path):
    rng = np.random.default_rng(3)
    resp = [sglang_response("a", routing(rng, 20, 2, 2, 8), 4, accept_rate=0.5, verify_ct=2),
            sglang_response("b", routing(rng, 30, 2, 2, 8), 4, accept_rate=1.0, verify_ct=6)]
    src = write_lines(tmp_path / "spec.jsonl", resp)
    out = tmp_path / "t.npz"
    assert run_import([src, "--format", "sglang", "--out", str(out), "--num-experts", "8", "--top-k", "2",
                       "--gamma", "3"]) == 0
    t = load_trace(out)
    assert t.meta["acceptance"] == (0.5 * 2 + 1.0 * 6) / 8  # weighted by verify forwards
    assert "spec_accept_rate" in t.meta["acceptance_source"]
    verify = t.steps["step_kind"] == 1
    for r in range(2):  # each request accepts round(n A gamma) drafts over its n verify steps
        n = int((verify & (t.steps["step_request"] == r)).sum())
        total = int(t.steps["step_accepted"][verify & (t.steps["step_request"] == r)].sum())
        assert total == int(n * Fraction("0.875") * 3 + Fraction(1, 2))


def test_no_acceptance_anywhere_is_refused(tmp_path, capsys):
    src = write_lines(tmp_path / "p.jsonl", plain_records({"r": (1, np.zeros((3, 1, 1), int), None)}))
    assert run_import([src, "--format", "jsonl", "--out", str(tmp_path / "t.npz"), "--num-experts", "2"]) == 2
    assert "give --acceptance" in capsys.readouterr().err


# -- malformed input -------------------------------------------------------------------------------------------
def _plain(t, prefill=True, layers=((0, 1), (2, 3)), request="r"):
    return json.dumps({"request": request, "token": t, "prefill": prefill, "layers": [list(x) for x in layers]})


def _sglang_line(**meta):
    base = sglang_response("s", np.zeros((4, 2, 2), int), 3)
    base["meta_info"].update(meta)
    return json.dumps(base)


GOOD = _sglang_line()
BAD = [  # (format, lines, line that is named, words the message holds)
    ("jsonl", [_plain(0), "{oops"], 2, "not JSON"),
    ("jsonl", [json.dumps({"request": "r", "token": 0, "prefill": True})], 1, "missing field 'layers'"),
    ("jsonl", [_plain(0), _plain(1, layers=((0, 1), (2,)))], 2, "ragged layers"),
    ("jsonl", [_plain(0), _plain(1, layers=((0, 1), (2, 8)))], 2, "expert id 8 outside [0, 8)"),
    ("jsonl", [_plain(0), _plain(1, layers=((0, 1, 2), (3, 4, 5)))], 2, "top-k 3 differs from line 1"),
    ("jsonl", [_plain(0), _plain(1), _plain(3)], 3, "token 3 out of order (expected 2)"),
    ("jsonl", [_plain(0), _plain(1, prefill=False), _plain(2)], 3, "prefill token 2 after a decoded token"),
    ("jsonl", [_plain(0), _plain(0, prefill=False, request="q")], 2, "request 'q' has no prefill tokens"),
    ("sglang", [GOOD, "[1, 2"], 2, "not JSON"),
    ("sglang", [GOOD, json.dumps({"text": "x"})], 2, "missing field 'meta_info'"),
    ("sglang", [GOOD, _sglang_line(routed_experts=None)], 2, "missing field 'meta_info.routed_experts'"),
    ("sglang", [_sglang_line(routed_experts="@@not base64@@")], 1, "not base64"),
    ("sglang", [GOOD, _sglang_line(completion_tokens=5)], 2, "not (prompt_tokens 3 + completion_tokens 5 - 1) rows"),
    ("sglang", [_sglang_line(prompt_tokens=0, routed_experts="")], 1, "request with no tokens"),
    ("sglang", [json.dumps(sglang_response("s", np.full((4, 2, 2), 9), 3))], 1, "expert id 9 outside [0, 8)"),
]


@pytest.mark.parametrize("fmt, lines, line, words", BAD, ids=[f"{b[0]}-{b[3][:24]}" for b in BAD])
def test_malformed_input_fails_in_one_line_naming_file_and_line(tmp_path, capsys, fmt, lines, line, words):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "t.npz"
    extra = ["--top-k", "2"] if fmt == "sglang" else []
    assert run_import([str(src), "--format", fmt, "--out", str(out), "--num-experts", "8", "--gamma", "0", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"moespac import-trace: error: {src}:{line}: "), err
    assert words in err
    assert not out.exists()


# -- replay through every policy -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Three SGLang requests of DeepSeek-V2-Lite's shape (27 decoder layers, 26 MoE, 64 experts, top-6)."""
    d = tmp_path_factory.mktemp("imported")
    rng = np.random.default_rng(4)
    resp = [sglang_response(f"r{i}", routing(rng, p + c - 1, 27, 6, 64), p)
            for i, (p, c) in enumerate([(6, 20), (3, 9), (5, 14)])]
    src = write_lines(d / "r.jsonl", resp)
    assert run_import([src, "--format", "sglang", "--out", str(d / "t.npz"), "--model-spec", "deepseek-v2-lite",
                       "--gamma", "4", "--acceptance", "0.7"]) == 0
    return str(d / "t.npz")


@pytest.mark.parametrize("name", sorted(policies()))
def test_imported_trace_replays_through_every_policy(imported, name):
    t = load_trace(imported)
    assert t.signals() == {"draft"}  # no cross-layer router predictions in served routing
    cfg = SimConfig(imported, name, "rtx4090-pcie4", cache_ratio=0.25, bounds=False)
    missing = [s for s in make_policy(name).requires if s in ENGINE_ONLY_SIGNALS]
    if missing:
        with pytest.raises(MoespacError, match=f"needs signal '{missing[0]}'"):
            simulate(cfg, t)
        return
    rec = simulate(cfg, t)
    c = rec["metrics"]["counters"]
    routed = sum(int((t.step_counts(s) > 0).sum()) for s in range(t.num_steps))
    assert c["hits"] + c["loads"] + c["host"] == routed > 0
    assert rec["metrics"]["tokens_per_s"] > 0


def test_some_policies_need_what_an_import_lacks():
    """The refusal branch above is exercised for each signal a serving stack's routing lacks."""
    for signal in ENGINE_ONLY_SIGNALS:
        assert any(signal in make_policy(n).requires for n in policies()), signal
