"""Hybrid device/host expert execution, registered in transformers' ExpertsInterface.

`HybridRuntime(model, policy, config, device)` takes the routed experts out of the model into an ExpertStore
and switches the model to the experts implementation `moespac_hybrid` (no model code is edited). Per MoE layer
and forward it asks the policy which activated experts run on the device and which on the host, runs each part
as one grouped call and merges them in a fixed order. `close()` gives the model back as it came.

Details: docs/internals.md#moespacenginehybridpy.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from moespac.cache import CacheSize, ExpertCache, PrefetchQueue
from moespac.engine.device import COMPUTE, Device
from moespac.engine.kernels import grouped_experts, grouped_mm_supported
from moespac.engine.selfdraft import SelfDraftExperts
from moespac.engine.store import ExpertStore
from moespac.errors import MoespacError
from moespac.models.experts import experts_per_token, find_experts
from moespac.policy import Policy, PolicyContext, StepInfo, Topology, UnitCosts
from moespac.trace import TraceRecorder

IMPL = "moespac_hybrid"


def _hybrid_experts_forward(self, hidden_states, top_k_index=None, top_k_weights=None, **kw):
    runtime = getattr(self, "_moespac_runtime", None)
    if runtime is None:
        raise RuntimeError("experts implementation 'moespac_hybrid' used without a HybridRuntime")
    if top_k_index is None:  # gpt-oss style keywords
        top_k_index, top_k_weights = kw["router_indices"], kw["routing_weights"]
    return runtime.layer_forward(self._moespac_layer, self, hidden_states, top_k_index, top_k_weights)


ExpertsInterface.register(IMPL, _hybrid_experts_forward)
assert IMPL in ALL_EXPERTS_FUNCTIONS


@dataclass(frozen=True)
class RuntimeConfig(CacheSize):
    """How the hybrid engine runs (its cache: CacheSize's fields)."""

    cache_ratio: float | None = field(default=0.5, kw_only=True)
    """Device expert slots / all routed experts, in [0, 1]; a runtime on loaded models has no memory plan to
    size it, so half of them by default."""
    copy_mode: str = "async"
    """'async': a worker thread serves prefetches concurrently; 'sync': prefetches are issued at the end of
    the layer that asked, in order (deterministic slot choice, for tests)."""
    trace_cross_layer: bool = True
    """Record, for layer l, the top-k of layer l+1's router on layer l's input (predictor baselines need it)."""
    slots: int | None = None
    """Device slots, exactly (the memory plan's count); overrides cache_ratio and cache_gib."""

    def __post_init__(self):
        super().__post_init__()
        if self.copy_mode not in ("async", "sync"):
            raise MoespacError(f"copy_mode {self.copy_mode!r}: 'async' or 'sync'")

    def slot_count(self, total: int, expert_bytes: int) -> int:
        """Slots for `total` routed experts of `expert_bytes` each."""
        if self.slots is not None:
            return min(self.slots, total)
        return self.requested_slots(total, expert_bytes)


class HybridRuntime:
    def __init__(self, model, policy: Policy, config: RuntimeConfig = RuntimeConfig(),
                 device: str | Device | None = None, costs: UnitCosts | None = None):
        pairs = find_experts(model)
        if not pairs:
            raise MoespacError(f"{type(model).__name__} has no routed experts (not an MoE model)")
        if getattr(model, "_moespac_runtime", None) is not None:
            raise MoespacError("this model already has an open HybridRuntime; close() it first")
        self.model, self.policy, self.config = model, policy, config
        self.experts = [m for m, _ in pairs]
        self.routers = [r for _, r in pairs]
        self._home = next(model.parameters()).device  # where close() puts the model back
        self.device = device if isinstance(device, Device) else Device(device or self._home)
        self.store = ExpertStore(self.experts, 0, self.device, policy.transfer_scale)
        L, E = len(self.experts), self.store.num_experts
        self.topology = Topology(L, E, experts_per_token(model, self.experts[0]))
        self.costs = costs or UnitCosts()
        self.queue = PrefetchQueue()
        self.cv = threading.Condition(threading.RLock())
        self._issuing: int | None = None  # layer whose prefetch the worker is issuing outside the lock
        self.recorder: TraceRecorder | None = None
        self.step: StepInfo | None = None
        self._self_draft: SelfDraftExperts | None = None  # built on the first lookahead pass
        self._lookahead_ids: dict[int, np.ndarray] | None = None  # set while a lookahead pass runs
        self._prev_impl = model.config._experts_implementation
        self.grouped = grouped_mm_supported(self.device.torch_device, self.store.dtype)
        self.host_grouped = grouped_mm_supported(torch.device("cpu"), self.store.dtype)
        self._staging: dict[str, torch.Tensor] = {}
        self.phases: dict[str, float] = defaultdict(float)
        """Host wall seconds by phase of the MoE layers (routing read, policy, device issue, host rows wait,
        host experts, merge, whole layer), summed since the runtime opened; read them with phase_times()."""
        self.reconfigure(config)
        for i, m in enumerate(self.experts):
            m._moespac_runtime, m._moespac_layer = self, i
        model._moespac_runtime = self
        model.to(self.device.torch_device)  # what is left: attention, norms, routers, shared experts, embeddings
        model.set_experts_implementation(IMPL)
        self._worker = None
        if config.copy_mode == "async":
            self._stop = False
            self._worker = threading.Thread(target=self._serve_prefetches, name="moespac-copy", daemon=True)
            self._worker.start()

    def reconfigure(self, config: RuntimeConfig, policy: Policy | None = None) -> None:
        """(Re)size the slot pool for `config`, and switch policy if one is given (several cache ratios and
        policies on one loaded model). The pool is replaced only when its size changes."""
        if policy is not None:
            if policy.transfer_scale != self.policy.transfer_scale:
                raise MoespacError("a runtime cannot switch between lossy and exact copies; build a new one")
            self.policy = policy
        with self.cv:
            self.queue.clear()
            self._wait_issuing()
            self.device.synchronize()
            L, E = self.topology.num_layers, self.topology.num_experts
            capacity = config.slot_count(L * E, self.store.expert_bytes)
            self.store.resize(capacity)
            self.config = config
            self.cache = ExpertCache(self.topology, capacity, config.per_layer_capacity(capacity, L),
                                     expert_bytes=self.store.copy_bytes)

    # -- request / step lifecycle ---------------------------------------------------------------------
    def start_request(self, gamma: int, batch_size: int = 1, signals=frozenset(), warmup_counts=None,
                      history=None) -> None:
        """Reset the policy and the cache for a new request and fill the initial placement."""
        with self.cv:
            self.queue.clear()
            self._wait_issuing()
            capacity = min(self.store.capacity, self.policy.device_slots(self.topology, self.store.capacity))
            self.cache = ExpertCache(self.topology, capacity, self.cache.per_layer_capacity,
                                     expert_bytes=self.store.copy_bytes)
            sig = set(signals) | {"cross_layer_topk"} if self.config.trace_cross_layer else set(signals)
            if "draft" in sig:  # a speculative run can always make the self-draft lookahead pass
                sig.add("self_draft_topk")
            if warmup_counts is not None:
                sig.add("warmup_counts")
            ctx = PolicyContext(self.topology, self.cache.capacity, self.cache.per_layer_capacity, gamma=gamma,
                                batch_size=batch_size, costs=self.costs, signals=frozenset(sig),
                                warmup_counts=warmup_counts, history=history)
            placement = self.policy.reset(ctx)
            for layer, expert, slot in self.cache.place(placement):
                self.store.copy_in(layer, expert, slot)

    def begin_step(self, step: StepInfo) -> None:
        """Before drafting: the policy may queue prefetches that overlap the draft phase."""
        if "cross_layer_topk" in self.policy.requires:  # row l is filled when layer l runs, before end_layer(l)
            L, k = self.topology.num_layers, self.topology.top_k
            step.signals["cross_layer_topk"] = np.full((L, step.num_tokens, k), -1, dtype=np.int64)
        self.step = step
        if self.recorder is not None:
            self.recorder.begin(step.kind, step.signals.get("request", 0), step.num_tokens, step.gamma)
            if "self_draft_topk" in step.signals:
                self.recorder.lookahead(step.signals["self_draft_topk"])
        with self.cv:
            self._push(self.policy.begin_step(step, self.cache))

    def end_step(self, accepted: int = 0, emitted: int = 0) -> None:
        with self.cv:
            self._push(self.policy.end_step(self.step, self.cache))
        if self.recorder is not None:
            self.recorder.end(accepted, emitted)

    @property
    def wants_lookahead(self) -> bool:
        """Whether verify steps need the self-draft lookahead pass: the policy reads it, or the trace keeps it."""
        return "self_draft_topk" in self.policy.requires or (self.recorder is not None and self.recorder.self_draft)

    def lookahead(self, forward) -> np.ndarray:
        """The routing of `forward()`, a target pass over drafted tokens, with every routed expert through INT4
        (MoE-SpeQ's self-draft, moespac.engine.selfdraft): int [L, tokens, k]. The pass runs outside the cache,
        the policy, the counters and the trace; its experts are dequantised on the host and run on the device
        (on a GPU that is a copy of every expert it routes to: a recording instrument, not a fast path)."""
        if self._self_draft is None:
            self._self_draft = SelfDraftExperts(self.store)
        self._lookahead_ids = {}
        try:
            forward()
            ids = self._lookahead_ids
        finally:
            self._lookahead_ids = None
        return np.stack([ids[layer] for layer in range(self.topology.num_layers)])

    def close(self) -> None:
        """Stop the copy worker and give the model back as it came: its experts in place, on its device."""
        if self._worker is not None:
            self._stop = True
            self.queue.close()
            self._worker.join(timeout=5)
            self._worker = None
        if getattr(self.model, "_moespac_runtime", None) is not self:
            return
        self.device.synchronize()
        self.model.set_experts_implementation(self._prev_impl)
        self.store.restore()
        self.store.slots = {}
        for buf in self._staging.values():  # pinned staging blocks go back to the host as well
            self.device.release_host_block(buf)
        self._staging = {}
        for m in self.experts:
            m._moespac_runtime = None
        self.model._moespac_runtime = None
        self.model.to(self._home)

    # -- prefetching -------------------------------------------------------------------------------
    def _push(self, requests) -> None:
        if not requests:
            return
        if self.config.copy_mode == "sync":
            for r in requests:
                self.queue.push([r])
            while (r := self.queue.pop()) is not None:
                self._prefetch_one(r)
        else:
            self.queue.push(requests)

    def _prefetch_one(self, r) -> None:
        """Reserve a slot and issue the copy; the expert is resident at once, and compute waits for its copy
        on the device (its ready event), never on the host."""
        if r.restore:  # its slot keeps the dequantised weights: nothing to copy again (Prefetch.restore)
            return
        with self.cv:
            slot = self.cache.start_prefetch(r.layer, r.expert, self.policy)
            if slot is None:
                return
            self._issuing = r.layer
            cache = self.cache
        self.store.copy_in(r.layer, r.expert, slot)  # on the CPU stand-in the copy itself runs here
        with self.cv:
            if cache is self.cache:  # a new request may have reset the cache meanwhile
                cache.finish_prefetch(r.layer, r.expert)
            self._issuing = None
            self.cv.notify_all()

    def _serve_prefetches(self) -> None:
        while not self._stop:
            r = self.queue.pop(block=True, timeout=0.2)
            if r is not None:
                self._prefetch_one(r)

    def _wait_issuing(self, layer: int | None = None) -> None:
        """Wait until the worker has issued the copy it reserved a slot for (for `layer`, or any)."""
        with self.cv:
            while self._issuing is not None and (layer is None or self._issuing == layer):
                self.cv.wait()

    # -- the layer -----------------------------------------------------------------------------------
    @contextmanager
    def _phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - t0

    def phase_times(self) -> dict[str, float]:
        return dict(self.phases)

    def layer_forward(self, layer: int, module, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor):
        if self._lookahead_ids is not None:
            return self._lookahead_layer(layer, module, hidden, ids, weights)
        with self._phase("moe layers"):
            return self._layer(layer, module, hidden, ids, weights)

    def _layer(self, layer: int, module, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor):
        E = self.topology.num_experts
        T, k = ids.shape
        with self._phase("routing read"):  # the policy needs the routing: the layer's first device sync
            flat = self.device.to_host(ids.reshape(-1)).to(torch.int64).numpy()
        counts = np.bincount(flat, minlength=E)
        cache, counters, store = self.cache, self.cache.counters, self.store
        with self.cv, self._phase("policy and on-demand copies"):
            counters.prefetch_dropped += self.queue.drop_layer(layer)
            self._wait_issuing(layer)  # a copy for this layer being issued is worth its wait
            active = counts > 0
            hit = active & cache.resident[layer]
            plan = self.policy.plan_layer(layer, counts, cache)
            cache.frozen[layer] = hit
            loaded = []
            # the runs first, then what comes along; a refused reservation runs on the host (as the simulator)
            for wanted in cache.on_demand(layer, plan, active):
                got, slots = cache.reserve_many(layer, wanted, self.policy)
                cache.frozen[layer, got] = True  # before the next batch looks for victims: these run now
                loaded += zip(got.tolist(), slots.tolist())
            for e, slot in loaded:  # on-demand loads: issued now, waited for by this layer's compute only
                store.copy_in(layer, e, slot)
                cache.commit(layer, e)
            on_device = active & cache.resident[layer]
            if plan.host is not None:
                on_device &= ~np.isin(np.arange(E), np.asarray(plan.host, dtype=np.int64))
            counters.hits += int((hit & on_device).sum())
            n_carried = int((~active[[e for e, _ in loaded]]).sum()) if loaded else 0
            counters.loads += len(loaded) - n_carried
            counters.carried += n_carried
            counters.host += int((active & ~on_device).sum())
            counters.bytes_copied += len(loaded) * store.copy_bytes
            slot_of = cache.slot_of[layer].copy()
        out = self._compute(layer, module, hidden, flat, weights, counts, on_device, slot_of, T, k)
        cross = self._cross_layer(layer, hidden)
        if cross is not None and self.step is not None and "cross_layer_topk" in self.step.signals:
            self.step.signals["cross_layer_topk"][layer] = self.device.to_host(cross).numpy()  # the policy reads it now
        with self.cv, self._phase("policy and on-demand copies"):
            cache.frozen[layer] = False
            requests = self.policy.end_layer(layer, counts, cache)
        self._push(requests)
        if self.recorder is not None:  # device tensors, read once at the end of the step
            self.recorder.layer(layer, flat.reshape(T, k), weights.detach(), cross)
        return out

    def _compute(self, layer, module, hidden, flat, weights, counts, on_device, slot_of, T, k):
        """Device experts as one grouped call over the slot pool, host experts as one over the host weights,
        overlapped: the host rows leave for the host before the device part is issued, so on a GPU the host
        computes while the device stream runs. Each (token, k) row keeps its routing weight and the rows of a
        token are summed in a fixed order, so where an expert ran never changes the numbers."""
        dev, store = self.device, self.store
        lay = store.layouts[layer]
        dev_row = on_device[flat]
        # rows sorted by group: device rows by slot first, then host rows by expert (stable: token order kept)
        key = np.where(dev_row, slot_of[flat], store.capacity + flat)
        order = np.argsort(key, kind="stable")
        n_dev = int(dev_row.sum())
        used = np.flatnonzero(counts * on_device)
        slot_counts = np.zeros(store.capacity, dtype=np.int64)
        slot_counts[slot_of[used]] = counts[used]
        order_t = self._to_device("order", order)
        x = hidden[order_t // k]
        host_rows = None
        if n_dev < len(flat):  # 1. host rows on their way (a non-blocking copy into a pinned buffer on a GPU)
            host_rows = self._rows_to_host(x[n_dev:])
        parts = []
        if n_dev:  # 2. device part issued (asynchronous on a GPU), after the copies of its slots
            with self._phase("device experts (issue; all of it on a CPU)"):
                dev.wait(COMPUTE, max((store.ready[s] for s in slot_of[used]), key=lambda e: e.value))
                dev.read_slots([(int(slot_of[e]), (layer, int(e))) for e in used])
                parts.append(grouped_experts(module, lay, x[:n_dev], store.slots, slot_counts, self.grouped,
                                             lambda name, a: self._to_device(f"device {name}", a)))
                done = dev.record(COMPUTE)
            for s in slot_of[used]:
                store.read_done[s] = done
        if host_rows is not None:  # 3. host part, meanwhile; its rows come back with one copy
            x_host, ready = host_rows
            with self._phase("host rows wait"):
                dev.host_wait(ready)  # the layer's second device sync: its host rows have arrived
            with self._phase("host experts"):
                y = grouped_experts(module, lay, x_host, store.host[layer], np.where(on_device, 0, counts),
                                    self.host_grouped)
                parts.append(self._rows_to_device(y))
        return _combine(torch.cat(parts) if len(parts) > 1 else parts[0], order_t, weights, T, k, hidden.dtype)

    def _lookahead_layer(self, layer, module, hidden, ids, weights):
        """One layer of a lookahead pass: its routing kept, its experts run through INT4 in one grouped call."""
        T, k = ids.shape
        flat = self.device.to_host(ids.reshape(-1)).to(torch.int64).numpy()
        self._lookahead_ids[layer] = flat.reshape(T, k)
        experts, group = np.unique(flat, return_inverse=True)
        order = np.argsort(group, kind="stable")
        order_t = torch.from_numpy(order).to(hidden.device)
        w = {n: t.to(hidden.device) for n, t in self._self_draft.weights(layer, experts).items()}
        rows = grouped_experts(module, self.store.layouts[layer], hidden[order_t // k], w,
                               np.bincount(group, minlength=len(experts)), self.grouped)
        return _combine(rows, order_t, weights, T, k, hidden.dtype)

    def _rows_to_host(self, x):
        """(host rows, the event after which they are there); on a CPU the rows are already on the host, and the
        wait for them is counted as the GPU's would be."""
        if not self.device.cuda:
            return x, self.device.record(COMPUTE)
        x_host = self._stage("x", x.shape, x.dtype)
        x_host.copy_(x, non_blocking=True)
        return x_host, self.device.record(COMPUTE)

    def _rows_to_device(self, y):
        if not self.device.cuda:
            return y
        # the pinned buffer is free: this layer's routing read waited for the compute stream, which carried the
        # previous layer's copy out of it
        y_host = self._stage("y", y.shape, y.dtype)
        y_host.copy_(y)
        return y_host.to(self.device.torch_device, non_blocking=True)

    def _to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """A small host array on the device: through a pinned buffer on a GPU, so the copy never blocks."""
        t = torch.from_numpy(array)
        if not self.device.cuda:
            return t
        staged = self._stage(name, t.shape, t.dtype)
        staged.copy_(t)
        return staged.to(self.device.torch_device, non_blocking=True)

    def _stage(self, name: str, shape, dtype) -> torch.Tensor:
        """A pinned host buffer of `shape`, grown as needed (exactly sized blocks). Reused from one layer to
        the next: the next layer's routing read waits for the compute stream, so earlier copies are done."""
        need = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        buf = self._staging.get(name)
        if buf is None or buf.numel() < need:
            if buf is not None:
                self.device.synchronize()
                self.device.release_host_block(buf)
            buf = self._staging[name] = self.device.host_block(max(need, 2 * (buf.numel() if buf is not None else 0)))
        return buf[:need].view(dtype).view(shape)

    def _cross_layer(self, layer: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """Top-k of layer l+1's router on layer l's input (Fate / SpecExp predictors); None at the last layer
        or when neither the policy nor the trace wants it."""
        wanted = ("cross_layer_topk" in self.policy.requires
                  or (self.recorder is not None and self.config.trace_cross_layer))
        if not wanted or layer + 1 >= self.topology.num_layers:
            return None
        router = self.routers[layer + 1]
        if router is None or not hasattr(router, "weight"):
            return None
        bias = getattr(router, "bias", None)
        logits = F.linear(hidden.to(router.weight.dtype), router.weight,
                          bias if isinstance(bias, torch.Tensor) else None)
        return torch.topk(logits, self.topology.top_k, dim=-1).indices

    # -- results -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        d = self.cache.counters.to_dict()
        d.update(capacity=self.cache.capacity, expert_bytes=self.store.expert_bytes,
                 policy=self.policy.name, policy_stats=self.policy.describe())
        return d


def _combine(rows: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, T: int, k: int, dtype) -> torch.Tensor:
    """Expert rows sorted by group (rows[i] is routing row order[i]) -> the layer's output [T, H]: each row times
    its routing weight, then the k rows of a token summed, in transformers' own order and dtypes."""
    out = torch.empty_like(rows)
    out[order] = rows
    return (out * weights.reshape(-1, 1)).view(T, k, rows.shape[-1]).sum(dim=1).to(dtype)
