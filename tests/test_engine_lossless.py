"""Greedy speculative decoding over the hybrid engine == Hugging Face's own greedy generate(), in float64, on
tiny random models of every architecture the engine supports; the device-path ordering checker runs inside."""

import pytest
import torch

from moespac.engine.device import Device, OrderChecker
from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.lossless import check_lossless, hf_greedy
from moespac.models.micro import ARCHS, build_micro
from moespac.registry import make_policy


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    # float64 makes batch-size-dependent rounding (1 token vs gamma+1 tokens) far below any logit gap
    target, draft, tok = build_micro(request.param, dtype=torch.float64, seed=3)
    return request.param, target, draft, tok


def _prompts(tok):
    return [tok.encode(t) for t in ("def add(a, b):", "The quick brown fox", "import os\nprint(")]


@pytest.mark.parametrize("policy", ["lru", "moespac", "hybrimoe"])
def test_greedy_speculative_equals_hf_generate(pair, policy):
    arch, target, draft, tok = pair
    prompts = _prompts(tok)[:2]
    checker = OrderChecker()
    n, bad = check_lossless(target, draft, prompts, gammas=[1, 4, 8], cache_ratios=[0.0, 0.25, 1.0], policy=policy,
                            max_new_tokens=16, device=Device("cpu", checker))
    assert n == len(prompts) * 3 * 3
    assert bad == [], f"{arch}: {bad[:3]}"
    # the device path ran: slots were filled and read, and every read and copy was ordered by events
    assert checker.copies > 0 and checker.reads > 0 and checker.violations == []


def test_a_perfect_draft_is_lossless_too(pair):
    """The target as its own draft: every draft accepted, plus the bonus token."""
    arch, target, _, tok = pair
    prompts = _prompts(tok)[1:]
    n, bad = check_lossless(target, target, prompts, gammas=[4], cache_ratios=[0.5], policy="lru", max_new_tokens=12)
    assert n == 2 and bad == [], f"{arch}: {bad[:3]}"


def test_perfect_draft_accepts_everything(pair):
    _, target, _, tok = pair
    p = _prompts(tok)[0]
    res = generate(target, p, draft=target, gamma=4, max_new_tokens=21, ignore_eos=True)
    assert res.acceptance_rate == 1.0 and res.rejected == 0
    assert res.steps == 4 and len(res.tokens) == 21  # 1 from prefill + 4 steps x (4 accepted + 1 bonus)


def test_rejections_are_the_steps_that_stop_early(pair):
    _, target, draft, tok = pair
    res = generate(target, _prompts(tok)[0], draft=draft, gamma=4, max_new_tokens=40, ignore_eos=True)
    assert res.rejected == sum(m < 4 for m in res.accepted_per_step) > 0  # a random draft is mostly rejected


def test_split_does_not_change_logits(pair):
    """Each expert's tokens are computed by the same call on device or host: logits are bitwise equal across
    cache ratios (and so across policies and prefetch timing)."""
    _, target, _, tok = pair
    ids = torch.tensor([_prompts(tok)[1]])
    outs = []
    for ratio in (0.0, 0.5, 1.0):
        rt = HybridRuntime(target, make_policy("all-host" if ratio == 0 else "lru"), RuntimeConfig(cache_ratio=ratio))
        try:
            rt.start_request(gamma=0)
            with torch.no_grad():
                outs.append(target(ids).logits)
        finally:
            rt.close()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])


def test_cache_counters_add_up(pair):
    _, target, draft, tok = pair
    rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.5, copy_mode="sync"))
    try:
        rt.start_request(gamma=4, signals={"draft"})
        generate(target, _prompts(tok)[2], draft=draft, gamma=4, max_new_tokens=16, runtime=rt)
        s = rt.stats()
        rt.cache.check()
    finally:
        rt.close()
    assert s["hits"] + s["loads"] + s["host"] == s["activations"] > 0
    assert s["bytes_copied"] == s["loads"] * s["expert_bytes"]
    assert s["host"] == 0  # LRU always finds a victim among unfrozen residents at ratio 0.5
    assert int(rt.cache.resident.sum()) <= rt.cache.capacity


def test_runtime_closes_and_opens_again_on_one_model(pair):
    """close() gives the experts back: the model matches HF generate again, and a second runtime finds experts."""
    _, target, draft, tok = pair
    prompt = _prompts(tok)[0]
    before = hf_greedy(target, [prompt], 8)
    impl = target.config._experts_implementation
    for _ in range(2):
        rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.5))
        try:
            rt.start_request(gamma=4, signals={"draft"})
            assert generate(target, prompt, draft=draft, gamma=4, max_new_tokens=8, runtime=rt,
                            ignore_eos=True).tokens == before[0]
        finally:
            rt.close()
        assert target.config._experts_implementation == impl
        assert hf_greedy(target, [prompt], 8) == before
