"""MoE-Infinity: match the request's expert activation matrix (EAM) against past requests' EAMs and
prefetch the best match's experts for every later layer; evict by lowest in-cache visit count (LFU).

The MoE-SpAc Table 1 row "MoE-Infinity" is what the released decode path runs, `prefetch='on-demand'` (every
miss fetched on demand into the in-cache LFU); `prefetch='eam'` (a variant) is the activation-matrix prefetch.

Provenance and upstream details: docs/baselines.md#moe-infinity.
"""

from __future__ import annotations

import numpy as np

from baselines.lfu import LFU
from moespac.errors import MoespacError
from moespac.policy import Prefetch, PolicyContext


def unit_rows(m: np.ndarray) -> np.ndarray:
    """Rows (last axis) scaled to unit L2 norm; all-zero rows stay zero (cosine 0, as nan_to_num gives)."""
    norm = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.divide(m, norm, out=np.zeros_like(m, dtype=np.float64), where=norm > 0)


class MoEInfinity(LFU):
    name = "moe-infinity"
    lossless = True
    needs_draft = False
    requires = ()
    profiled = True
    source = ("EfficientMoE/MoE-Infinity memory/expert_{tracer,predictor,prefetcher}.py (a41b5ce5f2), models/"
              "mixtral.py, deepseek.py (d617801793); arXiv 2401.14361")
    variants = {"prefetch=eam": "the activation-matrix (EAM) match prefetches every later layer's experts (the "
                                "paper's design; released only for Arctic and Grok)"}

    def __init__(self, trace_capacity: int = 1000, prefetch: str = "on-demand"):
        super().__init__(in_cache=True)
        if prefetch not in ("on-demand", "eam"):
            raise MoespacError(f"policy {self.name!r}: prefetch {prefetch!r} is not one of on-demand, eam")
        self.prefetch = prefetch
        """'on-demand': fetches on demand only (the released Mixtral, DeepSeek and Qwen3 decode paths); 'eam': the
        activation-matrix match prefetches."""
        self.profiled = prefetch == "eam"
        if trace_capacity < 1:
            raise MoespacError(f"policy {self.name!r}: trace_capacity must be >= 1, got {trace_capacity}")
        self.trace_capacity = trace_capacity
        """Past requests' EAMs kept for matching (MoE-Infinity `trace_capacity`)."""
        self.collection: list[np.ndarray] = []
        self.access: list[int] = []
        self.eam = None
        self.seeded = None  # the history the collection was seeded from (seeded once, then it learns)

    def _store(self, eam: np.ndarray) -> None:
        if len(self.collection) < self.trace_capacity:
            self.collection.append(eam)
            self.access.append(1)
        else:
            i = int(np.argmin(self.access))
            self.collection[i], self.access[i] = eam, 1

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        shape = (ctx.topology.num_layers, ctx.topology.num_experts)
        if self.collection and self.collection[0].shape != shape:  # another model: start over
            self.collection, self.access = [], []
        if self.eam is not None and self.eam.shape != shape:
            self.eam = None
        if ctx.history is not None and self.seeded is not ctx.history:
            for eam in np.asarray(ctx.history, dtype=np.int64)[-self.trace_capacity:]:  # the offline collection
                self._store(eam)
            self.seeded = ctx.history
        self.protected = np.zeros(shape, dtype=bool)
        self.requested = np.zeros(shape, dtype=bool)
        self.request = None
        self.start_request()
        return placement

    def start_request(self) -> None:
        """File the finished request's EAM and start an empty one."""
        shape = self.protected.shape
        if self.eam is not None and self.eam.any():
            self._store(self.eam)
        self.eam = np.zeros(shape, dtype=np.int64)
        # the collection is fixed during a request: cosines are kept per (entry, layer) and updated one
        # layer at a time, since only row l of the request's EAM changes at layer l
        self.unit = unit_rows(np.stack(self.collection).astype(np.float64)) if self.collection else None
        self.cos = np.zeros((len(self.collection), shape[0]))
        self.ranked = {}  # (match, layer) -> (scores, prefetch order)

    def begin_step(self, step, cache):
        request = step.signals.get("request")  # a driver that keeps the policy across requests says so here
        if request is not None and self.request is not None and request != self.request:
            self.start_request()
        self.request = request
        self.requested[:] = False
        return []

    def plan_layer(self, layer, counts, cache):
        if self.prefetch == "on-demand":  # the released path matches nothing: no matrix to keep
            return super().plan_layer(layer, counts, cache)
        self.eam[layer] += counts
        if self.unit is not None:
            self.cos[:, layer] = self.unit[:, layer] @ unit_rows(self.eam[layer].astype(np.float64))
        return super().plan_layer(layer, counts, cache)

    def best_match(self) -> int:
        """Index of the stored EAM most similar to this request's (mean per-layer cosine); counts it as accessed."""
        i = int(np.argmax(self.cos.mean(axis=1)))
        self.access[i] += 1
        return i

    def end_layer(self, layer, counts, cache):
        L = self.ctx.topology.num_layers
        # nothing to match, or no later layer to prefetch
        if self.prefetch == "on-demand" or self.unit is None or layer + 1 >= L:
            return []
        i = self.best_match()
        if (i, layer) not in self.ranked:  # the collection is fixed during a request: rank each (match, layer) once
            decay = 1.0 - (np.arange(L) - layer) / (L + 1)
            score = np.where(np.arange(L)[:, None] > layer, self.collection[i] * decay[:, None], 0.0)
            flat = np.flatnonzero(score > 0)
            self.ranked[i, layer] = score, flat[np.argsort(-score.ravel()[flat], kind="stable")][:self.ctx.capacity]
        score, order = self.ranked[i, layer]
        self.protected[:] = False
        self.protected.ravel()[order] = True
        new = order[~cache.resident.ravel()[order] & ~self.requested.ravel()[order]]  # order is unique
        self.requested.ravel()[new] = True
        E = score.shape[1]
        return [Prefetch(f // E, f % E, p) for f, p in zip(new.tolist(), score.ravel()[new].tolist())]

    def victim(self, candidates, cache):
        free = candidates & ~self.protected
        return super().victim(free if free.any() else candidates, cache)

    def victim_keys(self, cache):
        order = super().victim_keys(cache)
        if not self.protected.any():
            return order
        # the protected ones after every other candidate, in their own order (LFU keys are >= 0)
        return order._replace(keys=order.keys + self.protected * (int(order.keys.max()) + 1))
