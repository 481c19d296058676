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
    tgt = CachedModel(target, len(prompts), lean=True)
    state = _Batch(
        tgt=tgt, dft=CachedModel(draft, len(prompts), lean=True) if draft is not None else None,
        seqs=[list(p) for p in prompts], results=[GenerationResult(tokens=[], prompt_tokens=len(p)) for p in prompts],
        live=list(range(len(prompts))),
        gen=torch.Generator(device=tgt.device).manual_seed(sampling.seed),  # where the probabilities are
        sampling=sampling, runtime=runtime, request=request, gamma=gamma, max_new_tokens=max_new_tokens,
        stop_token=None if ignore_eos else eos_token_id)
    prefill_s = _prefill(state)
    decode_step = _ar_step if state.dft is None else _speculative_step
    t_start, step = time.perf_counter(), 0
    while _drop_finished(state):
        step += 1
        decode_step(state, step)
    decode_s = time.perf_counter() - t_start - state.lookahead_s
    for r in state.results:
        r.prefill_s, r.decode_s, r.lookahead_s = prefill_s, decode_s, state.lookahead_s
    return state.results


@dataclass
class _Batch:
    """What one generate_batch call works on: both models' caches, every request's tokens and counters, and
    which requests are still in the batch."""

    tgt: CachedModel
    dft: CachedModel | None
    seqs: list[list[int]]
    """Prompt + generated tokens of every request."""
    results: list[GenerationResult]
    live: list[int]
    """Batch row -> request index of the sequences still generating."""
    gen: torch.Generator
    """One generator for draft sampling and acceptance alike: the order of its draws is part of the output."""
    sampling: Sampling
    runtime: object | None
    request: int
    gamma: int
    max_new_tokens: int
    stop_token: int | None
    """EOS, or None when generation ignores it."""
    lookahead_s: float = 0.0

    @property
    def wants_lookahead(self) -> bool:
        return self.runtime is not None and self.runtime.wants_lookahead

    def begin(self, index: int, kind: str, num_tokens: int, gamma: int = 0, **signals) -> None:
        """Tell the runtime (if any) that a target forward begins; `signals` join the request's index."""
        if self.runtime is not None:
            self.runtime.begin_step(StepInfo(index=index, kind=kind, num_tokens=num_tokens, gamma=gamma,
                                             signals={"request": self.request, **signals}))

    def end(self, accepted: int, emitted: int) -> None:
        if self.runtime is not None:
            self.runtime.end_step(accepted, emitted)

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from one row of target logits."""
        if self.sampling.greedy:
            return int(torch.argmax(logits))
        return draw(self.sampling.probs(logits), self.gen)

    def emit(self, i: int, tokens: list[int]) -> None:
        self.seqs[i].extend(tokens)
        self.results[i].tokens.extend(tokens)

    def finished(self, i: int) -> bool:
        tokens = self.results[i].tokens
        return len(tokens) >= self.max_new_tokens or (self.stop_token is not None and tokens[-1] == self.stop_token)

    def pending(self, model: CachedModel, drafts: list[list[int]] | None = None) -> list[list[int]]:
        """Per live row, the tokens (and drafts) that `model`'s cache has not seen yet."""
        return [(self.seqs[i] + (drafts[row] if drafts is not None else []))[int(model.lengths[row]):]
                for row, i in enumerate(self.live)]


def _prefill(state: _Batch) -> float:
    """Every prompt in one target forward, each emitting its first token; returns the prefill time."""
    t0 = time.perf_counter()
    state.begin(0, "prefill", len(state.seqs) * max(map(len, state.seqs)))
    logits = state.tgt.forward(state.seqs)[:, -1]
    for b in range(len(state.seqs)):
        state.emit(b, [state.choose(logits[b])])
    _sync(state.tgt.model)
    prefill_s = time.perf_counter() - t0
    state.end(0, len(state.seqs))
    return prefill_s


def _drop_finished(state: _Batch) -> bool:
    """Take finished sequences out of the batch (and both caches); False when none is left."""
    keep_rows = [row for row, i in enumerate(state.live) if not state.finished(i)]
    if keep_rows and len(keep_rows) < len(state.live):
        state.tgt.select(keep_rows)
        if state.dft is not None:
            state.dft.select(keep_rows)
        state.live = [state.live[row] for row in keep_rows]
    return bool(keep_rows)


