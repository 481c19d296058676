"""Fiddler: the most popular experts (offline profile) fill the device once and never move; any other
activated expert runs on the CPU.

Source: efeslab/fiddler (commit 227715bfd6): after the non-expert weights, experts fill the GPU in
descending offline-profiled popularity (a hard-coded list for Mixtral) up to 95% of VRAM; decode runs a
resident expert on the GPU and any other on the CPU (activations go to the CPU, outputs come back). No
prefetch, no eviction. arXiv 2402.07033 (ICLR'25). Related work in MoE-SpAc (not a Table 1 row).

Popularity = the run's warm-up activation counts (signal 'warmup_counts'), ranked over all layers at
once; the cache's capacity replaces "95% of VRAM". Not modelled: Fiddler's prefill, which enumerates all
2^8 CPU/GPU assignments per layer with costs n_tok*7 (CPU) and 70 (copy + GPU) and copies a non-resident
expert in temporarily; the interface copies only into cache slots, and Fiddler's are all taken, so here
prefill misses run on the host too.
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
