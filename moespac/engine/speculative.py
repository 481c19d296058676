"""Speculative decoding (draft gamma tokens, verify gamma+1 in one target pass) and plain autoregressive decoding.

Acceptance is exact: greedy matching, or speculative sampling (Leviathan et al. 2023): accept draft token x
with probability min(1, p(x)/q(x)), on rejection sample from norm(max(p - q, 0)); if all gamma drafts are
accepted, sample a bonus token from p. KV caches of both models are cropped back to the accepted prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from moespac.errors import MoespacError
from moespac.policy import StepInfo


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen."""

    temperature: float = 0.0
    """0 = greedy; > 0 = sample from softmax(logits / temperature)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off); applied to target and draft alike."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    seed: int = 0
    """Seed of the sampling generator."""

    def __post_init__(self):
        if self.temperature < 0:
            raise MoespacError(f"temperature {self.temperature} must be >= 0")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise MoespacError(f"top_k {self.top_k} must be >= 0 and top_p {self.top_p} in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Sampling distribution over the last dim (float64 for exact acceptance ratios)."""
        logits = logits.double() / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        p = torch.softmax(logits, dim=-1)
        if self.top_p < 1:
            sp, idx = torch.sort(p, dim=-1, descending=True)
            drop = torch.cumsum(sp, -1) - sp > self.top_p
            p = p.scatter(-1, idx, sp.masked_fill(drop, 0.0))
            p = p / p.sum(-1, keepdim=True)
        return p


def greedy_accept(target_argmax: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """target_argmax [gamma+1], drafts [gamma] -> (accepted count m, next token = target's choice at m)."""
    match = (target_argmax[:-1] == drafts).int()
    m = int(torch.cumprod(match, 0).sum()) if len(drafts) else 0
    return m, int(target_argmax[m])


def stochastic_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """p [gamma+1, V] target probs, q [gamma, V] draft probs of the drafted tokens -> (m, next token)."""
    for i, x in enumerate(drafts.tolist()):
        r = torch.rand((), generator=gen, dtype=torch.float64)
        if q[i, x] > 0 and r * q[i, x] <= p[i, x]:  # r < min(1, p/q) without dividing by zero
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=gen))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))


@dataclass
class GenerationResult:
    tokens: list[int]
    """New tokens (prompt excluded)."""
    prompt_tokens: int
    steps: int = 0
    """Target forwards after prefill."""
    drafted: int = 0
    accepted: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens after the first / decode time (prefill emits the first token)."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 and len(self.tokens) > 1 else 0.0

    def summary(self) -> dict:
        return dict(new_tokens=len(self.tokens), prompt_tokens=self.prompt_tokens, steps=self.steps,
                    drafted=self.drafted, accepted=self.accepted, acceptance_rate=self.acceptance_rate,
                    prefill_s=self.prefill_s, decode_s=self.decode_s, draft_s=self.draft_s, target_s=self.target_s,
                    tokens_per_second=self.tokens_per_second, latency_s=self.prefill_s + self.decode_s)


