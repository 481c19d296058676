"""ExpertCache's reservations in one compiled call, for policies whose victim is the evictable expert of least
(or greatest) key (Policy.victim_keys): validate, choose the victims and move the slots at once.

The same slots, victims and counters as ExpertCache.reserve one expert at a time asking the policy's victim()
(tests/test_perf_structures.py replays every such policy both ways); in numpy a batch took ~20 calls of a few
microseconds each on 48 x 128 masks, on every layer of every step.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _before(ka, ia, kb, ib, largest):
    """Whether candidate (ka, ia) is evicted before (kb, ib): least key first (greatest if `largest`), then the
    lower flat index (np.argmin's and np.argmax's first-occurrence rule)."""
    if ka != kb:
        return ka > kb if largest else ka < kb
    return ia < ib


@njit(cache=True, nogil=True)
def _choose(keys, idx, m, take, largest, out):
    """The first `take` of the m candidates (keys[idx[:m]]) in eviction order, into out[:take]."""
    if take == 1:  # a prefetch's one slot: a scan
        best = idx[0]
        for j in range(1, m):
            i = idx[j]
            if _before(keys[i], i, keys[best], best, largest):
                best = i
        out[0] = best
        return
    # a bounded max-heap (worst on top) keeps the `take` earliest, then heap-sort them
    heap = np.empty(take, np.int64)
    n = 0
    for j in range(m):
        i = idx[j]
        if n < take:
            heap[n] = i
            c = n
            n += 1
            while c > 0:  # sift up: a parent is evicted no earlier than its children
                p = (c - 1) // 2
                if _before(keys[heap[p]], heap[p], keys[heap[c]], heap[c], largest):
                    heap[p], heap[c] = heap[c], heap[p]
                    c = p
                else:
                    break
        elif _before(keys[i], i, keys[heap[0]], heap[0], largest):
            heap[0] = i
            _sift_down(heap, n, keys, largest)
    for end in range(n - 1, -1, -1):
        out[end] = heap[0]
        heap[0] = heap[end]
        _sift_down(heap, end, keys, largest)


@njit(cache=True, nogil=True)
def _sift_down(heap, n, keys, largest):
    c = 0
    while True:
        a, b, worst = 2 * c + 1, 2 * c + 2, c
        if a < n and _before(keys[heap[worst]], heap[worst], keys[heap[a]], heap[a], largest):
            worst = a
        if b < n and _before(keys[heap[worst]], heap[worst], keys[heap[b]], heap[b], largest):
            worst = b
        if worst == c:
            return
        heap[c], heap[worst] = heap[worst], heap[c]
        c = worst


@njit(cache=True, nogil=True)
def reserve_keyed(resident, loading, frozen, exclude, slot_of, expert_at, occupied, free, nfree, layer, experts, keys,
                  largest, slots, victims):
    """Reserve a slot for each of `experts` (of `layer`) in turn: free slots first (popped from the top of the
    stack free[:nfree]), then the slot of each victim, the evictable experts (resident, not frozen, not
    excluded) in eviction order of `keys`; past the last candidate the rest are refused. expert_at[slot] is the
    flat id in each slot (-1: free): the candidates are found among the slots, not among all L x E experts.

    Writes slots[:got] and victims[:evicted] (flat ids); returns (got, nfree after, evicted), or (-1 - j, nfree,
    0) with nothing changed when experts[j] is resident, loading or named twice."""
    E = resident.shape[1]
    n = len(experts)
    seen = np.zeros(E, np.bool_)
    for j in range(n):
        e = experts[j]
        if resident[layer, e] or loading[layer, e] or seen[e]:
            return -1 - j, nfree, 0
        seen[e] = True
    got = min(n, nfree)
    for j in range(got):
        nfree -= 1
        slots[j] = free[nfree]
    evicted = 0
    if n > got:
        r, f, x, k = resident.ravel(), frozen.ravel(), exclude.ravel(), keys.ravel()
        idx = np.empty(len(expert_at), np.int64)
        m = 0
        for s in range(len(expert_at)):
            i = expert_at[s]
            if i >= 0 and r[i] and not f[i] and not x[i]:
                idx[m] = i
                m += 1
        evicted = min(n - got, m)
        if evicted:
            _choose(k, idx, m, evicted, largest, victims)
        for v in range(evicted):
            vl, ve = victims[v] // E, victims[v] % E
            slots[got + v] = slot_of[vl, ve]
            resident[vl, ve] = False
            slot_of[vl, ve] = -1
            occupied[vl] -= 1
        got += evicted
    for j in range(got):
        e = experts[j]
        loading[layer, e] = True
        slot_of[layer, e] = slots[j]
        expert_at[slots[j]] = layer * E + e
        occupied[layer] += 1
    return got, nfree, evicted
