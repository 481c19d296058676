"""Stochastic speculative sampling reproduces the target distribution; a wrong rule is caught (negative control)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from moespac.engine import speculative
from moespac.engine.speculative import Sampling, greedy_accept, stochastic_accept

V = 4
P = torch.tensor([[0.50, 0.25, 0.15, 0.10], [0.10, 0.20, 0.30, 0.40], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
Q = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.40, 0.30, 0.20, 0.10]], dtype=torch.float64)


def wrong_accept(p, q, drafts, gen):
    """Deliberately wrong: on rejection resample from p instead of the residual max(p - q, 0)."""
    for i, x in enumerate(drafts.tolist()):
        if torch.rand((), generator=gen, dtype=torch.float64) * q[i, x] <= p[i, x]:
            continue
        return i, int(torch.multinomial(p[i], 1, generator=gen))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))


def first_two_tokens(accept, n=20000, seed=0):
    """Draft gamma=2 tokens from Q, verify against P; count the first two emitted tokens (16 cells)."""
    gen = torch.Generator().manual_seed(seed)
    counts = np.zeros((V, V))
    for _ in range(n):
        drafts = torch.tensor([int(torch.multinomial(Q[i], 1, generator=gen)) for i in range(2)])
        m, nxt = accept(P, Q, drafts, gen)
        out = drafts[:m].tolist() + [nxt]
        if len(out) < 2:  # rejected at position 0: the next token comes from the target's position-1 distribution
            out.append(int(torch.multinomial(P[1], 1, generator=gen)))
        counts[out[0], out[1]] += 1
    return counts


def pvalue(counts):
    expected = np.outer(P[0].numpy(), P[1].numpy()) * counts.sum()
    return chisquare(counts.ravel(), expected.ravel()).pvalue


def test_speculative_sampling_matches_target_distribution():
    assert pvalue(first_two_tokens(stochastic_accept)) > 0.01


def test_wrong_acceptance_rule_is_detected():
    assert pvalue(first_two_tokens(wrong_accept)) < 0.01


def test_greedy_accept():
    assert greedy_accept(torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 9])) == (2, 7)
    assert greedy_accept(torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 7])) == (3, 8)
    assert greedy_accept(torch.tensor([1, 6]), torch.tensor([5])) == (0, 1)


def test_sampling_filters():
    s = Sampling(temperature=1.0, top_k=2)
    p = s.probs(torch.tensor([1.0, 3.0, 2.0, 0.0]))
    assert p[0] == 0 and p[3] == 0 and abs(float(p.sum()) - 1) < 1e-12
    with pytest.raises(Exception, match="temperature"):
        Sampling(temperature=-1)


# -- the same test through the engine: the hybrid runtime on the checked device path -------------------------------

ENGINE_RUNS = 1200


@pytest.fixture(scope="module")
def engine_micro():
    from moespac.models.micro import build_micro

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and immune to a busy machine
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=2)
    yield target, draft, tok.encode("def add(a, b):")
    torch.set_num_threads(before)


def target_joint(target, prompt, sampling):
    """The target's own distribution of its first three sampled tokens (27 cells at top_k=3), from its logits."""
    cells = {}
    with torch.no_grad():
        def dist(prefix):
            return sampling.probs(target(torch.tensor([prompt + prefix])).logits[0, -1])
        p1 = dist([])
        for a in torch.nonzero(p1).flatten().tolist():
            p2 = dist([a])
            for b in torch.nonzero(p2).flatten().tolist():
                p3 = dist([a, b])
                for c in torch.nonzero(p3).flatten().tolist():
                    cells[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return cells


def engine_pvalue(engine_micro, accept=None):
    """Sample ENGINE_RUNS three-token generations through an engine session (lru, a quarter of the experts on
    the 'device', ordering checked) and test them against the target's joint distribution."""
    from moespac.engine.session import EngineConfig, EngineSession

    target, draft, prompt = engine_micro
    sampling = Sampling(temperature=1.0, top_k=3)
    expected = target_joint(target, prompt, sampling)
    counts = dict.fromkeys(expected, 0)
    session = EngineSession(target, draft, None, EngineConfig(target="micro", policy="lru", cache_ratio=0.25))
    real = speculative.stochastic_accept
    try:
        if accept is not None:
            speculative.stochastic_accept = accept
        for seed in range(ENGINE_RUNS):
            (res,), _ = session.generate([prompt], gamma=2, max_new_tokens=3, ignore_eos=True,
                                         sampling=Sampling(temperature=1.0, top_k=3, seed=seed))
            counts[tuple(res.tokens)] += 1
    finally:
        speculative.stochastic_accept = real
        session.close()
    keys = sorted(expected, key=expected.get)
    obs, exp, small_o, small_e = [], [], 0, 0.0
    for k in keys:  # cells expected fewer than 5 times are pooled into one
        e = expected[k] * ENGINE_RUNS
        if e < 5:
            small_o, small_e = small_o + counts[k], small_e + e
        else:
            obs.append(counts[k])
            exp.append(e)
    if small_e:
        obs.append(small_o)
        exp.append(small_e)
    exp = np.array(exp) * sum(obs) / sum(exp)
    return chisquare(obs, exp).pvalue


def test_engine_speculative_sampling_matches_the_target_distribution(engine_micro):
    assert engine_pvalue(engine_micro) > 0.01


def test_engine_negative_control_wrong_rule_is_detected(engine_micro):
    assert engine_pvalue(engine_micro, wrong_accept) < 0.01
