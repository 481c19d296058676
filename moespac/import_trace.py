"""Turn per-token expert routing that a serving stack hands out into a moespac activation trace.

Formats (`--format`): `sglang`, SGLang responses carrying `meta_info.routed_experts` (a server launched with
`--enable-return-routed-experts`); `jsonl`, ours, one JSON object per (request, token) for a vLLM or HF forward
hook. A request's prompt tokens become one prefill step and its decoded tokens verify steps of gamma + 1 tokens
(one-token AR steps at gamma 0), whose acceptances are modelled from the acceptance A.

Formats, sources and the step rule: docs/internals.md#moespacimport_tracepy.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from moespac.errors import MoespacError, check_unit_interval
from moespac.hashing import stable_hash
from moespac.models.specs import ModelSpec
from moespac.policy import Topology
from moespac.trace import _STEP_ARRAYS, KINDS, SCHEMA_VERSION, Trace

FORMATS = {"sglang": "sglang-routed-experts", "jsonl": "jsonl"}
NOT_SEEN = ("the draft's rejected tokens are not in this trace: every row is a token the server decoded, grouped "
            "in order into verify steps; accepted and emitted counts follow the acceptance, not the server")


@dataclass
class Request:
    """One request's routing as read, before it becomes steps."""

    name: str
    prompt: int  # rows 0..prompt-1 are the prompt
    ids: np.ndarray  # int [tokens, L, k]
    weights: np.ndarray | None  # float [tokens, L, k]; None = not given
    accept_rate: float | None = None  # SGLang's spec_accept_rate and spec_verify_ct, when it drafted
    verify_ct: int = 0


def _json_lines(path: Path):
    """(line number, parsed JSON) of each non-blank line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise MoespacError(f"{path}:{n}: not UTF-8 text (byte {e.start})") from None
            if line.strip():
                try:
                    yield n, json.loads(line)
                except ValueError as e:
                    raise MoespacError(f"{path}:{n}: not JSON ({getattr(e, 'msg', e)})") from None
                except RecursionError:
                    raise MoespacError(f"{path}:{n}: JSON nested too deeply to be a routing record") from None


MAX_EXPERTS = np.iinfo(np.int16).max  # traces store expert ids as int16


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_sglang(path: Path, num_experts: int, num_layers: int | None, top_k: int) -> list[Request]:
    """SGLang responses -> requests. num_layers None: the rows' width / top_k (no spec to say it)."""
    out = []
    for n, obj in _json_lines(path):
        batch = obj if isinstance(obj, list) else [obj]
        for i, resp in enumerate(batch):
            where = f"{path}:{n}" + (f": response {i}" if isinstance(obj, list) else "")
            out.append(_sglang_request(resp, where, num_experts, num_layers, top_k))
            num_layers = out[0].ids.shape[1]  # the first response fixes the layers of the rest
    if not out:
        raise MoespacError(f"{path}: holds no responses")
    return out


