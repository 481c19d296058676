"""SP-MoE: while the draft model runs, predict the experts the verification pass will need and prefetch
them for the first L* layers, L* the largest L with L*k*t_io <= T_draft; an LRU cache holds them.

Source: paper only (no public code found), Chen et al., "SP-MoE: Speculative Decoding and Prefetching for
Accelerating MoE-based Model Inference", arXiv 2510.10302 (abstract and a third-party reproduction);
MoE-SpAc Table 1 row "SP-MoE".
- Cutoff: L* = min(L, floor(T_draft / (k * t_io)), capacity // k), T_draft = gamma * t_draft (the
  paper's memory bound L*k*M_expert <= free VRAM becomes L*k <= capacity). Layers 0..L*-1 get k
  prefetches each, in layer order (earlier layers first). AR steps and prefill (gamma = 0) prefetch none.
- Prediction (the row, predictor=draft-gates): SP-MoE runs the draft's hidden states through the target's
  gates, which needs a draft whose structure matches the target (e.g. Mistral-7B for Mixtral). Our draft
  is a dense model with no such mapping; the draft-phase signal the traces carry is the target's own
  routers over the drafted tokens, with INT4 experts (signal 'self_draft_topk', the engine's self-draft
  pass): per layer, the k experts those tokens name most. That is the stand-in, and it still differs: the
  routers see the target's INT4 hidden states, not the draft's, so it is at least as good a prediction as
  SP-MoE's. predictor=previous (a variant, for traces without the signal): the k experts of each layer most
  used by the previous target forward, which with an LRU cache are mostly still resident, so it
  approaches plain LRU.
- Cache: global LRU (baselines/lru.py); prefetched experts count as just used. Misses load on demand;
  all compute on the device.
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
