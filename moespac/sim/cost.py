"""Cost model: seconds for each piece of work, from a hardware profile and model specs.

Every kernel is priced as max(bytes / bandwidth, flops / peak) + launches x overhead: a roofline with a fixed
cost per operator. Nothing here is fitted to the paper. The structure is this engine's (moespac/engine/hybrid.py):
per MoE layer one device call and one host call; every policy is priced on that one substrate.

Where a native engine differs: docs/internals.md#moespacsimcostpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moespac.models.specs import BYTES_PER_PARAM, ModelSpec
from moespac.policy import UnitCosts
from moespac.sim.profile import HardwareProfile

# moespac.engine.kernels.expert_ffn runs 4 operators: linear(gate_up), act, mul, linear(down) (chunk is a
# view). Calibration divides a tiny expert's time by it; the same count prices a dense FFN block.
OPS_PER_EXPERT = 4
# The hybrid layer (moespac.engine.hybrid) runs a layer's device experts as one call over the slot pool and
# its host experts as one call over the host weights (moespac.engine.kernels.grouped_experts):
GROUPED_CALL_OPS = 5
"""A grouped call (a GPU's device experts): offsets to the device, two grouped matmuls, the gate (act, mul);
no operator per expert."""
LOOP_CALL_OPS = 4
"""A sparse call on a CPU (host experts; device experts when the device is the CPU) loops over its active
experts: the gate (act, mul) and two concatenations per call ..."""
LOOP_OPS_PER_EXPERT = 4
"""... and, per projection and active expert, the slice of its rows and its matmul (moespac.engine.kernels
._linear: two projections, two operators each). (A CPU call dense enough for torch's grouped matmul walks every
group instead, ~2 us each: close to this cost at the densities where it is chosen.)"""
ROUTED_MERGE_OPS = 6
"""Dispatch and merge of a layer's routed rows: the order to the device, gather, concatenation, scatter,
routing weight, sum over k."""
# Operators of one decoder layer outside the routed experts in eager transformers (Qwen3-MoE): input
# norm, q/k/v projections, q/k norms, rotary (2), attention, o-projection, residual add, post norm,
# router linear, softmax, top-k, renormalise.
OPS_PER_LAYER = 16
# Hidden states and the KV cache are bf16 in every setting the paper runs.
ACT_BYTES = 2


@dataclass
class Timing:
    """Seconds of every piece of work in one replay, precomputed per step (what the replay consumes)."""

    draft: np.ndarray
    """[S] draft phase of each step (0 for prefill / AR)."""
    attention: np.ndarray
    """[S] non-expert time of one MoE layer (attention, norms, router, shared experts)."""
    other: np.ndarray
    """[S] time of the forward outside the MoE layers (dense layers, final norm, LM head)."""
    device_by_count: np.ndarray
    """[C+1] device time of one expert given its routing-entry count c (entry 0 is 0)."""
    host_by_count: np.ndarray
    """[C+1] host time of one expert given its count."""
    hidden: np.ndarray
    """[S] fixed host-side time of a layer that computes any expert on the host: the host call and the
    hidden-state transfer there and back."""
    load: float
    """One expert copied host -> device (prefetch or on-demand)."""
    expert_bytes: int
    """Bytes of one expert (what a copy moves)."""
    serial: bool = False
    """Device and host expert work run one after the other (device is the host CPU)."""
    device_call: float = 0.0
    """Fixed device time of a layer's device expert call (charged when any of its experts runs there)."""

    def device_s(self, counts: np.ndarray) -> np.ndarray:
        return self.device_by_count[counts]

    def host_s(self, counts: np.ndarray) -> np.ndarray:
        return self.host_by_count[counts]


class CostModel:
    """Prices the work of one target model (and its draft) on one hardware profile."""

    def __init__(self, profile: HardwareProfile, spec: ModelSpec, draft: ModelSpec | None = None,
                 expert_dtype: str | None = None):
        self.profile, self.spec, self.draft = profile, spec, draft
        self.expert_dtype = expert_dtype or spec.dtype
        self.expert_bytes = spec.expert_bytes(self.expert_dtype)
        self.expert_flops_per_token = 2 * spec.expert_params()
        # weights read from the host's last-level cache when the whole pair fits in half of it, the working set
        # its bandwidth was measured on (a tiny proxy on a CPU; never a real model): every step touches every
        # weight, so a set that small stays there
        p = profile
        cached = 0 < self.weight_bytes() <= p.host_cache_bytes / 2 and p.host_cache_bandwidth > 0
        self.host_bandwidth = p.host_cache_bandwidth if cached else p.host_mem_bandwidth
        self.device_bandwidth = self.host_bandwidth if p.device_is_host and cached else p.device_mem_bandwidth

    def weight_bytes(self) -> int:
        """Bytes of every weight of the target (all experts) and the draft."""
        s = self.spec
        total = self.resident_bytes(context=0) + s.num_moe_layers * s.num_experts * self.expert_bytes
        return int(total)

    # -- primitives ------------------------------------------------------------------------------
    def _device(self, nbytes, flops, ops):
        p = self.profile
        return np.maximum(nbytes / self.device_bandwidth, flops / p.device_flops) + ops * p.launch_overhead

    def _host(self, nbytes, flops, ops):
        p = self.profile
        return np.maximum(nbytes / self.host_bandwidth, flops / p.host_flops) + ops * p.host_op_overhead

    # -- experts ---------------------------------------------------------------------------------
    def device_expert_s(self, tokens) -> np.ndarray:
        """One routed expert on the device for `tokens` routing entries (weights streamed once), without the
        layer's call (device_call_s): operators per expert only where the device's call loops (a CPU)."""
        n = np.asarray(tokens, dtype=np.float64)
        ops = LOOP_OPS_PER_EXPERT if self.profile.device_is_host else 0
        return np.where(n > 0, self._device(self.expert_bytes, self.expert_flops_per_token * n, ops), 0.0)

    def host_expert_s(self, tokens) -> np.ndarray:
        """One routed expert on the host cores for `tokens` routing entries, without the layer's call."""
        n = np.asarray(tokens, dtype=np.float64)
        return np.where(n > 0, self._host(self.expert_bytes, self.expert_flops_per_token * n, LOOP_OPS_PER_EXPERT), 0.0)

    def device_call_s(self) -> float:
        """Fixed time of a layer's device expert call: its operators and the engine's bookkeeping."""
        p = self.profile
        ops = LOOP_CALL_OPS if p.device_is_host else GROUPED_CALL_OPS
        return ops * p.launch_overhead + p.device_call_overhead

    def host_call_s(self) -> float:
        """Fixed time of a layer's host expert call: its operators and the engine's bookkeeping."""
        p = self.profile
        return LOOP_CALL_OPS * p.host_op_overhead + p.host_call_overhead

    def load_s(self) -> float:
        """Copy one expert host -> device: latency + bytes / link bandwidth + the engine's issue cost."""
        p = self.profile
        return p.link_latency + self.expert_bytes / p.link_bandwidth + p.copy_overhead

    def hidden_transfer_s(self, tokens) -> np.ndarray:
        """Hidden states to the host and expert outputs back, for a layer with host experts."""
        p = self.profile
        n = np.asarray(tokens, dtype=np.float64)
        if p.device_is_host:
            return np.zeros_like(n)  # already where the host experts run
        return 2 * (p.link_latency + n * self.spec.hidden_size * ACT_BYTES / p.link_bandwidth)

    # -- non-expert work ---------------------------------------------------------------------------
    @staticmethod
    def _attention_work(spec: ModelSpec, tokens, context, batch: int):
        """(bytes, flops) of one attention block: weights once, the KV of `context` + new tokens read."""
        bpp = BYTES_PER_PARAM[spec.dtype]
        n = np.asarray(tokens, dtype=np.float64)
        per_seq = np.asarray(context, dtype=np.float64) + n / batch  # keys each new token attends to
        kv_row = 2 * spec.num_kv_heads * spec.head_dim * ACT_BYTES
        nbytes = spec.attention_params() * bpp + batch * per_seq * kv_row
        flops = 2 * spec.attention_params() * n + 4 * n * per_seq * spec.num_attention_heads * spec.head_dim
        return nbytes, flops

    def attention_s(self, tokens, context, batch: int = 1) -> np.ndarray:
        """Non-expert time of one MoE layer: attention, router and shared experts, on the device."""
        s = self.spec
        nbytes, flops = self._attention_work(s, tokens, context, batch)
        extra = s.hidden_size * s.num_experts + s.num_shared_experts * s.expert_params()  # router + shared
        n = np.asarray(tokens, dtype=np.float64)
        nbytes = nbytes + extra * BYTES_PER_PARAM[s.dtype]
        flops = flops + 2 * extra * n
        ops = OPS_PER_LAYER + ROUTED_MERGE_OPS + (OPS_PER_EXPERT if s.num_shared_experts else 0)
        p = self.profile
        return self._device(nbytes, flops, ops) + p.layer_overhead + p.moe_layer_overhead

    def _dense_layers_s(self, spec: ModelSpec, layers: int, tokens, context, batch: int) -> np.ndarray:
        nbytes, flops = self._attention_work(spec, tokens, context, batch)
        ffn = 3 * spec.hidden_size * spec.dense_ffn
        n = np.asarray(tokens, dtype=np.float64)
        per_layer = self._device(nbytes + ffn * BYTES_PER_PARAM[spec.dtype], flops + 2 * ffn * n,
                                 OPS_PER_LAYER + OPS_PER_EXPERT) + self.profile.layer_overhead
        return layers * per_layer

    def _head_s(self, spec: ModelSpec, tokens) -> np.ndarray:
        params = spec.vocab_size * spec.hidden_size
        n = np.asarray(tokens, dtype=np.float64)
        # final norm + LM head, and the forward's fixed framework cost
        return self._device(params * BYTES_PER_PARAM[spec.dtype], 2 * params * n, 2) + self.profile.forward_overhead

    def other_s(self, tokens, context, batch: int = 1) -> np.ndarray:
        """Forward time outside the MoE layers: dense layers (DeepSeek/GLM first layers) and the LM head."""
        s = self.spec
        dense = s.num_layers - s.num_moe_layers
        return self._dense_layers_s(s, dense, tokens, context, batch) + self._head_s(s, tokens)

    def draft_forward_s(self, tokens=1, context=0, batch: int = 1) -> np.ndarray:
        """One draft forward over `tokens` new tokens: dense weights streamed once from device memory."""
        if self.draft is None:
            return np.zeros_like(np.asarray(tokens, dtype=np.float64))
        d = self.draft
        return self._dense_layers_s(d, d.num_layers, tokens, context, batch) + self._head_s(d, tokens)

    def draft_token_s(self) -> float:
        """Draft time per drafted token (one single-token forward)."""
        return float(self.draft_forward_s(1))

    # -- what policies and the replay consume ------------------------------------------------------------
    def unit_costs(self, tokens: int = 9, context: int = 512, batch: int = 1) -> UnitCosts:
        """UnitCosts for cost-aware policies; `tokens` = routing batch of one step (batch x (gamma+1))."""
        return UnitCosts(t_io=self.load_s(), t_gpu=float(self.device_expert_s(tokens)),
                         t_cpu=float(self.host_expert_s(1)), t_draft=self.draft_token_s(),
                         t_layer=float(self.attention_s(tokens, context, batch)))

    def timing(self, workload) -> Timing:
        """Per-step costs of a workload (moespac.sim.workload.Workload)."""
        steps = workload.steps
        tokens = steps["step_tokens"].astype(np.int64)
        gamma = steps["step_gamma"].astype(np.int64)
        batch = int(workload.trace.meta.get("batch_size", 1) or 1)
        is_prefill = steps["step_kind"] == 0
        # tokens in the KV before each step, per request: prefill adds the prompt, decode steps what they emit
        grown = np.where(is_prefill, tokens, steps["step_emitted"]).astype(np.int64)
        context = np.zeros(len(tokens), dtype=np.int64)
        first_verify = np.zeros(len(tokens), dtype=bool)
        for idx in workload.requests():
            c = np.cumsum(grown[idx])
            context[idx] = np.r_[0, c[:-1]]
            drafted = np.flatnonzero(gamma[idx] > 0)
            if len(drafted):
                first_verify[idx[drafted[0]]] = True
        per_seq = context / batch
        # the draft's first forward of a request also reads the prompt (it has no KV yet); later ones ~1 token
        catch_up = np.where(first_verify, context + 1, batch)
        draft = np.where(gamma > 0, self.draft_forward_s(catch_up, np.where(first_verify, 0, per_seq), batch)
                         + (gamma - 1).clip(0) * self.draft_forward_s(batch, per_seq, batch), 0.0)
        # the engine's loop: sampling each drafted token, and each decode step's acceptance and rollback
        p = self.profile
        draft = draft + gamma * p.draft_token_overhead
        loop = np.where(is_prefill, 0.0, p.step_overhead)
        cmax = int(workload.counts.max()) if workload.counts.size else 0
        c = np.arange(cmax + 1)
        return Timing(draft=draft, attention=self.attention_s(tokens, per_seq, batch),
                      other=self.other_s(tokens, per_seq, batch) + loop, device_by_count=self.device_expert_s(c),
                      host_by_count=self.host_expert_s(c), hidden=self.hidden_transfer_s(tokens) + self.host_call_s(),
                      load=self.load_s(), expert_bytes=self.expert_bytes, serial=self.profile.device_is_host,
                      device_call=self.device_call_s())

    # -- memory ----------------------------------------------------------------------------------
    def resident_bytes(self, context: int = 4096, batch: int = 1) -> int:
        """Device bytes besides the expert cache: non-expert target weights, the draft, the KV cache."""
        s = self.spec
        bpp = BYTES_PER_PARAM[s.dtype]
        params = s.num_layers * s.attention_params() + s.num_moe_layers * (
            s.hidden_size * s.num_experts + s.num_shared_experts * s.expert_params())
        params += (s.num_layers - s.num_moe_layers) * 3 * s.hidden_size * s.dense_ffn + 2 * s.vocab_size * s.hidden_size
        kv = batch * context * s.num_layers * 2 * s.num_kv_heads * s.head_dim * ACT_BYTES
        total = params * bpp + kv
        if self.draft is not None:
            d = self.draft
            dparams = (d.num_layers * (d.attention_params() + 3 * d.hidden_size * d.dense_ffn)
                       + 2 * d.vocab_size * d.hidden_size)
            total += (dparams * BYTES_PER_PARAM[d.dtype]
                      + batch * context * d.num_layers * 2 * d.num_kv_heads * d.head_dim * ACT_BYTES)
        return int(total)

    def fit_slots(self, headroom_bytes: float = 2**30, context: int = 4096, batch: int = 1) -> int:
        """Expert slots that fit in device memory after `resident_bytes` and `headroom_bytes` (CUDA context,
        activations; 1 GiB assumed)."""
        free = self.profile.device_memory - self.resident_bytes(context, batch) - headroom_bytes
        return int(max(0.0, free) // self.expert_bytes)
