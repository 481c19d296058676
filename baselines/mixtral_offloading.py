"""Mixtral-Offloading: each layer is its own LRU cache of a fixed number of slots; a miss is loaded on
demand and replaces the layer's least recently used expert.

Source: dvmazur/mixtral-offloading (src/build_model.py and src/expert_cache.py, commit 0d639be298; the spec
read ce545188b8): every layer is an eviction group with `N - offload_per_layer` GPU slots; experts with
index < offload_per_layer start offloaded, so the highest-numbered ones start resident; a hit moves the
expert to the MRU end; a miss swaps it with the group's LRU through staging buffers. No CPU compute, no
prefetch (speculative loading is listed as upcoming in the README). Tech report arXiv 2312.17238.
MoE-SpAc Table 1 row "Mixtral Offload".

Slots per layer: `slots_per_layer`, else capacity // L (at most the run's per_layer_capacity). In a shared
pool (no per_layer_capacity) a layer may borrow free slots; when it is at its budget it evicts its own LRU
expert, otherwise the layer furthest over budget gives one back (baselines/_common.budget_layer).
Deviation: when every resident expert of a layer is in use by the current forward (a verification batch
touching more experts than the layer has slots), the extra experts run on the host: the engine freezes
in-use experts, where Mixtral-Offloading would cycle them through its buffers one at a time.
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
