"""Lossless check: greedy speculative decoding over the hybrid engine equals Hugging Face's own greedy
`generate()`, token for token.

The reference is transformers' decoding loop, not ours. "stock" runs it on the stock model (transformers'
own experts implementation; the whole model where it sits, so small models only); "host" runs it over the
hybrid engine with every expert on the host, which never needs the whole model on the device
(`moespac check-lossless` on a 30B model).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from moespac.engine.hybrid import RuntimeConfig
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


@torch.no_grad()
def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy `generate()` of exactly max_new_tokens per prompt, one prompt at a time. Its EOS
    is an id outside the vocabulary, so nothing stops early (None would fall back to the model's own)."""
    cfg = copy.deepcopy(model.generation_config)
    cfg.do_sample, cfg.max_new_tokens, cfg.min_new_tokens = False, max_new_tokens, None
    cfg.eos_token_id = model.get_output_embeddings().weight.shape[0]
    cfg.temperature = cfg.top_p = cfg.top_k = None
    if cfg.pad_token_id is None:
        cfg.pad_token_id = 0
    device = model.get_input_embeddings().weight.device
    impl = model.config._experts_implementation
    if model.dtype == torch.float64 and impl not in ("eager", "moespac_hybrid"):
        model.set_experts_implementation("eager")  # torch's grouped matmul has no float64 kernel
    out = []
    try:
        for p in prompts:
            ids = torch.tensor([p], device=device)
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
            out.append(seq[0, len(p):].tolist())
    finally:
        if model.config._experts_implementation != impl:
            model.set_experts_implementation(impl)
    return out


def check_session(session, prompts: list[list[int]], gammas, cache_ratios, policy: str = "lru",
                  max_new_tokens: int = 32, progress=None, batch_sizes=(1,),
                  expected: list[list[int]] | None = None) -> tuple[int, list[Mismatch]]:
    """Every (cache ratio, batch size, gamma, prompt) on the session's runtime, reconfigured per ratio; each
    sequence is compared with its own unbatched HF greedy output: `expected`, or HF generate over the runtime
    with every expert on the host. Returns (sequences compared, mismatches)."""
    from moespac.engine.speculative import Sampling

    runtime = session.runtime
    if expected is None:
        runtime.reconfigure(RuntimeConfig(slots=0, copy_mode="sync"), make_policy("all-host"))
        runtime.start_request(gamma=0)
        expected = hf_greedy(session.target, prompts, max_new_tokens)
    mismatches, n = [], 0
    for ratio in cache_ratios:
        runtime.reconfigure(RuntimeConfig(cache_ratio=ratio, copy_mode=session.cfg.copy_mode), make_policy(policy))
        for batch in batch_sizes:
            for gamma in gammas:
                for start in range(0, len(prompts), batch):
                    group = list(range(start, min(start + batch, len(prompts))))
                    outs, _ = session.generate([prompts[i] for i in group], gamma=gamma, max_new_tokens=max_new_tokens,
                                               sampling=Sampling(), ignore_eos=True, max_batch=max(batch_sizes))
                    for i, out in zip(group, outs):
                        n += 1
                        ref, got = expected[i], out.tokens
                        if got != ref:
                            pos = next(j for j, (a, b) in enumerate(zip(ref, got)) if a != b)
                            mismatches.append(Mismatch(i, gamma, ratio, pos, ref[pos], got[pos], batch))
                        if progress:
                            progress()
    return n, mismatches


def check_lossless(target, draft, prompts: list[list[int]], gammas, cache_ratios, policy: str = "lru",
                   max_new_tokens: int = 32, device=None, progress=None, batch_sizes=(1,),
                   reference: str = "stock") -> tuple[int, list[Mismatch]]:
    """check_session on loaded models: the stock reference is HF generate on the model before the engine
    takes its experts; 'host' is HF generate over the engine with every expert on the host."""
    from moespac.engine.session import EngineConfig, EngineSession

    expected = hf_greedy(target, prompts, max_new_tokens) if reference == "stock" else None
    session = EngineSession(target, draft, None, EngineConfig(target="(in memory)", policy=policy), device=device)
    try:
        return check_session(session, prompts, gammas, cache_ratios, policy, max_new_tokens, progress, batch_sizes,
                             expected)
    finally:
        session.close()


# -- sampled speculative decoding reproduces the target's distribution ----------------------------------------

def target_joint(model, prompt: list[int], sampling, tokens: int = 3) -> dict[tuple, float]:
    """The model's own probability of each sequence of its next `tokens` sampled tokens (the support of
    `sampling`, e.g. top_k=3 gives 27 cells for 3 tokens), from its logits."""
    device = model.get_input_embeddings().weight.device
    cells = {(): 1.0}
    with torch.no_grad():
        for _ in range(tokens):
            grown = {}
            for prefix, p in cells.items():
                dist = sampling.probs(model(torch.tensor([prompt + list(prefix)], device=device)).logits[0, -1])
                for t in torch.nonzero(dist).flatten().tolist():
                    grown[prefix + (t,)] = p * float(dist[t])
            cells = grown
    return cells


def chi_square_pvalue(observed, expected) -> float:
    """Pearson's chi-square test of counts against expected counts (cells expected under 5 times pooled)."""
    obs, exp, small_o, small_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        if e < 5:
            small_o, small_e = small_o + o, small_e + e
        else:
            obs.append(o)
            exp.append(e)
    if small_e:
        obs.append(small_o)
        exp.append(small_e)
    o = torch.tensor(obs, dtype=torch.float64)
    e = torch.tensor(exp, dtype=torch.float64) * o.sum() / sum(exp)
    chi2 = float(((o - e) ** 2 / e).sum())
    df = max(len(obs) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(chi2 / 2,
                                         dtype=torch.float64)))


def sampling_pvalue(session, prompt: list[int], expected: dict, runs: int = 1200, gamma: int = 2,
                    top_k: int = 3) -> float:
    """Sample `runs` three-token generations through `session` (its runtime and device path) and test them
    against the target's own joint distribution `expected` (target_joint, computed before the session took
    the experts). Returns the p-value: a correct sampler gives p > 0.01."""
    from moespac.engine.speculative import Sampling

    counts = dict.fromkeys(expected, 0)
    for seed in range(runs):
        (res,), _ = session.generate([prompt], gamma=gamma, max_new_tokens=3, ignore_eos=True,
                                     sampling=Sampling(temperature=1.0, top_k=top_k, seed=seed))
        counts[tuple(res.tokens)] += 1
    keys = sorted(expected)
    return chi_square_pvalue([counts[k] for k in keys], [expected[k] * runs for k in keys])
