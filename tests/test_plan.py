"""The memory plan on the real shapes of the paper's models (configs only, meta device, offline by hub id)."""

import pytest

from moespac.cache import CacheSize
from moespac.cli import main
from moespac.engine.plan import model_shape, plan_memory
from moespac.errors import MoespacError
from moespac.models.hub_configs import HUB_CONFIGS, offline_config
from moespac.models.specs import PAPER_MODELS, spec_from_config

# total parameters as the model cards publish them (billions)
PUBLISHED = {"Qwen/Qwen3-30B-A3B": 30.5, "Qwen/Qwen3-4B": 4.0, "Qwen/Qwen3-4B-FP8": 4.0, "Qwen/Qwen3-1.7B": 1.7,
             "deepseek-ai/DeepSeek-V2-Lite": 15.7, "zai-org/GLM-4.5-Air": 106.0, "Qwen/Qwen3.5-122B-A10B": 122.0,
             "MiniMaxAI/MiniMax-M2.5": 229.0}
CORE = ("num_layers", "num_moe_layers", "num_experts", "top_k", "hidden_size", "expert_ffn", "num_attention_heads",
        "num_kv_heads", "vocab_size")


@pytest.mark.parametrize("hub", list(HUB_CONFIGS))
def test_configs_match_the_registry_and_the_published_size(hub):
    """Two transcriptions of each model's public config agree (the registry's architecture numbers, written
    first, and the transformers config the plan builds), and the parameter count matches the model card."""
    import torch
    from transformers import AutoModelForCausalLM

    config = offline_config(hub)
    name = HUB_CONFIGS[hub][2]
    spec, ref = spec_from_config(config, name=name), PAPER_MODELS[name]
    assert {k: getattr(spec, k) for k in CORE} == {k: getattr(ref, k) for k in CORE}
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert params / 1e9 == pytest.approx(PUBLISHED[hub], rel=0.02)


def test_paper_box_fits_and_a_small_host_is_refused(capsys, monkeypatch):
    """Qwen3-30B-A3B + Qwen3-4B-FP8 on the paper's RTX 4090 (24 GB) with a 64 GB host; refused at 32 GB."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["plan", "--target", "Qwen/Qwen3-30B-A3B", "--draft", "Qwen/Qwen3-4B-FP8", "--gpu-gib", "24"]
    assert main(args + ["--host-gib", "64"]) == 0
    out = capsys.readouterr().out
    assert "chosen by the plan" in out and "fits: " in out
    t = model_shape(offline_config("Qwen/Qwen3-30B-A3B"))
    d = model_shape(offline_config("Qwen/Qwen3-4B-FP8"))
    plan = plan_memory(t, d, device_gib=24, host_gib=64)
    assert f"fits: {plan.slots} expert slots, cache ratio {plan.cache_ratio:.3f}" in out
    assert 0.2 < plan.cache_ratio < 0.35 and plan.device_total <= 24 * 2**30 and plan.host_peak < 64 * 2**30
    assert plan.slots * t.expert_each == plan.slot_pool and t.expert_each == 3 * 2048 * 768 * 2
    assert main(args + ["--host-gib", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "host needs" in err[0] and "more than its 32.00 GiB" in err[0]


def test_the_default_cache_ratio_of_old_does_not_fit_and_says_by_how_much():
    t = model_shape(offline_config("Qwen/Qwen3-30B-A3B"))
    d = model_shape(offline_config("Qwen/Qwen3-4B-FP8"))
    with pytest.raises(MoespacError, match=r"--cache-ratio 0.5 asks for 3072 expert slots \(27.00 GiB\), but \d+ fit"):
        plan_memory(t, d, device_gib=24, host_gib=64, cache=CacheSize(cache_ratio=0.5))
    with pytest.raises(MoespacError, match="the device needs .* before any expert slot"):
        plan_memory(t, d, device_gib=6, host_gib=64)


@pytest.mark.parametrize("hub", ["deepseek-ai/DeepSeek-V2-Lite", "zai-org/GLM-4.5-Air", "Qwen/Qwen3.5-122B-A10B",
                                 "MiniMaxAI/MiniMax-M2.5"])
def test_each_table3_model_is_planned_on_an_a100_box(hub):
    """Table 3's models on an A100-80GB with a 512 GB host, drafted by Qwen3-4B-FP8 (the stand-in the tables
    name). MiniMax-M2.5's FP8 experts are planned dequantized to bf16, as the engine runs them."""
    t = model_shape(offline_config(hub), name=hub)
    plan = plan_memory(t, model_shape(offline_config("Qwen/Qwen3-4B-FP8")), device_gib=80, host_gib=512)
    assert 0 < plan.slots <= plan.total_slots and plan.device_total <= 80 * 2**30 and plan.host_peak < 512 * 2**30
    assert plan.target.expert_bytes == plan.target.moe_layers * plan.target.experts * plan.target.expert_each
    if hub.startswith("Qwen/Qwen3.5"):
        assert plan.target.state_bytes > 0  # Gated DeltaNet layers carry recurrent state, not KV


def test_local_folders_plan_from_their_config(micro_dir):
    assert main(["plan", "--target", str(micro_dir / "target"), "--draft", str(micro_dir / "draft"), "--device", "cpu",
                 "--host-gib", "8"]) == 0
    assert main(["plan", "--target", str(micro_dir / "nothing")]) == 2


def test_json_records_the_verdict_and_a_plan_that_does_not_fit_is_not_an_error(tmp_path, capsys, monkeypatch):
    """The Table 3 checkpoint reads this file: a pair that does not fit is a verdict (exit 0, fits false, the
    plan's one-line reason), a bad input is still an error that writes nothing."""
    import json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["plan", "--target", "Qwen/Qwen3-30B-A3B", "--draft", "Qwen/Qwen3-4B-FP8", "--gpu-gib", "24"]
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    assert main(args + ["--host-gib", "32", "--json", str(small)]) == 0
    v = json.loads(small.read_text())
    assert (v["fits"] is False and "host needs" in v["reason"] and v["host_gib"] == 32
            and v["draft"] == "Qwen/Qwen3-4B-FP8")
    assert main(args + ["--host-gib", "64", "--json", str(big)]) == 0
    v = json.loads(big.read_text())
    plan = plan_memory(model_shape(offline_config("Qwen/Qwen3-30B-A3B")),
                       model_shape(offline_config("Qwen/Qwen3-4B-FP8")),
                       device_gib=24, host_gib=64)
    assert (v["fits"] is True and v["reason"] is None and v["slots"] == plan.slots
            and v["total_slots"] == plan.total_slots)
    missing = tmp_path / "missing.json"
    assert main(["plan", "--target", str(tmp_path / "nothing"), "--json", str(missing)]) == 2
    assert not missing.exists()
    assert main(args + ["--json", str(tmp_path)]) == 2 and "is a folder" in capsys.readouterr().err
