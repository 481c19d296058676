"""Heterogeneous Workload Balancer: the integer threshold tau per layer (paper Sec 3.3, App C).

For tau = 1..K (all at once, all layers at once):
    T_cpu(tau) = r_c(tau) * tokens * k * t_cpu        r_c: share of (token, expert) pairs left to the host
    T_gpu(tau) = r_g(tau) * b * t_gpu                 r_g: share of the b distinct activated experts on device
    (tokens = gamma x batch as the paper writes, b = distinct experts of the layer's previous step)
    n(tau)     = experts with u >= tau not resident   (what the prefetcher would copy)
    I/O:     t_io * n(tau) <= T_total(tau) + gamma * t_draft / L,   T_total = t_layer + max(T_cpu, T_gpu)
    memory:  n(tau) <= free slots + evictable residents (utility below their layer's threshold)
    tau = argmin over feasible tau of |T_cpu - T_gpu| (ties: the smaller tau, which prefetches more).
n(tau) falls and the memory slack grows with tau, but the I/O budget moves with max(T_cpu, T_gpu), so the
feasible set need not be an interval: all K candidates are checked. When none is feasible the fallback
is tau = K, the threshold that asks for the fewest copies [inferred; the paper gives no fallback].
r_c and r_g are learned online per layer by replaying each step's activations against the utilities
the step started with (what tau would have put on the device): plain means for `warmup_steps` steps,
then a moving average with weight `rate_decay` [inferred from "learned from a warm up test", App C.1].
"""

from __future__ import annotations

import numpy as np

from moespac.policy import UnitCosts


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
        # histogram index of (layer, group 0, u 0), in the narrowest signed dtype that holds every index:
        # numpy calls on small same-dtype arrays cost less than on int64 with a cast per call
        bins = 3 * (K + 1)
        self._dtype = np.min_scalar_type(-num_layers * bins)
        self._bin = (np.arange(num_layers) * bins).astype(self._dtype)[:, None]
        self._rows = np.arange(num_layers)
        self._taus = np.arange(1, K + 1)

    def _hist(self, u: np.ndarray, resident=None, evictable=None, weights=None) -> np.ndarray:
        """hist[l, g, v] = sum of weights over layer l's experts with utility v in group g: 0 absent,
        1 resident (or loading) and kept, 2 evictable (a subset of resident)."""
        if resident is None:
            idx = np.add(self._bin, u, dtype=self._dtype)
        else:
            idx = np.add(resident, evictable, dtype=self._dtype)  # group
            idx *= self._dtype.type(self.K + 1)
            idx += self._bin
            idx += u
        h = np.bincount(idx.ravel(), None if weights is None else weights.ravel(), minlength=self.L * 3 * (self.K + 1))
        return h.reshape(self.L, 3, self.K + 1)

    def observe(self, counts: np.ndarray, u_before: np.ndarray) -> None:
        """Learn from one step: counts [L, E] activations, u_before [L, E] utilities the step started with."""
        # one histogram carries both sums: activation pairs below 2**32, distinct experts above (exact in float64)
        packed = self._hist(u_before, weights=counts + (counts > 0) * 2.0**32)[:, 0]
        active, pairs = np.divmod(packed, 2.0**32)
        total, b = pairs.sum(1), active.sum(1)
        hot_pairs = _at_least(pairs)  # pairs whose expert has u >= tau, tau = 1..K
        r_cpu = 1 - hot_pairs / np.maximum(total, 1)[:, None]
        r_gpu = _at_least(active) / np.maximum(b, 1)[:, None]
        w = np.where(self.seen < self.warmup_steps, 1.0 / (self.seen + 1), self.rate_decay)
        w[total == 0] = 0  # a layer that saw nothing learns nothing
        self.r_cpu += w[:, None] * (r_cpu - self.r_cpu)
        self.r_gpu += w[:, None] * (r_gpu - self.r_gpu)
        self.distinct = np.where(total > 0, b, self.distinct)
        self.seen += total > 0

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
        K, c = self.K, self.costs
        below = np.add.accumulate(self._hist(u, resident, evictable), 2)  # [L, group, v]: experts with u <= v
        n = below[:, 0, K:] - below[:, 0, :K]  # [L, K] absent experts with u >= tau: the copies tau asks for
        ev = below[:, 2, :K]  # own layer's evictables with u < tau
        free = np.asarray(free_slots)[..., None]
        if self.scope == "global":  # every layer evicts below the same tau
            slack = free + ev.sum(0)
        else:  # other layers give up what is below the thresholds they hold now
            cold_now = ev[self._rows, self.tau - 1]
            slack = ev + (cold_now.sum() - cold_now)[:, None]
            slack += free
        t_cpu, t_gpu = self.costs_per_tau(tokens)
        budget = np.maximum(t_cpu, t_gpu)
        budget += c.t_layer  # t_layer + max(...): the same float sum either way round
        budget += gamma * c.t_draft / self.L
        feasible = c.t_io * n <= budget
        feasible &= n <= slack
        gap = np.where(feasible, np.abs(t_cpu - t_gpu), np.inf)
        if self.scope == "global":
            feasible, gap = feasible.all(0, keepdims=True), gap.sum(0, keepdims=True)
        tau = self._taus[np.argmin(gap, 1)]  # ties: the smaller tau
        none = ~np.logical_or.reduce(feasible, axis=1)
        tau[none] = K
        warming = self.seen < self.warmup_steps
        if self.scope == "global":
            tau, none, warming = np.repeat(tau, self.L), np.repeat(none, self.L), np.repeat(warming.any(), self.L)
        tau[warming] = self.warmup_tau
        self.infeasible += int(np.count_nonzero(none > warming))  # none & ~warming
        self.tau = tau
        return tau


def _at_least(hist: np.ndarray) -> np.ndarray:
    """From hist[l, v] over utility levels v = 0..K: totals over v >= tau for tau = 1..K ([L, K])."""
    return np.cumsum(hist[:, ::-1], 1)[:, ::-1][:, 1:]
