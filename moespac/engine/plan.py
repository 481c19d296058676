"""The memory plan: what a run needs on the device and on the host, from the model configs alone.

Each model is built on the meta device (shapes, no weights). The plan chooses the slot count that fits the
device budget, checks an explicit --cache-ratio / --cache-gib against it, and refuses before anything is
loaded, in one line, saying what does not fit and by how much.

Details: docs/internals.md#moespacengineplanpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from moespac.cache import CacheSize
from moespac.errors import MoespacError

GiB = 2**30
CUDA_RESERVE = GiB // 2  # CUDA context and allocator slack on a GPU
DTYPE_BYTES = {torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.float16: 2}


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True)
class ModelShape:
    """One model's sizes, read from its config on the meta device."""

    name: str
    weight_bytes: int
    """Every weight as the engine loads it."""
    expert_bytes: int
    """Routed experts, all layers (the expert store; 0 for a dense model)."""
    expert_each: int
    """One routed expert (one device slot)."""
    moe_layers: int
    experts: int
    """Routed experts per MoE layer."""
    layer_block: int
    """The host block of one MoE layer, as ExpertStore allocates it (tensors rounded to 256 bytes)."""
    kv_per_token: int
    """KV-cache bytes per token per sequence, all attention layers."""
    state_bytes: int
    """Recurrent (linear-attention) state per sequence."""
    hidden: int
    vocab: int
    top_k: int
    expert_ffn: int
    dtype_bytes: int
    """Bytes of one activation element (the model's float dtype)."""


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _fp8(config) -> bool:
    q = getattr(config, "quantization_config", None)
    q = q if isinstance(q, dict) else (q.to_dict() if hasattr(q, "to_dict") else {})
    return q.get("quant_method") == "fp8"


def _kv(c, nbytes: int) -> tuple[int, int]:
    """(KV bytes per token, recurrent state bytes per sequence) over the layers of text config c."""
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    if getattr(c, "kv_lora_rank", None):  # MLA: transformers caches full keys (nope + rope) and values
        per_layer = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
    else:
        per_layer = 2 * kv_heads * head_dim
    types = list(getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers)
    linear = types.count("linear_attention")
    state = 0
    if linear:
        k_dim = c.linear_num_key_heads * c.linear_key_head_dim
        v_dim = c.linear_num_value_heads * c.linear_value_head_dim
        state = linear * (c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
                          + (2 * k_dim + v_dim) * c.linear_conv_kernel_dim)
    return (len(types) - linear) * per_layer * nbytes, state * nbytes


