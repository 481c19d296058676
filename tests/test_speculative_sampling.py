"""Stochastic speculative sampling reproduces the target distribution; a wrong rule is caught (negative control)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from moespac.engine import speculative
from moespac.engine.speculative import Sampling, draw, greedy_accept, stochastic_accept

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


def test_draw_samples_its_distribution_and_never_a_token_of_mass_zero():
    """The inverse-CDF draw against scipy's chi-square, on an unnormalised distribution with holes."""
    gen = torch.Generator().manual_seed(1)
    w = torch.tensor([0.0, 2.0, 0.0, 1.0, 5.0, 0.0, 2.0], dtype=torch.float64)
    n = 20000
    counts = np.bincount([draw(w, gen) for _ in range(n)], minlength=len(w))
    assert counts[w.numpy() == 0].sum() == 0
    live = w.numpy() > 0
    assert chisquare(counts[live], (w.numpy() / w.numpy().sum() * n)[live]).pvalue > 0.01
    skewed = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)  # negative control: another distribution
    assert chisquare(counts[live], (skewed.numpy() * n)).pvalue < 0.01


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
def engine_micro(one_torch_thread):
    from moespac.models.micro import build_micro

    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=2)
    return target, draft, tok.encode("def add(a, b):")


def engine_pvalue(engine_micro, accept=None):
    """ENGINE_RUNS three-token generations through an engine session (lru, a quarter of the experts on the
    'device', ordering checked), tested against the target's joint distribution (top_k=3: 27 cells)."""
    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.lossless import sampling_pvalue, target_joint

    target, draft, prompt = engine_micro
    expected = target_joint(target, prompt, Sampling(temperature=1.0, top_k=3))
    session = EngineSession(target, draft, None, EngineConfig(target="micro", policy="lru", cache_ratio=0.25))
    real = speculative.stochastic_accept
    try:
        if accept is not None:
            speculative.stochastic_accept = accept
        return sampling_pvalue(session, prompt, expected, ENGINE_RUNS)
    finally:
        speculative.stochastic_accept = real
        session.close()


def test_chi_square_matches_scipy():
    from moespac.lossless import chi_square_pvalue

    obs, exp = [18, 22, 31, 29, 50], [20, 20, 30, 30, 50]
    assert chi_square_pvalue(obs, exp) == pytest.approx(chisquare(obs, exp).pvalue, rel=1e-9)


def test_engine_speculative_sampling_matches_the_target_distribution(engine_micro):
    assert engine_pvalue(engine_micro) > 0.01


def test_engine_negative_control_wrong_rule_is_detected(engine_micro):
    assert engine_pvalue(engine_micro, wrong_accept) < 0.01
