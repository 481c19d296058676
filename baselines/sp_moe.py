"""SP-MoE: while the draft model runs, predict the experts the verification pass will need and prefetch
them for the first L* layers, L* the largest L with L*k*t_io <= T_draft; an LRU cache holds them.

Stand-in: the prediction is the target's own routers over the drafted tokens with INT4 experts (signal
'self_draft_topk'), not the draft's hidden states through the target's gates. MoE-SpAc Table 1 row "SP-MoE".

Provenance and upstream details: docs/baselines.md#sp-moe.
"""

from __future__ import annotations

import math

import numpy as np

from baselines._common import DraftLookaheadLRU, self_draft_counts
from moespac.errors import MoespacError


PREDICTORS = ("draft-gates", "previous")


class SPMoE(DraftLookaheadLRU):
    name = "sp-moe"
    lossless = True
    needs_draft = True
    requires = ("self_draft_topk",)  # () with predictor=previous (set per instance)
    source = "Chen et al., SP-MoE, arXiv 2510.10302 (no public code); MoE-SpAc Table 1"
    stand_in = ("the target's routers over the drafted tokens (INT4 self-draft pass) stand in for the draft's "
                "hidden states through the target's gates")
    variants = {"predictor=previous": "the previous target forward's routing predicts (traces without the "
                                      "self-draft signal; approaches LRU)"}

    def __init__(self, predictor: str = "draft-gates"):
        if predictor not in PREDICTORS:
            raise MoespacError(f"policy {self.name!r}: predictor {predictor!r} is not one of {', '.join(PREDICTORS)}")
        self.predictor = predictor
        """What names the verification's experts: the draft phase's routing ('draft-gates') or the previous
        target forward's ('previous')."""
        if predictor == "previous":
            self.requires = ()
            self.stand_in = DraftLookaheadLRU.stand_in

    def cutoff(self, step) -> int:
        """L*: layers whose k experts can be copied while the draft runs (and fit the cache)."""
        L, k = self.ctx.topology.num_layers, self.ctx.topology.top_k
        t_io = self.ctx.costs.t_io
        by_time = L if t_io <= 0 else math.floor(self.draft_time(step) / (k * t_io) * (1 + 1e-9))
        return max(min(L, by_time, self.ctx.capacity // k), 0)

    def lookahead(self, prev_counts, step, cache):
        L, k = self.ctx.topology.num_layers, self.ctx.topology.top_k
        counts = prev_counts if self.predictor == "previous" else self_draft_counts(step, prev_counts.shape)
        wanted = []
        for layer in range(self.cutoff(step)):
            top = np.argsort(-counts[layer], kind="stable")[:k]
            wanted += [(layer, int(e), float(L - layer)) for e in top if counts[layer, e] > 0]
        return wanted

    def describe(self) -> dict:
        return {"cutoff_layers": self.cutoff(self.step) if self.step is not None else 0}
