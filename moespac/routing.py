"""Routing statistics of activation counts, shared by the proxy statistics, the routing-statistics table and the
what-if: where a workload's routing sits (skew, step-to-step locality)."""

from __future__ import annotations

import math

import numpy as np


def top_share(counts: np.ndarray, share: float = 0.1) -> np.ndarray:
    """counts [L, E] -> per layer, the share of routing entries taken by its top ceil(share * E) experts
    (uniform routing gives ceil(share * E) / E); NaN for a layer with no entries."""
    counts = np.asarray(counts, dtype=np.float64)
    top = max(1, math.ceil(share * counts.shape[-1]))
    ranked = -np.sort(-counts, axis=-1)
    total = counts.sum(-1)
    return np.divide(ranked[:, :top].sum(-1), total, out=np.full(len(counts), np.nan), where=total > 0)


def locality(per_request: list[np.ndarray]) -> tuple[float, float]:
    """(reuse, active share) over consecutive decode steps of each request; counts [S, L, E] each."""
    inter, active, n = 0.0, 0.0, 0
    for c in per_request:
        a = c > 0
        if len(a) < 2:
            continue
        both = (a[1:] & a[:-1]).sum(-1)  # [S-1, L]
        now = a[1:].sum(-1)
        inter += float((both / np.maximum(now, 1)).sum())
        active += float(now.sum() / a.shape[-1])
        n += both.size
    return (inter / n, active / n) if n else (float("nan"), float("nan"))


def decode_counts(trace) -> list[np.ndarray]:
    """Per request, activation counts [S, L, E] of its decode (verify / AR) steps, in order."""
    req = trace.steps["step_request"]
    out: dict[int, list] = {}
    for s in range(trace.num_steps):
        if trace.kind(s) != "prefill":
            out.setdefault(int(req[s]), []).append(trace.step_counts(s))
    return [np.stack(v) for _, v in sorted(out.items())]
