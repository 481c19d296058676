"""A lean forward for Llama-family decoders at batch size 1: the arithmetic of transformers' modules on the
model's own weights, without the per-module Python around it.

It issues the same operators in the same order as transformers' Qwen3 / Qwen2 / Llama / Mistral decoders; a
routed MoE block runs its own `mlp` module, so the engine's hybrid experts run as inside transformers' forward.
Anything it does not know runs through transformers as before: `lean_forward(model)` returns None then.

Details: docs/internals.md#moespacengineleanpy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                 "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load (dynamic types change it per call)


class LayerCache:
    """One layer's keys and values [B, kv_heads, T, head_dim], cropped as transformers' cache layers are."""

    def __init__(self):
        self.keys = self.values = None

    def crop(self, n: int) -> None:
        """A negative n drops the last -n columns (the only form the engine uses)."""
        self.keys, self.values = self.keys[..., :n, :], self.values[..., :n, :]


class LeanCache:
    """The lean forward's KV cache: `layers` with keys/values, as the engine's CachedModel handles them."""

    def __init__(self, num_layers: int):
        self.layers = [LayerCache() for _ in range(num_layers)]

    def batch_select_indices(self, idx: torch.Tensor) -> None:
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]


def _plain(*modules) -> bool:
    return all(type(m) is torch.nn.Linear for m in modules)


def _swiglu(mlp) -> bool:
    """A plain SwiGLU MLP (gate, up, down linears, SiLU): computed here; anything else runs as its module."""
    parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(mlp, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"  # transformers' own SiLU
    return None not in parts and _plain(*parts) and silu


def lean_forward(model) -> "LeanForward | None":
    """A LeanForward over `model`, or None where it would not compute what transformers computes."""
    if type(model).__name__ not in ARCHITECTURES or getattr(model, "training", False):
        return None
    cfg = model.config
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if inner is None or rotary is None or getattr(rotary, "rope_type", "default") not in ROPE_TYPES:
        return None
    if getattr(cfg, "final_logit_softcapping", None):
        return None
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return None
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):  # Mistral's is in the mask
        return None
    for layer in inner.layers:
        a = layer.self_attn
        if not _plain(a.q_proj, a.k_proj, a.v_proj, a.o_proj) or getattr(a, "sliding_window", None):
            return None
        if getattr(a, "scaling", None) is None or not hasattr(a, "head_dim"):
            return None
        mlp = layer.mlp
        if not _swiglu(mlp) and any(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return None  # a dense MLP of another kind (a quantised or replaced linear)
    if not _plain(model.lm_head) or model.lm_head.bias is not None:
        return None
    return LeanForward(model)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: in float32, scaled by the weight in the input's dtype. A float32 input on a CPU takes
    torch's one-call rms_norm, the same arithmetic there (seven operators fewer; 8 vs 11 us here). Not on CUDA:
    there rms_norm dispatches to a fused kernel (_fused_rms_norm_cuda, torch 2.11 and 2.13 alike) that reduces in
    its own order, so the engine keeps transformers' operators and its bits."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu":
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _weights(m) -> tuple:
    return m.weight, m.bias


class LeanForward:
    """forward(ids [1, W], position_ids [1, W], cache) -> logits [1, W, V] (the last column's with last_only)."""

    def __init__(self, model):
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head = model.lm_head.weight
        self.rotary = inner.rotary_emb
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)  # Qwen3 normalises q and k per head
            swiglu = _swiglu(m)
            self.layers.append(dict(
                ln1=(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                ln2=(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                q=_weights(a.q_proj), k=_weights(a.k_proj), v=_weights(a.v_proj), o=_weights(a.o_proj),
                qn=(qn.weight, qn.variance_epsilon) if qn is not None else None,
                kn=(kn.weight, kn.variance_epsilon) if kn is not None else None,
                gate=_weights(m.gate_proj) if swiglu else None, up=_weights(m.up_proj) if swiglu else None,
                down=_weights(m.down_proj) if swiglu else None, mlp=None if swiglu else m,
                head_dim=a.head_dim, scaling=a.scaling))

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers))

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, position_ids: torch.Tensor, cache: LeanCache, last_only: bool = False):
        x = F.embedding(ids, self.embed)
        B, W = ids.shape
        inv = self.rotary.inv_freq.to(device=x.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rotary.attention_scaling
        cos = (emb.cos() * scale).to(x.dtype)[:, None]
        sin = (emb.sin() * scale).to(x.dtype)[:, None]
        past = 0 if cache.layers[0].keys is None else cache.layers[0].keys.shape[2]
        mask = None
        if W > 1 and past:  # causal with an offset: query i sees the past and new tokens 0..i
            mask = torch.ones((W, past + W), dtype=torch.bool, device=x.device).tril(past)
        for p, kv in zip(self.layers, cache.layers):
            d = p["head_dim"]
            h = _rms(x, *p["ln1"])
            q = F.linear(h, *p["q"]).view(B, W, -1, d)
            k = F.linear(h, *p["k"]).view(B, W, -1, d)
            v = F.linear(h, *p["v"]).view(B, W, -1, d).transpose(1, 2)
            if p["qn"] is not None:
                q, k = _rms(q, *p["qn"]), _rms(k, *p["kn"])
            q, k = _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin)
            if kv.keys is not None:
                k, v = torch.cat((kv.keys, k), dim=2), torch.cat((kv.values, v), dim=2)
            kv.keys, kv.values = k, v
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and W > 1,
                                               scale=p["scaling"], enable_gqa=k.shape[1] != q.shape[1])
            x = x + F.linear(o.transpose(1, 2).reshape(B, W, -1), *p["o"])
            h = _rms(x, *p["ln2"])
            if p["mlp"] is not None:  # a routed block: its own module (the engine's experts run inside it)
                y = p["mlp"](h)
                x = x + (y[0] if isinstance(y, tuple) else y)
            else:
                x = x + F.linear(F.silu(F.linear(h, *p["gate"])) * F.linear(h, *p["up"]), *p["down"])
        if last_only:
            x = x[:, -1:]
        return F.linear(_rms(x, self.norm, self.norm_eps), self.head)
