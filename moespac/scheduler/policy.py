"""MoE-SpAc as a moespac Policy: estimator + balancer + utility prefetch queue + utility eviction pool.

Hooks (moespac/policy.py): begin_step decides tau for every layer at once; plan_layer runs resident experts on
the device and the rest on the host (never loads on demand); end_layer(l) updates layer l's utilities and asks
for its experts with u >= tau[l] as Prefetch(priority=u); end_step lets the balancer learn r_c, r_g; victim is
the lowest (utility, eid) resident whose utility is below its layer's tau.

Trade-offs and released-code references: docs/internals.md#moespacschedulerpolicypy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moespac.errors import MoespacError
from moespac.policy import Policy, PolicyContext, Prefetch, StepInfo
from moespac.scheduler.balancer import WorkloadBalancer
from moespac.scheduler.config import MoESpAcConfig
from moespac.scheduler.estimator import SlidingCounts, UtilityEstimator
from moespac.scheduler.evictor import EvictionPool

_ALIASES = {"lambda": "lam"}


class MoESpAc(Policy):
    name = "moespac"
    lossless = True
    needs_draft = True  # the default (paper) config; each instance sets its own (False for no-sd)
    source = "arXiv 2603.09983 (MoE-SpAc) + github.com/lshAlgorithm/MoE-SpAc @77bb9cf"

    def __init__(self, config: MoESpAcConfig | None = None, **options):
        known = {f.name for f in dataclasses.fields(MoESpAcConfig)}
        options = {_ALIASES.get(k, k): v for k, v in options.items()}
        for key in options:
            if key not in known:
                raise MoespacError(f"policy 'moespac' has no option {key!r}; options: {', '.join(sorted(known))}")
        self.config = dataclasses.replace(config or MoESpAcConfig(), **options).resolved()
        self.needs_draft = self.config.decoding == "sd"
        self.estimator = None

    # -- hooks -------------------------------------------------------------------------------------

    def uses_profile(self) -> bool:
        """The static prefetcher (w/o SG-Prefetcher) places by a profiling run's counts."""
        return self.config.prefetcher == "static"
    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        cfg, topo = self.config, ctx.topology
        L, E = topo.num_layers, topo.num_experts
        gamma = ctx.gamma if cfg.decoding == "sd" else cfg.ar_window - 1  # the window plays the verify batch
        self.estimator = UtilityEstimator.from_config(cfg, L, E, gamma)
        self.window = SlidingCounts(L, E, cfg.ar_window) if cfg.decoding == "ar" else None
        self.balancer = WorkloadBalancer(L, cfg.K, topo.top_k, ctx.costs, cfg.warmup_steps, cfg.warmup_tau,
                                         cfg.rate_decay, cfg.tau_scope)
        self.solves = cfg.tau is None and cfg.prefetcher == "utility"
        self.evicts = cfg.evictor == "utility" and cfg.prefetcher == "utility"
        self.per_step = cfg.update_at == "step" or cfg.count_mode == "accepted"  # accepted counts come at the end
        self.tau = np.full(L, cfg.tau if cfg.tau is not None else cfg.warmup_tau, dtype=np.int64)
        self.pool = EvictionPool(L, E, cfg.K)
        self.pool_stale = True
        self.u_before = np.zeros((L, E), dtype=np.uint8)
        self.batch_counts = np.zeros((L, E), dtype=np.int64)
        self.accepted = None
        self.updating = False
        self.static = None  # bool [L, E]: the static placement of 'no-sg-prefetcher'
        self.warm_sum = np.zeros((L, E), dtype=np.int64)
        self.warm_steps = 0
        self.stats = dict(steps=0, prefetch_requests=0, victims=0, victim_refusals=0)
        self.tau_sum = np.zeros(L, dtype=np.int64)
        if cfg.prefetcher == "static" and ctx.warmup_counts is not None:
            self.static = self._most_frequent(np.asarray(ctx.warmup_counts))
            placement = self.static.copy()
        return placement

    def begin_step(self, step: StepInfo, cache) -> list[Prefetch]:
        self.updating = step.kind != "prefill" or self.config.update_on_prefill
        if not self.updating:
            return []
        self.stats["steps"] += 1
        self.accepted = None
        self.u_before[...] = self.estimator.u
        if self.solves:
            busy = cache.resident | _loading(cache)
            evictable = cache.resident & ~_frozen(cache) if self.evicts else np.zeros_like(busy)
            self.tau = self.balancer.solve(self.estimator.u, busy, evictable, _free_slots(cache),
                                           self._cpu_tokens(step), step.gamma)
        self.tau_sum += self.tau
        return []

    def end_layer(self, layer: int, counts: np.ndarray, cache) -> list[Prefetch]:
        if not self.updating:
            return []
        self.batch_counts[layer] = counts
        if self.per_step:
            return []  # every layer is updated in end_step
        self._update(layer, counts)
        return self._requests(layer, cache)

    def observe_accepted(self, counts: np.ndarray) -> None:
        """count_mode='accepted': counts [L, E] over the accepted tokens only; call before end_step."""
        self.accepted = np.asarray(counts)

    def end_step(self, step: StepInfo, cache) -> list[Prefetch]:
        if not self.updating:
            return []
        cfg, requests = self.config, []
        if self.per_step:
            if cfg.count_mode == "accepted" and self.accepted is None:
                raise MoespacError("moespac count_mode='accepted': the driver must call observe_accepted(counts) "
                                   "before end_step")
            self._update(slice(None), self.accepted if cfg.count_mode == "accepted" else self.batch_counts)
            for layer in range(len(self.tau)):
                requests += self._requests(layer, cache)
        if self.window is not None:
            self.window.advance()
        if self.solves:
            self.balancer.observe(self.batch_counts, self.u_before)
        if cfg.prefetcher == "static" and self.static is None:
            self.warm_sum += self.batch_counts
            self.warm_steps += 1
            if self.warm_steps >= cfg.static_warmup_steps:
                self.static = self._most_frequent(self.warm_sum)
                for layer in range(len(self.tau)):
                    requests += self._requests(layer, cache)
        return requests

    def victim(self, candidates: np.ndarray, cache):
        if not self.evicts:
            self.stats["victim_refusals"] += 1
            return None
        self.pool.sync(cache.resident.ravel(), self.estimator.u.ravel() if self.pool_stale else None)
        self.pool_stale = False
        eid = self.pool.pop_victim(np.asarray(candidates).ravel(), self.tau)
        if eid is None:
            self.stats["victim_refusals"] += 1
            return None
        self.stats["victims"] += 1
        return divmod(eid, self.estimator.u.shape[1])

    def describe(self) -> dict:
        cfg = self.config
        out = dict(variant=cfg.variant, ablation=cfg.ablation, config_hash=cfg.compute_hash(), K=cfg.K,
                   tau_mode="static placement" if cfg.prefetcher == "static" else
                   ("solved" if cfg.tau is None else f"fixed {cfg.tau}"))
        if self.estimator is None:
            return out
        steps = max(self.stats["steps"], 1)
        est = self.estimator
        out.update(self.stats, tau_per_layer_mean=np.round(self.tau_sum / steps, 3).tolist(),
                   tau_mean=float(self.tau_sum.sum() / steps / len(self.tau_sum)),
                   balancer_fallbacks=self.balancer.infeasible,
                   utility_histogram=np.bincount(est.u.ravel(), minlength=cfg.K + 1).tolist(),
                   theta_up_mean=float(est.theta_up.astype(np.float64).mean()),
                   theta_down_mean=float(est.theta_down.astype(np.float64).mean()),
                   estimator_state_bytes=est.nbytes)
        return out

    # -- internals ---------------------------------------------------------------------------------
    def _update(self, rows, counts) -> None:
        f = self.window.push(counts, rows) if self.window is not None else counts
        self.estimator.update(f, rows)
        self.pool_stale = True  # the eviction pool re-keys what moved at its next search

    def _requests(self, layer: int, cache) -> list[Prefetch]:
        busy = cache.resident[layer] | _loading(cache)[layer]
        u = self.estimator.u[layer]
        if self.config.prefetcher == "static":
            if self.static is None:
                return []
            wanted, priority = self.static[layer], np.zeros_like(u)
        else:
            wanted, priority = u >= self.tau[layer], u
        experts = np.greater(wanted, busy).nonzero()[0]  # wanted & ~busy
        self.stats["prefetch_requests"] += len(experts)
        return [Prefetch(layer, e, p) for e, p in zip(experts.tolist(), priority[experts].astype(float).tolist())]

    def _cpu_tokens(self, step: StepInfo) -> float:
        if self.config.cost_tokens == "gamma" and step.gamma > 0:
            return step.gamma * self.ctx.batch_size  # the paper's T_cpu writes gamma, not gamma + 1
        return step.num_tokens

    def _most_frequent(self, counts: np.ndarray) -> np.ndarray:
        """Static placement: the most activated experts that fit (ties: lowest layer, then expert)."""
        ctx = self.ctx
        order = np.argsort(-counts.ravel(), kind="stable")
        order = order[counts.ravel()[order] > 0]
        chosen = np.zeros(counts.shape, dtype=bool)
        per_layer = np.zeros(counts.shape[0], dtype=np.int64)
        limit = ctx.per_layer_capacity if ctx.per_layer_capacity is not None else counts.shape[1]
        taken = 0
        for eid in order.tolist():
            layer, expert = divmod(eid, counts.shape[1])
            if taken == ctx.capacity:
                break
            if per_layer[layer] < limit:
                chosen[layer, expert] = True
                per_layer[layer] += 1
                taken += 1
        return chosen


def _loading(cache) -> np.ndarray:
    loading = getattr(cache, "loading", None)
    return loading if loading is not None else np.zeros_like(cache.resident)


def _frozen(cache) -> np.ndarray:
    frozen = getattr(cache, "frozen", None)
    return frozen if frozen is not None else np.zeros_like(cache.resident)


def _free_slots(cache):
    if cache.per_layer_capacity is None:
        return cache.free_slots()
    return np.array([cache.free_slots(layer) for layer in range(cache.resident.shape[0])])
