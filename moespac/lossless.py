"""Lossless check: greedy speculative decoding over the hybrid engine equals greedy autoregressive
decoding with the stock transformers model, token for token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.registry import make_policy


@dataclass
class Mismatch:
    prompt: int
    gamma: int
    cache_ratio: float
    position: int
    expected: int
    got: int


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
                   max_new_tokens: int = 32, device: str = "cpu", progress=None) -> tuple[int, list[Mismatch]]:
    """Run every (gamma, cache ratio, prompt); returns (comparisons, mismatches)."""
    reference = stock_reference(target, prompts, max_new_tokens)
    mismatches, n = [], 0
    for ratio in cache_ratios:
        runtime = HybridRuntime(target, make_policy(policy), RuntimeConfig(cache_ratio=ratio), device=device)
        try:
            for gamma in gammas:
                for i, (p, ref) in enumerate(zip(prompts, reference)):
                    runtime.start_request(gamma=gamma, signals={"draft"})
                    got = generate(target, p, draft=draft, gamma=gamma, max_new_tokens=max_new_tokens,
                                   runtime=runtime, ignore_eos=True).tokens
                    n += 1
                    if got != ref:
                        pos = next(j for j, (a, b) in enumerate(zip(ref, got)) if a != b)
                        mismatches.append(Mismatch(i, gamma, ratio, pos, ref[pos], got[pos]))
                    if progress:
                        progress()
        finally:
            runtime.close()
    return n, mismatches
