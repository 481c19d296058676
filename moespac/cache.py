"""Device expert-cache bookkeeping and the prefetch queue, shared by the real engine and the simulator.

Only bookkeeping lives here (which (layer, expert) occupies which slot, who may be evicted, counters);
the engine adds real copies, the simulator adds simulated time. Loading is two-phase so an in-flight copy
is neither resident nor free: `reserve` (evicts a victim if needed) then `commit`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, fields

import numpy as np

from moespac.errors import MoespacError, check_unit_interval
from moespac.cache_kernels import reserve_keyed
from moespac.policy import Policy, Prefetch, Topology, keyed_victims


@dataclass
class CacheCounters:
    """Per-request expert-cache statistics (activations are (layer, expert) pairs per forward)."""

    hits: int = 0
    """Activated experts that were resident when their layer started."""
    loads: int = 0
    """Activated experts loaded on demand (blocking) and then run on the device."""
    host: int = 0
    """Activated experts computed on the host."""
    substituted: int = 0
    """Activated experts that did not run: a lossy policy ran a resident expert with their tokens instead
    (LayerPlan.substitute; simulator only)."""
    prefetched: int = 0
    """Prefetch copies completed."""
    prefetch_dropped: int = 0
    """Prefetch requests dropped because their layer started first."""
    prefetch_refused: int = 0
    """Prefetch requests refused (no slot and the policy chose no victim)."""
    evictions: int = 0
    """Resident experts evicted to make room."""
    restored: int = 0
    """Copies of resident experts that changed nothing resident (Prefetch.restore; simulator only)."""
    carried: int = 0
    """Experts copied in with their layer although not activated (LayerPlan.carry: a whole fused layer moved)."""
    bytes_copied: int = 0
    """Bytes moved host -> device (prefetches, on-demand loads and carried experts)."""

    @property
    def activations(self) -> int:
        return self.hits + self.loads + self.host + self.substituted

    def hit_rate(self) -> float:
        """Share of activated experts found resident (the paper's GPU cache hit rate)."""
        return self.hits / self.activations if self.activations else 0.0

    def host_share(self) -> float:
        """Share of activated experts computed on the host."""
        return self.host / self.activations if self.activations else 0.0

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(activations=self.activations, hit_rate=self.hit_rate(), host_share=self.host_share())
        return d


COUNTERS = tuple(f.name for f in fields(CacheCounters))
"""The counters every record and summary carries, in one order (the engine's, the simulator's, the bench's)."""


@dataclass(frozen=True, kw_only=True)
class CacheSize:
    """The device expert cache a run asks for. The engine's, the bench's and the simulator's configs are each one
    of these (they inherit its fields), so the three size, check and document a cache alike."""

    cache_ratio: float | None = None
    """Device expert slots / all routed experts (MoE layers x experts), in [0, 1]; None = as many as fit (the
    memory plan's count in the engine, the profile's device memory in the simulator)."""
    cache_gib: float | None = None
    """Device expert cache in GiB (overrides cache_ratio)."""
    per_layer: bool = False
    """Partition the slots evenly per layer (capacity // layers each) instead of one global pool (the authors'
    code is global)."""

    def __post_init__(self):
        check_unit_interval("cache_ratio", self.cache_ratio)
        if self.cache_gib is not None and not self.cache_gib >= 0:
            raise MoespacError(f"cache_gib {self.cache_gib} must be >= 0")

    def requested_slots(self, total: int, expert_bytes: int) -> int | None:
        """Slots this asks for of `total` routed experts of `expert_bytes` each: cache_gib of them (it wins), else
        cache_ratio of all, at most `total`; None when it asks for neither (the memory plan or the profile's device
        decides). The one sizing rule of the engine, its memory plan and the simulator."""
        if self.cache_gib is not None:
            return min(int(self.cache_gib * 2**30 // max(expert_bytes, 1)), total)
        if self.cache_ratio is not None:
            return min(round(self.cache_ratio * total), total)
        return None

    def per_layer_capacity(self, capacity: int, num_layers: int) -> int | None:
        """Each layer's share of `capacity` slots when partitioned per layer, else None (one global pool)."""
        return capacity // num_layers if self.per_layer else None


class ExpertCache:
    """Residency map over a pool of `capacity` slots, global across layers or partitioned per layer."""

    def __init__(self, topology: Topology, capacity: int, per_layer_capacity: int | None = None,
                 expert_bytes: int = 0):
        total = topology.num_layers * topology.num_experts
        if not 0 <= capacity <= total:
            raise MoespacError(f"cache capacity {capacity} outside [0, {total}] expert slots")
        if per_layer_capacity is not None and not 0 <= per_layer_capacity <= topology.num_experts:
            raise MoespacError(f"per_layer_capacity {per_layer_capacity} outside [0, {topology.num_experts}]")
        self.topology = topology
        self.capacity = capacity
        self.per_layer_capacity = per_layer_capacity
        self.expert_bytes = expert_bytes
        L, E = topology.num_layers, topology.num_experts
        self.resident = np.zeros((L, E), dtype=bool)
        self.loading = np.zeros((L, E), dtype=bool)
        self.frozen = np.zeros((L, E), dtype=bool)
        self.slot_of = np.full((L, E), -1, dtype=np.int64)
        self.expert_at = np.full(capacity, -1, dtype=np.int64)  # flat id (layer * E + expert) in each slot; -1 free
        self.occupied = np.zeros(L, dtype=np.int64)  # resident + loading, per layer
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack of free slots: _free[:_nfree]
        self._nfree = capacity
        self._exclude_none = np.zeros((L, E), dtype=bool)  # VictimKeys.exclude when a policy gives none
        self.counters = CacheCounters()
        self.requesting: tuple[int, int] | None = None  # the (layer, expert) a slot is sought for, during policy.victim

    # -- queries ---------------------------------------------------------------------------------
    def free_slots(self, layer: int | None = None) -> int:
        free = self._nfree
        if layer is not None and self.per_layer_capacity is not None:
            free = min(free, self.per_layer_capacity - int(self.occupied[layer]))
        return max(free, 0)

    def evictable(self, layer: int) -> np.ndarray:
        """Residents that may be evicted to make room for an expert of `layer`."""
        cand = np.greater(self.resident, self.frozen)  # resident & ~frozen in one numpy call
        if self.per_layer_capacity is not None and self.occupied[layer] >= self.per_layer_capacity:
            only = np.zeros_like(cand)
            only[layer] = cand[layer]
            cand = only
        return cand

    # -- mutation --------------------------------------------------------------------------------
    def place(self, mask: np.ndarray) -> list[tuple[int, int, int]]:
        """Initial placement; returns (layer, expert, slot) for the driver to fill."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != self.resident.shape:
            raise MoespacError(f"placement shape {mask.shape} != {self.resident.shape}")
        if mask.sum() > self.capacity:
            raise MoespacError(f"placement of {int(mask.sum())} experts exceeds the cache capacity {self.capacity}")
        if self.per_layer_capacity is not None and (mask.sum(1) > self.per_layer_capacity).any():
            raise MoespacError(f"placement exceeds per_layer_capacity {self.per_layer_capacity}")
        out = []
        for layer, expert in zip(*np.nonzero(mask)):
            slot = self.reserve(int(layer), int(expert), policy=None)
            self.commit(int(layer), int(expert))
            out.append((int(layer), int(expert), slot))
        self.counters = CacheCounters()  # placement happens before the request: not counted
        return out

    def reserve(self, layer: int, expert: int, policy: Policy | None) -> int | None:
        """Take a slot for (layer, expert), evicting the policy's victim if needed; None if refused."""
        if self.free_slots(layer) == 0 and (order := self._victim_order(policy)) is not None:
            got, slots = self._reserve_keyed(layer, np.array([expert], dtype=np.int64), policy, order)
            return int(slots[0]) if len(got) else None
        if self.resident[layer, expert] or self.loading[layer, expert]:
            raise MoespacError(f"expert ({layer}, {expert}) is already resident or loading")
        if self.free_slots(layer) == 0:
            cand = self.evictable(layer)
            if policy is None or not np.count_nonzero(cand):  # cheaper than ndarray.any() here
                return None
            self.requesting = (layer, expert)  # per-layer policies evict within the requesting layer
            key = policy.victim(cand, self)
            self.requesting = None
            if key is None:
                return None
            vl, ve = int(key[0]), int(key[1])
            if not cand[vl, ve]:
                raise MoespacError(f"policy {policy.name!r} chose victim ({vl}, {ve}), which is not evictable")
            self.evict(vl, ve)
        self._nfree -= 1
        slot = int(self._free[self._nfree])
        self.loading[layer, expert] = True
        self.slot_of[layer, expert] = slot
        self.expert_at[slot] = layer * self.resident.shape[1] + expert
        self.occupied[layer] += 1
        return slot

    def on_demand(self, layer: int, plan, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A layer plan's two on-demand batches, in the order both drivers reserve them: the experts it loads that
        run, then those it carries that do not (LayerPlan.carry), each absent when the layer starts, in the plan's
        order (a repeated id is refused by reserve_many). On every layer of every step: index, do not scan."""
        load = np.asarray(plan.load, dtype=np.int64)
        if load.size:
            load = load[active[load] & ~self.resident[layer, load] & ~self.loading[layer, load]]
        carry = np.asarray(plan.carry, dtype=np.int64)
        if carry.size:
            carry = carry[~active[carry] & ~self.resident[layer, carry] & ~self.loading[layer, carry]]
        return load, carry

    def reserve_many(self, layer: int, experts, policy: Policy | None) -> tuple[np.ndarray, np.ndarray]:
        """reserve() each of `experts` in turn; returns (experts that got a slot, their slots), int64. A policy
        that gives its eviction order as keys (Policy.victim_keys) has the whole batch done in one compiled call,
        with the same slots, victims and counters."""
        ex = np.asarray(experts, dtype=np.int64).ravel()
        if len(ex) > self._nfree and (order := self._victim_order(policy)) is not None:
            return self._reserve_keyed(layer, ex, policy, order)
        pairs = [(e, slot) for e in ex.tolist() if (slot := self.reserve(layer, e, policy)) is not None]
        return np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)

    def _victim_order(self, policy: Policy | None):
        """The policy's victim keys where one compiled call may choose the victims; None: ask its victim() each time.
        A per-layer partition restricts the candidates to one layer, which the policies' own victim() handles."""
        if policy is None or self.per_layer_capacity is not None or not keyed_victims(policy):
            return None
        return policy.victim_keys(self)

    def _reserve_keyed(self, layer: int, ex: np.ndarray, policy: Policy, order) -> tuple[np.ndarray, np.ndarray]:
        keys = np.ascontiguousarray(order.keys, dtype=np.int64)
        exclude = self._exclude_none if order.exclude is None else np.ascontiguousarray(order.exclude, dtype=bool)
        if keys.shape != self.resident.shape or exclude.shape != self.resident.shape:
            raise MoespacError(f"policy {policy.name!r}: victim keys of shape {keys.shape} for a cache of "
                               f"{self.resident.shape}")
        slots, victims = np.empty(len(ex), dtype=np.int64), np.empty(len(ex), dtype=np.int64)
        got, self._nfree, evicted = reserve_keyed(self.resident, self.loading, self.frozen, exclude, self.slot_of,
                                                  self.expert_at, self.occupied, self._free, self._nfree, layer, ex,
                                                  keys, bool(order.largest), slots, victims)
        if got < 0:
            raise MoespacError(f"expert ({layer}, {int(ex[-1 - got])}) is already resident or loading")
        if evicted:
            self.counters.evictions += evicted
            policy.victims_taken(victims[:evicted])
        return ex[:got], slots[:got]

    def commit_many(self, layer: int, experts) -> None:
        """commit() each of `experts`."""
        experts = np.asarray(experts, dtype=np.int64)
        self.loading[layer, experts] = False
        self.resident[layer, experts] = True

    def start_prefetch(self, layer: int, expert: int, policy: Policy) -> int | None:
        """The copy link takes a request: None if the expert is already resident or loading, or if no slot
        can be had (counted as refused); else the reserved slot. Finish with `finish_prefetch`."""
        if self.resident[layer, expert] or self.loading[layer, expert]:
            return None
        slot = self.reserve(layer, expert, policy)
        if slot is None:
            self.counters.prefetch_refused += 1
        return slot

    def finish_prefetch(self, layer: int, expert: int) -> None:
        """The prefetch copy landed: resident, counted, bytes accounted."""
        self.commit(layer, expert)
        self.counters.prefetched += 1
        self.counters.bytes_copied += self.expert_bytes

    def commit(self, layer: int, expert: int) -> None:
        """The copy into the reserved slot finished: the expert is resident."""
        self.loading[layer, expert] = False
        self.resident[layer, expert] = True

    def evict(self, layer: int, expert: int) -> None:
        slot = int(self.slot_of[layer, expert])
        self.resident[layer, expert] = False
        self.slot_of[layer, expert] = -1
        self.expert_at[slot] = -1
        self.occupied[layer] -= 1
        self._free[self._nfree] = slot
        self._nfree += 1
        self.counters.evictions += 1

    def check(self) -> None:
        """Invariants (used by tests): slots unique, counts consistent."""
        used = self.slot_of[self.slot_of >= 0]
        assert len(set(used.tolist())) == len(used), "slot used twice"
        assert len(used) + self._nfree == self.capacity, "slots leaked"
        held = np.flatnonzero(self.slot_of.ravel() >= 0)
        assert (self.expert_at[self.slot_of.ravel()[held]] == held).all(), "slot map drift"
        assert np.count_nonzero(self.expert_at >= 0) == len(used), "slot map drift"
        assert (self.occupied == (self.resident | self.loading).sum(1)).all(), "occupancy drift"
        assert not (self.resident & self.loading).any()


class PrefetchQueue:
    """Priority queue of prefetch requests: highest priority first, FIFO among equals.

    `drop_layer(l)` discards every queued request for layer l (its deadline, the start of layer l,
    has come). Thread-safe so the engine's copy worker can block on it.
    """

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()
        self._gen: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._cv = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return sum(self._live.values())

    def push(self, requests: list[Prefetch]) -> None:
        if not requests:
            return
        with self._cv:
            gen, live, seq, heap = self._gen, self._live, self._seq, self._heap
            entries = []
            for r in requests:
                layer = r.layer
                entries.append((-float(r.priority), next(seq), layer, gen.get(layer, 0), r))
                live[layer] = live.get(layer, 0) + 1
            # (priority, seq) is unique, so every heap of these entries pops in one order: a batch as large
            # as the heap is cheaper heapified at once than pushed one by one
            if len(entries) > 16 and 2 * len(entries) > len(heap):
                heap.extend(entries)
                heapq.heapify(heap)
            else:
                for x in entries:
                    heapq.heappush(heap, x)
            self._cv.notify_all()

    def drop_layer(self, layer: int) -> int:
        """Drop every queued request for `layer`; returns how many were dropped."""
        if layer not in self._live:  # nothing live to drop (the driver calls this per layer): skip the lock
            return 0
        with self._cv:
            n = self._live.pop(layer, 0)
            gen = self._gen
            gen[layer] = gen.get(layer, 0) + 1
            if len(self._heap) > 64 and len(self._heap) > 4 * sum(self._live.values()):
                # mostly dropped entries: keep the live ones. The order stands, (priority, seq) being unique
                self._heap = [x for x in self._heap if x[3] == gen.get(x[2], 0)]
                heapq.heapify(self._heap)
            return n

    def pop(self, block: bool = False, timeout: float | None = None) -> Prefetch | None:
        if not block and not self._heap:  # the simulator polls an empty queue often: skip the lock
            return None
        with self._cv:
            while True:
                while self._heap:
                    _, _, layer, gen, r = heapq.heappop(self._heap)
                    if gen == self._gen.get(layer, 0):
                        self._live[layer] -= 1
                        if not self._live[layer]:
                            del self._live[layer]
                        return r
                if not block or self._closed:
                    return None
                if not self._cv.wait(timeout):
                    return None

    def clear(self) -> None:
        with self._cv:
            for layer in list(self._live):
                self._gen[layer] = self._gen.get(layer, 0) + 1
            self._live.clear()
            self._heap.clear()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
