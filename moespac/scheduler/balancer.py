"""Heterogeneous Workload Balancer: the integer threshold tau per layer (paper Sec 3.3, App C).

For tau = 1..K: T_cpu = r_c * tokens * k * t_cpu, T_gpu = r_g * b * t_gpu, n(tau) = experts with u >= tau not
resident; tau is feasible if t_io * n(tau) <= t_layer + max(T_cpu, T_gpu) + gamma * t_draft / L (I/O) and
n(tau) <= free slots + evictable residents (memory). tau = argmin over feasible tau of |T_cpu - T_gpu| (ties:
the smaller tau), else K. r_c and r_g are learned online per layer; both run every step as numba loops.

Definitions, the [inferred] points and the numba loops: docs/internals.md#moespacschedulerbalancerpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moespac.policy import UnitCosts


@njit(cache=True, nogil=True)
def _shares(counts, u, K, r_cpu, r_gpu, total, b):
    """Per layer: the share of its (token, expert) pairs whose expert had u < tau (left to the host) and the
    share of its distinct active experts with u >= tau (on the device), tau = 1..K; its pairs and distinct
    experts. counts int [L, E] of one step; u [L, E] the utilities the step started with."""
    L, E = counts.shape
    pairs = np.zeros(K + 1)
    active = np.zeros(K + 1)
    for layer in range(L):
        pairs[:] = 0.0
        active[:] = 0.0
        for e in range(E):
            c = counts[layer, e]
            if c > 0:
                pairs[u[layer, e]] += c
                active[u[layer, e]] += 1.0
        t, n = pairs.sum(), active.sum()
        total[layer], b[layer] = t, n
        hot_pairs, hot_active = 0.0, 0.0
        for tau in range(K, 0, -1):  # totals over v >= tau
            hot_pairs += pairs[tau]
            hot_active += active[tau]
            r_cpu[layer, tau - 1] = 1 - hot_pairs / max(t, 1.0)
            r_gpu[layer, tau - 1] = hot_active / max(n, 1.0)


@njit(inline="always")
def _step4(r, new, layer, w):
    """r[layer] += w * (new[layer] - r[layer]) for a row of 4, every load before any store: the compiler need
    not assume that r and new overlap, and the row becomes vector operations (1.6x, same bits)."""
    a0, a1, a2, a3 = r[layer, 0], r[layer, 1], r[layer, 2], r[layer, 3]
    n0, n1, n2, n3 = new[layer, 0], new[layer, 1], new[layer, 2], new[layer, 3]
    r[layer, 0], r[layer, 1] = a0 + w * (n0 - a0), a1 + w * (n1 - a1)
    r[layer, 2], r[layer, 3] = a2 + w * (n2 - a2), a3 + w * (n3 - a3)


@njit(cache=True, nogil=True)
def _learn(r_cpu, r_gpu, new_cpu, new_gpu, total, b, distinct, seen, warmup_steps, rate_decay):
    """The warm-up arithmetic: plain means for the first warmup_steps steps a layer saw, then a moving average;
    a layer that saw nothing learns nothing. K = 4 (the paper's) takes an unrolled path with the same bits."""
    L, K = r_cpu.shape
    for layer in range(L):
        if total[layer] == 0:
            continue
        w = 1.0 / (seen[layer] + 1) if seen[layer] < warmup_steps else rate_decay
        if K == 4:
            _step4(r_cpu, new_cpu, layer, w)
            _step4(r_gpu, new_gpu, layer, w)
        else:
            for j in range(K):
                r_cpu[layer, j] += w * (new_cpu[layer, j] - r_cpu[layer, j])
                r_gpu[layer, j] += w * (new_gpu[layer, j] - r_gpu[layer, j])
        distinct[layer] = b[layer]
        seen[layer] += 1


@njit(cache=True, nogil=True)
def _solve(u, resident, evictable, free, tau_now, r_cpu, r_gpu, distinct, seen, costs, flags, tau_out):
    """tau per layer into tau_out (see the module docstring); free int [L] slots; tau_now the thresholds held
    now; costs = (cpu_unit, gpu_unit, t_layer, t_io, draft_share) and flags = (global_scope, warmup_steps,
    warmup_tau), packed because each argument costs the call's dispatch time. Layers still warming up take
    warmup_tau (all of them in global scope while any warms). Returns the decisions that fell back to K (warming
    layers not counted)."""
    cpu_unit, gpu_unit, t_layer, t_io, draft_share = costs[0], costs[1], costs[2], costs[3], costs[4]
    global_scope, warmup_steps, warmup_tau = flags[0] != 0, flags[1], flags[2]
    L, E = u.shape
    K = r_cpu.shape[1]
    n = np.zeros((L, K), np.int64)  # absent experts with u >= tau
    ev = np.zeros((L, K), np.int64)  # own evictable residents with u < tau
    r8, e8 = resident.view(np.uint8), evictable.view(np.uint8)
    for layer in range(L):
        for tau in range(1, K + 1):  # byte arithmetic and 32-bit sums, no branches: the loop vectorises (2x)
            t = np.uint8(tau)
            absent, cold = np.int32(0), np.int32(0)
            for e in range(E):
                ge = np.uint8(u[layer, e] >= t)
                absent += np.int32((np.uint8(1) - r8[layer, e]) & ge)
                cold += np.int32(e8[layer, e] & (np.uint8(1) - ge))
            n[layer, tau - 1], ev[layer, tau - 1] = absent, cold
    cold_total = 0
    if not global_scope:
        for layer in range(L):
            cold_total += ev[layer, tau_now[layer] - 1]
    gaps = np.empty((L, K))
    feasible = np.empty((L, K), np.bool_)
    for layer in range(L):
        for j in range(K):
            if global_scope:  # every layer evicts below the same tau
                slack = free[layer]
                for other in range(L):
                    slack += ev[other, j]
            else:  # other layers give up what is below the thresholds they hold now
                slack = ev[layer, j] + (cold_total - ev[layer, tau_now[layer] - 1]) + free[layer]
            t_cpu = r_cpu[layer, j] * cpu_unit
            t_gpu = r_gpu[layer, j] * (distinct[layer] * gpu_unit)
            budget = max(t_cpu, t_gpu)
            budget += t_layer
            budget += draft_share
            ok = t_io * n[layer, j] <= budget and n[layer, j] <= slack
            feasible[layer, j] = ok
            gaps[layer, j] = abs(t_cpu - t_gpu) if ok else np.inf
    fallbacks = 0
    if global_scope:
        best, best_gap, any_ok, warming = 0, np.inf, False, False
        for j in range(K):
            g, ok = 0.0, True
            for layer in range(L):
                g += gaps[layer, j]
                ok = ok and feasible[layer, j]
            if g < best_gap:  # ties: the smaller tau
                best, best_gap = j, g
            any_ok = any_ok or ok
        for layer in range(L):
            warming = warming or seen[layer] < warmup_steps
        for layer in range(L):
            tau_out[layer] = warmup_tau if warming else (K if not any_ok else best + 1)
            fallbacks += (not any_ok) and not warming
        return fallbacks
    for layer in range(L):
        best, best_gap, any_ok = 0, gaps[layer, 0], feasible[layer, 0]
        for j in range(1, K):
            if gaps[layer, j] < best_gap:
                best, best_gap = j, gaps[layer, j]
            any_ok = any_ok or feasible[layer, j]
        warming = seen[layer] < warmup_steps
        tau_out[layer] = warmup_tau if warming else (K if not any_ok else best + 1)
        fallbacks += (not any_ok) and not warming
    return fallbacks


_U8, _BOOL = np.dtype(np.uint8), np.dtype(np.bool_)


def _exact(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`a` as an array of `dtype` for a kernel, copied only when it is another dtype (this runs every step: an
    identity check of numpy's dtype singletons costs 17 ns, ascontiguousarray's own check 85). A strided array
    of the right dtype passes as it is: the kernel compiles for that layout once and computes the same."""
    return a if a.dtype is dtype else np.ascontiguousarray(a, dtype=dtype)


_WARM = []


def _warm() -> None:
    """Load (or compile) the kernels once per process with the real calls' argument types (see the estimator's)."""
    if _WARM:
        return
    r, v = np.zeros((1, 1)), np.zeros(1)
    i, u, flags = np.zeros(1, np.int64), np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.bool_)
    _shares(np.zeros((1, 1), np.int64), u, 1, r, r.copy(), v, v.copy())
    _learn(r, r.copy(), r.copy(), r.copy(), v, v.copy(), v.copy(), i, 1, 0.1)
    _solve(u, flags, flags, i, np.ones(1, np.int64), r, r.copy(), v, i.copy(), np.ones(5), np.ones(3, np.int64),
           np.zeros(1, np.int64))
    _WARM.append(True)


class WorkloadBalancer:
    """Per-layer r_c(tau), r_g(tau), b estimates and the threshold decision."""

    def __init__(self, num_layers: int, K: int, top_k: int, costs: UnitCosts, warmup_steps: int = 8,
                 warmup_tau: int = 1, rate_decay: float = 0.1, scope: str = "layer"):
        self.L, self.K, self.top_k, self.costs = num_layers, K, top_k, costs
        self.warmup_steps, self.warmup_tau, self.rate_decay, self.scope = warmup_steps, warmup_tau, rate_decay, scope
        self.r_cpu = np.zeros((num_layers, K))
        self.r_gpu = np.zeros((num_layers, K))
        self.distinct = np.zeros(num_layers)  # b: distinct activated experts at the layer's last step
        self.seen = np.zeros(num_layers, dtype=np.int64)
        self.tau = np.full(num_layers, warmup_tau, dtype=np.int64)
        self.infeasible = 0  # (layer, step) decisions that fell back to K
        # scratch of one step's shares (what `observe` learns from)
        self._new = np.zeros((2, num_layers, K))
        self._total, self._b = np.zeros(num_layers), np.zeros(num_layers)
        self._free = np.zeros(num_layers, dtype=np.int64)
        # the solve's packed arguments: costs[0] and costs[4] change with the step, the rest are fixed
        self._costs = np.array([0.0, costs.t_gpu, costs.t_layer, costs.t_io, 0.0])
        self._flags = np.array([scope == "global", warmup_steps, warmup_tau], dtype=np.int64)
        _warm()

    def observe(self, counts: np.ndarray, u_before: np.ndarray) -> None:
        """Learn from one step: counts [L, E] activations, u_before [L, E] utilities the step started with."""
        self.collect(counts, u_before)
        self.learn()

    def collect(self, counts: np.ndarray, u_before: np.ndarray) -> None:
        """The step's shares, kept for `learn` (the measurements the warm-up arithmetic takes)."""
        _shares(np.ascontiguousarray(counts, dtype=np.int64), np.ascontiguousarray(u_before, dtype=np.uint8), self.K,
                self._new[0], self._new[1], self._total, self._b)

    def learn(self) -> None:
        """The warm-up arithmetic over the shares `collect` kept."""
        _learn(self.r_cpu, self.r_gpu, self._new[0], self._new[1], self._total, self._b, self.distinct, self.seen,
               self.warmup_steps, self.rate_decay)

    def costs_per_tau(self, tokens: float) -> tuple[np.ndarray, np.ndarray]:
        """T_cpu and T_gpu, [L, K], for a step with `tokens` tokens in the CPU term."""
        c = self.costs
        t_cpu = self.r_cpu * (tokens * self.top_k * c.t_cpu)
        t_gpu = self.r_gpu * (self.distinct[:, None] * c.t_gpu)
        return t_cpu, t_gpu

    def solve(self, u: np.ndarray, resident: np.ndarray, evictable: np.ndarray, free_slots,
              tokens: float, gamma: int) -> np.ndarray:
        """Decide tau for every layer in one call; returns (and keeps) tau [L].

        resident: bool [L, E] resident or loading; evictable: bool [L, E] residents the evictor may
        give up (a subset of resident: not frozen; all False when eviction is off); free_slots: int or
        int [L].
        """
        c, packed = self.costs, self._costs
        if type(free_slots) is int:
            self._free.fill(free_slots)
        else:
            self._free[:] = free_slots
        packed[0], packed[4] = tokens * self.top_k * c.t_cpu, gamma * c.t_draft / self.L
        tau = np.empty(self.L, dtype=np.int64)
        self.infeasible += _solve(_exact(u, _U8), _exact(resident, _BOOL), _exact(evictable, _BOOL),
                                  self._free, self.tau, self.r_cpu, self.r_gpu, self.distinct, self.seen, packed,
                                  self._flags, tau)
        self.tau = tau
        return tau
