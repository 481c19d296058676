"""Speculative decoding (draft gamma tokens, verify gamma+1 in one target pass) and plain autoregressive decoding.

Acceptance is exact: greedy matching, or speculative sampling (Leviathan et al. 2023): accept draft token x
with probability min(1, p(x)/q(x)), on rejection sample from norm(max(p - q, 0)); if all gamma drafts are
accepted, sample a bonus token from p. KV caches of both models are cropped back to the accepted prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from moespac.engine.kvcache import CachedModel
from moespac.errors import MoespacError, check_context
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


def draw(p: torch.Tensor, gen: torch.Generator) -> int:
    """One token from the distribution p [V] (not necessarily normalised): inverse-CDF sampling, the first token
    whose cumulative mass exceeds u * total for one uniform u in [0, 1). Exact, and about 10x cheaper than
    torch.multinomial on a CPU (7 vs 71 us at V = 4096, measured); a token of mass 0 is never drawn."""
    cdf = torch.cumsum(p, -1)
    u = torch.rand((), generator=gen, dtype=cdf.dtype, device=cdf.device)
    i = int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True))
    return i if i < len(cdf) else int(torch.nonzero(p).max())  # u * total rounded up to total: the last token with mass


def greedy_accept(target_argmax: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """target_argmax [gamma+1], drafts [gamma] -> (accepted count m, next token = target's choice at m)."""
    match = (target_argmax[:-1] == drafts).int()
    m = int(torch.cumprod(match, 0).sum()) if len(drafts) else 0
    return m, int(target_argmax[m])


def stochastic_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """p [gamma+1, V] target probs, q [gamma, V] draft probs of the drafted tokens -> (m, next token); p, q and
    the generator on one device."""
    for i, x in enumerate(drafts.tolist()):
        r = torch.rand((), generator=gen, dtype=torch.float64, device=p.device)
        if q[i, x] > 0 and r * q[i, x] <= p[i, x]:  # r < min(1, p/q) without dividing by zero
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[i]
        return i, draw(dist, gen)
    return len(drafts), draw(p[len(drafts)], gen)


@dataclass
class GenerationResult:
    tokens: list[int]
    """New tokens (prompt excluded)."""
    prompt_tokens: int
    steps: int = 0
    """Target forwards after prefill."""
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    """Verify steps that rejected a draft (the rest accepted all): the paper's per-token alpha is
    accepted / (accepted + rejected), the estimate that fits its Omega(gamma, alpha)."""
    accepted_per_step: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    lookahead_s: float = 0.0
    """Wall time of the self-draft lookahead passes (an instrument for MoE-SpeQ's signal, not part of decoding):
    left out of decode_s."""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens after the first / decode time (prefill emits the first token)."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 and len(self.tokens) > 1 else 0.0

    def summary(self) -> dict:
        return dict(new_tokens=len(self.tokens), prompt_tokens=self.prompt_tokens, steps=self.steps,
                    drafted=self.drafted, accepted=self.accepted, rejected=self.rejected,
                    acceptance_rate=self.acceptance_rate,
                    prefill_s=self.prefill_s, decode_s=self.decode_s, draft_s=self.draft_s, target_s=self.target_s,
                    lookahead_s=self.lookahead_s,
                    tokens_per_second=self.tokens_per_second, latency_s=self.prefill_s + self.decode_s)


def _sync(model) -> None:
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()


def check_batch(prompts: list[list[int]], max_batch: int, limit: int | None, max_new_tokens: int, gamma: int) -> None:
    if not prompts:
        raise MoespacError("batch size 0: give at least one prompt")
    if len(prompts) > max_batch:
        raise MoespacError(f"batch size {len(prompts)} exceeds the configured maximum {max_batch}")
    for i, p in enumerate(prompts):
        if not p:
            raise MoespacError(f"prompt {i} is empty")
        if limit:
            check_context(f"prompt {i} of {len(p)} tokens", len(p), max_new_tokens, gamma, limit)


def generate_batch(target, prompts: list[list[int]], *, draft=None, gamma: int = 8, max_new_tokens: int = 64,
                   sampling: Sampling = Sampling(), runtime=None, eos_token_id: int | None = None,
                   request: int = 0, ignore_eos: bool = False, max_batch: int = 32) -> list[GenerationResult]:
    """Generate for B prompts together: drafted together, verified in one target pass, each sequence keeping
    its own accepted length; finished sequences leave the batch. Autoregressive when `draft` is None."""
    if draft is not None and gamma < 1:
        raise MoespacError(f"gamma {gamma} must be >= 1 for speculative decoding")
    if max_new_tokens < 1:
        raise MoespacError(f"max_new_tokens {max_new_tokens} must be >= 1")
    check_batch(prompts, max_batch, getattr(target.config, "max_position_embeddings", None), max_new_tokens,
                gamma if draft is not None else 0)
    B = len(prompts)
    tgt = CachedModel(target, B, lean=True)
    dft = CachedModel(draft, B, lean=True) if draft is not None else None
    gen = torch.Generator(device=tgt.device).manual_seed(sampling.seed)  # where the probabilities are
    results = [GenerationResult(tokens=[], prompt_tokens=len(p)) for p in prompts]
    seqs = [list(p) for p in prompts]
    live = list(range(B))  # batch row -> request index

    def choose(logits: torch.Tensor) -> int:
        if sampling.greedy:
            return int(torch.argmax(logits))
        return draw(sampling.probs(logits), gen)

    def finished(i: int) -> bool:
        r = results[i]
        return len(r.tokens) >= max_new_tokens or (not ignore_eos and eos_token_id is not None and r.tokens[-1] == eos_token_id)

    def info(index, kind, n, g):
        return StepInfo(index=index, kind=kind, num_tokens=n, gamma=g, signals={"request": request})

    # prefill: every prompt in one target forward, each emitting its first token
    t0 = time.perf_counter()
    if runtime is not None:
        runtime.begin_step(info(0, "prefill", B * max(map(len, prompts)), 0))
    logits = tgt.forward(seqs)[:, -1]
    for b in range(B):
        tok = choose(logits[b])
        seqs[b].append(tok)
        results[b].tokens.append(tok)
    _sync(target)
    prefill_s = time.perf_counter() - t0
    if runtime is not None:
        runtime.end_step(0, B)

    t_start, step, lookahead_s = time.perf_counter(), 0, 0.0
    while True:
        keep_rows = [row for row, i in enumerate(live) if not finished(i)]
        if not keep_rows:
            break
        if len(keep_rows) < len(live):
            tgt.select(keep_rows)
            if dft is not None:
                dft.select(keep_rows)
            live = [live[row] for row in keep_rows]
        n, step = len(live), step + 1
        tgt_pending = [seqs[i][int(tgt.lengths[row]):] for row, i in enumerate(live)]
        if dft is None:  # autoregressive: one token per sequence per target forward
            if runtime is not None:
                runtime.begin_step(info(step, "ar", n, 0))
            t1 = time.perf_counter()
            logits = tgt.forward(tgt_pending)[:, -1]
            for row, i in enumerate(live):
                tok = choose(logits[row])
                seqs[i].append(tok)
                results[i].tokens.append(tok)
                results[i].steps += 1
            _sync(target)
            dt = time.perf_counter() - t1
            for i in live:
                results[i].target_s += dt
            if runtime is not None:
                runtime.end_step(0, n)
            continue
        width = max(map(len, tgt_pending))
        lookahead = runtime is not None and runtime.wants_lookahead
        if runtime is not None and not lookahead:
            runtime.begin_step(info(step, "verify", n * (width + gamma), gamma))
        # draft phase: gamma tokens for every live sequence
        t1 = time.perf_counter()
        dft.checkpoint()
        drafts = [[] for _ in live]
        qs = [[] for _ in live]
        for _ in range(gamma):
            dl = dft.forward([(seqs[i] + drafts[row])[int(dft.lengths[row]):] for row, i in enumerate(live)],
                             last_only=True)[:, -1]
            for row in range(n):
                if sampling.greedy:
                    drafts[row].append(int(torch.argmax(dl[row])))
                else:
                    q = sampling.probs(dl[row]).to(tgt.device)
                    qs[row].append(q)
                    drafts[row].append(draw(q, gen))
        _sync(draft)
        t_drafted = time.perf_counter()
        if lookahead:  # the ELB needs the drafted tokens: this step begins once it is known (see self_draft_rows)
            t_la = t_drafted
            verify = info(step, "verify", n * (width + gamma), gamma)
            verify.signals["self_draft_topk"] = self_draft_rows(runtime, tgt, tgt_pending, drafts, width + gamma)
            _sync(target)
            lookahead_s += time.perf_counter() - t_la
            runtime.begin_step(verify)
        t2 = time.perf_counter()
        # verify phase: pending + gamma drafts of every sequence in one target forward
        tgt.checkpoint()
        logits = tgt.forward([tgt_pending[row] + drafts[row] for row in range(n)])[:, -(gamma + 1):]
        accepted, emitted, keep_t, keep_d = 0, 0, [], []
        for row, i in enumerate(live):
            d = torch.tensor(drafts[row])
            if sampling.greedy:
                m, nxt = greedy_accept(torch.argmax(logits[row], dim=-1).cpu(), d)
            else:
                m, nxt = stochastic_accept(sampling.probs(logits[row]), torch.stack(qs[row]), d, gen)
            base = len(seqs[i])
            keep_t.append(base + m)  # target cache keeps seq + accepted drafts
            keep_d.append(min(int(dft.lengths[row]), base + m))
            new = drafts[row][:m] + [nxt]
            if not ignore_eos and eos_token_id is not None and eos_token_id in new:
                new = new[:new.index(eos_token_id) + 1]
            new = new[:max_new_tokens - len(results[i].tokens)]
            seqs[i].extend(new)
            r = results[i]
            r.tokens.extend(new)
            r.steps += 1
            r.drafted += gamma
            r.accepted += m
            r.rejected += int(m < len(drafts[row]))
            r.accepted_per_step.append(m)
            accepted += m
            emitted += len(new)
        tgt.keep(keep_t)
        dft.keep(keep_d)
        _sync(target)
        t3 = time.perf_counter()
        for i in live:
            results[i].draft_s += t_drafted - t1
            results[i].target_s += t3 - t2
        if runtime is not None:
            runtime.end_step(accepted, emitted)
    decode_s = time.perf_counter() - t_start - lookahead_s
    for r in results:
        r.prefill_s, r.decode_s, r.lookahead_s = prefill_s, decode_s, lookahead_s
    return results


def self_draft_rows(runtime, tgt: CachedModel, pending: list[list[int]], drafts: list[list[int]], width: int):
    """MoE-SpeQ's lookahead for one verify step: the routing of the target with INT4 experts over the tokens a
    self-draft would have run (each sequence's pending tokens and its drafts but the last, whose successor is
    never drafted), on the target's KV cache, which is then put back as it was. int [L, rows, k] laid out like
    the verify pass's rows (left-padded to `width` per sequence; a pass one column narrower lines up with it
    column for column), -1 in each sequence's last column.

    MoE-SpeQ fills its buffer token by token while it drafts; here it is known once the (dense) draft is done,
    so a live engine begins the step after drafting, and the simulator hands it to the policy at the draft's
    start (its copy budget is the draft's time either way)."""
    before = tgt.lengths.tolist()
    tgt.checkpoint()
    ids = runtime.lookahead(lambda: tgt.forward([p + d[:-1] for p, d in zip(pending, drafts)]))
    tgt.keep(before)
    L, _, k = ids.shape
    rows = np.full((L, len(pending), width, k), -1, dtype=np.int64)
    rows[:, :, :width - 1] = ids.reshape(L, len(pending), width - 1, k)
    return rows.reshape(L, -1, k)


def generate(target, prompt: list[int], **kwargs) -> GenerationResult:
    """Generate for one prompt (speculative with `draft=`, else autoregressive); see generate_batch."""
    return generate_batch(target, [prompt], **kwargs)[0]
