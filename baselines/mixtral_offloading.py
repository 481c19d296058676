"""Mixtral-Offloading: each layer is its own LRU cache of a fixed number of slots; a miss is loaded on
demand and replaces the layer's least recently used expert.

Slots per layer: `slots_per_layer`, else capacity // L; in a shared pool a layer may borrow free slots
(baselines/_common.budget_layer). MoE-SpAc Table 1 row "Mixtral Offload".

Provenance and upstream details: docs/baselines.md#mixtral-offloading.
"""

from __future__ import annotations

import numpy as np

from baselines._common import budget_layer, uniform_budgets
from baselines.lru import LRU
from moespac.errors import MoespacError
from moespac.policy import PolicyContext


class MixtralOffloading(LRU):
    name = "mixtral-offloading"
    lossless = True
    needs_draft = False
    requires = ()
    source = "dvmazur/mixtral-offloading src/build_model.py, src/expert_cache.py (0d639be298); arXiv 2312.17238"

    def __init__(self, slots_per_layer: int | None = None):
        if slots_per_layer is not None and slots_per_layer < 0:
            raise MoespacError(f"policy {self.name!r}: slots_per_layer must be >= 0, got {slots_per_layer}")
        self.slots_per_layer = slots_per_layer
        """GPU slots per layer (Mixtral-Offloading: num_experts - offload_per_layer)."""

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        self.budgets = uniform_budgets(ctx, self.slots_per_layer)
        self.layer = 0
        placement = np.zeros((L, E), dtype=bool)
        for layer, b in enumerate(self.budgets):  # the highest-numbered experts start resident
            placement[layer, E - b:] = True
        return placement

    def plan_layer(self, layer, counts, cache):
        self.layer = layer
        return super().plan_layer(layer, counts, cache)

    def victim(self, candidates, cache):
        layer = budget_layer(candidates, cache, self.budgets, self.layer)
        if layer is None:
            return None
        only = np.zeros_like(candidates)
        only[layer] = candidates[layer]
        return super().victim(only, cache)

    def describe(self) -> dict:
        return {"slots_per_layer": int(self.budgets[0])}
