"""transformers configs of the paper's models, by hub id, from their public config.json numbers: the memory
plan reads a model's shape from its config alone (meta device, no weights), so it works offline for these.

Online, any hub id's config is read from the hub instead (`load_config`); a local folder's from its
config.json. Each entry names the architecture class and the numbers that decide parameter and KV-cache
sizes; everything else keeps the class's defaults. Where a number could not be read from a public copy
of the model's config it says so (`unverified`).
"""

from __future__ import annotations

import os
from pathlib import Path

from moespac.errors import MoespacError

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

# hub id -> (transformers config class, its numbers, registry name, numbers not read from a public copy)
HUB_CONFIGS: dict[str, tuple[str, dict, str, tuple[str, ...]]] = {
    "Qwen/Qwen3-30B-A3B": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1000000.0, dtype="bfloat16"),
        "qwen3-30b-a3b", ()),
    "Qwen/Qwen3-4B": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_theta=1000000.0, dtype="bfloat16"), "qwen3-4b", ()),
    "Qwen/Qwen3-4B-FP8": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_theta=1000000.0, dtype="bfloat16", quantization_config=FP8_BLOCK), "qwen3-4b-fp8", ()),
    "Qwen/Qwen3-1.7B": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_theta=1000000.0, dtype="bfloat16"), "qwen3-1.7b", ()),
    "deepseek-ai/DeepSeek-V2-Lite": ("DeepseekV2Config", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_group=1, topk_group=1, topk_method="greedy",
        norm_topk_prob=False, routed_scaling_factor=1.0, tie_word_embeddings=False, max_position_embeddings=163840,
        dtype="bfloat16"), "deepseek-v2-lite", ()),
    "zai-org/GLM-4.5-Air": ("Glm4MoeConfig", dict(
        vocab_size=151552, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8, head_dim=128, n_routed_experts=128,
        n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, partial_rotary_factor=0.5, attention_bias=True,
        use_qk_norm=False, tie_word_embeddings=False, max_position_embeddings=131072, dtype="bfloat16"),
        "glm-4.5-air", ()),
    "Qwen/Qwen3.5-122B-A10B": ("Qwen3_5MoeTextConfig", dict(
        vocab_size=248320, hidden_size=3072, moe_intermediate_size=1024, shared_expert_intermediate_size=1024,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=2, head_dim=256, num_experts=256,
        num_experts_per_tok=8, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12,
        tie_word_embeddings=False, dtype="bfloat16"), "qwen3.5-122b-a10b",
        ("shared_expert_intermediate_size", "linear-attention head numbers (the class defaults)")),
    "MiniMaxAI/MiniMax-M2.5": ("MiniMaxM2Config", dict(
        vocab_size=200064, hidden_size=3072, intermediate_size=1536, num_hidden_layers=62, num_attention_heads=48,
        num_key_value_heads=8, head_dim=128, num_local_experts=256, num_experts_per_tok=8,
        tie_word_embeddings=False, max_position_embeddings=196608, dtype="bfloat16", quantization_config=FP8_BLOCK),
        "minimax-m2.5", ()),
}


def offline_config(hub_id: str):
    """The config of a paper model from its numbers (no network)."""
    import transformers

    name, numbers, _, _ = HUB_CONFIGS[hub_id]
    return getattr(transformers, name)(**numbers)


def load_config(ref: str, trust_remote_code: bool = False, role: str = "model"):
    """A model's config: a local folder's config.json, a paper model's numbers by hub id when offline, else the
    hub's config.json. Unknown and unreachable ids fail in one line."""
    from transformers import AutoConfig

    from moespac.models.loading import check_ref, hub_unavailable, not_on_hub

    if check_ref(ref, role):
        try:
            return AutoConfig.from_pretrained(str(Path(ref).expanduser()), local_files_only=True,
                                              trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise MoespacError(f"{role} {ref!r}: not a model folder with a config.json "
                               f"({str(e).splitlines()[0]})") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False") or hub_unavailable(ref)
    if ref in HUB_CONFIGS and offline:
        return offline_config(ref)
    if offline:
        raise not_on_hub(ref, role)
    try:
        return AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        if ref in HUB_CONFIGS:
            return offline_config(ref)
        raise not_on_hub(ref, role) from None
