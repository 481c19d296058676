"""The least-time on-demand schedule of one request, by dynamic programming over cache states (small problems).

It is exact among plans that never prefetch (every copy a blocking on-demand load at the layer that uses the
expert), on a shared slot pool, under the simulator's rules (moespac/sim/replay.py). The oracle offers it as its
'exact' plan when `fits` says the search is small enough.

Details: docs/baselines.md#exact-on-demand-schedule-oracle-helper.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import comb

import numpy as np

from baselines._offline import all_subsets, subset_min
from moespac.policy import expert_wall

MAX_WORK = 2**17
"""Largest (cache states) x (2^experts per layer) the search takes on: 4096 states of 5-expert layers, which
replay in under a second per random scenario of the property tests."""


def state_count(experts: int, capacity: int, stop_above: int | None = None) -> int:
    """Cache states of `experts` candidates in `capacity` slots: sum_{j <= capacity} C(experts, j); with
    `stop_above`, the first partial sum above it once there is one (the whole sum of 6144 experts in 3072 slots
    has ~1850 digits: 2 s, once per oracle built, for a yes/no its first terms decide)."""
    if capacity >= experts:
        return 1
    total = 0
    for j in range(capacity + 1):
        total += comb(experts, j)
        if stop_above is not None and total > stop_above:
            break
    return total


def fits(topology, capacity: int) -> bool:
    """Whether every request of this topology and capacity is small enough for the exact search."""
    L, E = topology.num_layers, topology.num_experts
    limit = MAX_WORK // 2**E  # states * 2^E <= MAX_WORK  <=>  states <= MAX_WORK // 2^E (integers)
    return state_count(L * E, capacity, stop_above=limit) <= limit


@dataclass
class Schedule:
    """What the exact search decided; visits are numbered step * L + layer."""

    start: np.ndarray
    """bool [L, E] placement before the request."""
    loads: dict = field(default_factory=dict)
    """visit -> experts of the layer loaded on demand."""
    host: dict = field(default_factory=dict)
    """visit -> active experts of the layer run on the host (resident or not)."""
    victims: dict = field(default_factory=dict)
    """visit -> (layer, expert) residents evicted for the loads, after any expert never used again."""
    expert_s: float = 0.0
    """Expert phases plus on-demand loads of the whole request (the plan-dependent part of its time)."""


def exact_on_demand(counts: np.ndarray, dev_cost: np.ndarray, host_cost: np.ndarray, hidden: np.ndarray,
                    load: float, serial: bool, capacity: int, device_call: float = 0.0) -> Schedule:
    """The least-time schedule that never prefetches. counts int [S, L, E]; dev_cost / host_cost: expert time
    by routing count; hidden [S]: host-side fixed time of the step when any expert of a layer runs on the host;
    device_call: the device side's when any runs on the device."""
    S, L, E = counts.shape
    active = counts > 0
    used_at = [_mask(active[p // L, p % L], p % L, E) for p in range(S * L)]
    future = [0] * (S * L + 1)  # future[p]: experts used at visit p or later
    for p in range(S * L - 1, -1, -1):
        future[p] = future[p + 1] | used_at[p]
    used = _bits(future[0])
    if capacity >= len(used):
        starts = [future[0]]
    else:
        starts = [sum(1 << b for b in c) for j in range(capacity + 1) for c in itertools.combinations(used, j)]
    cur = {c: 0.0 for c in starts}
    back = []  # per visit: next state -> (state, loads, device set, victims)
    for p in range(S * L):
        s, layer = divmod(p, L)
        A, keep = used_at[p], future[p + 1]
        best_t, best_wall = _best_device_sets(counts[s, layer], active[s, layer], dev_cost, host_cost,
                                              float(hidden[s]), serial, device_call)
        local = {m: _compress(m, A) for m in _submasks(A)}
        nxt, how = {}, {}
        for C, v in cur.items():
            H, miss, ev = C & A, A & ~C, C & ~A
            free = capacity - C.bit_count()
            ev_bits = _bits(ev)
            for N in _submasks(miss):
                n = N.bit_count()
                need = n - free
                if need > len(ev_bits):
                    continue
                r = local[H | N]
                cost = v + n * load + best_wall[r]
                base = (C | N) & keep
                choices = [()] if need <= 0 else itertools.combinations(ev_bits, need)
                for V in choices:
                    c2 = base & ~sum(1 << b for b in V)
                    if cost < nxt.get(c2, np.inf):
                        nxt[c2], how[c2] = cost, (C, N, best_t[r], V)
        cur = nxt
        back.append(how)
    state = min(cur, key=cur.get)
    out = Schedule(start=np.zeros((L, E), dtype=bool), expert_s=float(cur[state]))
    for p in range(S * L - 1, -1, -1):
        C, N, T, V = back[p][state]
        layer = p % L
        A = used_at[p]
        on_device = [b for i, b in enumerate(_bits(A)) if T >> i & 1]
        out.loads[p] = [b - layer * E for b in _bits(N)]
        out.host[p] = [b - layer * E for b in _bits(A) if b not in on_device]
        out.victims[p] = [divmod(b, E) for b in V]
        state = C
    for b in _bits(state):
        out.start[divmod(b, E)] = True
    return out


def _best_device_sets(counts, active, dev_cost, host_cost, hidden, serial, device_call=0.0):
    """For every subset R of the layer's active experts (local bitmask over them in expert order): the device
    set T within R of least expert time (local bitmask) and that time; the rest run on the host."""
    experts = np.flatnonzero(active)
    n = len(experts)
    sets = all_subsets(n)
    d, h = dev_cost[counts[experts]], host_cost[counts[experts]]
    dev = sets @ d + device_call * sets.any(1)
    host = h.sum() - sets @ h + hidden * ~sets.all(1)
    best, best_t = subset_min(expert_wall(dev, host, serial))
    return best_t.tolist(), best.tolist()


def _mask(row: np.ndarray, layer: int, E: int) -> int:
    return sum(1 << (layer * E + int(e)) for e in np.flatnonzero(row))


def _bits(m: int) -> list[int]:
    return [i for i in range(m.bit_length()) if m >> i & 1]


def _submasks(m: int):
    sub = m
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & m


def _compress(m: int, within: int) -> int:
    """m's bits as a local bitmask over the set bits of `within` (lowest first)."""
    return sum(1 << i for i, b in enumerate(_bits(within)) if m >> b & 1)
