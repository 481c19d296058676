"""What would have stopped the engine on a GPU, each pinned by a CPU test (see the engine-on-GPU issue)."""

import inspect

import pytest
import torch

from moespac.engine import speculative
from moespac.engine.session import EngineConfig, EngineSession, plan_for
from moespac.engine.speculative import Sampling, generate
from moespac.errors import MoespacError
from moespac.lossless import check_lossless, hf_greedy
from moespac.models.micro import build_micro


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def micro():
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=11)
    return target, draft, tok, tok.encode("def add(a, b):")


class PastKeyValuesOnly(torch.nn.Module):
    """A model as the transformers releases before the `cache` rename present it (5.7-5.17): the KV cache is
    `past_key_values`, and any other keyword, `cache=` included, disappears into **kwargs."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, position_ids=None, attention_mask=None,
                **kwargs):
        keyword = "cache" if "cache" in inspect.signature(self.inner.forward).parameters else "past_key_values"
        return self.inner(input_ids=input_ids, use_cache=use_cache, position_ids=position_ids,
                          attention_mask=attention_mask, **{keyword: past_key_values})


def test_the_kv_cache_goes_in_under_the_keyword_the_model_takes(micro):
    target, draft, _, prompt = micro
    expected = hf_greedy(target, [prompt], 12)[0]
    got = generate(PastKeyValuesOnly(target), prompt, draft=PastKeyValuesOnly(draft), gamma=4, max_new_tokens=12,
                   ignore_eos=True)
    assert got.tokens == expected


def test_sampling_draws_on_the_probabilities_device(micro, monkeypatch):
    """The generator is made on the target's device and every draw uses it with tensors of that device."""
    target, draft, _, prompt = micro
    made, draws = [], []
    real_gen, real_rand = torch.Generator, torch.rand

    def generator(device=None):  # records the device asked for; the old code asked for none (a CPU generator)
        made.append(None if device is None else torch.device(device))
        return real_gen(device=device or "cpu")

    def rand(*size, generator=None, device=None, **kw):  # every draw starts from one uniform number
        draws.append((torch.device(device or "cpu"), generator.device))
        return real_rand(*size, generator=generator, device=device, **kw)

    monkeypatch.setattr(speculative.torch, "Generator", generator)
    monkeypatch.setattr(speculative.torch, "rand", rand)
    generate(target, prompt, draft=draft, gamma=4, max_new_tokens=10, sampling=Sampling(temperature=0.8, seed=3),
             ignore_eos=True)
    device = target.get_input_embeddings().weight.device
    assert made == [device] and draws and all(p == g == device for p, g in draws)


def test_check_lossless_never_needs_the_experts_in_the_model(micro):
    """With the host reference no forward ever sees the routed experts inside the model: they stay in the
    expert store (host) and the slot pool, so a 30B target is never moved to the device whole."""
    target, draft, _, prompt = micro
    seen = []
    hook = target.register_forward_pre_hook(
        lambda m, a: seen.append(sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)))
    try:
        n, bad = check_lossless(target, draft, [prompt], gammas=[2], cache_ratios=[0.25], max_new_tokens=6,
                                reference="host")
    finally:
        hook.remove()
    assert n == 1 and bad == [] and seen and set(seen) == {0}


def test_the_slot_pool_is_sized_by_the_memory_plan(micro_dir):
    """No default pool that cannot fit: without --cache-ratio the plan chooses the slots for the budget; an
    explicit ratio beyond it is refused before anything is loaded."""
    cfg = EngineConfig(target=str(micro_dir / "target"), draft=str(micro_dir / "draft"), device="cpu", host_gib=8)
    plan = plan_for(cfg, "cpu")
    assert plan.slots == plan.total_slots and plan.requested == "chosen by the plan"
    # a CPU run: the store, the rest of the run and the "device" slots all live in host memory; leave room for
    # a quarter of the experts' slots
    steady = plan.host_items["expert store"] + plan.device_total - plan.slot_pool
    tight = EngineConfig(target=cfg.target, draft=cfg.draft, device="cpu",
                         host_gib=(steady + plan.target.expert_bytes / 4) / 2**30)
    small = plan_for(tight, "cpu")
    assert 0 < small.slots < small.total_slots
    with EngineSession.open(tight) as session:
        assert session.runtime.cache.capacity == small.slots
    with pytest.raises(MoespacError, match="--cache-ratio 1 asks for"):
        plan_for(EngineConfig(target=cfg.target, draft=cfg.draft, device="cpu", host_gib=tight.host_gib,
                              cache_ratio=1.0), "cpu")
