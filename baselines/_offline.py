"""The oracle's offline arithmetic: which experts of a layer run on the device, and the best static placement.

A layer's expert time follows the simulator's own rule (moespac/sim/replay.py). Device sets are enumerated
exactly when a layer has at most EXACT_EXPERTS candidates, and otherwise among prefixes of the experts ordered
by how much the device saves (a heuristic).

Details: docs/baselines.md#offline-arithmetic-oracle-helper.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from moespac.policy import expert_wall

EXACT_EXPERTS = 10
"""Enumerate all 2^n device sets up to this many experts (1024 sets); beyond it, n + 1 prefixes."""
STATIC_GRID = 32
"""Static placement of a layer with more candidates than EXACT_EXPERTS: slot counts tried per layer."""


@lru_cache(maxsize=None)
def all_subsets(n: int) -> np.ndarray:
    """bool [2^n, n]; row m holds bit i of m in column i (so row m is the set with bitmask m)."""
    m = np.arange(2**n)
    return ((m[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)


@lru_cache(maxsize=None)
def subsets_by_size(n: int) -> np.ndarray:
    """all_subsets(n), smallest sets first."""
    sets = all_subsets(n)
    return sets[np.argsort(sets.sum(1), kind="stable")]


def device_sets(gain: np.ndarray) -> np.ndarray:
    """bool [K, n] candidate device sets of n experts, each at most once, smallest first: every subset
    (n <= EXACT_EXPERTS), else the prefixes of the order by `gain` (most device-favoured first)."""
    n = len(gain)
    if n <= EXACT_EXPERTS:
        return subsets_by_size(n)
    order = np.argsort(-gain, kind="stable")
    sets = np.empty((n + 1, n), dtype=bool)
    sets[:, order] = np.arange(n + 1)[:, None] > np.arange(n)[None, :]  # set k: the first k of the order
    return sets


def subset_min(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g [..., 2^n] indexed by bitmask: for every set m, the least g over the subsets of m and the subset that
    attains it (ties keep the larger set). One pass per bit (the subset-min transform)."""
    n = g.shape[-1].bit_length() - 1
    best, arg = g.copy(), np.broadcast_to(np.arange(2**n), g.shape).copy()
    for i in range(n):
        has = np.flatnonzero((np.arange(2**n) >> i) & 1)
        smaller = best[..., has ^ (1 << i)] < best[..., has]
        best[..., has] = np.where(smaller, best[..., has ^ (1 << i)], best[..., has])
        arg[..., has] = np.where(smaller, arg[..., has ^ (1 << i)], arg[..., has])
    return best, arg


def layer_times(sets: np.ndarray, d: np.ndarray, h: np.ndarray, x: float, serial: bool,
                h_fixed: float = 0.0, y: float = 0.0) -> np.ndarray:
    """[K] expert time of the layer for each device set (no loads): device d, host h, host-side fixed x
    when any expert runs on the host, device call y when any runs on the device; h_fixed = host time of
    experts that never run on the device."""
    dev = sets.astype(np.float64) @ d + y * sets.any(1)
    off = ~sets
    host = off.astype(np.float64) @ h + h_fixed
    host = host + x * (off.any(1) | (h_fixed > 0))
    return expert_wall(dev, host, serial)


def static_layer_values(counts: np.ndarray, dev_cost: np.ndarray, host_cost: np.ndarray, hidden: np.ndarray,
                        serial: bool, max_slots: int, device_call: float = 0.0) -> tuple[np.ndarray, list[np.ndarray]]:
    """One layer, never copying: values[b] = least total expert time over the steps with b experts resident
    (each step splits its active residents between device and host at its best), and sets[b] the experts.

    counts int [S, E] of this layer; hidden [S]. Only experts the layer ever activates are candidates.
    Exact (every resident set, every split) with at most EXACT_EXPERTS candidates; otherwise residents are
    the experts of most total host time, tried at up to STATIC_GRID slot counts, split by prefix."""
    used = np.flatnonzero((counts > 0).any(0))
    n = min(len(used), max_slots)
    d, h = dev_cost[counts[:, used]], host_cost[counts[:, used]]  # [S, n_used]; 0 where inactive
    active = counts[:, used] > 0
    if len(used) <= EXACT_EXPERTS:
        values = _exact_static(active, d, h, hidden, serial, device_call)
        subsets = all_subsets(len(used))
        sizes = subsets.sum(1)
        # among equally fast sets, the one whose experts are first needed soonest: the same time for this
        # plan, and a better start for the plans that copy later
        first_use = subsets @ active.argmax(0)
        out_v, out_s = [], []
        for b in range(n + 1):
            fits = np.flatnonzero(sizes <= b)
            ties = fits[values[fits] <= values[fits].min() * (1 + 1e-12)]
            m = ties[np.argmin(first_use[ties])]
            out_v.append(values[m])
            out_s.append(used[subsets[m]])
        return np.asarray(out_v), out_s
    rank = np.argsort(-h.sum(0), kind="stable")
    grid = np.unique(np.linspace(0, n, STATIC_GRID + 1).round().astype(int))
    values = np.full(n + 1, np.inf)
    sets = [used[:0]] * (n + 1)
    split = _PrefixSplit(d, h, hidden, serial, device_call)  # the order and sums every slot count shares
    for b in grid:
        resident = np.zeros(len(used), dtype=bool)
        resident[rank[:b]] = True
        values[b] = split.best(active & resident).sum()
        sets[b] = used[rank[:b]]
    for b in range(1, n + 1):  # a slot count between grid points keeps the smaller grid point's set
        if values[b] > values[b - 1]:
            values[b], sets[b] = values[b - 1], sets[b - 1]
    return values, sets


