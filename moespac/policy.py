"""The one scheduling interface: MoE-SpAc and every baseline implement it; the real engine and the
simulator drive it the same way.

Per request the driver (engine or simulator, owning an `ExpertCache`) calls `reset(ctx)`, then per forward
`begin_step`, per MoE layer `plan_layer` and `end_layer`, then `end_step`, and `victim` whenever a slot is
needed and none is free; prefetch requests go to one priority queue served by the copy link. Every activated
expert runs exactly once, on the device or the host; policies never touch tensors or clocks.

The driver loop and the queue's rules: docs/internals.md#moespacpolicypy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
from typing import ClassVar, NamedTuple, Protocol

import numpy as np

from moespac.errors import MoespacError

# Signals a trace or a live engine can provide; policies name what they need in `requires`.
SIGNALS = {
    "draft": "speculative decoding with a draft model (verify batches of gamma+1 tokens)",
    "cross_layer_topk": "for layer l, the top-k that layer l+1's router gives on layer l's input hidden state",
    "self_draft_topk": "for each verify token, the top-k of the target's own router when the target runs with INT4 "
                       "experts over the drafted tokens (MoE-SpeQ's self-draft lookahead; -1 where it has none)",
    "warmup_counts": "activation counts [L, E] of a warm-up window (static placements)",
    "future": "the whole request's routing ahead of time (only the simulator has it: offline oracle)",
}


@dataclass(frozen=True)
class Topology:
    """Shape of the routed experts: what a policy schedules."""

    num_layers: int
    """MoE layers (policies index them 0..L-1, dense layers excluded)."""
    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts per token."""

    def __post_init__(self):
        if min(self.num_layers, self.num_experts, self.top_k) < 1 or self.top_k > self.num_experts:
            raise MoespacError(f"invalid topology {self}")


@dataclass(frozen=True)
class UnitCosts:
    """Per-expert unit costs in seconds; from a hardware profile or measured online."""

    t_io: float = 1.0
    """Copy one expert host->device."""
    t_gpu: float = 0.1
    """Run one resident expert on the device (for its batch of tokens)."""
    t_cpu: float = 0.5
    """Run one (token, expert) pair on the host."""
    t_draft: float = 1.0
    """One draft-model token."""
    t_layer: float = 1.0
    """Non-expert time of one target layer (attention etc.)."""


def expert_wall(dev, host, serial: bool):
    """Wall time of a layer's expert phase from its device and host busy times (scalars or arrays): they run
    concurrently, or one after the other when the device is the host CPU."""
    return dev + host if serial else np.maximum(dev, host)


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows before the first step."""

    topology: Topology
    capacity: int
    """Device expert slots in total (0 = nothing fits)."""
    per_layer_capacity: int | None = None
    """If set, each layer may hold at most this many experts (Mixtral-Offloading style partition)."""
    gamma: int = 0
    """Draft length; 0 = autoregressive decoding."""
    batch_size: int = 1
    """Sequences decoded together."""
    costs: UnitCosts = field(default_factory=UnitCosts)
    """Unit costs for cost-aware policies."""
    signals: frozenset[str] = frozenset()
    """Signals this run provides (keys of SIGNALS)."""
    warmup_counts: np.ndarray | None = None
    """[L, E] activation counts of a warm-up window, when `warmup_counts` is provided."""
    history: np.ndarray | None = None
    """[R, L, E] activation counts of R profiled requests that are not replayed (other prompts), one matrix
    per request, when a profiling run is given: MoE-Infinity's offline activation-matrix collection."""


@dataclass(frozen=True)
class StepInfo:
    """One target forward: prefill, a verification of gamma drafts, or one autoregressive token."""

    index: int
    """Step number within the request (prefill = 0)."""
    kind: str
    """'prefill', 'verify' or 'ar'."""
    num_tokens: int
    """Tokens in this forward (verify: batch x (gamma+1))."""
    gamma: int = 0
    """Drafted tokens per sequence in this step."""
    signals: dict = field(default_factory=dict)
    """Per-step signals, e.g. 'cross_layer_topk' or 'self_draft_topk': int [L, num_tokens, k] (-1 where
    undefined)."""


