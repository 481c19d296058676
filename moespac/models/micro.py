"""`moespac make-micro`: a small random MoE target and dense draft sharing one tokenizer, for tests and smoke runs."""

from __future__ import annotations

from pathlib import Path

from moespac.errors import MoespacError

# Every MoE architecture the lossless tests check against Hugging Face's own generate(): the nine the engine
# is tested on (README, "Architectures"). `make-micro --arch` writes any of them. (No torch at import: the
# CLI and the workflow read this list.)
ARCHS = ("qwen3_moe", "deepseek_v2", "mixtral", "qwen2_moe", "olmoe", "glm4_moe", "phimoe", "minimax_m2",
         "qwen3_5_moe")


def _moe_common(vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6)


def target_config(arch: str, vocab_size: int, **overrides):
    """Config of a tiny MoE target of architecture `arch` (2-3 layers, 8 experts, top-2 by default): the real
    architecture class with small numbers, so that transformers' own modelling code runs."""
    import transformers

    common = _moe_common(vocab_size)
    experts = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    shapes = {
        "qwen3_moe": ("Qwen3MoeConfig", dict(common, head_dim=16, intermediate_size=128, norm_topk_prob=True,
                                              decoder_sparse_step=1, router_aux_loss_coef=0.01, **experts)),
        # one dense first layer + MoE layers with 2 shared experts, like DeepSeek-V2-Lite
        "deepseek_v2": ("DeepseekV2Config", dict(
            common, num_hidden_layers=3, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=2, moe_intermediate_size=32, intermediate_size=128, first_k_dense_replace=1,
            kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
            n_group=1, topk_group=1, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0)),
        "mixtral": ("MixtralConfig", dict(common, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                                          intermediate_size=32)),
        # a shared expert with its own sigmoid gate beside the routed ones
        "qwen2_moe": ("Qwen2MoeConfig", dict(common, intermediate_size=128, shared_expert_intermediate_size=64,
                                             decoder_sparse_step=1, norm_topk_prob=False, **experts)),
        "olmoe": ("OlmoeConfig", dict(common, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                      norm_topk_prob=False)),
        # one dense first layer, a shared expert, grouped sigmoid routing with a score-correction bias
        "glm4_moe": ("Glm4MoeConfig", dict(common, num_hidden_layers=3, head_dim=16, intermediate_size=128,
                                           n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                           n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                           partial_rotary_factor=0.5)),
        # sparsemixer routing, LayerNorm (not RMSNorm)
        "phimoe": ("PhimoeConfig", dict(common, head_dim=16, intermediate_size=32, num_local_experts=8,
                                        num_experts_per_tok=2)),
        "minimax_m2": ("MiniMaxM2Config", dict(common, head_dim=16, intermediate_size=32, num_local_experts=8,
                                               num_experts_per_tok=2)),
        # Gated DeltaNet (recurrent linear attention) layers beside full attention, and a shared expert
        "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(
            common, num_hidden_layers=4, head_dim=16, shared_expert_intermediate_size=64,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, **experts)),
    }
    if arch not in shapes:
        raise MoespacError(f"unknown --arch {arch!r}; one of {', '.join(ARCHS)}")
    name, cfg = shapes[arch]
    cfg.update(overrides)
    return getattr(transformers, name)(**cfg)


def draft_config(vocab_size: int, **overrides):
    """A tiny dense Qwen3 draft."""
    from transformers import Qwen3Config

    cfg = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=4096,
               tie_word_embeddings=True)
    cfg.update(overrides)
    return Qwen3Config(**cfg)


def build_micro(arch: str = "qwen3_moe", vocab_size: int = 320, seed: int = 0, dtype=None, **target_overrides):
    """Return (target, draft, tokenizer), random weights, in memory (float32 unless `dtype`); overrides go to
    the target config."""
    import torch
    from transformers import AutoModelForCausalLM

    from moespac.models.tokenizer import builtin_corpus, train_tokenizer

    dtype = dtype or torch.float32
    tokenizer = train_tokenizer(builtin_corpus(), vocab_size)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    target = AutoModelForCausalLM.from_config(target_config(arch, vocab, **special, **target_overrides), dtype=dtype)
    # Random init of the router is near-uniform; widen it so routing is decisive like a trained model's
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name.endswith((".gate.weight", ".router.weight")) and p.dim() == 2 and p.shape[0] > 1:  # [E, H]
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
        f"target: {arch}, {target.config.num_hidden_layers} layers; draft: dense qwen3, 1 layer; "
        f"vocab {len(tokenizer)}.\n")
    return out