def model_shape(config, dtype: torch.dtype | None = None, name: str = "") -> ModelShape:
    """Sizes of the model `config` describes, at `dtype` (default: the config's)."""
    from transformers import AutoModelForCausalLM

    from moespac.models.experts import find_experts
    from moespac.engine.kernels import ExpertLayout

    c = _text(config)
    dtype = dtype or getattr(c, "dtype", None) or getattr(config, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    nbytes = DTYPE_BYTES.get(dtype, 2)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    experts = find_experts(model)
    expert_ids = {id(getattr(m, n)) for m, _ in experts for n in ExpertLayout.of(m, "plan").names}
    fp8 = _fp8(config)
    fp8_weights = set()
    if fp8:  # Linear weights of an FP8 checkpoint stay FP8 (1 byte + a float32 scale per 128 x 128 block)
        fp8_weights = {id(m.weight) for n, m in model.named_modules()
                       if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")}
    weight_bytes = expert_bytes = 0
    for p in model.parameters():
        if id(p) in expert_ids:
            expert_bytes += p.numel() * nbytes  # the engine runs float experts: dequantized
        elif id(p) in fp8_weights:
            weight_bytes += p.numel() + 4 * math.ceil(p.shape[0] / 128) * math.ceil(p.shape[-1] / 128)
        else:
            weight_bytes += p.numel() * nbytes
    each = block = 0
    n_experts = 0
    if experts:
        m0 = experts[0][0]
        names = ExpertLayout.of(m0, "plan").names
        n_experts = getattr(m0, names[0]).shape[0]
        each = sum(getattr(m0, n)[0].numel() for n in names) * nbytes
        block = sum(-(-getattr(m0, n).numel() * nbytes // 256) * 256 for n in names)
    kv, state = _kv(c, nbytes)
    top_k = int(getattr(c, "num_experts_per_tok", 0) or 0)
    ffn = int(getattr(c, "moe_intermediate_size", 0) or (getattr(c, "intermediate_size", 0) if experts else 0))
    return ModelShape(name or getattr(config, "_name_or_path", "") or type(config).__name__,
                      weight_bytes + expert_bytes, expert_bytes, each, len(experts), n_experts, block, kv, state,
                      c.hidden_size, c.vocab_size, top_k, ffn, nbytes)


class DoesNotFit(MoespacError):
    """The run cannot fit this machine's device or host memory (the plan's verdict, not a bad input)."""


@dataclass(frozen=True)
class MemoryPlan:
    target: ModelShape
    draft: ModelShape | None
    device_budget: int | None
    """Bytes the device may use (None: the device is the host, e.g. a CPU run)."""
    host_budget: int | None
    context: int
    batch: int
    slots: int
    requested: str
    """How the slot count was chosen: 'plan' or the explicit flag."""
    device_fixed: dict
    """Device bytes by item, before the slot pool."""
    host_items: dict
    """Host bytes by item: the steady store and the peak while loading."""

    @property
    def total_slots(self) -> int:
        return self.target.moe_layers * self.target.experts

    @property
    def cache_ratio(self) -> float:
        return self.slots / self.total_slots if self.total_slots else 0.0

    @property
    def slot_pool(self) -> int:
        return self.slots * self.target.expert_each

    @property
    def device_total(self) -> int:
        return sum(self.device_fixed.values()) + self.slot_pool

    @property
    def host_peak(self) -> int:
        return self.host_items["peak while loading"]

    def render(self) -> str:
        t, d = self.target, self.draft
        rows = [f"memory plan: target {t.name}" + (f" + draft {d.name}" if d else "") +
                f", context {self.context} x batch {self.batch}"]
        budget = _gib(self.device_budget) if self.device_budget is not None else "the host's (a CPU run)"
        rows.append(f"device (budget {budget}):")
        for k, v in self.device_fixed.items():
            rows.append(f"  {k:<34} {_gib(v):>12}")
        rows.append(f"  {'expert slots':<34} {_gib(self.slot_pool):>12}   {self.slots} of {self.total_slots} "
                    f"experts x {t.expert_each / 2**20:.2f} MiB = cache ratio {self.cache_ratio:.3f} "
                    f"({self.requested})")
        rows.append(f"  {'total':<34} {_gib(self.device_total):>12}")
        hb = _gib(self.host_budget) if self.host_budget is not None else "not given"
        rows.append(f"host (budget {hb}):")
        for k, v in self.host_items.items():
            rows.append(f"  {k:<34} {_gib(v):>12}")
        return "\n".join(rows)


def plan_memory(target: ModelShape, draft: ModelShape | None = None, *, device_gib: float | None,
                host_gib: float | None, context: int = 4096, batch: int = 1, gamma: int = 8, cuda: bool = True,
                cache: CacheSize = CacheSize()) -> MemoryPlan:
    """The plan of one run (`cache`: the slots asked for, if any); raises MoespacError (one line) when it cannot
    fit."""
    if not target.moe_layers:
        raise MoespacError(f"target {target.name}: no routed experts (not an MoE model)")
    total = target.moe_layers * target.experts
    rows = batch * (gamma + 1) * max(target.top_k, 1)
    prefill = min(context, 2048) * batch  # prompt tokens of one prefill forward, at most
    act_bytes = target.dtype_bytes
    workspace = (prefill * (8 * target.hidden + target.top_k * 3 * (target.hidden + target.expert_ffn)) * act_bytes
                 + batch * (gamma + 1) * target.vocab * 8 * 2  # float64 sampling probabilities of both models
                 + (CUDA_RESERVE if cuda else 0))
    fixed = {"target non-expert weights": target.weight_bytes - target.expert_bytes}
    if draft is not None:
        fixed["draft weights"] = draft.weight_bytes
    kv = target.kv_per_token * context * batch + target.state_bytes * batch
    if draft is not None:
        kv += draft.kv_per_token * context * batch + draft.state_bytes * batch
    fixed["KV cache and recurrent state"] = kv
    fixed["workspace (estimate)"] = workspace
    staging = 2 * rows * target.hidden * act_bytes
    store = target.layer_block * target.moe_layers
    host = {"expert store": store, "pinned staging buffers": staging if cuda else 0,
            "peak while loading": target.weight_bytes + target.layer_block + staging}
    device_budget = int(device_gib * GiB) if device_gib is not None else None
    host_budget = int(host_gib * GiB) if host_gib is not None else None
    need = sum(fixed.values())
    if not cuda and host_budget is not None:  # a CPU run: the "device" pool is host memory too
        device_budget = host_budget - store - staging
        if need > device_budget:
            raise DoesNotFit(f"memory plan: a CPU run keeps everything in host memory: the expert store "
                             f"{_gib(store)} and the rest {_gib(need)}, {_gib(store + staging + need - host_budget)} "
                             f"more than the host's {_gib(host_budget)}")
    if device_budget is not None and need > device_budget:
        parts = ", ".join(f"{k} {_gib(v)}" for k, v in fixed.items())
        raise DoesNotFit(f"memory plan: the device needs {_gib(need)} before any expert slot ({parts}), "
                         f"{_gib(need - device_budget)} more than its {_gib(device_budget)}")
    fit = total if device_budget is None else min(total, (device_budget - need) // max(target.expert_each, 1))
    slots = cache.requested_slots(total, target.expert_each)
    requested = (f"--cache-gib {cache.cache_gib:g}" if cache.cache_gib is not None else
                 f"--cache-ratio {cache.cache_ratio:g}" if cache.cache_ratio is not None else "chosen by the plan")
    slots = fit if slots is None else slots
    if slots > fit:
        raise DoesNotFit(f"memory plan: {requested} asks for {slots} expert slots "
                         f"({_gib(slots * target.expert_each)}), but {fit} fit the device next to the rest "
                         f"({_gib(fit * target.expert_each)}, cache ratio {fit / total:.3f}); lower it, or omit "
                         "it to let the plan choose")
    plan = MemoryPlan(target, draft, device_budget if cuda else None, host_budget, context, batch, slots, requested,
                      fixed, host)
    if host_budget is not None:
        peak = plan.host_peak
        if peak > host_budget:
            raise DoesNotFit(f"memory plan: the host needs {_gib(peak)} at its peak (the target as loaded "
                             f"{_gib(target.weight_bytes)}, one layer's block {_gib(target.layer_block)}), "
                             f"{_gib(peak - host_budget)} more than its {_gib(host_budget)}")
    return plan