class _Model:
    """A causal LM with its KV cache and the count of tokens the cache holds."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.cached = 0

    @torch.no_grad()
    def forward(self, tokens: list[int]) -> torch.Tensor:
        """Feed `tokens` (those after the cached prefix); returns logits [len(tokens), V]."""
        dev = self.model.get_input_embeddings().weight.device
        ids = torch.tensor([tokens], device=dev)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True)
        self.cached += len(tokens)
        return out.logits[0]

    def crop(self, n: int) -> None:
        if n < self.cached:
            self.cache.crop(n - self.cached)  # transformers 5: a negative count of tokens to drop
            self.cached = n


def _sync(model) -> None:
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()


def generate(target, prompt: list[int], *, draft=None, gamma: int = 8, max_new_tokens: int = 64,
             sampling: Sampling = Sampling(), runtime=None, eos_token_id: int | None = None,
             request: int = 0, ignore_eos: bool = False) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt`: speculative with `draft`, else autoregressive.

    `runtime` (a HybridRuntime installed on `target`) is told about each step so the policy sees it.
    """
    if draft is not None and gamma < 1:
        raise MoespacError(f"gamma {gamma} must be >= 1 for speculative decoding")
    if max_new_tokens < 1:
        raise MoespacError(f"max_new_tokens {max_new_tokens} must be >= 1")
    if not prompt:
        raise MoespacError("empty prompt")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit and len(prompt) + max_new_tokens + gamma + 1 > limit:
        raise MoespacError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens does not fit the target's "
                           f"context of {limit}")
    gen = torch.Generator().manual_seed(sampling.seed)
    tgt = _Model(target)
    dft = _Model(draft) if draft is not None else None
    res = GenerationResult(tokens=[], prompt_tokens=len(prompt))
    seq = list(prompt)

    def choose(logits: torch.Tensor) -> int:
        if sampling.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(sampling.probs(logits), 1, generator=gen))

    def step_info(index, kind, n, g):
        return StepInfo(index=index, kind=kind, num_tokens=n, gamma=g, signals={"request": request})

    # prefill: the whole prompt in one target forward, emitting the first token
    t0 = time.perf_counter()
    if runtime is not None:
        runtime.begin_step(step_info(0, "prefill", len(seq), 0))
    logits = tgt.forward(seq)
    first = choose(logits[-1])
    _sync(target)
    res.prefill_s = time.perf_counter() - t0
    if runtime is not None:
        runtime.end_step(0, 1, 0.0, res.prefill_s)
    seq.append(first)
    res.tokens.append(first)

    t_start = time.perf_counter()
    while len(res.tokens) < max_new_tokens and (ignore_eos or eos_token_id is None or res.tokens[-1] != eos_token_id):
        res.steps += 1
        if dft is None:  # autoregressive: one token per target forward
            if runtime is not None:
                runtime.begin_step(step_info(res.steps, "ar", 1, 0))
            t1 = time.perf_counter()
            tok = choose(tgt.forward(seq[tgt.cached:])[-1])
            _sync(target)
            dt = time.perf_counter() - t1
            res.target_s += dt
            seq.append(tok)
            res.tokens.append(tok)
            if runtime is not None:
                runtime.end_step(0, 1, 0.0, dt)
            continue
        pending = seq[tgt.cached:]  # tokens the target has not seen yet (normally 1)
        if runtime is not None:
            runtime.begin_step(step_info(res.steps, "verify", len(pending) + gamma, gamma))
        # draft phase
        t1 = time.perf_counter()
        drafts, qs = [], []
        for _ in range(gamma):
            dl = dft.forward((seq + drafts)[dft.cached:])[-1]
            if sampling.greedy:
                drafts.append(int(torch.argmax(dl)))
            else:
                q = sampling.probs(dl)
                qs.append(q)
                drafts.append(int(torch.multinomial(q, 1, generator=gen)))
        _sync(draft)
        t2 = time.perf_counter()
        # verify phase: pending + gamma drafts in one target forward
        logits = tgt.forward(pending + drafts)[-(gamma + 1):]
        d = torch.tensor(drafts)
        if sampling.greedy:
            m, nxt = greedy_accept(torch.argmax(logits, dim=-1).cpu(), d)
        else:
            m, nxt = stochastic_accept(sampling.probs(logits).cpu(), torch.stack(qs).cpu(), d, gen)
        _sync(target)
        t3 = time.perf_counter()
        new = drafts[:m] + [nxt]
        base = len(seq)
        tgt.crop(base + m)  # target cache keeps seq + accepted drafts
        dft.crop(min(dft.cached, base + m))
        room = max_new_tokens - len(res.tokens)
        if not ignore_eos and eos_token_id is not None and eos_token_id in new:
            new = new[:new.index(eos_token_id) + 1]
        new = new[:room]
        seq.extend(new)
        res.tokens.extend(new)
        res.drafted += gamma
        res.accepted += m
        res.accepted_per_step.append(m)
        res.draft_s += t2 - t1
        res.target_s += t3 - t2
        if runtime is not None:
            runtime.end_step(m, len(new), t2 - t1, t3 - t2)
    res.decode_s = time.perf_counter() - t_start
    return res
