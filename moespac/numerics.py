"""Paper Table 6 for our hybrid layer: NMSE of the hybrid MoE block against the stock transformers block.

In fp32 and in bf16 (what a GPU run loads). On one CPU both sides of the split run the same kernels, so the hybrid
matches the stock block bit for bit in either dtype; the bf16 block against the fp32 one is the rounding floor a
bf16 run carries (the scale of error the paper's bound is about), and the hybrid must add nothing to it. The
CUDA-vs-CPU comparison (the paper's AGGRE row) needs a GPU: benchmarks/gpu_engine_check.sh.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.policy import Policy, PolicyContext

PAPER_WORST_NMSE = 4.1e-6  # Table 6, "Small split MoE" row: the loosest bound the paper reports


class RandomSplit(Policy):
    """Diagnostic placement: a seeded random subset of experts resident, every other expert on the host."""

    name = "_random-split"

    def reset(self, ctx: PolicyContext) -> np.ndarray:
        placement = super().reset(ctx)
        rng = np.random.default_rng(0)
        flat = rng.permutation(placement.size)[:ctx.capacity]
        placement.flat[flat] = True
        return placement


def _block(num_experts: int, top_k: int, hidden: int, ffn: int, seed: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=16, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=hidden // 4, num_experts=num_experts,
                         num_experts_per_tok=top_k, moe_intermediate_size=ffn, intermediate_size=ffn,
                         norm_topk_prob=True)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "mlp" in n:
                p.normal_(0.0, 0.02 if "experts" in n else 0.5)
    return model


def nmse(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((got.double() - ref.double()) ** 2).sum() / (ref.double() ** 2).sum().clamp_min(1e-300))


def _hybrid(model, block, x, ratio: float) -> torch.Tensor:
    rt = HybridRuntime(model, RandomSplit(), RuntimeConfig(cache_ratio=ratio, copy_mode="sync"), device="cpu")
    try:
        rt.start_request(gamma=0)
        with torch.no_grad():
            return block(x)
    finally:
        rt.close()


def run_numerics(experts=(8, 128), top_ks=(2, 8), tokens=(1, 7, 32), cache_ratios=(0.0, 0.5, 1.0),
                 hidden: int = 256, ffn: int = 128, realistic: bool = True) -> list[dict]:
    """Rows of (configuration, worst NMSE over cache ratios and token counts): the hybrid block against the stock
    one in fp32 (worst_nmse) and in bf16 (worst_nmse_bf16), and the bf16 hybrid against the fp32 stock block
    (bf16_rounding, the worst over cases), beside the stock bf16 block's own (stock_bf16_rounding)."""
    cases = [(f"E={e}, U={u}", e, u, hidden, ffn, tokens) for e, u in itertools.product(experts, top_ks)]
    if realistic:
        cases.append(("realistic layer: embedding 2048, FFN 768, E=128, U=8", 128, 8, 2048, 768, (32,)))
    rows = []
    for label, e, u, h, f, toks in cases:
        model = _block(e, u, h, f, seed=e * 100 + u)
        block = model.model.layers[0].mlp
        xs = {t: torch.randn(1, t, h, generator=torch.Generator().manual_seed(t)) for t in toks}
        with torch.no_grad():
            ref = {t: block(x) for t, x in xs.items()}
        per = {f"T={t},r={r}": nmse(_hybrid(model, block, x, r), ref[t]) for t, x in xs.items() for r in cache_ratios}
        impl = model.config._experts_implementation
        model = model.to(torch.bfloat16)  # in place: one copy of the weights at a time
        worst16, rounding, stock_rounding = 0.0, 0.0, 0.0
        for t, x in xs.items():
            with torch.no_grad():
                stock = block(x.to(torch.bfloat16))
            stock_rounding = max(stock_rounding, nmse(stock, ref[t]))
            for r in cache_ratios:
                got = _hybrid(model, block, x.to(torch.bfloat16), r)
                worst16, rounding = max(worst16, nmse(got, stock)), max(rounding, nmse(got, ref[t]))
        rows.append(dict(configuration=label, tokens=list(toks), cache_ratios=list(cache_ratios),
                         worst_nmse=max(per.values()), per_case=per, worst_nmse_bf16=worst16, bf16_rounding=rounding,
                         stock_bf16_rounding=stock_rounding, stock_impl=impl))
        del model
    return rows
