"""Fate: after layer l, layer l+1's experts are predicted by applying layer l+1's gate to layer l's gate
input and prefetched; the cache gives shallow layers more slots and replaces by ARC in each layer.

Source: paper only (no public code), Fang et al., "Fate: Fast Edge Inference of Mixture-of-Experts Models
via Cross-Layer Gate", arXiv 2502.12224 (v2); MoE-SpAc Table 1 row "Fate".
- Predictor: signal 'cross_layer_topk' (StepInfo.signals, int [L, tokens, k]: layer l+1's router top-k
  on layer l's input, recorded by the engine). After layer l, every expert some token predicts for l+1 is
  prefetched, most-predicted first. Layer 0 is never predicted (misses load on demand, as do wrong
  predictions).
- Shallow-favouring cache: the paper favours shallow layers (where prediction is weakest) without a
  formula in our sources; inferred here: layer l's slot budget is proportional to
  1 + (shallow_bias - 1) * (L - 1 - l) / (L - 1) (layer 0 gets `shallow_bias` times the last layer's),
  apportioned by largest remainder, at most E (or the run's per_layer_capacity) per layer. A layer
  under budget may borrow free slots and gives them back first (baselines/_common.budget_layer).
- ARC (Megiddo & Modha) in each layer: T1 = residents referenced once since they entered, T2 = more
  than once, ghosts B1/B2 remember recent evictions and steer the target size p of T1. An expert enters
  T1 when it becomes resident (prefetched or loaded), or T2 if it was a ghost when last referenced;
  references are activations; the incoming expert (cache.requesting) decides REPLACE's tie
  "x in B2 and |T1| = p".
- Precision: Fate copies INT4/INT2 expert versions (low-popularity ones as INT2, mainly in prefill), so
  it is lossy. Default here is the lossless variant (full-precision copies). `lossy_transfer=True` marks
  the policy lossy and sets `transfer_scale` = 0.25 (INT4 bytes / BF16 bytes): the simulator charges
  each copy 0.25 of an expert's bytes and copy time; the engine copies experts as per-row symmetric INT4
  and dequantises them in the slot (moespac/engine/store.py), so device experts are lossy; host experts
  stay full precision. Not modelled: INT2 versions of unpopular experts.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from baselines._common import apportion, budget_layer, layer_cap, missing, next_layer_prediction
from moespac.errors import MoespacError
from moespac.policy import LayerPlan, Policy, PolicyContext, Prefetch


class ARC:
    """Adaptive Replacement Cache bookkeeping for one layer; residency itself lives in the ExpertCache."""

    def __init__(self, size: int, num_experts: int):
        self.c = max(int(size), 1)
        self.p = 0.0
        self.t1, self.t2, self.b1, self.b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
        self.member = np.zeros(num_experts, dtype=bool)  # in T1 or T2
        self.promote: dict[int, bool] = {}  # ghosts referenced again (value: it was in B2): enter T2 once resident

    def sync(self, resident: np.ndarray) -> None:
        """Take in experts that became resident since the last call; forget ones that left."""
        changed = np.flatnonzero(self.member != resident)
        if len(changed):  # usually nothing: sync runs at every layer and every eviction
            left = self.member[changed]
            for e in changed[left].tolist():
                self.t1.pop(e, None)
                self.t2.pop(e, None)
            for e in changed[~left].tolist():
                self.b1.pop(e, None)
                self.b2.pop(e, None)
                (self.t2 if self.promote.pop(e, None) is not None else self.t1)[e] = True
            self.member = resident.copy()
        while self.b1 and len(self.t1) + len(self.b1) > self.c:
            self.b1.popitem(last=False)
        while self.b2 and len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * self.c:
            self.b2.popitem(last=False)

    def reference(self, e: int) -> None:
        """An activation of expert e (call after sync)."""
        if e in self.t1:
            del self.t1[e]
            self.t2[e] = True
        elif e in self.t2:
            self.t2.move_to_end(e)
        elif e in self.b1:
            self.p = min(self.c, self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[e]
            self.promote[e] = False
        elif e in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[e]
            self.promote[e] = True

    def replace(self, evictable: np.ndarray, incoming: int | None = None) -> int | None:
        """ARC's REPLACE over the evictable residents: LRU of T1 if T1 exceeds p, else LRU of T2."""
        t1 = next((e for e in self.t1 if evictable[e]), None)
        t2 = next((e for e in self.t2 if evictable[e]), None)
        from_b2 = incoming is not None and (incoming in self.b2 or self.promote.get(incoming, False))
        if t1 is not None and (len(self.t1) > self.p or (from_b2 and len(self.t1) == self.p) or t2 is None):
            lst, ghost, e = self.t1, self.b1, t1
        elif t2 is not None:
            lst, ghost, e = self.t2, self.b2, t2
        else:
            return None
        del lst[e]
        ghost[e] = True
        self.member[e] = False
        return e


class Fate(Policy):
    name = "fate"
    lossless = True
    needs_draft = False
    requires = ("cross_layer_topk",)
    source = "Fang et al., Fate, arXiv 2502.12224 (no public code); MoE-SpAc Table 1"

    def __init__(self, shallow_bias: float = 2.0, lossy_transfer: bool = False):
        if shallow_bias < 1.0:
            raise MoespacError(f"policy {self.name!r}: shallow_bias must be >= 1, got {shallow_bias}")
        self.shallow_bias = shallow_bias
        """Slots of layer 0 relative to the last layer (inferred; the paper gives no formula)."""
        self.lossy_transfer = bool(lossy_transfer)
        """Copy INT4 versions of experts (Fate's lossy I/O): the engine round-trips them through INT4."""
        self.lossless = not self.lossy_transfer
        self.transfer_scale = 0.25 if self.lossy_transfer else 1.0
        """Bytes per copy relative to a full-precision expert."""

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        depth = np.arange(L) / max(L - 1, 1)
        self.budgets = apportion(1.0 + (self.shallow_bias - 1.0) * (1.0 - depth), ctx.capacity, layer_cap(ctx))
        self.arc = [ARC(b, E) for b in self.budgets]
        self.step = None
        self.layer = 0
        return placement

    def begin_step(self, step, cache):
        self.step = step
        return []

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.layer = layer
        arc = self.arc[layer]
        arc.sync(cache.resident[layer])
        for e in np.flatnonzero(counts):
            arc.reference(int(e))
        return LayerPlan(load=missing(layer, counts, cache))

    def end_layer(self, layer, counts, cache) -> list[Prefetch]:
        self.arc[layer].sync(cache.resident[layer])
        if layer + 1 >= self.ctx.topology.num_layers:
            return []
        predicted = next_layer_prediction(self.step, layer, self.ctx.topology.num_experts, self.name)
        order = np.argsort(-predicted, kind="stable")
        order = order[predicted[order] > 0]
        order = order[~cache.resident[layer + 1, order]]
        return [Prefetch(layer + 1, e, float(p)) for e, p in zip(order.tolist(), predicted[order].tolist())]

    def victim(self, candidates, cache):
        layer = budget_layer(candidates, cache, self.budgets, self.layer)
        if layer is None:
            return None
        arc = self.arc[layer]
        arc.sync(cache.resident[layer])
        req = getattr(cache, "requesting", None)
        e = arc.replace(candidates[layer], req[1] if req is not None and req[0] == layer else None)
        return None if e is None else (layer, e)

    def describe(self) -> dict:
        return {"slots_per_layer": self.budgets.tolist(), "transfer_scale": self.transfer_scale}
