"""Pieces several baselines share: static masks, per-layer slot budgets, an LRU that can be told about
prefetches, and the stand-in lookahead of the speculative-decoding baselines.

Not a policy module (the registry skips files starting with '_'); every function is pure numpy.
"""

from __future__ import annotations

import numpy as np

from baselines.lru import LRU
from moespac.errors import MoespacError
from moespac.policy import LayerPlan, Prefetch, StepInfo, VictimKeys


INT4_SCALE = 4.5 / 16
"""Bytes of an INT4 expert relative to a 16-bit one: 4 bits a weight plus a 16-bit scale and zero per 64 weights
(Fate_open's quantizer.py: asymmetric, group 64; MoE-SpeQ's GPTQ at group 128 is a little smaller)."""


def missing(layer: int, counts: np.ndarray, cache) -> np.ndarray:
    """Activated experts of `layer` that are not resident: what an on-demand loader loads."""
    active = np.flatnonzero(counts)
    return active[~cache.resident[layer, active]]


def top_mask(scores: np.ndarray, n: int) -> np.ndarray:
    """The n highest entries of `scores` as a bool mask of its shape; ties go to the lower flat index."""
    flat = np.asarray(scores, dtype=np.float64).ravel()
    mask = np.zeros(flat.size, dtype=bool)
    mask[np.argsort(-flat, kind="stable")[:max(n, 0)]] = True
    return mask.reshape(np.shape(scores))


def layer_mask(num_layers: int, num_experts: int, layers) -> np.ndarray:
    """Whole layers resident: bool [L, E] with every expert of `layers` set."""
    mask = np.zeros((num_layers, num_experts), dtype=bool)
    mask[list(layers)] = True
    return mask


