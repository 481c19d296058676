"""Activation traces: what the engine saw, per target forward, for the scheduler, simulator and tables.

On disk: one `.npz` (compressed) with a JSON `meta` entry carrying `schema_version` and the model spec.
Per step s (a target forward: prefill, verify or AR), `step_tokens[s]` tokens were run; their routing
rows are the next `step_tokens[s]` rows of `topk_ids` / `topk_weights` ([N, L, k], N = sum of tokens).

A trace holds only what the run decided (routing, tokens, acceptances), never a clock reading: two runs of
the same models, prompts and seeds write byte-identical traces. The run's timings are in its record.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moespac.atomic import atomic_path
from moespac.errors import MoespacError
from moespac.hashing import stable_hash
from moespac.policy import Topology

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 also stored measured step times; they are ignored
KINDS = ("prefill", "verify", "ar")
OPTIONAL_ROWS = ("cross_topk", "self_draft_topk")  # per-row arrays a trace may lack, shaped like topk_ids

_STEP_ARRAYS = {  # name -> dtype; one entry per step
    "step_kind": np.int8,  # index into KINDS
    "step_request": np.int32,  # request (prompt) index
    "step_tokens": np.int32,  # tokens in this target forward
    "step_gamma": np.int16,  # drafted tokens per sequence (0 for prefill / AR)
    "step_accepted": np.int16,  # accepted drafts summed over the batch (0 for prefill / AR)
    "step_emitted": np.int32,  # new tokens this step produced
}


@dataclass
class Trace:
    """An activation trace in memory (see module docstring for the layout)."""

    meta: dict
    steps: dict[str, np.ndarray]
    topk_ids: np.ndarray  # int16 [N, L, k]
    topk_weights: np.ndarray  # float16 [N, L, k]
    cross_topk: np.ndarray | None = None  # int16 [N, L, k]; layer l+1's router on layer l's input; -1 at the last layer
    self_draft_topk: np.ndarray | None = None
    """int16 [N, L, k]: the routing of the target with INT4 experts over the drafted tokens (MoE-SpeQ's
    self-draft lookahead, moespac.engine.selfdraft); -1 on rows the self-draft never runs (prefill, AR, the
    last drafted token of each sequence)."""
    _offsets: np.ndarray | None = field(default=None, repr=False)
    _counts: np.ndarray | None = field(default=None, repr=False)

    @property
    def topology(self) -> Topology:
        t = self.meta["topology"]
        return Topology(t["num_layers"], t["num_experts"], t["top_k"])

    @property
    def num_steps(self) -> int:
        return len(self.steps["step_tokens"])

    def offsets(self) -> np.ndarray:
        if self._offsets is None:
            self._offsets = np.concatenate([[0], np.cumsum(self.steps["step_tokens"], dtype=np.int64)])
        return self._offsets

    def step_ids(self, s: int) -> np.ndarray:
        """Routing ids of step s: int [tokens, L, k]."""
        o = self.offsets()
        return self.topk_ids[o[s]:o[s + 1]]

    def step_cross(self, s: int) -> np.ndarray | None:
        return self._step_rows(self.cross_topk, s)

    def step_self_draft(self, s: int) -> np.ndarray | None:
        return self._step_rows(self.self_draft_topk, s)

    def _step_rows(self, rows: np.ndarray | None, s: int) -> np.ndarray | None:
        if rows is None:
            return None
        o = self.offsets()
        return rows[o[s]:o[s + 1]]

    def counts(self) -> np.ndarray:
        """Activation counts (routing entries naming each expert) of every step: int32 [S, L, E], computed once
        in one bincount and read-only."""
        if self._counts is None:
            topo = self.topology
            S, L, E = self.num_steps, topo.num_layers, topo.num_experts
            ids = self.topk_ids.astype(np.int64)  # [N, L, k]
            step_of_token = np.repeat(np.arange(S), self.steps["step_tokens"])
            flat = (step_of_token[:, None, None] * L + np.arange(L)[None, :, None]) * E + ids
            counts = np.bincount(flat.ravel(), minlength=S * L * E).reshape(S, L, E).astype(np.int32)
            counts.flags.writeable = False
            self._counts = counts
        return self._counts

    def step_counts(self, s: int) -> np.ndarray:
        """Activation counts of step s: int [L, E]."""
        return self.counts()[s].astype(np.int64)

    def kind(self, s: int) -> str:
        return KINDS[int(self.steps["step_kind"][s])]

    def signals(self) -> frozenset[str]:
        out = set()
        if (self.steps["step_gamma"] > 0).any():
            out.add("draft")
        if self.cross_topk is not None:
            out.add("cross_layer_topk")
        if self.self_draft_topk is not None:
            out.add("self_draft_topk")
        return frozenset(out)

    def trace_id(self) -> str:
        return self.meta.get("trace_id", "")

    # -- validation --------------------------------------------------------------------------------
    def validate(self, where: str = "trace") -> "Trace":
        m = self.meta
        if m.get("schema_version") not in READABLE_VERSIONS:
            raise MoespacError(f"{where}: schema_version {m.get('schema_version')!r}, this moespac reads "
                               f"{', '.join(map(str, READABLE_VERSIONS))}")
        for key in ("topology", "model_spec"):
            if key not in m:
                raise MoespacError(f"{where}: meta lacks {key!r}")
        topo = self.topology
        for name, dtype in _STEP_ARRAYS.items():
            if name not in self.steps:
                raise MoespacError(f"{where}: missing array {name!r}")
        S = len(self.steps["step_tokens"])
        for name in _STEP_ARRAYS:
            if len(self.steps[name]) != S:
                raise MoespacError(f"{where}: {name} has {len(self.steps[name])} entries, expected {S} steps")
        N = int(self.steps["step_tokens"].sum())
        shape = (N, topo.num_layers, topo.top_k)
        if self.topk_ids.shape != shape:
            raise MoespacError(f"{where}: topk_ids shape {self.topk_ids.shape}, expected {shape} (truncated?)")
        if self.topk_weights.shape != shape:
            raise MoespacError(f"{where}: topk_weights shape {self.topk_weights.shape}, expected {shape}")
        for name in OPTIONAL_ROWS:
            rows = getattr(self, name)
            if rows is not None and rows.shape != shape:
                raise MoespacError(f"{where}: {name} shape {rows.shape}, expected {shape}")
        if N and (self.topk_ids.min() < 0 or self.topk_ids.max() >= topo.num_experts):
            raise MoespacError(f"{where}: expert id outside [0, {topo.num_experts})")
        batch = int(m.get("batch_size", 1))
        if (self.steps["step_accepted"] > self.steps["step_gamma"].astype(np.int64) * batch).any():
            raise MoespacError(f"{where}: a step accepted more drafts than it drafted")
        if (self.steps["step_kind"] < 0).any() or (self.steps["step_kind"] >= len(KINDS)).any():
            raise MoespacError(f"{where}: unknown step kind")
        return self

    # -- io --------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        arrays = dict(self.steps)
        arrays["topk_ids"] = self.topk_ids.astype(np.int16)
        arrays["topk_weights"] = self.topk_weights.astype(np.float16)
        for name in OPTIONAL_ROWS:
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name).astype(np.int16)
        meta = dict(self.meta, schema_version=SCHEMA_VERSION)
        arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)


def bench_trace_id(tcfg: dict) -> str:
    """The id of a trace `moespac bench` records: traces of the same models, prompts and decoding settings share it."""
    return f"bench-{tcfg['benchmark']}-{stable_hash(tcfg)}"


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace; a truncated, corrupt or wrong-version file fails with a clear error."""
    path = Path(path)
    if not path.exists():
        raise MoespacError(f"trace {path}: no such file")
    if not path.is_file():
        raise MoespacError(f"trace {path}: is a folder; give a .npz trace file")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # numpy would call anything else "pickled data"
            raise MoespacError(f"trace {path}: not a trace (an .npz archive starts with a zip header)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as e:  # zlib: a flipped byte in a member
        raise MoespacError(f"trace {path}: unreadable or truncated ({type(e).__name__}: {e})") from None
    if "meta" not in data:
        raise MoespacError(f"trace {path}: no meta entry (not a moespac trace)")
    try:
        meta = json.loads(bytes(data.pop("meta")).decode())
    except ValueError:
        raise MoespacError(f"trace {path}: meta is not valid JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("topology", {}), dict):
        raise MoespacError(f"trace {path}: meta is not a mapping with a topology mapping (not a moespac trace)")
    missing = [k for k in list(_STEP_ARRAYS) + ["topk_ids", "topk_weights"] if k not in data]
    if missing:
        raise MoespacError(f"trace {path}: missing arrays {missing}")
    steps = {k: data[k].astype(_STEP_ARRAYS[k]) for k in _STEP_ARRAYS}
    return Trace(meta=meta, steps=steps, topk_ids=data["topk_ids"], topk_weights=data["topk_weights"],
                 cross_topk=data.get("cross_topk"),
                 self_draft_topk=data.get("self_draft_topk")).validate(f"trace {path}")


def _host(x) -> np.ndarray:
    """A numpy array of x (a torch tensor on any device, without importing torch here, or an array)."""
    return x.float().cpu().numpy() if hasattr(x, "cpu") and getattr(x, "is_floating_point", lambda: False)() \
        else (x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x))


class TraceRecorder:
    """Collects steps while the engine runs; `finish()` returns a validated Trace."""

    def __init__(self, topology: Topology, model_spec: dict, meta: dict | None = None, cross_layer: bool = True,
                 self_draft: bool = False):
        self.topology = topology
        self.meta = dict(meta or {}, topology=topology.__dict__, model_spec=model_spec)
        self.cross_layer = cross_layer
        self.self_draft = self_draft
        """Keep the self-draft lookahead routing of verify steps (the engine runs that pass when it is set)."""
        self.steps: dict[str, list] = {k: [] for k in _STEP_ARRAYS}
        self._ids: list[np.ndarray] = []
        self._w: list[np.ndarray] = []
        self._cross: list[np.ndarray] = []
        self._self_draft: list[np.ndarray] = []
        self._cur: dict | None = None

    def begin(self, kind: str, request: int, num_tokens: int, gamma: int = 0) -> None:
        L, k = self.topology.num_layers, self.topology.top_k
        self._cur = dict(kind=KINDS.index(kind), request=request, tokens=num_tokens, gamma=gamma,
                         ids=np.full((num_tokens, L, k), -1, np.int16), w=np.zeros((num_tokens, L, k), np.float16),
                         cross=np.full((num_tokens, L, k), -1, np.int16), pending=[],
                         self_draft=np.full((num_tokens, L, k), -1, np.int16))

    def lookahead(self, ids: np.ndarray) -> None:
        """This step's self-draft lookahead routing, int [L, num_tokens, k] (-1 where it has none)."""
        if self._cur is not None:
            self._cur["self_draft"][:] = np.asarray(ids).transpose(1, 0, 2)

    def layer(self, layer: int, ids: np.ndarray, weights, cross=None) -> None:
        """One layer's routing. weights / cross may be device tensors: they are read once, at end()."""
        c = self._cur
        if c is None:
            return
        c["ids"][:, layer] = ids
        c["pending"].append((layer, weights, cross))

    def end(self, accepted: int, emitted: int) -> None:
        c, self._cur = self._cur, None
        for layer, weights, cross in c.pop("pending"):
            c["w"][:, layer] = _host(weights)
            if cross is not None:
                c["cross"][:, layer] = _host(cross)
        if (c["ids"] < 0).any():
            raise MoespacError("trace recorder: a layer reported no routing for this step (hook not installed?)")
        for name, val in (("step_kind", c["kind"]), ("step_request", c["request"]), ("step_tokens", c["tokens"]),
                          ("step_gamma", c["gamma"]), ("step_accepted", accepted), ("step_emitted", emitted)):
            self.steps[name].append(val)
        self._ids.append(c["ids"])
        self._w.append(c["w"])
        self._cross.append(c["cross"])
        self._self_draft.append(c["self_draft"])

    def finish(self, **extra_meta) -> Trace:
        L, k = self.topology.num_layers, self.topology.top_k
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros((0, L, k), dt)  # noqa: E731
        steps = {n: np.asarray(v, dtype=_STEP_ARRAYS[n]) for n, v in self.steps.items()}
        meta = dict(self.meta, **extra_meta, schema_version=SCHEMA_VERSION)
        return Trace(meta=meta, steps=steps, topk_ids=cat(self._ids, np.int16), topk_weights=cat(self._w, np.float16),
                     cross_topk=cat(self._cross, np.int16) if self.cross_layer else None,
                     self_draft_topk=cat(self._self_draft, np.int16) if self.self_draft else None).validate()
