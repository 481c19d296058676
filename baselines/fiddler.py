"""Fiddler: the most popular experts (offline profile) fill the device once and never move; any other
activated expert runs on the CPU.

Popularity is the run's warm-up activation counts (signal 'warmup_counts'), ranked over all layers at once;
the cache's capacity replaces "95% of VRAM". Related work in MoE-SpAc (not a Table 1 row).

Provenance and upstream details: docs/baselines.md#fiddler.
"""

from __future__ import annotations

from baselines._common import top_mask
from moespac.policy import Policy, PolicyContext


class Fiddler(Policy):
    name = "fiddler"
    lossless = True
    needs_draft = False
    requires = ("warmup_counts",)
    source = "efeslab/fiddler (227715bfd6); arXiv 2402.07033"

    def reset(self, ctx: PolicyContext):
        super().reset(ctx)
        return top_mask(ctx.warmup_counts, ctx.capacity)
