"""`moespac make-micro`: a small random MoE target and dense draft sharing one tokenizer, for tests and smoke runs."""

from __future__ import annotations

from pathlib import Path

import torch

from moespac.errors import MoespacError
from moespac.models.tokenizer import builtin_corpus, train_tokenizer

ARCHS = ("qwen3_moe", "deepseek_v2", "mixtral")


def target_config(arch: str, vocab_size: int, **overrides):
    """Config of a tiny MoE target of architecture `arch` (2 MoE layers, 8 experts, top-2 by default)."""
    from transformers import DeepseekV2Config, MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
                  rms_norm_eps=1e-6)
    if arch == "qwen3_moe":
        cfg = dict(common, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1, router_aux_loss_coef=0.01)
        cfg.update(overrides)
        return Qwen3MoeConfig(**cfg)
    if arch == "deepseek_v2":
        # one dense first layer + MoE layers with 2 shared experts, like DeepSeek-V2-Lite
        cfg = dict(common, num_hidden_layers=3, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                   moe_intermediate_size=32, intermediate_size=128, first_k_dense_replace=1, kv_lora_rank=16,
                   q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
                   n_group=1, topk_group=1, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0)
        cfg.update(overrides)
        return DeepseekV2Config(**cfg)
    if arch == "mixtral":
        cfg = dict(common, head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32)
        cfg.update(overrides)
        return MixtralConfig(**cfg)
    raise MoespacError(f"unknown --arch {arch!r}; one of {', '.join(ARCHS)}")


def draft_config(vocab_size: int, **overrides):
    """A tiny dense Qwen3 draft."""
    from transformers import Qwen3Config

    cfg = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=4096,
               tie_word_embeddings=True)
    cfg.update(overrides)
    return Qwen3Config(**cfg)


def build_micro(arch: str = "qwen3_moe", vocab_size: int = 320, seed: int = 0, dtype=torch.float32, **target_overrides):
    """Return (target, draft, tokenizer), random weights, in memory; overrides go to the target config."""
    from transformers import AutoModelForCausalLM

    tokenizer = train_tokenizer(builtin_corpus(), vocab_size)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_config(target_config(arch, vocab, **target_overrides), dtype=dtype)
    # Random init of the router is near-uniform; widen it so routing is decisive like a trained model's
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    torch.manual_seed(seed + 1)
    draft = AutoModelForCausalLM.from_config(draft_config(vocab), dtype=dtype)
    if dtype == torch.float64:  # grouped_mm has no fp64 kernel; eager is the stock fallback
        target.set_experts_implementation("eager")
    for m in (target, draft):
        m.generation_config.eos_token_id = tokenizer.eos_token_id
        m.generation_config.pad_token_id = tokenizer.pad_token_id
        m.eval()
    return target, draft, tokenizer


def make_micro(out: str | Path, arch: str = "qwen3_moe", seed: int = 0, vocab_size: int = 320) -> Path:
    """Write DIR/target and DIR/draft (safetensors + shared tokenizer); returns DIR."""
    out = Path(out)
    target, draft, tokenizer = build_micro(arch, vocab_size, seed)
    for sub, model in (("target", target), ("draft", draft)):
        d = out / sub
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d)
        tokenizer.save_pretrained(d)
    (out / "README.md").write_text(
        f"# micro pair ({arch})\n\nRandom weights (seed {seed}) for tests and smoke runs: not a trained model.\n"
        f"target: {arch}, {target.config.num_hidden_layers} layers; draft: dense qwen3, 1 layer; vocab {len(tokenizer)}.\n")
    return out
