"""MoE-SpeQ: drafting fills an Expert Lookahead Buffer (ELB) of (layer, expert, confidence); prefetch runs
in three phases: (I) ELB entries already resident are kept, (II) the highest-confidence missing entries
are copied during drafting within the link's budget, (III) after drafting every remaining miss is
fetched.

Source: paper only (no public code found), Wang et al., "MoE-SpeQ: Speculative Quantized Decoding with
Proactive Expert Prefetching and Offloading for Mixture-of-Experts", arXiv 2511.14102 (abstract and a
third-party summary); MoE-SpAc Table 1 row "MoE-SpeQ".
- ELB stand-in: MoE-SpeQ drafts with the target itself (INT4 experts), so drafting reveals the target's
  routing. Our draft is dense, so the ELB is the previous target forward's routing: confidence of
  (l, e) = share of that forward's tokens routed to e in layer l (baselines/_common.DraftLookaheadLRU).
- Phase I: resident ELB entries are marked as just used (LRU) so phase II does not evict them.
  Phase II: missing entries in descending confidence, as many as floor(T_draft / t_io) copies
  (T_draft = gamma * t_draft), priority = confidence. Phase III: what is still missing when a layer
  starts is loaded on demand (plan_layer).
- Cache: LRU (the paper's "cache saturation" rule is not specified further). All compute on the device.
Not modelled: the amortisation governor choosing the draft length (the run fixes gamma), token
reordering in verification, and the INT4 draft's own cost.
"""

from __future__ import annotations

import math

import numpy as np

from baselines._common import DraftLookaheadLRU


class MoESpeQ(DraftLookaheadLRU):
    name = "moe-speq"
    lossless = True
    needs_draft = True
    requires = ()
    source = "Wang et al., MoE-SpeQ, arXiv 2511.14102 (no public code); MoE-SpAc Table 1"

    def copy_budget(self, step) -> int:
        """Phase II: copies the link completes while the draft runs."""
        t_io = self.ctx.costs.t_io
        n = self.ctx.capacity if t_io <= 0 else math.floor(self.draft_time(step) / t_io * (1 + 1e-9))
        return min(n, self.ctx.capacity)

    def lookahead(self, prev_counts, step, cache):
        tokens = prev_counts.sum(axis=1, keepdims=True) / self.ctx.topology.top_k
        confidence = np.divide(prev_counts, tokens, out=np.zeros(prev_counts.shape), where=tokens > 0)
        flat = np.flatnonzero(confidence > 0)
        flat = flat[np.argsort(-confidence.ravel()[flat], kind="stable")]
        keys = [divmod(int(f), prev_counts.shape[1]) for f in flat]
        resident = cache.resident
        hits = [(l, e) for l, e in keys if resident[l, e]]  # phase I
        fetch = [(l, e) for l, e in keys if not resident[l, e]][:self.copy_budget(step)]  # phase II
        return [(l, e, float(confidence[l, e])) for l, e in hits + fetch]
