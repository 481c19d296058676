"""Ratio of the hybrid engine's verify forward to the stock transformers forward (same model, same batch, CPU),
measured side by side in one run, at cache ratio 1.0 (goal <= 1.3, moonshot <= 1.1) and 0.25 (goal <= 1.5).

    python benchmarks/hybrid_overhead.py [--tokens 9] [--repeats 20] [--cache-ratios 1,0.25]

The model is big enough that expert arithmetic, not Python, dominates both paths (4 layers x 32 experts,
width 1024, expert FFN 512, top-4, fp32: 0.8 GB of experts). At a split the resident experts are a fixed
seeded quarter (moespac.numerics.RandomSplit): the forward measures the split layer, not copies.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.numerics import RandomSplit


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM

    from moespac.models.micro import target_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=9, help="verify batch: gamma + 1")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--cache-ratios", default="1,0.25")
    args = ap.parse_args()
    cfg = target_config("qwen3_moe", 320, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_experts=args.experts, num_experts_per_tok=4, moe_intermediate_size=args.hidden // 2,
                        head_dim=args.hidden // 8, num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    stock = copy.deepcopy(model)  # the engine takes the experts out of `model`; the stock copy keeps its own
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens))

    def fwd(m):
        with torch.no_grad():
            m(ids)

    goals = {1.0: 1.3, 0.25: 1.5}
    print(f"model: qwen3_moe {args.layers} layers, hidden {args.hidden}, {args.experts} experts top-4, expert FFN "
          f"{args.hidden // 2}, verify batch {args.tokens} tokens, fp32, {torch.get_num_threads()} threads")
    for ratio in (float(r) for r in args.cache_ratios.split(",")):
        rt = HybridRuntime(model, RandomSplit(), RuntimeConfig(cache_ratio=ratio, copy_mode="sync"))
        try:
            rt.start_request(gamma=args.tokens - 1)
            samples = {"stock": [], "hybrid": []}
            for _ in range(3):  # interleaved, so both share the machine's noise
                fwd(stock)
                samples["stock"] += timed(lambda: fwd(stock), args.repeats)
                fwd(model)
                samples["hybrid"] += timed(lambda: fwd(model), args.repeats)
        finally:
            rt.close()
        med = {k: statistics.median(v) for k, v in samples.items()}
        ratio_t = med["hybrid"] / med["stock"]
        goal = goals.get(ratio)
        verdict = "" if goal is None else f"  (goal <= {goal}: {'OK' if ratio_t <= goal else 'MISSED'})"
        print(f"cache ratio {ratio:g}: stock ({stock.config._experts_implementation}) {med['stock'] * 1e3:.2f} ms, "
              f"hybrid {med['hybrid'] * 1e3:.2f} ms (medians, measured); hybrid / stock = {ratio_t:.3f}{verdict}")


if __name__ == "__main__":
    main()
