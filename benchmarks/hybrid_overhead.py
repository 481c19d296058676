"""Ratio of the hybrid engine's verify forward to the stock transformers forward (same model, same batch,
cache ratio 1.0, CPU), measured side by side in one run. Goal (issue #2): <= 1.3.

    python benchmarks/hybrid_overhead.py [--tokens 9] [--repeats 30]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.models.micro import build_micro
from moespac.registry import make_policy


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=9, help="verify batch: gamma + 1")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    # A model big enough that expert math, not Python, dominates both paths (like any real MoE)
    target, _, _ = build_micro("qwen3_moe", seed=0)
    from transformers import AutoModelForCausalLM

    from moespac.models.micro import target_config

    cfg = target_config("qwen3_moe", target.config.vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_experts=args.experts, num_experts_per_tok=4, moe_intermediate_size=args.hidden // 2,
                        head_dim=args.hidden // 4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens))
    stock_impl = model.config._experts_implementation

    stock = copy.deepcopy(model)  # the engine takes the experts out of `model`; the stock copy keeps its own

    def fwd(m):
        with torch.no_grad():
            m(ids)

    rt = HybridRuntime(model, make_policy("lru"), RuntimeConfig(cache_ratio=1.0, copy_mode="sync"))
    rt.start_request(gamma=args.tokens - 1)
    fwd(model)  # warm the cache: every expert resident
    samples = {"stock": [], "hybrid": []}
    for _ in range(3):  # interleave to share machine noise
        fwd(stock)
        samples["stock"] += timed(lambda: fwd(stock), args.repeats)
        fwd(model)
        samples["hybrid"] += timed(lambda: fwd(model), args.repeats)
    rt.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = med["hybrid"] / med["stock"]
    print(f"model: qwen3_moe {args.layers} layers, hidden {args.hidden}, {args.experts} experts top-4, "
          f"verify batch {args.tokens} tokens, fp32, {torch.get_num_threads()} threads")
    print(f"stock ({stock_impl}) forward   median {med['stock'] * 1e3:8.2f} ms  (measured)")
    print(f"hybrid (cache ratio 1.0) forward median {med['hybrid'] * 1e3:8.2f} ms  (measured)")
    print(f"ratio hybrid / stock = {ratio:.3f}  (goal <= 1.3: {'OK' if ratio <= 1.3 else 'MISSED'})")


if __name__ == "__main__":
    main()
