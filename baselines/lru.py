"""Reference policy: load every miss on demand into a global cache, evict the least recently used.

Not a published system; the classic baseline that cache-based offloaders (Mixtral-Offloading per
layer, SP-MoE globally) refine. Nothing is computed on the host while a slot can be found.
"""

from __future__ import annotations

import numpy as np

from moespac.policy import LayerPlan, Policy, PolicyContext, VictimKeys


_NEVER = np.iinfo(np.int64).max  # marks non-candidates in the argmin


class VictimOrder:
    """The lowest-key candidate, cheaply for the successive victims of one batch of reservations.

    An on-demand load reserves a slot per expert back to back: between those victim() calls the
    candidates lose exactly the previous victim and no use is recorded (the clock stands still), so
    the victims are the candidates in key order. The first call of a batch takes one argmin; the second
    sorts the remaining candidates once; later calls take the next entry. Anything else (a commit, a
    frozen layer, a new use) changes the candidates or the clock and starts a new batch.
    Contract: keys change only when the clock moves (every use is stamped with a fresh clock).
    """

    def __init__(self):
        self.clock = None  # clock the batch started at
        self.expect = bytearray()  # the candidate mask the next call of the batch presents
        self.order = None  # remaining candidates sorted by (key, index), from the batch's second call
        self.at = 0

    def pick(self, candidates: np.ndarray, clock: int, keys) -> int | None:
        """Flat index of the candidate with the lowest keys() (int64 [L, E]; ties: lowest index), or None."""
        candidates = np.asarray(candidates, dtype=bool)
        seen = candidates.tobytes()
        if clock == self.clock and seen == self.expect:
            if self.order is None:
                idx = np.flatnonzero(candidates)
                self.order, self.at = idx[np.argsort(keys().ravel()[idx], kind="stable")], 0
            if self.at == len(self.order):
                return None
            eid = int(self.order[self.at])
            self.at += 1
        else:
            masked = np.where(candidates, keys(), _NEVER)
            eid = int(np.argmin(masked))
            self.clock, self.expect, self.order = clock, bytearray(seen), None
            if masked.flat[eid] == _NEVER:
                return None
        self.expect[eid] = 0  # the driver evicts it
        return eid


class LRU(Policy):
    name = "lru"
    lossless = True
    source = "reference: least-recently-used expert cache with on-demand loading"

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        self.last_use = np.zeros((L, E), dtype=np.int64)
        self.clock = 0  # advance it whenever last_use changes (VictimOrder's contract)
        self.victims = VictimOrder()
        return placement

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.clock += 1
        active = np.flatnonzero(counts)
        self.last_use[layer, active] = self.clock
        missing = active[~cache.resident[layer, active]]
        return LayerPlan(load=missing)

    def victim(self, candidates, cache):
        eid = self.victims.pick(candidates, self.clock, lambda: self.last_use)
        return None if eid is None else divmod(eid, self.last_use.shape[1])

    def victim_keys(self, cache):
        return VictimKeys(self.last_use)  # least recently used first, as victim() picks