def _exact_static(active, d, h, hidden, serial, device_call=0.0):
    """values [2^n]: total time over the steps with resident set = bitmask m, each step at its best split."""
    S, n = active.shape
    sets = all_subsets(n)
    dev = d @ sets.T + device_call * sets.any(1)  # [S, 2^n]: device time if the set ran on the device
    host = h.sum(1, keepdims=True) - h @ sets.T
    left = (active[:, None, :] & ~sets[None, :, :]).any(2)  # something of the step stays on the host
    host = host + hidden[:, None] * left
    g = expert_wall(dev, host, serial)
    inside = ~(sets[None, :, :] & ~active[:, None, :]).any(2)  # the set only holds active experts
    g = np.where(inside, g, np.inf)
    return subset_min(g)[0].sum(0)  # best split within each resident set


class _PrefixSplit:
    """Each step's best prefix split of its experts, ordered by h - d, between device and host (d, h [S, n];
    0 where inactive). The order, the sorted costs and the host totals do not depend on which experts may run on
    the device, so they are computed once for all the resident sets a layer tries."""

    def __init__(self, d, h, hidden, serial, device_call=0.0):
        self.order = np.argsort(-(h - d), axis=1, kind="stable")
        self.d = np.take_along_axis(d, self.order, 1)
        self.h = np.take_along_axis(h, self.order, 1)
        self.h_total = h.sum(1, keepdims=True)
        self.n_active = (d > 0).sum(1, keepdims=True)
        self.hidden, self.serial, self.device_call = hidden, serial, device_call

    def best(self, eligible) -> np.ndarray:
        """[S] each step's least expert time, device candidates = `eligible` [S, n]."""
        e = np.take_along_axis(eligible, self.order, 1)
        ds = self.d * e
        hs = self.h * e
        zero = np.zeros((len(ds), 1))
        dev = np.concatenate([zero, np.cumsum(ds, 1)], 1)
        host = self.h_total - np.concatenate([zero, np.cumsum(hs, 1)], 1)
        on_dev = np.concatenate([zero, np.cumsum(e, 1)], 1)
        dev = dev + self.device_call * (on_dev > 0)
        left = on_dev < self.n_active  # active experts left on the host
        host = host + self.hidden[:, None] * left
        return expert_wall(dev, host, self.serial).min(1)


def static_placement(counts: np.ndarray, dev_cost: np.ndarray, host_cost: np.ndarray, hidden: np.ndarray,
                     serial: bool, capacity: int, per_layer_capacity: int | None,
                     device_call: float = 0.0) -> np.ndarray:
    """bool [L, E]: the resident set that never copies and minimises the request's expert time (counts int
    [S, L, E]): each layer's best set per slot count, then slots shared among layers by dynamic programming."""
    S, L, E = counts.shape
    per_layer = E if per_layer_capacity is None else per_layer_capacity
    layers = [static_layer_values(counts[:, l], dev_cost, host_cost, hidden, serial, min(per_layer, capacity),
                                  device_call)
              for l in range(L)]
    C = min(capacity, sum(len(v) - 1 for v, _ in layers))
    best = np.zeros(C + 1)  # least time of the layers so far with at most c slots
    choice = np.zeros((L, C + 1), dtype=np.int64)
    for l, (values, _) in enumerate(layers):
        b = np.arange(len(values))
        c = np.arange(C + 1)
        total = np.where(b[None, :] <= c[:, None],
                         best[np.maximum(c[:, None] - b[None, :], 0)] + values[None, :], np.inf)
        choice[l] = np.argmin(total, 1)  # first minimum: fewest slots
        best = total[c, choice[l]]
    out = np.zeros((L, E), dtype=bool)
    c = C
    for l in range(L - 1, -1, -1):
        b = choice[l, c]
        out[l, layers[l][1][b]] = True
        c -= b
    return out
