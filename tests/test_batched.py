"""Batched speculative decoding: each sequence equals its own unbatched greedy autoregressive output."""

import pytest
import torch

from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import Sampling, generate_batch
from moespac.errors import MoespacError
from moespac.lossless import hf_greedy
from moespac.models.micro import build_micro
from moespac.prompts import builtin_prompts
from moespac.registry import make_policy


@pytest.fixture(scope="module", params=["qwen3_moe", "deepseek_v2"])
def pair(request):
    target, draft, tok = build_micro(request.param, dtype=torch.float64, seed=5)
    prompts = [tok.encode(t)[: 6 + 3 * i] for i, t in enumerate(builtin_prompts(8, seed=2))]  # ragged lengths
    return target, draft, prompts


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_batched_greedy_speculative_equals_unbatched_autoregressive(pair, batch):
    target, draft, prompts = pair
    prompts = prompts[:batch]
    ref = hf_greedy(target, prompts, 20)
    for d in (draft, target):  # mostly rejected drafts, then all accepted (sequences diverge in length either way)
        rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.5))
        try:
            rt.start_request(gamma=4, batch_size=batch, signals={"draft"})
            out = generate_batch(target, prompts, draft=d, gamma=4, max_new_tokens=20, runtime=rt, ignore_eos=True)
        finally:
            rt.close()
        assert [r.tokens for r in out] == ref


def test_sequences_keep_their_own_acceptance(pair):
    target, draft, prompts = pair
    out = generate_batch(target, prompts[:4], draft=draft, gamma=3, max_new_tokens=30, ignore_eos=True)
    assert all(len(r.tokens) == 30 for r in out)
    for r in out:
        assert sum(r.accepted_per_step) == r.accepted and all(0 <= m <= 3 for m in r.accepted_per_step)


def test_finished_sequences_retire(pair):
    """With an EOS chosen as a token one sequence emits early, that sequence stops and the others go on."""
    target, draft, prompts = pair
    free = generate_batch(target, prompts[:3], draft=draft, gamma=2, max_new_tokens=12, ignore_eos=True)
    eos = free[0].tokens[3]
    out = generate_batch(target, prompts[:3], draft=draft, gamma=2, max_new_tokens=12, eos_token_id=eos)
    for f, o in zip(free, out):
        cut = f.tokens.index(eos) + 1 if eos in f.tokens else len(f.tokens)
        assert o.tokens == f.tokens[:cut]


def test_stochastic_batch_runs(pair):
    target, draft, prompts = pair
    out = generate_batch(target, prompts[:4], draft=draft, gamma=3, max_new_tokens=10,
                         sampling=Sampling(temperature=1.0, seed=1), ignore_eos=True)
    assert [len(r.tokens) for r in out] == [10] * 4


def test_batch_errors(pair):
    target, draft, prompts = pair
    with pytest.raises(MoespacError, match="batch size 0"):
        generate_batch(target, [], draft=draft)
    with pytest.raises(MoespacError, match="exceeds the configured maximum 2"):
        generate_batch(target, prompts[:3], draft=draft, max_batch=2)
    with pytest.raises(MoespacError, match="does not fit"):
        generate_batch(target, [[1] * 4090], draft=draft, max_new_tokens=16)
