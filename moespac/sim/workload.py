"""What the simulator replays: a trace's routing as per-step activation counts, under a model spec.

A trace recorded on one model (say a small proxy) can be replayed with another model's expert sizes when
the expert topology matches (MoE layers, experts, top-k). A mismatch fails naming the keys, unless
`allow_topology_mismatch=True`: then layer l of the spec replays trace layer l mod L, and trace expert e
becomes expert e mod E' (experts that collide add their counts); the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moespac.errors import MoespacError
from moespac.models.specs import ModelSpec
from moespac.policy import Topology
from moespac.trace import Trace

_TOPOLOGY_KEYS = (("num_layers", "num_moe_layers"), ("num_experts", "num_experts"), ("top_k", "top_k"))


@dataclass
class Workload:
    """Per-step arrays of a trace, mapped onto the spec's expert topology."""

    trace: Trace
    spec: ModelSpec
    topology: Topology
    """Topology the policy sees (the spec's)."""
    counts: np.ndarray
    """int32 [S, L, E]: routing entries naming each expert per step and MoE layer."""
    mapping: str | None
    """None when the topologies match; otherwise how trace layers/experts were mapped."""
    trace_path: str = ""

    @property
    def steps(self) -> dict[str, np.ndarray]:
        return self.trace.steps

    @property
    def num_steps(self) -> int:
        return len(self.counts)

    def requests(self) -> list[np.ndarray]:
        """Step indices of each request, in order of first appearance (steps of a request are contiguous)."""
        req = self.steps["step_request"]
        if not len(req):
            return []
        starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
        bounds = np.r_[starts, len(req)]
        seen = req[starts]
        if len(np.unique(seen)) != len(seen):
            raise MoespacError(f"trace {self.trace.trace_id() or '?'}: the steps of a request are not contiguous")
        return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def step_cross(self, s: int) -> np.ndarray | None:
        """Cross-layer top-k of step s as the policy expects it: int [L, tokens, k] (-1 = undefined)."""
        return self._per_layer(self.trace.step_cross(s))

    def step_self_draft(self, s: int) -> np.ndarray | None:
        """Self-draft lookahead routing of step s as the policy expects it: int [L, tokens, k] (-1 = none)."""
        return self._per_layer(self.trace.step_self_draft(s))

    def _per_layer(self, rows: np.ndarray | None) -> np.ndarray | None:
        """Trace rows [tokens, L, k] of expert ids -> [L, tokens, k] on the spec's topology (mapped like the
        routing)."""
        if rows is None:
            return None
        rows = rows.transpose(1, 0, 2).astype(np.int64)
        if self.mapping:
            L, E = self.topology.num_layers, self.topology.num_experts
            rows = rows[np.arange(L) % rows.shape[0]]
            rows = np.where(rows >= 0, rows % E, -1)
        return rows


def topology_mismatch(trace: Trace, spec: ModelSpec) -> list[str]:
    """`trace key != spec key` for every expert-topology key that differs."""
    t = trace.topology
    out = []
    for tkey, skey in _TOPOLOGY_KEYS:
        if getattr(t, tkey) != getattr(spec, skey):
            out.append(f"trace {tkey}={getattr(t, tkey)} != spec {skey}={getattr(spec, skey)}")
    return out


def make_workload(trace: Trace, spec: ModelSpec, allow_topology_mismatch: bool = False,
                  trace_path: str = "") -> Workload:
    """Combine a trace with the spec whose expert sizes are simulated."""
    if not spec.is_moe:
        raise MoespacError(f"model spec {spec.name!r} is dense (num_moe_layers=0): nothing to schedule")
    counts = trace.counts()
    diff = topology_mismatch(trace, spec)
    mapping = None
    if diff:
        if not allow_topology_mismatch:
            raise MoespacError(f"trace {trace.trace_id() or trace_path or '?'} and model spec {spec.name!r} differ in "
                               f"topology: {'; '.join(diff)} (--allow-topology-mismatch maps them by modulo)")
        L, E = spec.num_moe_layers, spec.num_experts
        counts = counts[:, np.arange(L) % counts.shape[1]]
        folded = np.zeros(counts.shape[:2] + (E,), dtype=np.int32)
        np.add.at(folded, (slice(None), slice(None), np.arange(counts.shape[2]) % E), counts)
        counts = folded
        t = trace.topology
        mapping = (f"modulo: spec layer l replays trace layer l mod {t.num_layers}, trace expert e -> e mod {E} "
                   f"({'; '.join(diff)})")
    k = min(trace.topology.top_k, spec.num_experts)
    topology = Topology(spec.num_moe_layers, spec.num_experts, k)
    return Workload(trace=trace, spec=spec, topology=topology, counts=counts, mapping=mapping, trace_path=trace_path)
