"""Architecture numbers of the paper's models, and the ModelSpec every layer below uses.

Numbers come from each model's public `config.json` on the hub (the id is given); bytes per expert are
derived: 3 projections (gate, up, down) x hidden x expert FFN width x bytes per parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moespac.errors import MoespacError

BYTES_PER_PARAM = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a (possibly MoE) decoder-only model, as far as expert scheduling needs it."""

    name: str
    """Spec name (a key of PAPER_MODELS), e.g. `qwen3-30b-a3b`."""
    hub_id: str | None
    """Hugging Face hub id (None for locally built models)."""
    num_layers: int
    """Decoder layers in total."""
    num_moe_layers: int
    """Decoder layers whose FFN is a routed MoE (0 for a dense model)."""
    num_experts: int
    """Routed experts per MoE layer."""
    num_shared_experts: int
    """Always-active shared experts per MoE layer (kept on the device, never scheduled)."""
    top_k: int
    """Routed experts per token."""
    hidden_size: int
    """Model width."""
    expert_ffn: int
    """Intermediate width of one routed expert."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads."""
    head_dim: int
    """Width of one attention head."""
    vocab_size: int
    """Vocabulary size."""
    dense_ffn: int = 0
    """Intermediate width of dense FFN layers (dense models and dense-first layers)."""
    dtype: str = "bf16"
    """Storage dtype of the released weights."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self):
        if self.dtype not in BYTES_PER_PARAM:
            raise MoespacError(f"model spec {self.name!r}: unknown dtype {self.dtype!r}; "
                               f"one of {sorted(BYTES_PER_PARAM)}")
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, f) <= 0:
                raise MoespacError(f"model spec {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        if self.num_moe_layers:
            for f in ("num_experts", "top_k", "expert_ffn"):
                if getattr(self, f) <= 0:
                    raise MoespacError(f"model spec {self.name!r}: {f} must be positive for an MoE model")
            if self.top_k > self.num_experts:
                raise MoespacError(f"model spec {self.name!r}: top_k {self.top_k} > num_experts {self.num_experts}")

    @property
    def is_moe(self) -> bool:
        return self.num_moe_layers > 0

    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_ffn

    def expert_bytes(self, dtype: str | None = None) -> int:
        """Bytes of one routed expert at `dtype` (default: the spec's own dtype)."""
        dtype = dtype or self.dtype
        if dtype not in BYTES_PER_PARAM:
            raise MoespacError(f"unknown dtype {dtype!r}; one of {sorted(BYTES_PER_PARAM)}")
        return self.expert_params() * BYTES_PER_PARAM[dtype]

    def total_experts(self) -> int:
        return self.num_moe_layers * self.num_experts

    def attention_params(self) -> int:
        """Parameters of one attention block (q, k, v, o projections)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * kv)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise MoespacError(f"model spec: unknown keys {sorted(unknown)}")
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - set(d)
        if missing:
            raise MoespacError(f"model spec: missing keys {sorted(missing)}")
        return cls(**d)


def _spec(**kw) -> ModelSpec:
    return ModelSpec(**kw)


PAPER_MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        _spec(name="qwen3-30b-a3b", hub_id="Qwen/Qwen3-30B-A3B", num_layers=48, num_moe_layers=48, num_experts=128,
              num_shared_experts=0, top_k=8, hidden_size=2048, expert_ffn=768, num_attention_heads=32,
              num_kv_heads=4, head_dim=128, vocab_size=151936, source="hub config.json (Qwen3MoeConfig)"),
        _spec(name="qwen3-4b", hub_id="Qwen/Qwen3-4B", num_layers=36, num_moe_layers=0, num_experts=0,
              num_shared_experts=0, top_k=0, hidden_size=2560, expert_ffn=0, num_attention_heads=32,
              num_kv_heads=8, head_dim=128, vocab_size=151936, dense_ffn=9728, source="hub config.json"),
        _spec(name="qwen3-4b-fp8", hub_id="Qwen/Qwen3-4B-FP8", num_layers=36, num_moe_layers=0, num_experts=0,
              num_shared_experts=0, top_k=0, hidden_size=2560, expert_ffn=0, num_attention_heads=32,
              num_kv_heads=8, head_dim=128, vocab_size=151936, dense_ffn=9728, dtype="fp8",
              source="hub config.json (fine-grained FP8, block 128)"),
        _spec(name="qwen3-1.7b", hub_id="Qwen/Qwen3-1.7B", num_layers=28, num_moe_layers=0, num_experts=0,
              num_shared_experts=0, top_k=0, hidden_size=2048, expert_ffn=0, num_attention_heads=16,
              num_kv_heads=8, head_dim=128, vocab_size=151936, dense_ffn=6144, source="hub config.json"),
        _spec(name="deepseek-v2-lite", hub_id="deepseek-ai/DeepSeek-V2-Lite", num_layers=27, num_moe_layers=26,
              num_experts=64, num_shared_experts=2, top_k=6, hidden_size=2048, expert_ffn=1408,
              num_attention_heads=16, num_kv_heads=16, head_dim=192, vocab_size=102400, dense_ffn=10944,
              source="hub config.json (first_k_dense_replace=1; MLA, head_dim = qk_nope 128 + qk_rope 64)"),
        _spec(name="glm-4.5-air", hub_id="zai-org/GLM-4.5-Air", num_layers=46, num_moe_layers=45, num_experts=128,
              num_shared_experts=1, top_k=8, hidden_size=4096, expert_ffn=1408, num_attention_heads=96,
              num_kv_heads=8, head_dim=128, vocab_size=151552, dense_ffn=10944,
              source="hub config.json (first_k_dense_replace=1)"),
        _spec(name="qwen3.5-122b-a10b", hub_id="Qwen/Qwen3.5-122B-A10B", num_layers=48, num_moe_layers=48,
              num_experts=256, num_shared_experts=1, top_k=8, hidden_size=3072, expert_ffn=1024,
              num_attention_heads=32, num_kv_heads=2, head_dim=256, vocab_size=248320,
              source="hub config.json (hybrid linear/full attention; "
                     "attention numbers are the full-attention layers')"),
        _spec(name="minimax-m2.5", hub_id="MiniMaxAI/MiniMax-M2.5", num_layers=62, num_moe_layers=62,
              num_experts=256, num_shared_experts=0, top_k=8, hidden_size=3072, expert_ffn=1536,
              num_attention_heads=48, num_kv_heads=8, head_dim=128, vocab_size=200064, dtype="fp8",
              source="hub config.json (MiniMax-M2 architecture, FP8 release)"),
    ]
}


def get_spec(name: str) -> ModelSpec:
    """Look up a paper model by its spec name (case-insensitive)."""
    key = name.lower()
    if key not in PAPER_MODELS:
        raise MoespacError(f"unknown model spec {name!r}; known: {', '.join(sorted(PAPER_MODELS))}")
    return PAPER_MODELS[key]


def spec_from_config(config, name: str = "local", hub_id: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a transformers config (MoE or dense)."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = c.num_hidden_layers
    n_experts = (getattr(c, "num_experts", None) or getattr(c, "n_routed_experts", None)
                 or getattr(c, "num_local_experts", None) or 0)
    top_k = getattr(c, "num_experts_per_tok", 0) or 0
    moe_ffn = getattr(c, "moe_intermediate_size", None) or (getattr(c, "intermediate_size", 0) if n_experts else 0)
    dense_first = getattr(c, "first_k_dense_replace", 0) or 0
    mlp_only = set(getattr(c, "mlp_only_layers", []) or [])
    step = getattr(c, "decoder_sparse_step", 1) or 1
    if n_experts:
        moe_layers = [i for i in range(n_layers) if i >= dense_first and i not in mlp_only and (i + 1) % step == 0]
    else:
        moe_layers = []
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    shared = getattr(c, "n_shared_experts", 0) or 0
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
        str(getattr(c, "dtype", "float32")).replace("torch.", ""), "fp32")
    return ModelSpec(
        name=name, hub_id=hub_id, num_layers=n_layers, num_moe_layers=len(moe_layers), num_experts=n_experts,
        num_shared_experts=shared, top_k=top_k, hidden_size=c.hidden_size, expert_ffn=moe_ffn if n_experts else 0,
        num_attention_heads=heads, num_kv_heads=getattr(c, "num_key_value_heads", heads), head_dim=head_dim,
        vocab_size=c.vocab_size, dense_ffn=getattr(c, "intermediate_size", 0) or 0, dtype=dtype,
        source=f"transformers config ({type(c).__name__})",
    )
