"""Discrete-event replay of a trace through a Policy, with the engine's semantics and simulated time.

Per step (prefill, verify or AR forward) it drives the policy as moespac/engine does, with the same Policy
objects, ExpertCache and PrefetchQueue; only time is simulated. Copies move `policy.transfer_scale` times an
expert's bytes. Requests start cold by default (policy.reset and a new cache per request); `warm_cache=True`
keeps cache, policy state and link across requests.

The step sequence, copy scaling and warm-up counts: docs/internals.md#moespacsimreplaypy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moespac.cache import COUNTERS, ExpertCache, PrefetchQueue
from moespac.errors import MoespacError
from moespac.policy import Policy, PolicyContext, StepInfo, UnitCosts, expert_wall
from moespac.sim.cost import Timing
from moespac.sim.link import CopyLink
from moespac.sim.workload import Workload

# signals the simulator can always give: it holds the whole trace
SIM_SIGNALS = frozenset({"future"})
BREAKDOWN = ("draft", "attention", "other", "stall", "expert", "expert_device", "expert_host")


@dataclass
class ReplayResult:
    """Per-step times and per-request statistics of one replay (seconds)."""

    step_time: dict[str, np.ndarray]
    """BREAKDOWN name -> [S]; a step lasts draft + attention + other + stall + expert, where expert is
    the wall time of the expert phases and expert_device / expert_host their busy times."""
    step_kind: np.ndarray
    """[S] index into moespac.trace.KINDS (0 = prefill)."""
    requests: list[dict] = field(default_factory=list)
    link_busy_s: float = 0.0

    @property
    def total(self) -> np.ndarray:
        """[S] wall time of each step."""
        t = self.step_time
        return t["draft"] + t["attention"] + t["other"] + t["stall"] + t["expert"]

    def summary(self) -> dict:
        """Overall metrics: decode tokens/s, latency (prefill and decode apart), breakdown, cache and link."""
        decode = self.step_kind != 0
        totals = {}
        for k in (*COUNTERS, "activations"):
            totals[k] = sum(r["counters"][k] for r in self.requests)
        acts = totals["activations"]
        elapsed = float(self.total.sum())
        out = throughput(self.total, self.step_kind, [r["tokens"] for r in self.requests])
        out.update(
            breakdown_decode_s={k: float(v[decode].sum()) for k, v in self.step_time.items()},
            breakdown_prefill_s={k: float(v[~decode].sum()) for k, v in self.step_time.items()},
            hit_rate=totals["hits"] / acts if acts else 0.0, host_share=totals["host"] / acts if acts else 0.0,
            link_bytes=totals["bytes_copied"], link_busy_s=self.link_busy_s,
            link_utilisation=self.link_busy_s / elapsed if elapsed > 0 else 0.0, counters=totals)
        return out


def throughput(step_total: np.ndarray, step_kind: np.ndarray, request_tokens: list[int]) -> dict:
    """tokens/s = tokens emitted by decode steps / decode time (prefill emits the first token and is timed
    apart, as the engine's GenerationResult does); latency = prefill + decode, averaged over requests."""
    decode_s = float(step_total[step_kind != 0].sum())
    prefill_s = float(step_total[step_kind == 0].sum())
    tokens = int(sum(request_tokens))
    n = max(len(request_tokens), 1)
    return dict(tokens=tokens, decode_s=decode_s, prefill_s=prefill_s,
                tokens_per_s=tokens / decode_s if decode_s > 0 else 0.0,
                latency_s=(prefill_s + decode_s) / n, prefill_latency_s=prefill_s / n, decode_latency_s=decode_s / n,
                requests=len(request_tokens))


def _layer_expert_time(timing: Timing, dev_cost, host_cost, on_device, host_mask, on_host: int, hidden_s):
    """dev_cost / host_cost: the layer's per-expert times (timing.*_by_count of its counts)."""
    dev = float(dev_cost[on_device].sum())
    if on_device.any():  # one call for the layer's device experts
        dev += timing.device_call
    host = float(host_cost[host_mask].sum())
    if on_host:
        host += hidden_s
    return dev, host, float(expert_wall(dev, host, timing.serial))


class Replay:
    """Replays one workload through one policy; `run()` returns a ReplayResult."""

    def __init__(self, workload: Workload, timing: Timing, policy: Policy, capacity: int,
                 per_layer_capacity: int | None = None, costs: UnitCosts | None = None, warm_cache: bool = False,
                 warmup_counts: np.ndarray | None = None, history: np.ndarray | None = None):
        self.w, self.timing, self.policy = workload, timing, policy
        self.warmup_counts, self.history = warmup_counts, history
        self.per_layer_capacity = per_layer_capacity
        self.costs = costs or UnitCosts()
        self.warm_cache = warm_cache
        topo = workload.topology
        if warm_cache and "future" in policy.requires:
            raise MoespacError(f"policy {policy.name!r} reads each request's future from its first step: "
                               "it needs cold requests (no warm_cache)")
        if not 0 <= capacity <= topo.num_layers * topo.num_experts:
            raise MoespacError(f"cache capacity {capacity} outside [0, {topo.num_layers * topo.num_experts}] "
                               "expert slots")
        scale = float(getattr(policy, "transfer_scale", 1.0))
        if not 0.0 < scale <= 1.0:
            raise MoespacError(f"policy {policy.name!r}: transfer_scale {scale} outside (0, 1]")
        # a streaming system's buffers, or a compressed cache's larger count (Policy.device_slots)
        self.capacity = min(policy.device_slots(topo, capacity), topo.num_layers * topo.num_experts)
        self.copy_bytes = round(timing.expert_bytes * scale)
        self.copy_s = timing.load * scale
        self.now = 0.0
        S = workload.num_steps
        self.step_time = {k: np.zeros(S) for k in BREAKDOWN}

    # -- request lifecycle -------------------------------------------------------------------------
    def _start_request(self, steps: np.ndarray) -> None:
        w, trace = self.w, self.w.trace
        self.cache = ExpertCache(w.topology, self.capacity, self.per_layer_capacity, expert_bytes=self.copy_bytes)
        self.queue = PrefetchQueue()
        self.link = CopyLink(self.cache, self.queue, self.policy, self.copy_s, self.copy_bytes)
        self.link.t = self.now
        if "future" in self.policy.requires:
            t = self.timing
            self.policy.bind_trace(w.counts[steps], device_by_count=t.device_by_count, host_by_count=t.host_by_count,
                                   hidden=t.hidden[steps], load=self.copy_s, serial=t.serial,
                                   attention=t.attention[steps], other=t.other[steps], draft=t.draft[steps],
                                   device_call=t.device_call)
        gamma = int(w.steps["step_gamma"][steps].max()) if len(steps) else 0
        signals = trace.signals() | SIM_SIGNALS | ({"warmup_counts"} if self.warmup_counts is not None else set())
        ctx = PolicyContext(w.topology, self.capacity, self.per_layer_capacity, gamma=gamma,
                            batch_size=int(trace.meta.get("batch_size", 1) or 1), costs=self.costs, signals=signals,
                            warmup_counts=self.warmup_counts, history=self.history)
        self.cache.place(self.policy.reset(ctx))  # initial placement happens before the request (untimed)

    def run(self) -> ReplayResult:
        result = ReplayResult(step_time=self.step_time, step_kind=self.w.steps["step_kind"].copy())
        for r, steps in enumerate(self.w.requests()):
            if r == 0 or not self.warm_cache:
                self._start_request(steps)
            before, busy = self.cache.counters.to_dict(), self.link.busy
            for i, s in enumerate(steps):
                self._step(int(s), i)
            if not self.warm_cache:
                self.link.close(self.now)
            summary = self._request_summary(steps, before, self.cache.counters.to_dict())
            summary["link_busy_s"] = self.link.busy - busy
            result.requests.append(summary)
        result.link_busy_s = float(sum(q["link_busy_s"] for q in result.requests))
        return result

    # -- one target forward ------------------------------------------------------------------------
    def _step(self, s: int, index: int) -> None:
        w, t, policy, cache, link = self.w, self.timing, self.policy, self.cache, self.link
        steps = w.steps
        kind = w.trace.kind(s)
        signals = {"request": int(steps["step_request"][s])}
        for name, rows in (("cross_layer_topk", w.step_cross(s)), ("self_draft_topk", w.step_self_draft(s))):
            if rows is not None:
                signals[name] = rows
        step = StepInfo(index=index, kind=kind, num_tokens=int(steps["step_tokens"][s]),
                        gamma=int(steps["step_gamma"][s]), signals=signals)
        now = self.now
        link.advance(now)
        link.push(policy.begin_step(step, cache), now)
        now += t.draft[s]
        counts, attention, hidden = w.counts[s], t.attention[s], t.hidden[s]
        counters, resident, frozen = cache.counters, cache.resident, cache.frozen
        # whole-step arrays, sliced per layer below (one numpy call each instead of one per layer)
        active_all = counts > 0
        dev_cost, host_cost = t.device_by_count[counts], t.host_by_count[counts]
        stall = dev_busy = host_busy = expert = 0.0
        for layer in range(w.topology.num_layers):
            now += attention
            link.advance(now)
            counters.prefetch_dropped += self.queue.drop_layer(layer)
            waited = link.wait_layer(layer, now)
            stall += waited - now
            now = waited
            row, active = counts[layer], active_all[layer]
            hit = active & resident[layer]
            plan = policy.plan_layer(layer, row, cache)
            frozen[layer] = hit
            load, carry = cache.on_demand(layer, plan, active)  # carry: copied with the layer, not run
            if load.size or carry.size:
                loaded_at = now  # an empty batch would change nothing: the other one waits for the copy in flight
                if load.size:
                    loaded_at, loaded = link.load(layer, load, now)
                    frozen[layer, loaded] = True  # before the carried copies look for victims: these run now
                if carry.size:
                    loaded_at, carried = link.load(layer, carry, loaded_at, counter="carried")
                    frozen[layer, carried] = True
                stall += loaded_at - now
                now = loaded_at
                on_device = active & resident[layer]
            else:  # nothing of this layer was loaded, so its residents are the ones `hit` saw
                on_device = hit
            if plan.host is not None and len(plan.host):
                on_device = on_device.copy()
                on_device[np.asarray(plan.host, dtype=np.int64)] = False
                counters.hits += int(np.count_nonzero(hit & on_device))
            else:  # hits stay resident (frozen), so all of them run on the device
                counters.hits += int(np.count_nonzero(hit))
            if len(plan.substitute):  # a lossy policy runs a resident expert with these tokens: device time
                sub = np.zeros_like(active)
                sub[np.asarray(plan.substitute, dtype=np.int64)] = True
                sub &= active & ~on_device
                counters.substituted += int(np.count_nonzero(sub))
                on_device = on_device | sub
            host_mask = np.greater(active, on_device)  # active & ~on_device
            on_host = int(np.count_nonzero(host_mask))
            counters.host += on_host
            d, h, wall = _layer_expert_time(t, dev_cost[layer], host_cost[layer], on_device, host_mask, on_host, hidden)
            dev_busy, host_busy, expert = dev_busy + d, host_busy + h, expert + wall
            now += wall
            link.advance(now)
            frozen[layer] = False
            link.push(policy.end_layer(layer, row, cache), now)
        now += t.other[s]
        link.advance(now)
        link.push(policy.end_step(step, cache), now)
        L = w.topology.num_layers
        st = self.step_time
        st["draft"][s], st["attention"][s], st["other"][s] = t.draft[s], L * attention, t.other[s]
        (st["stall"][s], st["expert"][s], st["expert_device"][s],
         st["expert_host"][s]) = stall, expert, dev_busy, host_busy
        self.now = now

    def _request_summary(self, steps, before: dict, after: dict) -> dict:
        w = self.w
        kinds = w.steps["step_kind"][steps]
        total = sum(self.step_time[k][steps] for k in ("draft", "attention", "other", "stall", "expert"))
        prefill = float(total[kinds == 0].sum())
        decode = float(total[kinds != 0].sum())
        tokens = int(w.steps["step_emitted"][steps][kinds != 0].sum())
        counters = {k: after[k] - before[k] for k in after if k not in ("hit_rate", "host_share")}
        acts = counters["activations"]
        counters["hit_rate"] = counters["hits"] / acts if acts else 0.0
        counters["host_share"] = counters["host"] / acts if acts else 0.0
        return dict(request=int(w.steps["step_request"][steps[0]]), steps=len(steps), prefill_s=prefill,
                    decode_s=decode, latency_s=prefill + decode, tokens=tokens,
                    tokens_per_s=tokens / decode if decode > 0 else 0.0, counters=counters)


def warmup_window(counts: np.ndarray, step_request: np.ndarray, steps: int | None = None) -> tuple[np.ndarray, dict]:
    """The 'warmup_counts' signal, as Fiddler profiles popularity before serving: activation counts [L, E]
    summed over the first `steps` steps (None = all) of the first request of per-step `counts` [S, L, E].
    Returns (counts, the window for the record). The simulator takes a trace's first steps; the bench
    harness records its warm-up calls (all one request, -1) and takes all of them."""
    S = len(step_request)
    first = np.flatnonzero(step_request != step_request[0]) if S else np.zeros(0, np.int64)
    n = int(first[0]) if len(first) else S
    n = n if steps is None else min(int(steps), n)
    total = counts[:n].sum(axis=0, dtype=np.int64) if n else np.zeros(np.shape(counts)[1:], np.int64)
    return total, dict(request=int(step_request[0]) if S else None, steps=n, entries=int(total.sum()))


def replay(workload: Workload, timing: Timing, policy: Policy, capacity: int, **kw) -> ReplayResult:
    """Replay `workload` through `policy` with `capacity` device expert slots.

    An offline policy (the oracle) may propose several complete plans (`Policy.offline_plans`): each is replayed
    and every request keeps the fastest, as a planner that knows the whole request can evaluate its options
    before it commits. Requests start cold, so each request's plan is independent of the others'."""
    plans = policy.offline_plans(workload.topology, capacity, kw.get("per_layer_capacity"))
    results = [Replay(workload, timing, p, capacity, **kw).run() for p in plans]
    if len(results) == 1:
        return results[0]
    best = ReplayResult(step_time={k: v.copy() for k, v in results[0].step_time.items()},
                        step_kind=results[0].step_kind)
    for r, steps in enumerate(workload.requests()):
        i = min(range(len(plans)), key=lambda i: results[i].requests[r]["latency_s"])  # first minimum on ties
        for k, v in best.step_time.items():
            v[steps] = results[i].step_time[k][steps]
        best.requests.append(dict(results[i].requests[r], plan=plans[i].describe()))
    best.link_busy_s = float(sum(q["link_busy_s"] for q in best.requests))
    return best
