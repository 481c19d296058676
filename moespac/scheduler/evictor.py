"""Utility-guided eviction pool: device-resident experts ordered by (utility, layer, expert).

The victim is the lowest (u, eid) resident candidate whose utility is below its layer's threshold, ties to the
lowest eid = layer * E + expert, as the released code orders them. One bitset per utility level makes a search
at most K + 1 vectorised numpy passes; a search removes nothing. The key is always the current utility.

The structure and the released code's transient window: docs/internals.md#moespacschedulerevictorpy.
"""

from __future__ import annotations

import numpy as np


class EvictionPool:
    def __init__(self, num_layers: int, num_experts: int, K: int = 127):
        self.L, self.E = num_layers, num_experts
        N = num_layers * num_experts
        self.key = np.zeros(N, dtype=np.uint8)  # the utility each expert's level bit says
        self.level = np.zeros((K + 1, N), dtype=bool)
        self.level[0] = True
        self.resident = np.zeros(N, dtype=bool)
        self._tau_seen = None  # tau bytes the per-level masks below were made for
        self._warm: list = []  # per level v < max tau: bool [N] "layer's tau > v", None if every layer's is
        self._allowed = np.empty(N, dtype=bool)  # scratch: candidates & resident
        self._hit = np.empty(N, dtype=bool)  # scratch: one level's eligible bits

    def __len__(self) -> int:
        return int(np.count_nonzero(self.resident))

    def rekey(self, eids: np.ndarray, u_flat: np.ndarray) -> None:
        """Utilities of `eids` may have changed: move the bits of those whose value moved."""
        eids = np.asarray(eids)
        new = u_flat[eids]
        moved = self.key[eids] != new
        if np.count_nonzero(moved):
            eids, new = eids[moved], new[moved]
            self.level[self.key[eids], eids] = False
            self.level[new, eids] = True
            self.key[eids] = new

    def sync(self, resident_flat: np.ndarray, u_flat: np.ndarray | None) -> None:
        """Take the current residents and re-key every utility that moved (u_flat None: none moved)."""
        self.resident = resident_flat
        if u_flat is not None:
            self.rekey(np.flatnonzero(self.key != u_flat), u_flat)

    def pop_victim(self, candidates_flat: np.ndarray, tau_of_layer: np.ndarray) -> int | None:
        """Lowest (u, eid) among resident candidates with u below its layer's tau (the driver evicts it)."""
        allowed = np.logical_and(candidates_flat, self.resident, out=self._allowed)
        for v, warm in enumerate(self._warm_levels(tau_of_layer)):
            hit = np.logical_and(self.level[v], allowed, out=self._hit)
            if warm is not None:
                hit &= warm
            eid = int(hit.argmax())  # the first True: the lowest eid of this level
            if hit[eid]:
                return eid
        return None

    def _warm_levels(self, tau: np.ndarray) -> list:
        """Masks of the levels a victim may come from, remade only when tau changes (once a step)."""
        seen = tau.tobytes()
        if seen != self._tau_seen:
            self._tau_seen = seen
            levels = min(int(tau.max()), len(self.level))
            self._warm = [None if (tau > v).all() else np.repeat(tau > v, self.E) for v in range(levels)]
        return self._warm
