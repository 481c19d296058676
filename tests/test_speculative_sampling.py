"""Stochastic speculative sampling reproduces the target distribution; a wrong rule is caught (negative control)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

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
