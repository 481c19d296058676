"""Offline oracle: it reads the request's whole future and the simulator's costs, and plans with them.

A reference point for the simulator only: it reads the request's whole future (signal 'future', given
by `bind_trace` before `reset`), which no real run has, so in the engine `check_signals` fails naming it.
With plan='best' (the default) the simulator replays several complete plans ('dynamic', 'hybrid',
'hybrid-early', 'static', 'exact') and every request keeps the fastest. A strong reference, not a proven
optimum; what is proved is in tests/test_sim_bounds.py.

Details: docs/baselines.md#offline-oracle.
"""

from __future__ import annotations

import hashlib

import numpy as np

from baselines import _exact
from baselines._offline import device_sets, layer_times, static_placement
from moespac.errors import MoespacError
from moespac.policy import LayerPlan, Policy, PolicyContext, Prefetch, VictimKeys

# plans that start from a static placement -> the share of the request (its first steps) it is fitted to
STATIC_STARTS = {"static": 1.0, "hybrid": 1.0, "hybrid-early": 0.5}
PLANS = ("best", "dynamic", "exact") + tuple(STATIC_STARTS)


class Oracle(Policy):
    name = "oracle"
    lossless = True
    requires = ("future",)
    source = ("reference: Belady (1966) furthest-next-use eviction with lookahead prefetch, and the best static "
              "placement in hindsight; simulator only")

    def __init__(self, prefetch: bool = True, host: bool = True, plan: str = "best", eager: bool = False,
                 credit: bool = False):
        if plan not in PLANS:
            raise MoespacError(f"oracle option plan={plan!r}: expected one of {', '.join(PLANS)}")
        if (plan in STATIC_STARTS or plan == "exact") and not host:
            raise MoespacError(f"oracle option plan={plan!r} runs non-resident experts on the host: needs host=true")
        self.prefetch, self.host, self.plan, self.eager = bool(prefetch), bool(host), plan, bool(eager)
        self.credit = bool(credit)
        self.counts = None
        self.device_call = 0.0
        self._static: dict = {}

    def offline_plans(self, topology, capacity: int, per_layer_capacity: int | None) -> list["Oracle"]:
        """The complete plans the simulator replays for each request, keeping the fastest. Each one earns its
        place: without it, some policy beat the oracle on more random scenarios (benchmarks/oracle_gap.py), or
        the oracle lost time on a 512-token trace of Qwen3-30B-A3B's shape (eager lookahead, static start).
        'exact' joins them when the cache is small enough for its search (baselines/_exact.py)."""
        if self.plan != "best":
            return [self]
        if not self.host:  # device only: Belady with careful, eager or no lookahead prefetch
            pf = [Oracle(True, False, "dynamic"), Oracle(True, False, "dynamic", eager=True)] if self.prefetch else []
            return pf + [Oracle(False, False, "dynamic")]
        plans = [Oracle(False, True, "dynamic", credit=True), Oracle(False, True, "hybrid"),
                 Oracle(False, True, "hybrid-early"), Oracle(False, True, "static")]
        if self.prefetch:
            plans = [Oracle(True, True, "dynamic", eager=True), Oracle(True, True, "hybrid", eager=True)] + plans
        if per_layer_capacity is None and _exact.fits(topology, capacity):
            plans.append(Oracle(False, True, "exact"))
        shared: dict = {}  # the static placement of each request, computed once for all plans that start from it
        for plan in plans:
            plan._static = shared
        return plans

    def bind_trace(self, counts: np.ndarray, device_by_count=None, host_by_count=None, hidden=None,
                   load: float | None = None, serial: bool = False, attention=None, other=None, draft=None,
                   device_call: float = 0.0) -> None:
        """The request's future: counts int [S, L, E] per step index, and (optionally) the simulator's costs:
        expert time on device / host by routing count, the host side's fixed time per step (its call and the
        hidden transfer), one copy, serial mode, the fixed time of each step (attention per layer, the rest of
        the forward, the draft phase) and the device call of a layer with device experts."""
        self.device_call = float(device_call)
        self.counts = np.asarray(counts)
        self.dev_cost = None if device_by_count is None else np.asarray(device_by_count, dtype=np.float64)
        self.host_cost = None if host_by_count is None else np.asarray(host_by_count, dtype=np.float64)
        self.hidden = None if hidden is None else np.asarray(hidden, dtype=np.float64)
        self.load_s, self.serial = load, bool(serial)
        fixed = (attention, other, draft)
        self.fixed = None if any(f is None for f in fixed) else [np.asarray(f, dtype=np.float64) for f in fixed]

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        if self.counts is None:
            raise RuntimeError("oracle: bind_trace() must be called before reset()")
        S, L, E = self.counts.shape
        # next_step[s, l, e] = first step >= s that activates (l, e); S = never (row S is all "never")
        active_at = np.where(self.counts > 0, np.arange(S)[:, None, None], S)
        self.next_step = np.concatenate([np.minimum.accumulate(active_at[::-1], axis=0)[::-1],
                                         np.full((1, L, E), S)], axis=0)
        self.requested = np.zeros((L, E), dtype=bool)
        if self.host_cost is not None:  # per step and layer: all-host expert time and active experts
            self._host_all = self.host_cost[self.counts].sum(2)
            self._n_active = (self.counts > 0).sum(2)
        self.s, self.layer = 0, -1
        self._keys_at = None
        self.wait_at = None
        if self.fixed is not None and self.load_s:
            # earliest times (fixed costs only; expert time and stalls only add) at which each step starts and
            # each layer visit s * L + l waits for its in-flight copies
            att, other, draft = self.fixed
            self.step_start = np.r_[0.0, np.cumsum(draft + L * att + other)]
            self.wait_at = (self.step_start[:S, None] + draft[:, None] + att[:, None] * np.arange(1, L + 1)).ravel()
        if self.plan == "exact":
            if self.dev_cost is None or self.host_cost is None or self.hidden is None or self.load_s is None:
                raise RuntimeError("oracle plan 'exact' needs the simulator's costs (bind_trace)")
            if ctx.per_layer_capacity is not None:
                raise MoespacError("oracle plan 'exact' needs a shared slot pool (no per-layer capacity)")
            topo = ctx.topology
            if not _exact.fits(topo, ctx.capacity):
                raise MoespacError(f"oracle plan 'exact': {topo.num_layers} x {topo.num_experts} experts in "
                                   f"{ctx.capacity} slots are too many for its search (baselines/_exact.py, MAX_WORK)")
            self.schedule = _exact.exact_on_demand(self.counts, self.dev_cost, self.host_cost, self.hidden,
                                                   self.load_s, self.serial, ctx.capacity, self.device_call)
            return placement | self.schedule.start
        if self.plan in STATIC_STARTS:
            if self.dev_cost is None or self.host_cost is None or self.hidden is None:
                raise RuntimeError(f"oracle plan {self.plan!r} needs the simulator's costs (bind_trace)")
            n = max(1, int(np.ceil(STATIC_STARTS[self.plan] * S)))
            digest = hashlib.blake2b(self.counts[:n].tobytes() + self.hidden[:n].tobytes()).hexdigest()
            key = (digest, n, ctx.capacity, ctx.per_layer_capacity, self.device_call)
            if key not in self._static:
                self._static[key] = static_placement(self.counts[:n], self.dev_cost, self.host_cost, self.hidden[:n],
                                                     self.serial, ctx.capacity, ctx.per_layer_capacity,
                                                     self.device_call)
            return placement | self._static[key]
        # the initial placement is free (made before the request): the soonest-needed experts
        # (worth ignored: a placement costs nothing, and each layer's plan still picks device or host)
        return placement | self._soonest(self._compute_keys(worth=False))

    # -- the future --------------------------------------------------------------------------------
    def _source_steps(self) -> np.ndarray:
        """int [L]: the step whose next uses each layer's row reads at the current position: the current step
        for the layers still to come, the next one for the layers already run (this step's uses are behind)."""
        L = self.next_step.shape[1]
        return np.where(np.arange(L) > self.layer, self.s, min(self.s + 1, len(self.next_step) - 1))

    def _next_use(self, rows: np.ndarray | None = None, src: np.ndarray | None = None) -> np.ndarray:
        """int [L, E] (or those `rows`): position (step * L + layer) of each expert's next use after the current
        layer."""
        src = self._source_steps() if src is None else src
        rows = np.arange(len(src)) if rows is None else rows
        return self.next_step[src[rows], rows] * self.next_step.shape[1] + rows[:, None]

    def _keys(self) -> np.ndarray:
        """int [L, E] sort keys: next use, then (costs bound) what the device saves at that use, then expert id
        (unique, so ties break the same way every time); experts never used again, or not worth a device slot,
        get keys >= self.never. A layer's row depends only on the step its next uses are read from
        (`_source_steps`), so when the position moves only the rows whose step changed are computed again: one
        row per layer visit, none at a step's start (victim asks many times per position)."""
        if self._keys_at != (self.s, self.layer):
            src = self._source_steps()
            if self._keys_at is None:
                self._keys_cache = self._compute_keys(src=src)
            elif len(rows := np.flatnonzero(src != self._keys_src)):
                self._keys_cache = self._keys_cache.copy()
                self._keys_cache[rows] = self._compute_keys(rows=rows, src=src)
            self._keys_at, self._keys_src = (self.s, self.layer), src
        return self._keys_cache

    def _compute_keys(self, worth: bool = True, rows: np.ndarray | None = None,
                      src: np.ndarray | None = None) -> np.ndarray:
        """The rows `rows` (default all) of the keys at source steps `src` (default the current position's)."""
        rows = np.arange(self.next_step.shape[1]) if rows is None else rows
        nxt = self._next_use(rows, src)
        L, (n, E) = self.next_step.shape[1], nxt.shape
        gain = self._gain(nxt, rows)
        # rank within the layer by saving (largest first), then the use after the next (soonest first), then
        # id; next use dominates (rank < E)
        S = len(self.next_step) - 1
        after = self.next_step[np.minimum(nxt // L + 1, S), rows[:, None], np.arange(E)[None, :]]
        order = np.lexsort((np.broadcast_to(np.arange(E), (n, E)), after, -gain), axis=1)
        rank = np.empty_like(order)  # the inverse permutation of each row: a scatter, cheaper than argsort
        np.put_along_axis(rank, order, np.arange(E)[None, :], axis=1)
        keys = nxt * E + rank
        self.never = len(self.next_step) * L * E  # above any real use's key
        useless = nxt >= (len(self.next_step) - 1) * L
        if worth and self.host and self.dev_cost is not None and self.host_cost is not None:
            useless |= gain <= 0  # runs no faster on the device than on the host
        return np.where(useless, keys + self.never, keys)

    def victim(self, candidates, cache):
        if not candidates.any() or self.plan == "static":
            return None
        if self.plan == "exact":
            return self._planned_victim(candidates)
        keys = np.where(candidates, self._keys(), -1)
        return divmod(int(np.argmax(keys)), keys.shape[1])

    def victim_keys(self, cache):
        if self.plan in ("static", "exact"):  # evicts nothing; the plan's own order
            return None
        return VictimKeys(self._keys(), largest=True)  # unique keys: the furthest next use first

    def _planned_victim(self, candidates):
        """The exact plan's eviction: an expert never used again in the request first (its slot is free in
        effect), then the plan's victims of this layer visit in order."""
        L = candidates.shape[0]
        never = candidates & (self._next_use() >= (len(self.next_step) - 1) * L)
        if never.any():
            return divmod(int(np.flatnonzero(never)[0]), candidates.shape[1])
        for i, (layer, expert) in enumerate(self._victims):
            if candidates[layer, expert]:
                return self._victims.pop(i)
        return None  # the replay left the plan (cannot happen: the plan is checked against the replay in tests)

    def _window(self, cache) -> list[Prefetch]:
        """Prefetches for the non-resident experts used in the next L layer visits that are among the
        `capacity` soonest-needed ones (and worth a slot), soonest first."""
        if not self.prefetch or self.ctx.capacity == 0 or self.plan in ("static", "exact"):
            return []
        L, E = self.requested.shape
        keys = self._keys()
        nxt = keys // E  # position of the next use (offset for the useless ones: never in the window)
        base = self.s * L + self.layer
        want = self._soonest(keys) & (nxt > base) & (nxt <= base + L) & ~cache.resident & ~self.requested
        if hasattr(cache, "loading"):
            want &= ~cache.loading
        layers, experts = np.nonzero(want)
        order = np.argsort(keys[layers, experts], kind="stable")
        if self.wait_at is not None and not self.eager:
            order = self._in_time(order, nxt[layers, experts], cache)
        self.requested[layers[order], experts[order]] = True
        # one priority for all: the link serves them FIFO, so a later request never delays an earlier one
        return [Prefetch(int(layers[i]), int(experts[i]), priority=0.0) for i in order]

    def _in_time(self, order: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        """The requests (in `order`) whose copy surely ends before their layer waits for it: behind every copy
        still outstanding, one copy each, within the fixed time until that layer visit. A copy that could
        make its layer wait is never started (the failure mode of naive lookahead prefetching)."""
        now = self.step_start[self.s] if self.layer < 0 else self.wait_at[self.s * self.requested.shape[0] + self.layer]
        backlog = int(np.count_nonzero(self.requested & ~cache.resident))
        keep = []
        for i in order:
            if (backlog + 1) * self.load_s <= self.wait_at[positions[i]] - now:
                keep.append(i)
                backlog += 1
        return np.asarray(keep, dtype=np.int64)

    def _soonest(self, keys: np.ndarray) -> np.ndarray:
        """bool [L, E]: the `capacity` useful experts with the smallest keys (per layer with a per-layer
        capacity)."""
        per_layer = self.ctx.per_layer_capacity
        if per_layer is None:
            cap = min(self.ctx.capacity, keys.size)
            kth = np.partition(keys.ravel(), cap - 1)[cap - 1] if cap > 0 else -1
        else:
            cap = min(per_layer, keys.shape[1])
            kth = np.partition(keys, cap - 1, axis=1)[:, cap - 1:cap] if cap > 0 else -1
        return (keys <= kth) & (keys < self.never)

    def _gain(self, nxt: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """float [len(rows), E]: what running each expert of layers `rows` (default all) on the device instead of
        the host saves its layer at its next use (`nxt`), the layer's other experts on the host (0 without costs).
        Concurrent: the host's share shrinks even when the expert alone is slower on the device, so the saving
        is (H + x) - max(d, H - h + x')."""
        if self.dev_cost is None or self.host_cost is None:
            return np.zeros(nxt.shape)
        L, E = self.next_step.shape[1], nxt.shape[1]
        step = np.minimum(nxt // L, len(self.counts) - 1)
        layer = (np.arange(L) if rows is None else rows)[:, None]
        c = self.counts[step, layer, np.arange(E)[None, :]]
        d, h = self.dev_cost[c], self.host_cost[c]
        x = self.hidden[step] if self.hidden is not None else np.zeros(nxt.shape)
        others = self._n_active[step, layer] > 1  # someone else stays on the host (so does the hidden transfer)
        if self.serial:
            return h - d + np.where(others, 0.0, x)
        H = self._host_all[step, layer]
        return H + x - np.maximum(d, H - h + np.where(others, x, 0.0))

    # -- hooks -------------------------------------------------------------------------------------
    def begin_step(self, step, cache):
        self.s, self.layer = step.index, -1
        return self._window(cache)

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        self.layer = layer
        self.requested[layer] = False  # the driver dropped this layer's queued requests
        active = np.flatnonzero(counts)
        resident = cache.resident[layer, active]
        if not self.host or self.dev_cost is None or self.host_cost is None:
            return LayerPlan(load=active[~resident])
        if self.plan == "exact":
            visit = self.s * self.requested.shape[0] + layer
            self._victims = list(self.schedule.victims[visit])
            return LayerPlan(load=np.asarray(self.schedule.loads[visit], dtype=np.int64),
                             host=np.asarray(self.schedule.host[visit], dtype=np.int64))
        if self.plan == "static":  # never copies: only the active residents may run on the device
            return self._best_split(layer, counts, active[resident], np.ones(int(resident.sum()), bool), cache,
                                    host=active[~resident])
        return self._best_split(layer, counts, active, resident, cache)

    def _best_split(self, layer, counts, active, resident, cache, host=None) -> LayerPlan:
        """The device set of `active` (the rest, and `host`, on the host) of least layer time."""
        host = np.zeros(0, np.int64) if host is None else host
        d = self.dev_cost[counts[active]]
        h = self.host_cost[counts[active]]
        miss = ~resident
        load = float(self.load_s or 0.0)
        x = float(self.hidden[self.s]) if self.hidden is not None else 0.0
        charge = load * miss
        if self.credit and miss.any():  # a load also spares the expert's next use in this layer a host run
            S = len(self.counts)
            nxt = self.next_step[min(self.s + 1, S), layer, active]
            c = self.counts[np.minimum(nxt, S - 1), layer, active]
            saving = np.where(nxt < S, self.host_cost[c] - self.dev_cost[c], 0.0)
            charge = charge - miss * np.clip(saving, 0.0, load)
        sets = device_sets(h - d - charge)  # smallest first
        loads = sets.astype(np.int64) @ miss
        # on-demand loads first wait for the copy in flight (at most one copy time)
        inflight = load if getattr(cache, "loading", None) is not None and cache.loading.any() else 0.0
        h_fixed = float(self.host_cost[counts[host]].sum())
        layer_s = (layer_times(sets, d, h, x, self.serial, h_fixed, self.device_call) + sets @ charge
                   + (loads > 0) * inflight)
        # a load needs a slot: a free one, or a resident expert this layer does not use (counted, not masked:
        # this runs on every layer visit)
        per_layer = cache.per_layer_capacity
        row = cache.resident[layer]
        only_this_layer = per_layer is not None and row.sum() >= per_layer
        used_here = int(np.count_nonzero(row[active]))
        pool = int(np.count_nonzero(row if only_this_layer else cache.resident))
        slots = cache.free_slots(layer) + pool - used_here
        layer_s = np.where(loads <= slots, layer_s, np.inf)
        best = sets[int(np.argmin(layer_s))]  # first minimum: fewest experts on the device
        on_device = active[best]
        return LayerPlan(load=on_device[~cache.resident[layer, on_device]], host=np.concatenate([active[~best], host]))

    def end_layer(self, layer, counts, cache):
        return self._window(cache)

    def describe(self) -> dict:
        return {"prefetch": self.prefetch, "eager": self.eager, "credit": self.credit, "host": self.host,
                "plan": self.plan}
