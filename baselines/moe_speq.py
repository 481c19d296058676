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
- Memory split (the row, int4_resident=True): the self-draft's INT4 experts live on the device (it drafts
  there), so the full-precision experts that verification runs get what is left of the run's memory:
  capacity - ceil(L E x 4.5/16) slots (Policy.device_slots), at least one layer's E as staging. At Table 1's
  25 % cache the INT4 copies alone exceed the budget, so verification fetches nearly everything it runs. The
  INT4 copies' own placement is not modelled beyond their memory (they are taken as resident, as the draft's
  cost is the dense draft's). int4_resident=False (a variant): the whole budget caches full-precision experts.
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

from baselines._common import INT4_SCALE, DraftLookaheadLRU, self_draft_counts
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

    variants = {"int4_resident=false": "the INT4 draft experts take no device memory: the whole budget caches "
                                       "full-precision experts"}

    def __init__(self, elb: str = "self-draft", int4_resident: bool = True):
        if elb not in ELB_SOURCES:
            raise MoespacError(f"policy {self.name!r}: elb {elb!r} is not one of {', '.join(ELB_SOURCES)}")
        self.elb = elb
        self.int4_resident = bool(int4_resident)
        """The self-draft's INT4 experts occupy device memory (MoE-SpeQ drafts on the device)."""
        """Where the lookahead buffer comes from: the INT4 self-draft's routing ('self-draft') or the previous
        target forward's ('previous', the stand-in for traces without the self-draft signal)."""
        if elb == "previous":
            self.requires = ()
            self.stand_in = DraftLookaheadLRU.stand_in

    def device_slots(self, topology, capacity):
        if not self.int4_resident:
            return capacity
        int4 = math.ceil(topology.num_layers * topology.num_experts * INT4_SCALE)
        return max(capacity - int4, min(topology.num_experts, capacity))

    def copy_budget(self, step) -> int:
        """Phase II: copies the link completes while the draft runs."""
        t_io = self.ctx.costs.t_io
        n = self.ctx.capacity if t_io <= 0 else math.floor(self.draft_time(step) / t_io * (1 + 1e-9))
        return min(n, self.ctx.capacity)

    def buffer(self, prev_counts: np.ndarray, step) -> np.ndarray:
        """The ELB as counts [L, E]: tokens of the lookahead routed to each expert."""
        if self.elb == "previous":
            return prev_counts
        return self_draft_counts(step, prev_counts.shape)

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
        return {"elb": self.elb, "full_precision_slots": self.ctx.capacity}
