"""MoE-Infinity: match the request's expert activation matrix (EAM) against past requests' EAMs and
prefetch the best match's experts for every later layer; evict by lowest in-cache visit count (LFU).

Source: EfficientMoE/MoE-Infinity (moe_infinity/memory/expert_tracer.py @a41b5ce5f2, expert_predictor.py
@2648d8e01a, expert_prefetcher.py @01b56cd94c; the spec read d617801793), arXiv 2401.14361. MoE-SpAc
Table 1 row "MoE-Infinity".
- EAM: L x N counts of the request's routing entries. A bounded collection keeps past requests' EAMs
  (`trace_capacity`); a new EAM fills an empty entry, else replaces the least-accessed one; each match
  counts as an access. MoE-Infinity builds the collection offline from a dataset's requests before serving:
  here the driver's profiling run of other prompts (PolicyContext.history, never the replayed requests)
  seeds it once; without one the first request has nothing to match (plain LFU until a request ends).
- At every MoE layer l: rows are normalised and compared by cosine similarity per layer, averaged over
  layers, with every stored EAM (the spec's reading; the code at a41b5ce5f2 instead blanks the stored
  EAMs' rows <= l). The best match is taken, rows before the next layer are zeroed and row j is scaled by
  1 - (j - l)/(L + 1); its positive entries are prefetched in descending score order, and they replace
  the previous layer's candidates as the entries protected from eviction.
- Eviction: global, lowest in-cache visit count (baselines/lfu.py with in_cache=True), never a current
  candidate while another expert can go. All compute on the device; misses load on demand.

The Table 1 row is what the released decode path runs (EfficientMoE/MoE-Infinity main at
d6178017933c3d39f82be99f702d8a3e4ce98f8f: moe_infinity/models/mixtral.py and deepseek.py have their
`expert_predictor.predict` / `prefetch_experts` calls commented out, and the dev branch's Qwen3 block, the
only one for the paper's model, calls none; only arctic.py and grok.py prefetch): `prefetch='on-demand'`, every
miss fetched on demand (ExpertDispatcher::GPUFetchFunc) into the in-cache LFU. No released decode path
prefetches the next layer from the current layer's router logits. `prefetch='eam'` (a variant) is the
activation-matrix prefetch below, as the paper and the Arctic/Grok paths run it.

Adaptations: a request's EAM enters the collection when the next request starts (reset, or a new
StepInfo.signals['request'] id when a driver keeps the policy across requests). The code adds 1e-8 to
every entry of rows >= l, which would queue all L x N experts every layer; here only entries the match
actually used are queued, at most `capacity` of them and each (layer, expert) once per step (the real
task pool clears and re-fills its queue instead).
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
        if self.prefetch == "on-demand" or self.unit is None or layer + 1 >= L:  # nothing to match, or no later layer to prefetch
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
