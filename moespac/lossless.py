"""Lossless check: greedy speculative decoding over the hybrid engine equals greedy autoregressive
decoding with the stock transformers model, token for token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate, generate_batch
from moespac.registry import make_policy


@dataclass
class Mismatch:
    prompt: int
    gamma: int
    cache_ratio: float
    position: int
    expected: int
    got: int
    batch_size: int = 1


def stock_reference(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy AR with the stock experts implementation (eager where grouped_mm lacks the dtype)."""
    impl = target.config._experts_implementation
    if target.dtype == torch.float64:
        target.set_experts_implementation("eager")
    try:
        return [generate(target, p, max_new_tokens=max_new_tokens, ignore_eos=True).tokens for p in prompts]
    finally:
        target.set_experts_implementation(impl)


def check_lossless(target, draft, prompts: list[list[int]], gammas, cache_ratios, policy: str = "lru",
                   max_new_tokens: int = 32, device: str = "cpu", progress=None,
                   batch_sizes=(1,)) -> tuple[int, list[Mismatch]]:
    """Run every (batch size, gamma, cache ratio, prompt); each sequence is compared with its own unbatched
    stock greedy output. Returns (sequences compared, mismatches)."""
    reference = stock_reference(target, prompts, max_new_tokens)
    mismatches, n = [], 0
    for ratio in cache_ratios:
        runtime = HybridRuntime(target, make_policy(policy), RuntimeConfig(cache_ratio=ratio), device=device)
        try:
            for batch in batch_sizes:
                for gamma in gammas:
                    for start in range(0, len(prompts), batch):
                        group = list(range(start, min(start + batch, len(prompts))))
                        runtime.start_request(gamma=gamma, batch_size=len(group), signals={"draft"})
                        outs = generate_batch(target, [prompts[i] for i in group], draft=draft, gamma=gamma,
                                              max_new_tokens=max_new_tokens, runtime=runtime, ignore_eos=True,
                                              max_batch=max(batch_sizes))
                        for i, out in zip(group, outs):
                            n += 1
                            ref, got = reference[i], out.tokens
                            if got != ref:
                                pos = next(j for j, (a, b) in enumerate(zip(ref, got)) if a != b)
                                mismatches.append(Mismatch(i, gamma, ratio, pos, ref[pos], got[pos], batch))
                            if progress:
                                progress()
        finally:
            runtime.close()
    return n, mismatches
