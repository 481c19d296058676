"""Infinite-cache bound: a time no policy can beat on the same trace, profile and draft.

Everything resident, no copies, no stalls, and each layer's experts split between device and host in the best
possible way, relaxed to fractions of an expert (a linear program solved by fractional knapsack), so the
integer optimum of any policy is at least this. Step time = draft + L * attention + other + the layers' bounds.

Formulas: docs/internals.md#moespacsimboundspy.
"""

from __future__ import annotations

import numpy as np

from moespac.sim.cost import Timing
from moespac.sim.replay import throughput
from moespac.sim.workload import Workload


def layer_lower_bound(d: np.ndarray, h: np.ndarray, x: np.ndarray, serial: bool, y: float = 0.0) -> np.ndarray:
    """Lower bound of one layer's expert time; d, h [R, E] (0 for inactive experts), x [R], y the device call."""
    active = (d > 0) | (h > 0)
    d_all = d.sum(1) + y * active.any(1)
    h_all = h.sum(1) + x * active.any(1)
    if serial:
        return np.minimum(np.minimum(d_all, h_all), x + y + np.minimum(d, h).sum(1))
    ratio = np.where(h > 0, d / np.where(h > 0, h, 1.0), np.inf)
    order = np.argsort(ratio, axis=1, kind="stable")
    ds, hs = np.take_along_axis(d, order, 1), np.take_along_axis(h, order, 1)
    zero = np.zeros((len(d), 1))
    dev = np.concatenate([zero, np.cumsum(ds, 1)], 1) + y  # device load with the first k on the device
    host = h.sum(1, keepdims=True) - np.concatenate([zero, np.cumsum(hs, 1)], 1) + x[:, None]
    gap = dev - host  # increasing in k
    k = np.argmax(gap >= 0, axis=1)  # first k where the device load catches up
    crosses = (gap >= 0).any(1) & (k > 0)
    j = np.where(crosses, k - 1, 0)  # the expert split fractionally
    rows = np.arange(len(d))
    dj, hj = ds[rows, j], hs[rows, j]
    f = (host[rows, j] - dev[rows, j]) / np.where(dj + hj > 0, dj + hj, 1.0)
    lp = np.where(crosses, dev[rows, j] + f * dj, np.where((gap >= 0).any(1), host[:, 0], x))
    return np.minimum(np.minimum(d_all, h_all), lp)


def infinite_cache_steps(workload: Workload, timing: Timing) -> np.ndarray:
    """[S] lower-bound time of each step."""
    L = workload.topology.num_layers
    out = timing.draft + L * timing.attention + timing.other
    for idx in workload.requests() or []:  # a request at a time keeps memory at [S_r * L, E]
        c = workload.counts[idx].reshape(len(idx) * L, -1)
        x = np.repeat(timing.hidden[idx], L)
        lb = layer_lower_bound(timing.device_s(c), timing.host_s(c), x, timing.serial, timing.device_call)
        out[idx] += lb.reshape(len(idx), L).sum(1)
    return out


def infinite_cache(workload: Workload, timing: Timing) -> dict:
    """Throughput and latency of the infinite-cache bound (same definitions as ReplayResult.summary)."""
    steps = infinite_cache_steps(workload, timing)
    kinds = workload.steps["step_kind"]
    tokens = [int(workload.steps["step_emitted"][idx][kinds[idx] != 0].sum()) for idx in workload.requests()]
    return throughput(steps, kinds, tokens)
