"""MoE-SpeQ: drafting fills an Expert Lookahead Buffer (ELB) of (layer, expert, confidence); prefetch runs
in three phases: (I) ELB entries already resident are kept, (II) the highest-confidence missing entries
are copied during drafting within the link's budget, (III) after drafting every remaining miss is
fetched.

Source: paper only (no public code found), Wang et al., "MoE-SpeQ: Speculative Quantized Decoding with
Proactive Expert Prefetching and Offloading for Mixture-of-Experts", arXiv 2511.14102 (abstract and a
third-party summary); MoE-SpAc Table 1 row "MoE-SpeQ".
- ELB: MoE-SpeQ drafts with the target itself, its experts in INT4 (GPTQ, group 128), so the draft's
  routing is the lookahead. The engine runs that self-draft's routing over the drafted tokens (signal
  'self_draft_topk', moespac/engine/selfdraft.py; traces keep it with --self-draft-lookahead): for each
  drafted token and MoE layer, the top-k of the target's router with INT4 experts. Confidence of (l, e) =
  share of the ELB's tokens routed to e in layer l.
- Phase I: resident ELB entries are marked as just used (LRU) so phase II does not evict them.
  Phase II: missing entries in descending confidence, as many as floor(T_draft / t_io) copies
  (T_draft = gamma * t_draft), priority = confidence. Phase III: what is still missing when a layer
  starts is loaded on demand (plan_layer).
- Cache: LRU (the paper's "cache saturation" rule is not specified further). All compute on the device.
- elb=previous: the earlier stand-in (the previous target forward's routing as the ELB), for traces
  recorded without the lookahead.
Not modelled: the self-draft's own tokens, acceptance and cost (the pair's dense draft decides them, and
its time is the copy window), GPTQ's error-compensating rounding (round-to-nearest INT4 instead), the
buffer filling token by token (the simulator hands the whole ELB over at the draft's start), the
amortisation governor choosing the draft length (the run fixes gamma), and token reordering in verification.
"""

from __future__ import annotations

import math

import numpy as np

from baselines._common import DraftLookaheadLRU
from moespac.errors import MoespacError

ELB_SOURCES = ("self-draft", "previous")


class MoESpeQ(DraftLookaheadLRU):
    name = "moe-speq"
    lossless = True
    needs_draft = True
    requires = ("self_draft_topk",)  # () with elb=previous (set per instance)
    source = "Wang et al., MoE-SpeQ, arXiv 2511.14102 (no public code); MoE-SpAc Table 1"
    stand_in = ("the INT4 self-draft routes the dense draft's tokens (round-to-nearest INT4, not GPTQ); the dense "
                "draft's acceptance and cost stand in for the self-draft's")

    def __init__(self, elb: str = "self-draft"):
        if elb not in ELB_SOURCES:
            raise MoespacError(f"policy {self.name!r}: elb {elb!r} is not one of {', '.join(ELB_SOURCES)}")
        self.elb = elb
        """Where the lookahead buffer comes from: the INT4 self-draft's routing ('self-draft') or the previous
        target forward's ('previous', the stand-in for traces without the self-draft signal)."""
        if elb == "previous":
            self.requires = ()
            self.stand_in = DraftLookaheadLRU.stand_in

    def copy_budget(self, step) -> int:
        """Phase II: copies the link completes while the draft runs."""
        t_io = self.ctx.costs.t_io
        n = self.ctx.capacity if t_io <= 0 else math.floor(self.draft_time(step) / t_io * (1 + 1e-9))
        return min(n, self.ctx.capacity)

    def buffer(self, prev_counts: np.ndarray, step) -> np.ndarray:
        """The ELB as counts [L, E]: tokens of the lookahead routed to each expert."""
        if self.elb == "previous":
            return prev_counts
        rows = step.signals.get("self_draft_topk")
        L, E = prev_counts.shape
        if rows is None:  # prefill: nothing drafted yet
            return np.zeros((L, E), dtype=np.int64)
        ids = np.asarray(rows, dtype=np.int64)  # [L, tokens, k], -1 where the self-draft ran no token
        flat = (np.arange(L)[:, None, None] * E + ids)[ids >= 0]
        return np.bincount(flat, minlength=L * E).reshape(L, E)

    def lookahead(self, prev_counts, step, cache):
        counts = self.buffer(prev_counts, step)
        tokens = counts.sum(axis=1, keepdims=True) / self.ctx.topology.top_k
        confidence = np.divide(counts, tokens, out=np.zeros(counts.shape), where=tokens > 0)
        flat = np.flatnonzero(confidence > 0)
        flat = flat[np.argsort(-confidence.ravel()[flat], kind="stable")]
        keys = [divmod(int(f), counts.shape[1]) for f in flat]
        resident = cache.resident
        hits = [(l, e) for l, e in keys if resident[l, e]]  # phase I
        fetch = [(l, e) for l, e in keys if not resident[l, e]][:self.copy_budget(step)]  # phase II
        return [(l, e, float(confidence[l, e])) for l, e in hits + fetch]

    def describe(self) -> dict:
        return {"elb": self.elb}
