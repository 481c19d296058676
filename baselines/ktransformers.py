"""kTransformers (SGLang integration): routed experts live on the CPU except a static set placed on the
GPU by one of four strategies; the CPU skips GPU experts, so each expert runs exactly once.

Strategies: uniform (upstream's default), frequency, front-loading, random. Related work in MoE-SpAc (not a
Table 1 row).

Provenance and upstream details: docs/baselines.md#ktransformers.
"""

from __future__ import annotations

import numpy as np

from baselines._common import top_mask
from moespac.errors import MoespacError
from moespac.policy import Policy, PolicyContext

STRATEGIES = ("uniform", "frequency", "front-loading", "random")


class KTransformers(Policy):
    name = "ktransformers"
    lossless = True
    needs_draft = False
    requires = ()  # 'warmup_counts' when strategy=frequency (set per instance)
    source = "kvcache-ai/ktransformers experts-sched-Tutorial.md (15c624dcae), kt-kernel generate_gpu_experts_masks"

    def __init__(self, strategy: str = "uniform"):
        strategy = str(strategy).replace("_", "-")
        if strategy not in STRATEGIES:
            raise MoespacError(f"policy {self.name!r}: strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        """GPU expert placement: uniform (kTransformers' default), frequency, front-loading or random."""
        if strategy == "frequency":
            self.requires = ("warmup_counts",)

    def reset(self, ctx: PolicyContext):
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        n = ctx.capacity
        if self.strategy == "frequency":
            return top_mask(ctx.warmup_counts, n)
        mask = np.zeros(L * E, dtype=bool)
        if self.strategy == "front-loading":
            mask[:n] = True
        elif self.strategy == "random":
            mask[np.random.default_rng(42).permutation(L * E)[:n]] = True
        else:  # uniform: take positions expert-major, i.e. transpose, fill, transpose back
            return np.arange(L * E).reshape(E, L).T < n
        return mask.reshape(L, E)

    def describe(self) -> dict:
        return {"strategy": self.strategy}
