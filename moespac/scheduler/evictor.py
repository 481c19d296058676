"""Utility-guided eviction pool: device-resident experts ordered by (utility, layer, expert).

A binary heap with lazy deletion: O(log N) push and pop. An entry (u, eid) is live while the pool
still registers eid with utility u; changing an expert's utility pushes a fresh entry and leaves the old
one to be discarded when it surfaces. Ties go to the lowest eid = layer * E + expert, as the released
code's std::set of (state, eid) does [code gb.cpp:893-896, 1212-1229].

The pool keys residents by the estimator's current utility. The released code instead drops every
resident of a layer to state 0 after the layer runs and re-promotes it when the estimator's request
is popped [code gb.cpp:1237-1266]; in between it can evict an expert it is about to re-promote (the
authors' own TODO). We skip that transient window: the key is always the current utility.
"""

from __future__ import annotations

import heapq

import numpy as np


class EvictionPool:
    def __init__(self, num_layers: int, num_experts: int):
        self.E = num_experts
        self.key = np.full(num_layers * num_experts, -1, dtype=np.int16)  # registered utility, -1 = absent
        self.heap: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return int((self.key >= 0).sum())

    def _push(self, eids: np.ndarray, u_flat: np.ndarray) -> None:
        self.key[eids] = u_flat[eids]
        for eid in eids.tolist():
            heapq.heappush(self.heap, (int(u_flat[eid]), eid))

    def sync(self, resident_flat: np.ndarray, u_flat: np.ndarray) -> None:
        """Register new residents and forget departed ones (the driver commits and evicts)."""
        present = self.key >= 0
        self._push(np.flatnonzero(resident_flat & ~present), u_flat)
        self.key[present & ~resident_flat] = -1
        if len(self.heap) > 4 * max(len(self), 64):  # too many dead entries: rebuild
            live = np.flatnonzero(self.key >= 0)
            self.heap = list(zip(self.key[live].tolist(), live.tolist()))
            heapq.heapify(self.heap)

    def rekey(self, eids: np.ndarray, u_flat: np.ndarray) -> None:
        """Utilities of `eids` may have changed: re-key the registered ones whose value moved."""
        eids = np.asarray(eids)
        moved = eids[(self.key[eids] >= 0) & (self.key[eids] != u_flat[eids])]
        self._push(moved, u_flat)

    def pop_victim(self, candidates_flat: np.ndarray, tau_of_layer: np.ndarray) -> int | None:
        """Lowest (u, eid) among candidates with u below its layer's tau; removed from the pool."""
        aside, found = [], None
        top = int(tau_of_layer.max())
        while self.heap:
            u, eid = self.heap[0]
            if self.key[eid] != u:  # stale entry
                heapq.heappop(self.heap)
                continue
            if u >= top:  # every remaining entry is at or above every threshold
                break
            entry = heapq.heappop(self.heap)
            if candidates_flat[eid] and u < tau_of_layer[eid // self.E]:
                found = eid
                self.key[eid] = -1
                break
            aside.append(entry)  # frozen, or hot for its own layer: keep it
        for entry in aside:
            heapq.heappush(self.heap, entry)
        return found
