"""A tiny policy driver for behaviour tests: the engine's call sequence over hand-made routing, with an
infinitely fast copy link (the prefetch queue is served completely whenever a hook returns requests).

Mirrors moespac/engine/hybrid.py (the run's capacity capped by Policy.device_slots): drop a layer's queued
prefetches when it starts, plan, freeze the hits,
load plan.load (activated, non-resident experts only; a refused slot means the host runs it) and
plan.carry (non-activated ones copied along), count hits / loads / host / carried, unfreeze, end_layer.
Independent of moespac/sim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from moespac.cache import ExpertCache, PrefetchQueue
from moespac.policy import Policy, PolicyContext, StepInfo, Topology


@dataclass
class LayerRun:
    """What happened at one layer of one step."""

    device: set
    host: set
    loaded: list
    hits: set
    substitute: set = field(default_factory=set)  # plan.substitute: the engine runs them on the host


@dataclass
class Run:
    cache: ExpertCache
    placement: np.ndarray
    layers: list = field(default_factory=list)  # [step][layer] -> LayerRun
    prefetched: list = field(default_factory=list)  # (step, layer-before-which, (layer, expert)) in copy order
    residency: list = field(default_factory=list)  # resident mask after each step
    restored: list = field(default_factory=list)  # Prefetch.restore requests, as `prefetched`


def context(L: int, E: int, k: int, capacity: int, signals=(), **kw) -> PolicyContext:
    return PolicyContext(Topology(L, E, k), capacity, signals=frozenset(signals), **kw)


def counts_of(L: int, E: int, active: dict) -> np.ndarray:
    """Counts [L, E] from {layer: {expert: count}} (or {layer: [experts]} meaning count 1 each)."""
    c = np.zeros((L, E), dtype=np.int64)
    for layer, experts in active.items():
        items = experts.items() if isinstance(experts, dict) else ((e, 1) for e in experts)
        for e, n in items:
            c[layer, e] = n
    return c


def step(index: int, kind: str = "ar", tokens: int = 1, gamma: int = 0, **signals) -> StepInfo:
    return StepInfo(index, kind, tokens, gamma, signals=dict(signals))


def drive(policy: Policy, ctx: PolicyContext, steps: list[tuple[StepInfo, np.ndarray]]) -> Run:
    """Run `policy` over (StepInfo, counts [L, E]) pairs; returns the cache and a per-layer log."""
    L, E = ctx.topology.num_layers, ctx.topology.num_experts
    ctx = dataclasses.replace(ctx, capacity=min(ctx.capacity, policy.device_slots(ctx.topology, ctx.capacity)))
    cache = ExpertCache(ctx.topology, ctx.capacity, ctx.per_layer_capacity, expert_bytes=1)
    queue = PrefetchQueue()
    placement = policy.reset(ctx)
    cache.place(placement)
    run = Run(cache, placement.copy())

    def serve(requests, where):
        queue.push(requests)
        while (r := queue.pop()) is not None:
            if r.restore:  # as the engine: traffic only, nothing to do here
                run.restored.append((where, (r.layer, r.expert)))
                continue
            if cache.start_prefetch(r.layer, r.expert, policy) is None:
                continue
            cache.finish_prefetch(r.layer, r.expert)
            run.prefetched.append((where, (r.layer, r.expert)))

    for s, (info, counts) in enumerate(steps):
        serve(policy.begin_step(info, cache), (s, 0))
        log = []
        for layer in range(L):
            cache.counters.prefetch_dropped += queue.drop_layer(layer)
            c = counts[layer]
            active = c > 0
            hit = active & cache.resident[layer]
            plan = policy.plan_layer(layer, c, cache)
            cache.frozen[layer] = hit
            loaded = []
            load, carry = np.asarray(plan.load, dtype=np.int64), np.asarray(plan.carry, dtype=np.int64)
            for e in np.concatenate([load[active[load]], carry[~active[carry]]]):
                if cache.resident[layer, e] or cache.loading[layer, e]:
                    continue
                if cache.reserve(layer, int(e), policy) is None:
                    continue
                cache.frozen[layer, e] = True
                loaded.append(int(e))
            for e in loaded:
                cache.commit(layer, e)
            on_device = active & cache.resident[layer]
            if plan.host is not None:
                on_device &= ~np.isin(np.arange(E), np.asarray(plan.host, dtype=np.int64))
            cache.counters.hits += int((hit & on_device).sum())
            carried = [e for e in loaded if not active[e]]
            cache.counters.loads += len(loaded) - len(carried)
            cache.counters.carried += len(carried)
            cache.counters.host += int((active & ~on_device).sum())
            cache.counters.bytes_copied += len(loaded)
            cache.frozen[layer] = False
            cache.check()
            log.append(LayerRun(set(np.flatnonzero(on_device).tolist()),
                                set(np.flatnonzero(active & ~on_device).tolist()), [e for e in loaded if active[e]],
                                set(np.flatnonzero(hit & on_device).tolist()),
                                set(np.asarray(plan.substitute, dtype=np.int64).tolist())))
            serve(policy.end_layer(layer, c, cache), (s, layer + 1))
        serve(policy.end_step(info, cache), (s + 1, 0))
        run.layers.append(log)
        run.residency.append(cache.resident.copy())
    return run


def random_steps(L: int, E: int, k: int, n: int, seed: int = 0, gamma: int = 3, cross: bool = True):
    """A prefill then verify steps with random routing (and a cross-layer prediction that is mostly right)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n):
        tokens = 6 if s == 0 else gamma + 1
        ids = np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(tokens)])
        counts = np.zeros((L, E), dtype=np.int64)
        for t in range(tokens):
            for layer in range(L):
                counts[layer, ids[t, layer]] += 1
        signals = {}
        if cross:
            pred = np.full((L, tokens, k), -1, dtype=np.int64)
            pred[:-1] = ids[:, 1:].transpose(1, 0, 2)  # layer l predicts layer l+1's true top-k ...
            flip = rng.random(pred.shape) < 0.3  # ... with 30% of the guesses wrong
            pred[flip & (pred >= 0)] = rng.integers(0, E, int((flip & (pred >= 0)).sum()))
            signals["cross_layer_topk"] = pred
        out.append((StepInfo(s, "prefill" if s == 0 else "verify", tokens, 0 if s == 0 else gamma,
                             signals=signals), counts))
    return out

