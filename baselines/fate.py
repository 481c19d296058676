"""Fate: after layer l, layer l+1's experts are predicted by applying layer l+1's gate to layer l's gate
input and prefetched as INT4 copies; the device caches INT4 experts, the first layers whole and the rest split
evenly, with ARC replacement in each layer.

Lossy in the MoE-SpAc Table 1 row "Fate" (`lossy_transfer=True`: INT4 copies and slots); every use of a cached
expert also restores its INT4 copy. Stand-in: the prefetch budget comes from the unit costs, not from timing
each layer.

Provenance and upstream details: docs/baselines.md#fate.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from baselines._common import INT4_SCALE, budget_layer, layer_cap, missing, ranked_prediction
from moespac.policy import LayerPlan, Policy, PolicyContext, Prefetch, StepInfo


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


WHOLE_LAYERS = 4
"""Layers `memory_cost_qwen` caches whole when the budget allows."""


def upstream_budgets(slots: int, num_layers: int, num_experts: int, cap: int) -> np.ndarray:
    """Fate's per-layer slots: the first four layers whole, the rest split evenly (fewer slots: whole layers in
    order, then the remainder)."""
    L, E = num_layers, num_experts
    out = np.zeros(L, dtype=np.int64)
    whole = min(slots // E, L)
    if whole < WHOLE_LAYERS:
        out[:whole] = E
        if whole < L:
            out[whole] = slots - whole * E
    else:
        out[:WHOLE_LAYERS] = E
        if L > WHOLE_LAYERS:
            out[WHOLE_LAYERS:] = (slots - WHOLE_LAYERS * E) // (L - WHOLE_LAYERS)
    return np.minimum(out, cap)


class Fate(Policy):
    name = "fate"
    lossless = False
    needs_draft = False
    requires = ("cross_layer_topk",)
    source = ("FFFzy/Fate_open @f7c0eebc96 (utils/memory_cost.py, expert_ARC_cache.py, modeling_qwen_moe.py, "
              "utils/prefetch_k.py); arXiv 2502.12224; MoE-SpAc Table 1")
    stand_in = "no INT2 copies; the prefetch budget from the unit costs, not measured per layer"

    variants = {"lossy_transfer=false": "full-precision copies and slots (exact output; the same memory caches "
                                        "4.5/16 as many experts)"}

    def __init__(self, lossy_transfer: bool = True):
        self.lossy_transfer = bool(lossy_transfer)
        """Copy and cache INT4 experts (Fate's format); False = full precision (exact output)."""
        self.lossless = not self.lossy_transfer
        self.transfer_scale = INT4_SCALE if self.lossy_transfer else 1.0
        """Bytes per copy (and per cached expert) relative to a full-precision expert."""

    def device_slots(self, topology, capacity):
        return min(topology.num_layers * topology.num_experts, int(capacity / self.transfer_scale))

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        # a layer upstream caches nothing of streams its experts through a transient buffer: top_k slots here
        placed = upstream_budgets(ctx.capacity, L, E, layer_cap(ctx))
        self.budgets = np.maximum(placed, min(ctx.topology.top_k, layer_cap(ctx)))
        self.arc = [ARC(b, E) for b in self.budgets]
        self.step = None
        self.layer = 0
        placement = np.arange(E)[None, :] < placed[:, None]
        for layer in range(L):
            self.arc[layer].sync(placement[layer])
        return placement

    def prefetch_k(self, step) -> int:
        """Decode: copies that fit in one layer's time (upstream's get_prefetch_k); prefill: every prediction."""
        if step is None or step.kind == "prefill":
            return self.ctx.topology.num_experts
        c = self.ctx.costs
        copy = c.t_io * self.transfer_scale
        layer = c.t_layer + self.ctx.topology.top_k * c.t_gpu
        return self.ctx.topology.num_experts if copy <= 0 else int(layer / copy * (1 + 1e-9))

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
        restore = []
        if self.lossy_transfer and layer > 0:  # post_comp: each used expert that stays cached is copied again
            used = np.flatnonzero((counts > 0) & cache.resident[layer])
            restore = [Prefetch(layer, int(e), 0.0, restore=True) for e in used]
        if layer + 1 >= self.ctx.topology.num_layers:
            return restore
        order, _ = ranked_prediction(self.step, layer, self.ctx.topology.num_experts, self.name)
        order = order[:self.prefetch_k(self.step)]  # upstream's top prefetch_k, then those not cached
        order = order[~cache.resident[layer + 1, order]]
        # one stream, first in first out: layer l + 1's prefetches were issued before layer l's experts ran
        return [Prefetch(layer + 1, e) for e in order.tolist()] + restore

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
        return {"slots_per_layer": self.budgets.tolist(), "transfer_scale": self.transfer_scale,
                "prefetch_k_decode": self.prefetch_k(StepInfo(0, "ar", 1))}
