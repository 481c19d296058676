"""The one device path: the CPU stand-in's ordering checker catches what a GPU would get wrong, the expert
store takes the experts out of the model and gives them back, and host memory holds one copy of them."""

import subprocess
import sys
import textwrap

import pytest
import torch

from moespac.engine import device as devmod
from moespac.engine.device import COMPUTE, COPY, Device, OrderChecker, OrderViolation
from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate
from moespac.errors import MoespacError
from moespac.models.micro import build_micro
from moespac.registry import make_policy


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the checker's rules ---------------------------------------------------------------------------------------

def test_a_read_needs_the_copy_event_waited_for():
    dev = Device("cpu")
    with dev.on_copy_stream():
        dev.copy_into_slot(0, ("L0", 3), [])
        ready = dev.record(COPY)
    with pytest.raises(OrderViolation, match="before its copy"):
        dev.read_slots([(0, ("L0", 3))])  # program order is not enough: nothing waited for the copy
    dev.checker.violations.clear()
    dev.wait(COMPUTE, ready)
    dev.read_slots([(0, ("L0", 3))])


def test_a_copy_needs_the_last_read_of_its_slot_waited_for():
    dev = Device("cpu")
    dev.copy_into_slot(0, "a", [])
    dev.wait(COMPUTE, dev.record(COPY))
    dev.read_slots([(0, "a")])
    read = dev.record(COMPUTE)
    with pytest.raises(OrderViolation, match="may overwrite the slot while the read is in flight"):
        dev.copy_into_slot(0, "b", [])
    dev.wait(COPY, read)
    dev.copy_into_slot(0, "b", [])  # now ordered after the read


def test_a_host_wait_orders_everything_issued_after_it():
    dev = Device("cpu")
    dev.copy_into_slot(1, "x", [])
    dev.host_wait(dev.record(COPY))
    dev.read_slots([(1, "x")])
    with pytest.raises(OrderViolation, match="last copy into it was"):
        dev.read_slots([(1, "y")])  # the slot holds x, not y


# -- the checker inside the engine -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def micro():
    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=5)
    return target, draft, tok.encode("def quicksort(items):")


def _run(target, draft, prompt, ratio=0.25, policy="lru", copy_mode="async", checker=None):
    dev = Device("cpu", checker or OrderChecker(keep_log=True))
    rt = HybridRuntime(target, make_policy(policy), RuntimeConfig(cache_ratio=ratio, copy_mode=copy_mode), device=dev)
    try:
        rt.start_request(gamma=4, signals={"draft"})
        out = generate(target, prompt, draft=draft, gamma=4, max_new_tokens=24, runtime=rt, ignore_eos=True)
    finally:
        rt.close()
    return out, dev.checker


@pytest.mark.parametrize("policy", ["lru", "moespac", "hybrimoe"])
def test_engine_orders_every_copy_and_read(micro, policy):
    _, checker = _run(*micro, policy=policy)
    kinds = {entry[0] for entry in checker.log}
    assert {"copy", "read"} <= kinds and checker.copies > 0 and checker.reads > 0 and checker.violations == []


@pytest.mark.parametrize("stream, message", [(COMPUTE, "before its copy"), (COPY, "while the read is in flight")])
def test_a_missing_wait_in_the_engine_is_caught(micro, monkeypatch, stream, message):
    """Negative controls: the engine with one stream's waits dropped (what would race on a GPU) fails on a CPU."""
    real = devmod.Device.wait

    def skip(self, s, event):
        if s != stream:
            real(self, s, event)

    monkeypatch.setattr(devmod.Device, "wait", skip)
    with pytest.raises(OrderViolation, match=message):
        _run(*micro, ratio=0.125, copy_mode="sync")


# -- the store: experts out of the model and back, one host copy --------------------------------------------------

def test_store_takes_the_experts_out_and_gives_them_back(micro):
    target, draft, prompt = micro
    experts = [(n, p.clone()) for n, p in target.named_parameters() if ".experts." in n]
    rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.5))
    try:
        assert all(p.numel() == 0 for n, p in target.named_parameters() if ".experts." in n)  # not in the model
        assert sum(b.numel() for b in rt.store._blocks) == rt.store.host_bytes
        assert len(rt.store._blocks) == rt.topology.num_layers  # one exactly sized block per MoE layer
    finally:
        rt.close()
    after = dict(target.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in experts)
    rt2 = HybridRuntime(target, make_policy("lru"))
    try:
        with pytest.raises(MoespacError, match="already has an open HybridRuntime"):
            HybridRuntime(target, make_policy("lru"))
    finally:
        rt2.close()


def test_host_blocks_are_exactly_the_experts_bytes(micro, monkeypatch):
    """One block per MoE layer, of exactly its experts' bytes (each tensor rounded up to 256 B), asked of the
    device as pinned memory is on a GPU (torch's pinned allocator would round 0.75 GiB up to 1 GiB)."""
    target, *_ = micro
    sizes = []
    real = Device.host_block
    monkeypatch.setattr(Device, "host_block", lambda self, n: sizes.append(n) or real(self, n))
    rt = HybridRuntime(target, make_policy("lru"), RuntimeConfig(cache_ratio=0.0))
    rt.close()
    per_layer = sum(-(-t.numel() * t.element_size() // 256) * 256
                    for n, t in target.named_parameters() if n.startswith("model.layers.0.mlp.experts."))
    assert sizes == [per_layer] * rt.topology.num_layers


PEAK = textwrap.dedent("""
    import resource, sys, torch
    from transformers import Qwen3MoeConfig, AutoModelForCausalLM
    from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
    from moespac.registry import make_policy
    torch.set_num_threads(1)
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, num_experts=64, num_experts_per_tok=2,
                         moe_intermediate_size=256, intermediate_size=256)
    model = AutoModelForCausalLM.from_config(cfg)
    experts = sum(p.numel() * 4 for n, p in model.named_parameters() if ".experts." in n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rt = HybridRuntime(model, make_policy("lru"), RuntimeConfig(cache_ratio=0.0))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(experts, after - before)
""")


def test_taking_the_experts_never_holds_two_copies_of_them():
    """8 layers x 64 experts of 768 KiB (384 MiB): the store grows the peak by about one layer, not by all."""
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True).stdout.split()
    experts, growth = int(out[0]), int(out[1])
    assert growth < 0.35 * experts, f"peak grew by {growth / 2**20:.0f} MiB for {experts / 2**20:.0f} MiB of experts"
