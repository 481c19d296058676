"""The lean forward (moespac.engine.lean) against transformers' own forward of the same model, step by step
through the engine's cache operations, dense drafts and MoE targets; and where it must step aside."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from moespac.engine.lean import lean_forward
from moespac.engine.kvcache import CachedModel

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
ARCHS = {
    "qwen3": dict(head_dim=8),
    "qwen2": {},  # q, k, v with bias
    "llama": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(sliding_window=None),
    "qwen3_moe": dict(head_dim=8, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16),
    "qwen2_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=24),
    "mixtral": dict(num_local_experts=6, num_experts_per_tok=2, sliding_window=None),
}


def dense(arch: str, seed: int = 0, **extra):
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(arch, **{**SMALL, **ARCHS[arch], **extra})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()
    if "num_experts_per_tok" in ARCHS[arch]:
        model.set_experts_implementation("eager")  # transformers' grouped matmul has no float64 kernel
    with torch.no_grad():  # the biases start at zero; random ones make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return model


# (pending tokens fed, then the columns kept: None = all), the way a speculative step drives a draft
SCRIPT = [([5, 9, 2, 44, 17, 3, 60], None), ([8], None), ([12], None), ([30], 8), ([31, 70, 4], None), ([1], 9),
          ([2, 3], None), ([40], None)]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_lean_logits_equal_transformers_through_feeds_and_crops(arch, one_torch_thread):
    model = dense(arch)
    lean, ref = CachedModel(model, 1, lean=True), CachedModel(model, 1)
    assert lean.lean is not None and ref.lean is None
    for pending, keep in SCRIPT:
        got, want = lean.forward([pending]), ref.forward([pending])
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        last = lean.forward([[7]], last_only=True)  # a one-column feed, then rolled back
        torch.testing.assert_close(last, ref.forward([[7]], last_only=True), rtol=0, atol=1e-10)
        n = int(ref.lengths[0]) - 1
        lean.keep([n])
        ref.keep([n])
        if keep is not None:
            lean.keep([keep])
            ref.keep([keep])
        assert lean.lengths.tolist() == ref.lengths.tolist()
        assert lean.cache.layers[0].keys.shape[2] == int(lean.lengths[0])


def test_last_only_is_the_last_column():
    model = dense("qwen3", seed=1)
    a, b = CachedModel(model, 1, lean=True), CachedModel(model, 1, lean=True)
    torch.testing.assert_close(a.forward([[3, 4, 5, 6]])[:, -1:], b.forward([[3, 4, 5, 6]], last_only=True),
                               rtol=0, atol=1e-12)


def test_what_it_does_not_compute_goes_through_transformers():
    assert lean_forward(dense("mistral", sliding_window=4)) is None  # a window the lean forward does not apply
    assert lean_forward(dense("qwen3", rope_scaling={"rope_type": "dynamic", "factor": 2.0})) is None
    model = dense("qwen3")
    model.model.layers[1].mlp.up_proj = torch.nn.Sequential(model.model.layers[1].mlp.up_proj)  # a replaced linear
    assert lean_forward(model) is None
    assert lean_forward(dense("qwen3").train()) is None
    olmoe = AutoModelForCausalLM.from_config(AutoConfig.for_model("olmoe", **SMALL, num_experts=4,
                                                                  num_experts_per_tok=2))
    assert lean_forward(olmoe) is None  # its q/k norms span all heads: not a decoder this path knows
    assert CachedModel(dense("qwen3"), 2, lean=True).lean is None  # batches keep transformers' masks
