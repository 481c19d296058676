"""Long generations: peak memory of a 4096-token generation and MoE-SpAc's estimator state size at 512 vs 4096 tokens.

    python benchmarks/long_generation.py [--tokens 512,4096]

Runs the real engine (micro Qwen3-MoE pair, CPU, policy moespac, gamma 8, greedy; the target drafts for itself
so every step is a full verify of 9 tokens). Peak memory is the process's max RSS after each run (measured);
the KV cache's own size is computed from the config for comparison.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.models.micro import build_micro
from moespac.registry import make_policy


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,4096")
    ap.add_argument("--gamma", type=int, default=8)
    args = ap.parse_args()
    lengths = [int(x) for x in args.tokens.split(",")]
    target, _, tok = build_micro("qwen3_moe", max_position_embeddings=max(lengths) + 256)
    c = target.config
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    prompt = tok.encode("Explain speculative decoding for mixture-of-experts models.")
    print(f"micro qwen3_moe ({c.num_hidden_layers} layers, {c.num_experts} experts), fp32, CPU, policy moespac, "
          f"gamma {args.gamma}")
    print(f"{'new tokens':>10s} {'steps':>6s} {'seconds':>8s} {'max RSS MiB':>12s} {'KV cache MiB':>13s} "
          f"{'estimator state B':>18s}")
    for n in lengths:
        rt = HybridRuntime(target, make_policy("moespac"), RuntimeConfig(cache_ratio=0.5))
        try:
            rt.start_request(gamma=args.gamma, signals={"draft"})
            t0 = time.perf_counter()
            res = generate(target, prompt, draft=target, gamma=args.gamma, max_new_tokens=n, runtime=rt,
                           ignore_eos=True)
            dt = time.perf_counter() - t0
            state = rt.policy.describe().get("estimator_state_bytes")
        finally:
            rt.close()
        kv = kv_per_token * (len(prompt) + n) / 2**20
        print(f"{len(res.tokens):10d} {res.steps:6d} {dt:8.2f} {max_rss_mib():12.1f} {kv:13.2f} {state!s:>18s}")
    print("(measured; max RSS is cumulative over the process, so growth between rows bounds the extra memory)")


if __name__ == "__main__":
    with torch.no_grad():
        main()