def _ar_step(state: _Batch, step: int) -> None:
    """Autoregressive: one token per sequence per target forward."""
    n = len(state.live)
    pending = state.pending(state.tgt)
    state.begin(step, "ar", n)
    t1 = time.perf_counter()
    logits = state.tgt.forward(pending)[:, -1]
    for row, i in enumerate(state.live):
        state.emit(i, [state.choose(logits[row])])
        state.results[i].steps += 1
    _sync(state.tgt.model)
    dt = time.perf_counter() - t1
    for i in state.live:
        state.results[i].target_s += dt
    state.end(0, n)


def _speculative_step(state: _Batch, step: int) -> None:
    """Draft gamma tokens per sequence, then verify them all in one target forward."""
    n, gamma = len(state.live), state.gamma
    pending = state.pending(state.tgt)
    width = max(map(len, pending)) + gamma  # columns of the verify pass
    lookahead = state.wants_lookahead
    if not lookahead:
        state.begin(step, "verify", n * width, gamma)
    t1 = time.perf_counter()
    drafts, qs = _draft(state)
    t_drafted = time.perf_counter()
    if lookahead:  # the ELB needs the drafted tokens: this step begins once they are known (see self_draft_rows)
        rows = self_draft_rows(state.runtime, state.tgt, pending, drafts, width)
        _sync(state.tgt.model)
        state.lookahead_s += time.perf_counter() - t_drafted
        state.begin(step, "verify", n * width, gamma, self_draft_topk=rows)
    t2 = time.perf_counter()
    accepted, emitted = _verify(state, pending, drafts, qs)
    t3 = time.perf_counter()
    for i in state.live:
        state.results[i].draft_s += t_drafted - t1
        state.results[i].target_s += t3 - t2
    state.end(accepted, emitted)


def _draft(state: _Batch) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """gamma draft tokens for every live sequence -> (drafts, their draft distributions; empty when greedy)."""
    state.dft.checkpoint()
    drafts = [[] for _ in state.live]
    qs = [[] for _ in state.live]
    for _ in range(state.gamma):
        logits = state.dft.forward(state.pending(state.dft, drafts), last_only=True)[:, -1]
        for row in range(len(state.live)):
            if state.sampling.greedy:
                drafts[row].append(int(torch.argmax(logits[row])))
            else:
                q = state.sampling.probs(logits[row]).to(state.tgt.device)
                qs[row].append(q)
                drafts[row].append(draw(q, state.gen))
    _sync(state.dft.model)
    return drafts, qs


def _verify(state: _Batch, pending: list[list[int]], drafts: list[list[int]], qs: list[list[torch.Tensor]]):
    """Pending tokens + drafts of every sequence in one target forward; each sequence keeps its accepted prefix
    and both caches are cropped to it. Returns (accepted, emitted) summed over the batch."""
    state.tgt.checkpoint()
    logits = state.tgt.forward([p + d for p, d in zip(pending, drafts)])[:, -(state.gamma + 1):]
    accepted, emitted, keep_t, keep_d = 0, 0, [], []
    for row, i in enumerate(state.live):
        m, nxt = _accept(state, logits[row], drafts[row], qs[row])
        base = len(state.seqs[i])
        keep_t.append(base + m)  # target cache keeps seq + accepted drafts
        keep_d.append(min(int(state.dft.lengths[row]), base + m))
        new = _cut(state, i, drafts[row][:m] + [nxt])
        state.emit(i, new)
        _count_verify(state.results[i], m, len(drafts[row]), state.gamma)
        accepted += m
        emitted += len(new)
    state.tgt.keep(keep_t)
    state.dft.keep(keep_d)
    _sync(state.tgt.model)
    return accepted, emitted


def _accept(state: _Batch, logits: torch.Tensor, drafts: list[int], qs: list[torch.Tensor]) -> tuple[int, int]:
    """One sequence's accepted draft count and the token that follows them."""
    d = torch.tensor(drafts)
    if state.sampling.greedy:
        return greedy_accept(torch.argmax(logits, dim=-1).cpu(), d)
    return stochastic_accept(state.sampling.probs(logits), torch.stack(qs), d, state.gen)


def _cut(state: _Batch, i: int, new: list[int]) -> list[int]:
    """New tokens of request i up to its stop token and within its length cap."""
    if state.stop_token is not None and state.stop_token in new:
        new = new[:new.index(state.stop_token) + 1]
    return new[:state.max_new_tokens - len(state.results[i].tokens)]


def _count_verify(r: GenerationResult, m: int, drafted: int, gamma: int) -> None:
    r.steps += 1
    r.drafted += gamma
    r.accepted += m
    r.rejected += int(m < drafted)
    r.accepted_per_step.append(m)


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
