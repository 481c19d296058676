"""HybriMoE: a per-layer expert cache ranked by a decayed router score (MRS), next-layer prefetch of the
top-scored experts, and a greedy split of each layer's experts between GPU and CPU from both ends of a
hot-to-cold queue.

Stand-in: our traces carry activation counts, not router probabilities, so an expert's score uses its share of
the layer's routing entries. Prefetch is off in the MoE-SpAc Table 1 row "HybriMoE", as upstream runs by default.

Provenance and upstream details: docs/baselines.md#hybrimoe.
"""

from __future__ import annotations

import numpy as np

from baselines._common import budget_layer, missing, uniform_budgets
from moespac.errors import MoespacError
from moespac.policy import LayerPlan, Policy, PolicyContext, Prefetch, UnitCosts


def greedy_split(counts: np.ndarray, resident: np.ndarray, costs: UnitCosts) -> tuple[list[int], list[int]]:
    """HybriMoE's two-ended split of one layer's activated experts: (device experts, host experts)."""
    active = np.flatnonzero(counts)
    ranked = active[np.argsort(-counts[active], kind="stable")]  # ties keep id order
    on = resident[ranked]
    queue = np.concatenate([ranked[on], ranked[~on]])
    # plain Python numbers from here: the loop runs on every layer of every step
    tokens, on, queue = counts[queue].tolist(), resident[queue].tolist(), queue.tolist()
    t_io, t_gpu, t_cpu = costs.t_io, costs.t_gpu, costs.t_cpu
    head, tail = 0, len(queue) - 1  # the GPU takes queue[:head], the CPU queue[tail + 1:]
    gpu_t = cpu_t = io_t = 0.0
    while head <= tail:
        if on[head]:
            io, g = io_t, gpu_t + t_gpu
        else:  # cannot start before its copy, which queues behind the earlier ones
            io = io_t + t_io
            g = max(gpu_t, io) + t_gpu
        c = cpu_t + t_cpu * tokens[tail]
        if g <= c:
            head, gpu_t, io_t = head + 1, g, io
        else:
            tail, cpu_t = tail - 1, c
    return queue[:head], queue[tail + 1:][::-1]


class HybriMoE(Policy):
    name = "hybrimoe"
    lossless = True
    needs_draft = False
    requires = ()
    source = ("PKU-SEC-Lab/HybriMoE ktransformers/operators/experts.py, models/modeling_deepseek.py (508a85b9a4); "
              "arXiv 2504.05897; MoE-SpAc Table 1")
    stand_in = "routing counts of every token stand in for token 0's router probabilities in the MRS score"
    variants = {"prefetch_size=none": "the next layer's top-k experts by score prefetched in decode (upstream's "
                                      "--prefetch_size flag at top_k; off by default)"}

    def __init__(self, alpha: float = 0.5, top_p: int | None = None, slots_per_layer: int | None = None,
                 prefetch_size: int | None = 0):
        if not 0.0 < alpha <= 1.0:
            raise MoespacError(f"policy {self.name!r}: alpha must be in (0, 1], got {alpha}")
        if top_p is not None and top_p < 1:
            raise MoespacError(f"policy {self.name!r}: top_p must be >= 1, got {top_p}")
        for key, v in (("slots_per_layer", slots_per_layer), ("prefetch_size", prefetch_size)):
            if v is not None and v < 0:
                raise MoespacError(f"policy {self.name!r}: {key} must be >= 0, got {v}")
        self.alpha = alpha
        """Weight of the newest router score in the MRS update."""
        self.top_p = top_p
        """Experts per router call whose score is refreshed (the rest only decay); None = 2 top_k, as upstream."""
        self.slots_per_layer = slots_per_layer
        """Cache slots per layer (HybriMoE --cache_size); default capacity // L."""
        self.prefetch_size = prefetch_size
        """Top-scored experts of the next layer to prefetch in decode (HybriMoE --prefetch_size, default 0 = off);
        None = top_k."""

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        self.budgets = uniform_budgets(ctx, self.slots_per_layer)
        self.scores = np.zeros((L, E))
        self.prefetch = ctx.topology.top_k if self.prefetch_size is None else self.prefetch_size
        self.p = 2 * ctx.topology.top_k if self.top_p is None else self.top_p
        self.step = None
        self.layer = 0
        return np.arange(E)[None, :] < self.budgets[:, None]  # experts 0..b-1 of each layer

    def update_scores(self, layer: int, counts: np.ndarray) -> None:
        row = self.scores[layer]
        row *= 1.0 - self.alpha
        # an expert of the top p with no routing entry gains alpha * 0: only the active ones of the top p change
        active = np.flatnonzero(counts)
        if len(active) > self.p:  # the p highest counts, ties to the lower id (a stable sort of all would agree)
            active = active[np.argsort(-counts[active], kind="stable")[:self.p]]
        row[active] += self.alpha * (counts[active] / max(int(counts.sum()), 1))

    def begin_step(self, step, cache):
        self.step = step
        return []

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.layer = layer
        self.update_scores(layer, counts)
        if self.step is not None and self.step.kind == "prefill":
            return LayerPlan(load=missing(layer, counts, cache))
        resident = cache.resident[layer]
        gpu, cpu = greedy_split(counts, resident, self.ctx.costs)
        gpu = np.array(gpu, dtype=np.int64)
        return LayerPlan(load=gpu[~resident[gpu]], host=np.array(cpu, dtype=np.int64))

    def end_layer(self, layer, counts, cache) -> list[Prefetch]:
        nxt = layer + 1
        if (nxt >= self.ctx.topology.num_layers or self.prefetch == 0 or self.step is None
                or self.step.kind == "prefill"):
            return []  # upstream prefetches in decode only
        row = self.scores[nxt]
        top = np.argsort(-row, kind="stable")[:self.prefetch]
        return [Prefetch(nxt, e, p)
                for e, p, on in zip(top.tolist(), row[top].tolist(), cache.resident[nxt, top].tolist())
                if p > 0 and not on]

    def victim(self, candidates, cache):
        layer = budget_layer(candidates, cache, self.budgets, self.layer)
        if layer is None:
            return None
        score = np.where(candidates[layer], self.scores[layer], np.inf)
        return layer, int(np.argmin(score))