def _sglang_request(resp, where: str, num_experts: int, num_layers: int | None, top_k: int) -> Request:
    if not isinstance(resp, dict):
        raise MoespacError(f"{where}: not a JSON object (an SGLang response)")
    if "meta_info" in resp:
        meta = resp["meta_info"]
    elif "sglext" in resp:  # OpenAI-compatible endpoints: the string in sglext, the counts in usage
        meta = dict(resp.get("usage") or {}, routed_experts=(resp["sglext"] or {}).get("routed_experts"),
                    id=resp.get("id"))
    else:
        raise MoespacError(f"{where}: missing field 'meta_info' (not an SGLang /generate response)")
    if not isinstance(meta, dict):
        raise MoespacError(f"{where}: meta_info is not a JSON object")
    for key in ("routed_experts", "prompt_tokens", "completion_tokens"):
        if meta.get(key) is None:
            hint = " (server needs --enable-return-routed-experts, the request return_routed_experts)" \
                if key == "routed_experts" else ""
            raise MoespacError(f"{where}: missing field 'meta_info.{key}'{hint}")
    prompt, done, text = meta["prompt_tokens"], meta["completion_tokens"], meta["routed_experts"]
    if not (_int(prompt) and _int(done) and prompt >= 0 and done >= 0):
        raise MoespacError(f"{where}: prompt_tokens / completion_tokens must be counts")
    if prompt == 0 or not text:
        raise MoespacError(f"{where}: request with no tokens (prompt_tokens {prompt}, routed_experts "
                           f"{'empty' if not text else 'given'})")
    if done == 0:
        raise MoespacError(f"{where}: completion_tokens 0: SGLang returns no routing for the last prompt token")
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) % 4:
        raise MoespacError(f"{where}: meta_info.routed_experts is not base64 of int32 values")
    flat = np.frombuffer(raw, dtype="<i4")
    rows = prompt + done - 1
    width = num_layers * top_k if num_layers else None
    if flat.size % rows or (width and flat.size != rows * width) or (flat.size // rows) % top_k:
        shape = f"{num_layers} layers x top-k {top_k}" if num_layers else f"layers x top-k {top_k}"
        raise MoespacError(f"{where}: routed_experts holds {flat.size} ids, not (prompt_tokens {prompt} + "
                           f"completion_tokens {done} - 1) rows x {shape} "
                           "(another model, or routed_experts_start_len > 0?)")
    ids = flat.reshape(rows, -1, top_k)
    _check_range(ids, num_experts, where)
    rate, verify_ct = meta.get("spec_accept_rate"), meta.get("spec_verify_ct")
    if rate is not None and not (isinstance(rate, (int, float)) and math.isfinite(rate) and 0 <= rate <= 1):
        raise MoespacError(f"{where}: meta_info.spec_accept_rate {rate!r} is not a share in [0, 1]")
    if verify_ct is not None and not (_int(verify_ct) and verify_ct >= 0):
        raise MoespacError(f"{where}: meta_info.spec_verify_ct {verify_ct!r} is not a count of verify forwards (>= 0)")
    return Request(str(meta.get("id") or where), prompt, ids, None,
                   float(rate) if isinstance(rate, (int, float)) and meta.get("spec_verify_ct") else None,
                   int(meta.get("spec_verify_ct") or 0))


def _check_range(ids: np.ndarray, num_experts: int, where: str) -> None:
    """ids int [tokens, L, k] (one token: [L, k]) lie in [0, num_experts)."""
    bad = (ids < 0) | (ids >= num_experts)
    if bad.any():
        at = np.argwhere(bad)[0]
        token = f"token {at[0]}, " if ids.ndim == 3 else ""
        raise MoespacError(f"{where}: expert id {int(ids[tuple(at)])} outside [0, {num_experts}) "
                           f"({token}layer {at[-2]})")


def _grid(value, name: str, where: str, is_number) -> list:
    """A [layers][k] list of numbers, or one line naming what is wrong with it."""
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        raise MoespacError(f"{where}: {name} must be a non-empty list of per-layer lists")
    widths = sorted({len(r) for r in value})
    if len(widths) > 1:
        raise MoespacError(f"{where}: ragged {name}: its layers hold {widths} entries")
    if widths[0] == 0 or not all(is_number(x) for r in value for x in r):
        raise MoespacError(f"{where}: {name} must hold {'integers' if name == 'layers' else 'numbers'}")
    if name == "layers" and (big := next((x for r in value for x in r if abs(x) > MAX_EXPERTS), None)) is not None:
        raise MoespacError(f"{where}: expert id {big} is larger than any model's ({MAX_EXPERTS} at most)")
    return value


def read_jsonl(path: Path, num_experts: int) -> list[Request]:
    """Our plain format (module docstring) -> requests, in order of first appearance."""
    reqs: dict = {}  # request -> dict(line, prompt, ids, weights)
    first = None  # (line, layers, k, has weights) of the file's first record
    for n, obj in _json_lines(path):
        where = f"{path}:{n}"
        if not isinstance(obj, dict):
            raise MoespacError(f"{where}: not a JSON object")
        for key in ("request", "token", "prefill", "layers"):
            if key not in obj:
                raise MoespacError(f"{where}: missing field {key!r}")
        name, pos, prefill = obj["request"], obj["token"], obj["prefill"]
        if not (isinstance(name, str) or _int(name)) or not (_int(pos) and pos >= 0) or not isinstance(prefill, bool):
            raise MoespacError(f"{where}: request must be a string or integer, token a position >= 0, prefill a bool")
        ids = np.asarray(_grid(obj["layers"], "layers", where, _int), dtype=np.int64)
        w = obj.get("weights")
        if w is not None:
            finite = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            w = np.asarray(_grid(w, "weights", where, finite), dtype=np.float32)
            if w.shape != ids.shape:
                raise MoespacError(f"{where}: weights {list(w.shape)} do not match layers {list(ids.shape)}")
        L, k = ids.shape
        if first is None:
            first = (n, L, k, w is not None)
        elif (L, k) != first[1:3]:
            what = f"top-k {k} differs from" if L == first[1] else f"{L} layers differ from"
            raise MoespacError(f"{where}: {what} line {first[0]}'s ({first[1]} layers x top-k {first[2]})")
        elif (w is not None) != first[3]:
            raise MoespacError(f"{where}: weights {'given' if w is not None else 'absent'}, but "
                               f"{'absent' if w is not None else 'given'} on line {first[0]} (all lines or none)")
        _check_range(ids, num_experts, where)
        r = reqs.setdefault(name, dict(line=n, prompt=0, ids=[], weights=[]))
        if pos != len(r["ids"]):
            raise MoespacError(f"{where}: request {name!r}: token {pos} out of order (expected {len(r['ids'])})")
        if prefill and r["prompt"] != pos:
            raise MoespacError(f"{where}: request {name!r}: prefill token {pos} after a decoded token")
        r["prompt"] += prefill
        r["ids"].append(ids)
        r["weights"].append(w)
    if not reqs:
        raise MoespacError(f"{path}: holds no records")
    out = []
    for name, r in reqs.items():
        if r["prompt"] == 0:
            raise MoespacError(f"{path}:{r['line']}: request {name!r} has no prefill tokens (a request starts "
                               f"with its prompt)")
        out.append(Request(str(name), r["prompt"], np.stack(r["ids"]),
                           np.stack(r["weights"]) if first[3] else None))
    return out


def step_rows(prompt: int, decoded: int, gamma: int, acceptance: float | None) -> list[tuple]:
    """(kind, tokens, gamma, accepted, emitted) of one request's steps (the rule of the module docstring)."""
    rows = [("prefill", prompt, 0, 0, 1)]
    if gamma == 0:
        return rows + [("ar", 1, 0, 0, 1)] * decoded
    per_step = Fraction(str(acceptance)) * gamma  # the decimal as written: 0.8 is 4/5, not 0.8000000000000000444
    done = 0
    for j, start in enumerate(range(0, decoded, gamma + 1)):
        total = math.floor((j + 1) * per_step + Fraction(1, 2))
        rows.append(("verify", min(gamma + 1, decoded - start), gamma, total - done, total - done + 1))
        done = total
    return rows


def _acceptance(requests: list[Request], given: float | None, gamma: int, path: Path) -> tuple[float | None, str]:
    """(acceptance, where it came from)."""
    if gamma == 0:
        return None, "none (gamma 0: autoregressive steps)"
    if given is not None:
        check_unit_interval("--acceptance", given)
        return given, "given"
    rated = [r for r in requests if r.accept_rate is not None]
    if not rated:
        raise MoespacError(f"{path}: no acceptance in the data (no spec_accept_rate: the server did not draft); "
                           f"give --acceptance")
    if len(rated) < len(requests):
        missing = next(r.name for r in requests if r.accept_rate is None)
        raise MoespacError(f"{path}: request {missing} has no spec_accept_rate while others do; give --acceptance")
    verifies = sum(r.verify_ct for r in rated)
    a = sum(r.accept_rate * r.verify_ct for r in rated) / verifies
    return round(a, 6), (f"trace: SGLang meta_info spec_accept_rate of {len(rated)} requests, weighted by "
                         f"spec_verify_ct (the server's own draft length, which --gamma may not match)")


def _moe_layers(requests: list[Request], spec: ModelSpec | None, path: Path) -> int:
    """Drop a spec's leading dense layers when the data has a row slot for every decoder layer (SGLang does);
    returns how many were dropped."""
    L = requests[0].ids.shape[1]
    if spec is None or L == spec.num_moe_layers:
        return 0
    if L != spec.num_layers:
        raise MoespacError(f"{path}: {L} layers in the data, but model spec {spec.name!r} has {spec.num_layers} "
                           f"layers, {spec.num_moe_layers} of them MoE")
    dense = spec.num_layers - spec.num_moe_layers  # the registry's dense layers lead (first_k_dense_replace)
    for r in requests:
        r.ids = r.ids[:, dense:]
        r.weights = None if r.weights is None else r.weights[:, dense:]
    return dense


def import_trace(path: str | Path, fmt: str, gamma: int = 8, acceptance: float | None = None,
                 spec: ModelSpec | None = None, num_experts: int | None = None,
                 top_k: int | None = None, limit: int | None = None, max_new_tokens: int | None = None,
                 benchmark: str | None = None, model: str | None = None) -> tuple[Trace, dict]:
    """Read `path` in `fmt` and build the trace; returns (trace, a small summary for the record).

    limit: the file's first `limit` requests; max_new_tokens: each request's first tokens only (a longer one
    is cut, a shorter one kept whole). benchmark: the prompts' benchmark; with it the trace also carries the
    per-request facts `moespac bench --timing simulated` replays from (as a trace the engine recorded does),
    naming `model` (default: the spec's name) as the model that routed."""
    path = Path(path)
    if gamma < 0:
        raise MoespacError(f"--gamma {gamma} must be >= 0")
    for name, value in (("--limit", limit), ("--max-new-tokens", max_new_tokens)):
        if value is not None and value < 1:
            raise MoespacError(f"{name} {value} must be >= 1")
    requests, E = _read(path, fmt, spec, num_experts, top_k)
    requests = requests[:limit]
    if max_new_tokens is not None:  # a request's rows are its prompt and its new tokens but the last
        requests = [dataclasses.replace(q, ids=q.ids[:q.prompt + max_new_tokens - 1],
                                        weights=(None if q.weights is None
                                                 else q.weights[:q.prompt + max_new_tokens - 1]))
                    for q in requests]
    dropped = _moe_layers(requests, spec, path)
    A, source = _acceptance(requests, acceptance, gamma, path)
    k = requests[0].ids.shape[2]

    rows = [(r, *row) for r, q in enumerate(requests) for row in step_rows(q.prompt, len(q.ids) - q.prompt, gamma, A)]
    names = ("step_request", "step_kind", "step_tokens", "step_gamma", "step_accepted", "step_emitted")
    cols = dict(zip(names, map(list, zip(*rows))))
    cols["step_kind"] = [KINDS.index(kind) for kind in cols["step_kind"]]
    steps = {name: np.asarray(cols[name], dtype=dtype) for name, dtype in _STEP_ARRAYS.items()}
    ids = np.concatenate([r.ids for r in requests])
    given = requests[0].weights is not None
    weights = np.concatenate([r.weights for r in requests]) if given else np.full(ids.shape, 1.0 / k)
    topology = Topology(ids.shape[1], E, k)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    weights_note = "given" if given else \
        f"uniform 1/k: {'SGLang returns no router weights' if fmt == 'sglang' else 'the file gives none'}"
    structure = NOT_SEEN if gamma else "every decoded token is one autoregressive step"
    cut = {k: v for k, v in dict(limit=limit, max_new_tokens=max_new_tokens).items() if v is not None}
    # one file gives other traces at another gamma, acceptance or cut: their ids differ
    variant = stable_hash(dict(gamma=gamma, acceptance=A, **cut), 8)
    meta = dict(schema_version=SCHEMA_VERSION, trace_id=f"import-{fmt}-{sha[:12]}-{variant}", imported=True,
                source=FORMATS[fmt], source_file=path.name, source_sha256=sha, batch_size=1, gamma=gamma,
                acceptance=A, acceptance_source=source, weights=weights_note, structure=structure,
                dense_layers_dropped=dropped, requests=len(requests), topology=topology.__dict__,
                model_spec=spec.to_dict() if spec else None)
    meta.update(cut)
    trace = Trace(meta=meta, steps=steps, topk_ids=ids.astype(np.int16), topk_weights=weights.astype(np.float16))
    if benchmark is not None:
        _add_bench_facts(trace, requests, benchmark, model or (spec.name if spec else None), fmt, max_new_tokens)
    trace.validate(f"import {path}")
    verify = steps["step_kind"] == KINDS.index("verify")
    summary = dict(
        source=FORMATS[fmt], file=str(path), sha256=sha, trace_id=meta["trace_id"], requests=[r.name for r in requests],
        prompt_tokens=sum(r.prompt for r in requests), decoded_tokens=sum(len(r.ids) - r.prompt for r in requests),
        steps={kind: int((steps["step_kind"] == i).sum()) for i, kind in enumerate(KINDS)}, gamma=gamma,
        acceptance=A, acceptance_source=source, realized_acceptance=(
            float(steps["step_accepted"][verify].sum() / (gamma * verify.sum())) if verify.any() else None),
        weights=weights_note, structure=structure, topology=topology.__dict__, dense_layers_dropped=dropped,
        model_spec=spec.name if spec else None, **cut,
        benchmark=benchmark and trace.meta["bench"]["config"]["benchmark"], model=trace.meta.get("target"))
    return trace, summary


def _add_bench_facts(trace: Trace, requests: list[Request], benchmark: str, model: str | None, fmt: str,
                     max_new_tokens: int | None) -> None:
    """What `moespac bench` keeps of each request of a trace it records (meta['bench']), from the steps: tokens,
    steps, drafts, acceptances. One call per request, batch 1; nothing was sampled here."""
    from moespac.datasets import get_benchmark

    if not model:
        raise MoespacError("an imported trace for a benchmark needs the model that routed (--model or --model-spec)")
    st = trace.steps
    rows = []
    for r, q in enumerate(requests):
        mine = st["step_request"] == r
        decode = mine & (st["step_kind"] != KINDS.index("prefill"))
        drafted = int(st["step_gamma"][decode].sum())
        accepted = int(st["step_accepted"][decode].sum())
        rows.append(dict(id=q.name, prompt_id=q.name, turn=1, call=r, prompt_tokens=q.prompt,
                         new_tokens=int(st["step_emitted"][mine].sum()), steps=int(decode.sum()), drafted=drafted,
                         accepted=accepted, rejected=drafted - accepted, eos=False))
    gamma = int(trace.meta["gamma"])
    config = dict(benchmark=get_benchmark(benchmark).name, source="imported", limit=len(requests),
                  seed=None, turns=None, target_id=model, draft_id=None, gamma=gamma, batch_size=1,
                  max_new_tokens=max_new_tokens, ignore_eos=None, temperature=None, dtype=None,
                  imported=dict(format=FORMATS[fmt], trace_id=trace.meta["trace_id"], file=trace.meta["source_file"],
                                sha256=trace.meta["source_sha256"]))
    trace.meta.update(target=model, draft=None, bench=dict(config=config, prompts=len(requests), rows=rows, skipped=[],
                                                           proxy=[False] * len(requests)))


def _read(path: Path, fmt: str, spec: ModelSpec | None, num_experts: int | None,
          top_k: int | None) -> tuple[list[Request], int]:
    """(requests, experts per layer), the options checked against each other and the data."""
    if fmt not in FORMATS:
        raise MoespacError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise MoespacError(f"{path}: no such file")
    if (spec is None) == (num_experts is None):
        raise MoespacError("give the expert count: --model-spec NAME or --num-experts E (one of them)")
    if spec is not None and not spec.is_moe:
        raise MoespacError(f"model spec {spec.name!r} is dense: no experts to import")
    if top_k is not None and (spec is not None or fmt != "sglang"):
        raise MoespacError("--top-k is for --format sglang without --model-spec "
                           "(otherwise the spec or the data says it)")
    E = spec.num_experts if spec else num_experts
    if not 1 <= E <= MAX_EXPERTS:
        raise MoespacError(f"--num-experts {E} must be in [1, {MAX_EXPERTS}] (a trace stores expert ids as int16)")
    if fmt == "jsonl":
        requests = read_jsonl(path, E)
    else:
        k = spec.top_k if spec else top_k
        if not k or k < 1:
            raise MoespacError("--format sglang needs --model-spec or --top-k: SGLang's flat array does not say "
                               "where one layer's experts end")
        requests = read_sglang(path, E, spec.num_layers if spec else None, k)
    if spec is not None and requests[0].ids.shape[2] != spec.top_k:
        raise MoespacError(f"{path}: top-k {requests[0].ids.shape[2]} in the data, but model spec {spec.name!r} "
                           f"routes {spec.top_k}")
    return requests, E
