"""Hybrid device/host expert execution, registered in transformers' ExpertsInterface.

`HybridRuntime(model, policy, ...)` registers the experts implementation `moespac_hybrid` and switches
the model to it (no model code is edited). For every MoE layer and forward it asks the policy which
activated experts run on the device (resident in the slot pool, or loaded on demand) and which on the
host, launches the device part first (asynchronous on CUDA), computes the host part meanwhile, and merges.
A copy worker thread serves the prefetch queue. Per-(token, slot) expert outputs are computed the same
way wherever an expert runs and summed in a fixed order, so the split never changes the numerics on CPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from moespac.cache import ExpertCache, PrefetchQueue
from moespac.engine.kernels import expert_ffn
from moespac.engine.store import ExpertStore
from moespac.errors import MoespacError
from moespac.policy import Policy, PolicyContext, StepInfo, Topology, UnitCosts
from moespac.trace import TraceRecorder

IMPL = "moespac_hybrid"


def _hybrid_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    runtime = getattr(self, "_moespac_runtime", None)
    if runtime is None:
        raise RuntimeError("experts implementation 'moespac_hybrid' used without a HybridRuntime")
    return runtime.layer_forward(self._moespac_layer, self, hidden_states, top_k_index, top_k_weights)


ExpertsInterface.register(IMPL, _hybrid_experts_forward)
assert IMPL in ALL_EXPERTS_FUNCTIONS


def find_experts(model) -> list[tuple[torch.nn.Module, torch.nn.Module | None]]:
    """(experts module, its router) for every routed-MoE layer, in layer order."""
    out = []
    for _, parent in model.named_modules():
        experts = getattr(parent, "experts", None)
        if isinstance(experts, torch.nn.Module) and hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj") \
                and getattr(experts.gate_up_proj, "dim", lambda: 0)() == 3:
            out.append((experts, getattr(parent, "gate", None)))
    return out


@dataclass(frozen=True)
class RuntimeConfig:
    """How the hybrid engine runs."""

    cache_ratio: float = 0.5
    """Device expert slots as a share of all routed experts, in [0, 1]."""
    cache_gib: float | None = None
    """Device expert cache size in GiB; overrides cache_ratio when set."""
    per_layer: bool = False
    """Partition the slots evenly per layer instead of one global pool (the authors' code is global)."""
    copy_mode: str = "async"
    """'async': a worker thread serves prefetches concurrently; 'sync': prefetches complete at the end of
    the layer that asked (an infinitely fast link; deterministic, for tests)."""
    trace_cross_layer: bool = True
    """Record, for layer l, the top-k of layer l+1's router on layer l's input (predictor baselines need it)."""

    def __post_init__(self):
        if not 0.0 <= self.cache_ratio <= 1.0:
            raise MoespacError(f"cache_ratio {self.cache_ratio} outside [0, 1]")
        if self.cache_gib is not None and self.cache_gib < 0:
            raise MoespacError(f"cache_gib {self.cache_gib} must be >= 0")
        if self.copy_mode not in ("async", "sync"):
            raise MoespacError(f"copy_mode {self.copy_mode!r}: 'async' or 'sync'")


class HybridRuntime:
    def __init__(self, model, policy: Policy, config: RuntimeConfig = RuntimeConfig(), device: str | None = None,
                 costs: UnitCosts | None = None):
        pairs = find_experts(model)
        if not pairs:
            raise MoespacError(f"{type(model).__name__} has no routed experts (not an MoE model)")
        self.model, self.policy, self.config = model, policy, config
        self.experts = [m for m, _ in pairs]
        self.routers = [r for _, r in pairs]
        m0 = self.experts[0]
        L, E = len(self.experts), m0.gate_up_proj.shape[0]
        k = int(getattr(m0.config, "num_experts_per_tok", 0) or 0)
        self.topology = Topology(L, E, k)
        self.device = torch.device(device) if device else next(model.parameters()).device
        one = (m0.gate_up_proj[0].numel() + m0.down_proj[0].numel()) * m0.gate_up_proj.element_size()
        capacity = int(config.cache_gib * 2**30 // one) if config.cache_gib is not None else round(config.cache_ratio * L * E)
        capacity = min(capacity, L * E)
        self.store = ExpertStore(self.experts, capacity, self.device, policy.transfer_scale)  # < 1: INT4 copies
        self.cache = ExpertCache(self.topology, capacity, capacity // L if config.per_layer else None,
                                 expert_bytes=self.store.copy_bytes)
        self.costs = costs or UnitCosts()
        self.queue = PrefetchQueue()
        self.cv = threading.Condition(threading.RLock())
        self._inflight_layer: int | None = None
        self.recorder: TraceRecorder | None = None
        self.step: StepInfo | None = None
        self.tau_log: list = []
        self._prev_impl = model.config._experts_implementation
        for i, m in enumerate(self.experts):
            m._moespac_runtime, m._moespac_layer = self, i
        if self.store.cuda:  # routed experts live on the host; free their device copies
            for m in self.experts:
                m.gate_up_proj = torch.nn.Parameter(torch.empty(0, device=self.device), requires_grad=False)
                m.down_proj = torch.nn.Parameter(torch.empty(0, device=self.device), requires_grad=False)
        model.set_experts_implementation(IMPL)
        self._worker = None
        if config.copy_mode == "async":
            self._stop = False
            self._worker = threading.Thread(target=self._serve_prefetches, name="moespac-copy", daemon=True)
            self._worker.start()

    # -- request / step lifecycle ---------------------------------------------------------------------
    def start_request(self, gamma: int, batch_size: int = 1, signals=frozenset(), warmup_counts=None) -> None:
        """Reset the policy and the cache for a new request and fill the initial placement."""
        with self.cv:
            self.queue.clear()
            self._wait_idle()
            self.cache = ExpertCache(self.topology, self.cache.capacity, self.cache.per_layer_capacity,
                                     expert_bytes=self.store.copy_bytes)
            sig = set(signals) | {"cross_layer_topk"} if self.config.trace_cross_layer else set(signals)
            if warmup_counts is not None:
                sig.add("warmup_counts")
            ctx = PolicyContext(self.topology, self.cache.capacity, self.cache.per_layer_capacity, gamma=gamma,
                                batch_size=batch_size, costs=self.costs, signals=frozenset(sig),
                                warmup_counts=warmup_counts)
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
        with self.cv:
            self._push(self.policy.begin_step(step, self.cache))

    def end_step(self, accepted: int = 0, emitted: int = 0) -> None:
        with self.cv:
            self._push(self.policy.end_step(self.step, self.cache))
        if self.recorder is not None:
            self.recorder.end(accepted, emitted)

    def close(self) -> None:
        if self._worker is not None:
            self._stop = True
            self.queue.close()
            self._worker.join(timeout=5)
            self._worker = None
        self.model.set_experts_implementation(self._prev_impl)

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
        with self.cv:
            slot = self.cache.start_prefetch(r.layer, r.expert, self.policy)
            if slot is None:
                return
            self._inflight_layer = r.layer
            cache = self.cache
        self.store.copy_in(r.layer, r.expert, slot, wait=True)
        with self.cv:
            if cache is self.cache:  # a new request may have reset the cache meanwhile
                cache.finish_prefetch(r.layer, r.expert)
            self._inflight_layer = None
            self.cv.notify_all()

    def _serve_prefetches(self) -> None:
        while not self._stop:
            r = self.queue.pop(block=True, timeout=0.2)
            if r is not None:
                self._prefetch_one(r)

    def _wait_idle(self, layer: int | None = None) -> None:
        with self.cv:
            while self._inflight_layer is not None and (layer is None or self._inflight_layer == layer):
                self.cv.wait()

    # -- the layer -----------------------------------------------------------------------------------
    def layer_forward(self, layer: int, module, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor):
        E = self.topology.num_experts
        T, k = ids.shape
        ids_host = ids.to("cpu", torch.int64).reshape(-1)
        counts = torch.bincount(ids_host, minlength=E).numpy()
        cache, counters = self.cache, self.cache.counters
        with self.cv:
            counters.prefetch_dropped += self.queue.drop_layer(layer)
            self._wait_idle(layer)  # a copy for this layer already on the link is worth its wait
            active = counts > 0
            hit = active & cache.resident[layer]
            plan = self.policy.plan_layer(layer, counts, cache)
            cache.frozen[layer] = hit
            loaded = []
            for e in np.asarray(plan.load, dtype=np.int64):
                if not active[e] or cache.resident[layer, e] or cache.loading[layer, e]:
                    continue
                slot = cache.reserve(layer, int(e), self.policy)
                if slot is None:
                    continue  # no victim: the expert runs on the host
                loaded.append((int(e), slot))
                cache.frozen[layer, e] = True
            for e, slot in loaded:  # blocking on-demand loads (the layer cannot start without them)
                self.store.copy_in(layer, e, slot, wait=False)
                cache.commit(layer, e)
            on_device = active & cache.resident[layer]
            if plan.host is not None:
                on_device &= ~np.isin(np.arange(E), np.asarray(plan.host, dtype=np.int64))
            counters.hits += int((hit & on_device).sum())
            counters.loads += len(loaded)
            counters.host += int((active & ~on_device).sum())
            counters.bytes_copied += len(loaded) * self.store.copy_bytes
            slots = cache.slot_of[layer].copy()
        if loaded and self.store.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.store.copy_stream)
        out = self._compute(module, hidden, ids_host, weights, counts, on_device, slots, T, k)
        self.store.mark_compute()
        cross = self._cross_layer(layer, hidden)
        if cross is not None and self.step is not None and "cross_layer_topk" in self.step.signals:
            self.step.signals["cross_layer_topk"][layer] = cross
        with self.cv:
            cache.frozen[layer] = False
            requests = self.policy.end_layer(layer, counts, cache)
        self._push(requests)
        if self.recorder is not None:
            self.recorder.layer(layer, ids_host.view(T, k).numpy(), weights.detach().float().cpu().numpy(), cross)
        return out

    def _compute(self, module, hidden, ids_host, weights, counts, on_device, slots, T, k):
        """Run every activated expert once, device part first (async on CUDA), then the host part; merge."""
        H = hidden.shape[-1]
        order = torch.argsort(ids_host, stable=True)
        starts = np.concatenate([[0], np.cumsum(counts)])
        act = module.act_fn
        rows_out = torch.empty((T * k, H), dtype=hidden.dtype, device=hidden.device)
        order_dev = order.to(hidden.device, non_blocking=True)
        host_experts = []
        for e in np.flatnonzero(counts):
            if not on_device[e]:
                host_experts.append(e)
                continue
            rows = order_dev[starts[e]:starts[e + 1]]
            s = int(slots[e])
            rows_out[rows] = expert_ffn(hidden[rows // k], self.store.slot_gate_up[s], self.store.slot_down[s], act)
        if host_experts:
            hidden_host = hidden.to("cpu", non_blocking=False) if self.store.cuda else hidden
            gu, dn = self.store.host_gate_up[module._moespac_layer], self.store.host_down[module._moespac_layer]
            for e in host_experts:
                rows = order[starts[e]:starts[e + 1]]
                y = expert_ffn(hidden_host[rows // k], gu[e], dn[e], act)
                rows_out[rows.to(hidden.device)] = y.to(hidden.device, non_blocking=True)
        w = weights.to(rows_out.dtype).reshape(T, k, 1)
        return (rows_out.view(T, k, H) * w).sum(dim=1).to(hidden.dtype)

    def _cross_layer(self, layer: int, hidden: torch.Tensor) -> np.ndarray | None:
        """Top-k of layer l+1's router on layer l's input (Fate / SpecExp predictors); None at the last layer
        or when neither the policy nor the trace wants it."""
        wanted = "cross_layer_topk" in self.policy.requires or (self.recorder is not None and self.config.trace_cross_layer)
        if not wanted or layer + 1 >= self.topology.num_layers:
            return None
        router = self.routers[layer + 1]
        if router is None or not hasattr(router, "weight"):
            return None
        logits = F.linear(hidden.to(router.weight.dtype), router.weight)
        return torch.topk(logits, self.topology.top_k, dim=-1).indices.cpu().numpy()

    # -- results -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        d = self.cache.counters.to_dict()
        d.update(capacity=self.cache.capacity, expert_bytes=self.store.expert_bytes,
                 policy=self.policy.name, policy_stats=self.policy.describe())
        return d
