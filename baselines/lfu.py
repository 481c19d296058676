"""Reference policy: load every miss on demand into a global cache, evict the least frequently used.

Not a published system; the frequency counterpart of baselines/lru.py. A use is one forward in which the
expert is activated (not one per token). Ties go to the least recently used, then the lower index.
`in_cache=True` counts only uses since the expert last entered the cache (a victim's count restarts at 0),
which is MoE-Infinity's "in-cache visit count"; the default counts every use in the request.
"""

from __future__ import annotations

import numpy as np

from baselines._common import missing
from baselines.lru import VictimOrder
from moespac.policy import LayerPlan, Policy, PolicyContext, VictimKeys


class LFU(Policy):
    name = "lfu"
    lossless = True
    source = "reference: least-frequently-used expert cache with on-demand loading"

    def __init__(self, in_cache: bool = False):
        self.in_cache = bool(in_cache)
        """Forget an expert's count when it is evicted (in-cache LFU) instead of keeping it for the request."""

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        shape = (ctx.topology.num_layers, ctx.topology.num_experts)
        self.uses = np.zeros(shape, dtype=np.int64)
        self.last_use = np.zeros(shape, dtype=np.int64)
        self.clock = 0  # advance it whenever uses or last_use change (VictimOrder's contract)
        self.victims = VictimOrder()
        return placement

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.clock += 1
        active = np.flatnonzero(counts)
        self.uses[layer, active] += 1
        self.last_use[layer, active] = self.clock
        return LayerPlan(load=missing(layer, counts, cache))

    def _keys(self):
        # one integer orders by uses, then last use (< clock + 1); ties go to the lowest index
        return self.uses * (self.clock + 1) + self.last_use

    def victim(self, candidates, cache):
        eid = self.victims.pick(candidates, self.clock, self._keys)
        if eid is None:
            return None
        key = divmod(eid, self.uses.shape[1])
        if self.in_cache:
            self.uses[key] = 0  # the victim leaves the candidates: the order of the rest stands
        return key

    def victim_keys(self, cache):
        return VictimKeys(self._keys())

    def victims_taken(self, flat):
        if self.in_cache:
            self.uses.ravel()[flat] = 0  # as victim() does for each
