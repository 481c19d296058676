"""MoE-SpeQ: drafting fills an Expert Lookahead Buffer (ELB) of (layer, expert, confidence); prefetch runs
in three phases: (I) ELB entries already resident are kept, (II) the highest-confidence missing entries
are copied during drafting within the link's budget, (III) after drafting every remaining miss is
fetched.

Stand-in: the ELB is the routing of an INT4 self-draft pass of the target over the dense draft's tokens (signal
'self_draft_topk'); elb=previous uses the previous target forward's. MoE-SpAc Table 1 row "MoE-SpeQ".

Provenance and upstream details: docs/baselines.md#moe-speq.
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