def apportion(weights: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Split `total` slots over layers in proportion to `weights` (largest remainder), at most `cap` each."""
    weights = np.asarray(weights, dtype=np.float64)
    out = np.zeros(len(weights), dtype=np.int64)
    total = min(total, cap * len(weights))
    while (left := total - int(out.sum())) > 0:  # layers that reach the cap hand their share on
        open_ = out < cap
        share = left * np.where(open_, weights, 0.0) / weights[open_].sum()
        add = np.minimum(np.floor(share).astype(np.int64), cap - out)
        frac = np.where(open_ & (out + add < cap), share - np.floor(share), -1.0)
        for i in np.argsort(-frac, kind="stable")[:left - int(add.sum())]:
            add[i] += frac[i] >= 0
        out += add
    return out


def layer_cap(ctx) -> int:
    """Most experts one layer may hold: E, or the run's per_layer_capacity."""
    E = ctx.topology.num_experts
    return E if ctx.per_layer_capacity is None else min(E, ctx.per_layer_capacity)


def uniform_budgets(ctx, slots_per_layer: int | None = None) -> np.ndarray:
    """Equal per-layer slot budgets: `slots_per_layer` if given (it must fit), else capacity // L."""
    L = ctx.topology.num_layers
    if slots_per_layer is None:
        return np.full(L, min(ctx.capacity // L, layer_cap(ctx)), dtype=np.int64)
    if slots_per_layer * L > ctx.capacity or slots_per_layer > layer_cap(ctx):
        raise MoespacError(f"slots_per_layer={slots_per_layer} x {L} layers does not fit the cache "
                           f"({ctx.capacity} slots, at most {layer_cap(ctx)} per layer)")
    return np.full(L, slots_per_layer, dtype=np.int64)


def budget_layer(candidates: np.ndarray, cache, budgets: np.ndarray, fallback_layer: int) -> int | None:
    """Which layer gives up a slot under per-layer budgets in a shared pool.

    A layer at its budget evicts one of its own experts, or gets no slot (None: the expert runs on the
    host) when all of them are in use. A layer under budget takes the slot back from the layer furthest
    over its budget (one that borrowed free slots earlier).
    """
    req = getattr(cache, "requesting", None)
    layer = req[0] if req is not None else fallback_layer
    occupancy = getattr(cache, "occupied", None)  # ExpertCache: resident + in flight, per layer
    if occupancy is None:
        occupancy = cache.resident.sum(axis=1)
    if occupancy[layer] >= budgets[layer]:
        return int(layer) if candidates[layer].any() else None
    has = candidates.any(axis=1)
    if not has.any():
        return None
    over = np.where(has, occupancy - budgets, np.iinfo(np.int64).min)
    return int(np.argmax(over))


def next_layer_prediction(step: StepInfo | None, layer: int, num_experts: int, policy_name: str) -> np.ndarray:
    """Tokens predicting each expert of layer+1 from the recorded cross-layer router (int [E])."""
    cross = None if step is None else step.signals.get("cross_layer_topk")
    if cross is None:
        raise MoespacError(f"policy {policy_name!r} needs StepInfo.signals['cross_layer_topk'] "
                           f"(int [L, tokens, k]) on every step; this step has none")
    ids = np.asarray(cross[layer]).ravel()
    return np.bincount(ids[ids >= 0].astype(np.int64), minlength=num_experts)


def ranked_prediction(step: StepInfo | None, layer: int, num_experts: int, policy_name: str):
    """Layer layer+1's predicted experts, most-predicted first (ties: lower id), and the votes [E] they got."""
    votes = next_layer_prediction(step, layer, num_experts, policy_name)
    order = np.argsort(-votes, kind="stable")
    return order[votes[order] > 0], votes


def self_draft_counts(step: StepInfo, shape: tuple[int, int]) -> np.ndarray:
    """Counts [L, E] of the self-draft pass's routing over this step's drafted tokens (signal 'self_draft_topk',
    int [L, tokens, k], -1 where it ran no token); zeros where the step has none (prefill: nothing drafted)."""
    rows = step.signals.get("self_draft_topk")
    L, E = shape
    if rows is None:
        return np.zeros((L, E), dtype=np.int64)
    ids = np.asarray(rows, dtype=np.int64)
    flat = (np.arange(L)[:, None, None] * E + ids)[ids >= 0]
    return np.bincount(flat, minlength=L * E).reshape(L, E)


class PrefetchLRU(LRU):
    """LRU whose prefetched experts count as just used, so the next prefetch does not evict them."""

    def touch(self, keys) -> None:
        self.clock += 1  # newer than every use so far: the batch's own prefetches never evict each other
        for layer, expert in keys:
            self.last_use[layer, expert] = self.clock


class DraftLookaheadLRU(PrefetchLRU):
    """Shared by SP-MoE and MoE-SpeQ: an LRU cache plus prefetches issued while the draft runs.

    Both systems read the experts the verification will need from the draft phase (SP-MoE: draft hidden states
    through the target's gates; MoE-SpeQ: a quantised self-draft). Their rows read the self-draft pass's routing
    of the drafted tokens (`self_draft_counts`); for traces without it, the variants' prediction is the previous
    target forward's activation counts per layer ("the last target hidden state as a proxy",
    spec/baselines.md), the stand-in below. Subclasses choose which predicted entries to fetch, from
    `lookahead(prev_counts, step, cache)` -> [(layer, expert, priority)].
    """

    needs_draft = True
    stand_in = ("the previous target forward's routing stands in for the draft-side expert prediction (our "
                "draft is dense, with no mapping to the target's routers)")

    def reset(self, ctx):
        placement = super().reset(ctx)
        self.step_counts = np.zeros((ctx.topology.num_layers, ctx.topology.num_experts), dtype=np.int64)
        self.prev_counts = self.step_counts.copy()
        self.step = None
        return placement

    def draft_time(self, step: StepInfo) -> float:
        """Seconds the draft runs in this step: the window the copy link has before verification."""
        return step.gamma * self.ctx.costs.t_draft

    def begin_step(self, step, cache) -> list[Prefetch]:
        self.step = step
        if self.step_counts.any():
            self.prev_counts, self.step_counts = self.step_counts, np.zeros_like(self.step_counts)
        wanted = self.lookahead(self.prev_counts, step, cache)
        self.touch((l, e) for l, e, _ in wanted)
        return [Prefetch(l, e, p) for l, e, p in wanted if not cache.resident[l, e]]

    def lookahead(self, prev_counts: np.ndarray, step: StepInfo, cache) -> list[tuple[int, int, float]]:
        raise NotImplementedError

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.step_counts[layer] = counts
        return super().plan_layer(layer, counts, cache)


class StreamedLayers(LRU):
    """Whole layers resident in layer order; every other expert is loaded when used and dropped after.

    Shared by HF Accelerate and vLLM `--cpu-offload-gb`, which differ in which end of the model stays on the
    device and in what crosses the link (Accelerate copies whole fused layers, vLLM reads routed experts).
    The interface has no "drop now", so offloaded experts go through a staging area (the slots not given to
    whole layers) whose victim is the least recently used staged expert: the staging
    then holds only the latest loads, which by the next step belong to other layers. (Evicting the most
    recently loaded one instead would pin the first loads forever, i.e. act as a cache.) Placed experts are
    never victims. Here only routed experts cross the link; a system that moves whole layers adds the rest
    (Accelerate: LayerPlan.carry).
    """

    keep_first_layers = True  # which end of the model is resident

    def __init__(self, staging: int | None = None):
        if staging is not None and staging < 0:
            raise MoespacError(f"policy {self.name!r}: staging must be >= 0, got {staging}")
        self.staging = staging
        """Slots kept for on-demand copies; default one layer's experts (the largest layer)."""

    def reset(self, ctx):
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        staging = self.staging if self.staging is not None else min(E, ctx.capacity)
        n = L if ctx.capacity >= L * E else max(ctx.capacity - staging, 0) // E
        layers = range(n) if self.keep_first_layers else range(L - n, L)
        self.placed = layer_mask(L, E, layers)
        self.placed_layers = n
        return self.placed.copy()

    def victim(self, candidates, cache):
        return super().victim(candidates & ~self.placed, cache)

    def victim_keys(self, cache):
        return VictimKeys(self.last_use, exclude=self.placed)

    def describe(self) -> dict:
        return {"resident_layers": self.placed_layers}