NOTHING = np.zeros(0, dtype=np.int64)
NOTHING.setflags(write=False)  # one shared empty plan field: a plan is made for every layer of every step


@dataclass
class LayerPlan:
    """How one layer's activated experts run."""

    load: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Non-resident experts to load on demand (blocking) and then run on the device."""
    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Non-resident experts copied in with the layer although they do not run now: a system that moves a
    whole fused layer for each forward (HF Accelerate's offload hooks) copies every expert of it. They are
    loaded like `load` (blocking, into slots) and stay resident until evicted."""
    host: np.ndarray | None = None
    """Experts to run on the host. None = every activated expert that is neither resident nor loaded."""
    substitute: np.ndarray = field(default_factory=lambda: NOTHING)
    """Activated, non-resident experts that do not run: a lossy policy runs a resident expert with their tokens
    instead (SpecExp executes its speculated experts, not the routed ones). The simulator charges their tokens as
    device compute of an expert of the same size and counts them as `substituted`; the engine cannot run other
    weights in place of the routed ones, so it runs them on the host (outputs stay exact, its timing is not
    the lossy system's)."""


class Prefetch(NamedTuple):
    """Ask the copy link to make (layer, expert) resident before `layer` next starts. A named tuple, not a
    dataclass: policies hand out thousands per step, and a tuple is several times cheaper to make."""

    layer: int
    expert: int
    priority: float = 0.0
    """Higher is served first; FIFO among equal priorities."""
    restore: bool = False
    """Copy a resident expert's bytes again, changing nothing resident (Fate re-copies each used expert's INT4
    version after it runs). The simulator's link spends the copy on it (counter `restored`); the engine skips
    it, as it skips every request for a resident expert (its slots keep the dequantised weights)."""


class VictimKeys(NamedTuple):
    """A policy's eviction order (Policy.victim_keys)."""

    keys: np.ndarray
    """int64 [L, E]: the victim is the evictable expert of least key."""
    largest: bool = False
    """Greatest key first instead."""
    exclude: np.ndarray | None = None
    """bool [L, E]: experts never evicted (None: none)."""


class CacheView(Protocol):
    """Read-only view of device residency that policies may consult."""

    resident: np.ndarray  # bool [L, E]
    capacity: int
    per_layer_capacity: int | None
    requesting: tuple[int, int] | None  # during victim(): the (layer, expert) that needs the slot

    def free_slots(self, layer: int | None = None) -> int: ...


