"""Reference policy: load every miss on demand into a global cache, evict the least recently used.

Not a published system; the classic baseline that cache-based offloaders (Mixtral-Offloading per
layer, SP-MoE globally) refine. Nothing is computed on the host while a slot can be found.
"""

from __future__ import annotations

import numpy as np

from moespac.policy import LayerPlan, Policy, PolicyContext


_NEVER = np.iinfo(np.int64).max  # marks non-candidates in the argmin


class LRU(Policy):
    name = "lru"
    lossless = True
    source = "reference: least-recently-used expert cache with on-demand loading"

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        self.last_use = np.zeros((L, E), dtype=np.int64)
        self.clock = 0
        return placement

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.clock += 1
        active = np.flatnonzero(counts)
        self.last_use[layer, active] = self.clock
        missing = active[~cache.resident[layer, active]]
        return LayerPlan(load=missing)

    def victim(self, candidates, cache):
        age = np.where(candidates, self.last_use, _NEVER)
        flat = int(np.argmin(age))
        return divmod(flat, age.shape[1]) if age.flat[flat] != _NEVER else None