class Policy:
    """Base class: defaults are 'compute misses on the host, never prefetch, evict nothing'."""

    name: ClassVar[str] = "base"
    lossless: ClassVar[bool] = True
    """Greedy output equals the unmodified model's."""
    needs_draft: ClassVar[bool] = False
    """Only meaningful with speculative decoding."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Signals (keys of SIGNALS) the policy cannot run without."""
    source: ClassVar[str] = ""
    """Paper, repository and commit the behaviour follows."""
    stand_in: ClassVar[str] = ""
    """One line on what replaces the system's own mechanism here, when something does ('' = nothing)."""
    variants: ClassVar[dict[str, str]] = {}
    """Other settings of the system worth a row of their own: spec options -> what they change. The catalogue's
    row runs the defaults (`moespac policy list` shows both)."""
    profiled: ClassVar[bool] = False
    """Reads a profiling run of other requests (ctx.warmup_counts, ctx.history) when the driver has one; a
    driver then gives it one (see `uses_profile`)."""
    transfer_scale: float = 1.0
    """Bytes of one expert copy relative to a full-precision one; < 1 = compressed, lossy copies (Fate's
    INT4 with its scales: 4.5/16). The simulator scales copy bytes and time by it; the engine copies INT4
    (moespac/engine/store.py)."""

    def uses_profile(self) -> bool:
        """Whether this instance reads profiling data (a static placement, an activation-matrix collection)."""
        return self.profiled or "warmup_counts" in self.requires

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        """Start a request; return the initial residency (bool [L, E], at most ctx.capacity True)."""
        check_signals(self, ctx.signals)
        self.ctx = ctx
        return np.zeros((ctx.topology.num_layers, ctx.topology.num_experts), dtype=bool)

    def begin_step(self, step: StepInfo, cache: CacheView) -> list[Prefetch]:
        """Before the draft phase of a step (the copy link is idle while the draft runs)."""
        return []

    def plan_layer(self, layer: int, counts: np.ndarray, cache: CacheView) -> LayerPlan:
        """Decide where `layer`'s activated experts run; counts[e] = routing entries that name e."""
        return LayerPlan()

    def end_layer(self, layer: int, counts: np.ndarray, cache: CacheView) -> list[Prefetch]:
        """After `layer` computed: observe and ask for prefetches."""
        return []

    def end_step(self, step: StepInfo, cache: CacheView) -> list[Prefetch]:
        """After the whole forward."""
        return []

    def victim(self, candidates: np.ndarray, cache: CacheView) -> tuple[int, int] | None:
        """Choose a resident expert to evict among `candidates` (bool [L, E]); None refuses the load."""
        return None

    def victim_keys(self, cache: CacheView) -> VictimKeys | None:
        """When victim() always evicts the candidate of least key (greatest with `largest`), ties to the lower flat
        index, its keys at this moment; the cache then chooses every victim of a reservation itself, in compiled
        code (moespac/cache_kernels.py), without calling victim(). None = ask victim() each time.
        Used only where the class that defines it also defines victim() (`keyed_victims`), so a subclass that
        changes victim() is never bypassed. What victim() records about its victims, `victims_taken` records."""
        return None

    def victims_taken(self, flat: np.ndarray) -> None:
        """The cache evicted these experts (flat ids, layer * E + expert, in order), chosen by `victim_keys`: record
        what victim() would have recorded choosing them (e.g. an in-cache count that restarts)."""

    def device_slots(self, topology: Topology, capacity: int) -> int:
        """Device expert slots the system makes of the run's `capacity` (full-precision slots): fewer for one that
        streams experts through fixed buffers (SpecExp), more for one that caches compressed experts (Fate's
        INT4; the simulator caps it at every expert). The engine dequantises into full-precision slots, so it
        holds at most `capacity`."""
        return capacity

    def describe(self) -> dict:
        """Per-request statistics the policy wants in the result record (e.g. tau per layer)."""
        return {}

    def offline_plans(self, topology: Topology, capacity: int, per_layer_capacity: int | None) -> list["Policy"]:
        """Complete plans the simulator replays, keeping the fastest per request. Only a policy that knows the
        whole request (the offline oracle) can evaluate its options before committing; others are one plan."""
        return [self]


def _defined_by(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in vars(k))


def keyed_victims(policy: Policy) -> bool:
    """Whether `policy.victim_keys` stands for its victim(): both come from the same class."""
    return _keyed_victims(type(policy))


@functools.cache  # asked on every reservation that needs a victim; a class's methods do not change
def _keyed_victims(cls: type) -> bool:
    return _defined_by(cls, "victim_keys") is _defined_by(cls, "victim") is not Policy


def check_signals(policy: Policy, available) -> None:
    """Fail with the name of the first signal the policy needs and the run does not provide."""
    if policy.needs_draft and "draft" not in available:
        raise MoespacError(f"policy {policy.name!r} needs signal 'draft' ({SIGNALS['draft']}), which this run lacks")
    for s in policy.requires:
        if s not in available:
            raise MoespacError(f"policy {policy.name!r} needs signal {s!r} ({SIGNALS.get(s, '?')}), "
                               "which this run lacks")
