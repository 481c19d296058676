"""The locally trained proxy pair: build (tiny config, pydoc corpus), load, card, hold-out, lossless, stats."""

import json

import numpy as np
import pytest
import torch

from moespac.errors import MoespacError
from moespac.models import corpus as corpora
from moespac.models.proxy import build_proxy, get_config
from moespac.models.proxy_train import target_loss


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("proxy")
    card = build_proxy(out, get_config("tiny"), seed=0, log=lambda m: None)
    return out, card


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_builds_give_the_same_pair_on_a_busy_machine(pair, tmp_path):
    """The step counts, not the clock, stop training: a second build with a core kept busy and the caller's
    torch at another thread count writes byte-identical models and tokenizers."""
    import subprocess
    import sys

    out, card = pair
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        again = build_proxy(tmp_path, get_config("tiny"), seed=0, log=lambda m: None)
        assert torch.get_num_threads() == 2  # the build ran on the config's thread count and restored the caller's
    finally:
        busy.kill()
        torch.set_num_threads(before)
    for sub in ("target", "draft"):
        first, second = _files(out / sub), _files(tmp_path / sub)
        assert first.keys() == second.keys() and "model.safetensors" in first
        assert [k for k in first if first[k] != second[k]] == []
    for model in ("target", "draft"):
        assert card[model]["steps"] == again[model]["steps"] == get_config("tiny").__dict__[f"{model}_steps"]
    assert again["held_back"] == card["held_back"] and again["threads"] == 1


def test_over_budget_build_fails_naming_the_step_and_writes_nothing(tmp_path):
    from moespac.models.proxy_train import OverBudget

    with pytest.raises(OverBudget, match=r"over its wall-clock guard of 0.0001 min at target step 0 of 40"):
        build_proxy(tmp_path / "p", get_config("tiny", {"budget_minutes": "0.0001"}), seed=0, log=lambda m: None)
    assert not (tmp_path / "p").exists()


def test_pair_loads_like_hub_models(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moespac.models.experts import find_experts

    out, card = pair
    target = AutoModelForCausalLM.from_pretrained(out / "target")
    draft = AutoModelForCausalLM.from_pretrained(out / "draft")
    tok = AutoTokenizer.from_pretrained(out / "target")
    assert type(target).__name__ == "Qwen3MoeForCausalLM" and type(draft).__name__ == "Qwen3ForCausalLM"
    assert len(find_experts(target)) == 2 and target.config.num_experts == 8 and target.config.num_experts_per_tok == 2
    assert target.config.router_aux_loss_coef == 0.01
    assert target.config.vocab_size == draft.config.vocab_size == len(tok) == card["tokens"]["vocab"]
    assert target.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    assert (out / "target" / "model.safetensors").is_file() and (out / "draft" / "model.safetensors").is_file()
    assert card["target"]["steps"] == 40 and card["draft"]["steps"] == 20  # the config's counts, exactly


def test_card_names_data_holdout_and_disclaimer(pair):
    from moespac.datasets import BENCHMARKS, load_benchmark

    out, card = pair
    text = (out / "MODEL_CARD.md").read_text()
    saved = json.loads((out / "model_card.json").read_text())
    n_prompts = sum(len(load_benchmark(b)) for b in BENCHMARKS)
    assert saved["corpus"]["benchmark_prompts"] == n_prompts
    assert saved["corpus"]["source"] == "pydoc" and saved["corpus"]["kept"] == saved["corpus"]["read"] == 79
    assert f"held out: {saved['corpus']['held_out']} conversations" in text
    assert "not Qwen3-30B-A3B" in text and "pydoc" in text
    assert saved["target"]["steps"] > 0 and saved["draft"]["steps"] > 0 and saved["timing"] == "measured"


def test_holdout_drops_conversations_containing_a_benchmark_prompt(tmp_path):
    from moespac.datasets import load_benchmark

    holdout, _ = corpora.benchmark_holdout()
    alpaca = load_benchmark("alpaca")[0].turns[0]  # a ShareGPT first turn itself
    gsm = load_benchmark("gsm8k")[0].turns[0]
    clean = [{"from": "human", "value": "How do tides work?"}, {"from": "gpt", "value": "The moon pulls the sea."}]
    records = [
        {"id": "a", "conversations": clean},
        {"id": "b", "conversations": [{"from": "human", "value": alpaca}, {"from": "gpt", "value": "Sure."}]},
        # embedded, with case and spacing changed: still recognised
        {"id": "c", "conversations": [{"from": "human", "value": "Help me:  " + gsm.upper().replace(" ", "  ")},
                                      {"from": "gpt", "value": "Let us see."}]},
        {"id": "d", "conversations": clean},
    ]
    # the real file is cut off mid-record; the reader must stop there quietly
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records) [:-1] + ', {"id": "e", "conversations": [{"from": "hu')
    assert [c[0]["content"] for c in corpora.sharegpt_conversations(path)][1] == alpaca
    convs, stats = corpora.collect("sharegpt", 10**9, holdout, path=path)
    assert (stats.read, stats.kept, stats.held_out) == (4, 2, 2)
    assert convs == [[{"role": "user", "content": "How do tides work?"},
                      {"role": "assistant", "content": "The moon pulls the sea."}]] * 2
    assert not holdout.matches([{"role": "user", "content": "Examples:"}])  # short paragraphs are not keys


def test_greedy_speculative_equals_autoregressive(pair):
    from moespac.lossless import check_lossless
    from moespac.models.loading import load_pair
    from moespac.prompts import builtin_prompts

    out, _ = pair
    # float64: batch-shape-dependent rounding (1 vs gamma+1 tokens) stays far below any logit gap
    target, draft, tok = load_pair(str(out / "target"), str(out / "draft"), dtype="fp64")
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for t in builtin_prompts(3)]
    n, bad = check_lossless(target, draft, prompts, gammas=[1, 4, 8], cache_ratios=[0.0, 0.5, 1.0], max_new_tokens=16)
    assert n == 27 and bad == []


def test_router_aux_loss_is_in_the_loss_per_layer(pair):
    from transformers import AutoModelForCausalLM

    from moespac.models.proxy_train import layer_balance_loss

    out, _ = pair
    target = AutoModelForCausalLM.from_pretrained(out / "target")
    x = torch.arange(24).reshape(2, 12) % target.config.vocab_size
    with torch.no_grad():
        loss, metrics = target_loss(target, x)
        hf = target(input_ids=x, labels=x, output_router_logits=True)
    # transformers adds coef * its aux loss when router logits are on; ours is the per-layer form, same coefficient
    ce = hf.loss - 0.01 * hf.aux_loss
    assert metrics["ce"] == pytest.approx(ce.item(), abs=1e-5)
    # the base model + head (skipping transformers' unused pooled aux loss) gives the wrapper's logits to the bit
    exact = torch.nn.functional.cross_entropy(hf.logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
    assert metrics["ce"] == exact.item()
    assert loss.item() == pytest.approx(ce.item() + 0.01 * metrics["aux"], abs=1e-5)
    # balanced routing gives top_k; a layer collapsed onto k experts gives E
    E, k, T = 8, 2, 64
    uniform = torch.zeros(T, E)
    assert layer_balance_loss([uniform], k).item() == pytest.approx(k)
    a = torch.full((T, E), -9.0)
    a[:, :2] = 9.0
    b = torch.full((T, E), -9.0)
    b[:, 2:4] = 9.0
    assert layer_balance_loss([a, b], k).item() == pytest.approx(E, rel=1e-3)


def test_config_overrides_and_validation():
    assert get_config("default", {"layers": "6", "draft_from_target": "false"}).layers == 6
    with pytest.raises(MoespacError, match="top_k"):
        get_config("default", {"top_k": "64"})
    with pytest.raises(MoespacError, match="unknown proxy config key"):
        get_config("default", {"depth": "3"})
    with pytest.raises(MoespacError, match="draft_from_target"):
        get_config("default", {"draft_hidden": "96"})
    shape = get_config("qwen3-30b-shape")
    assert (shape.layers, shape.experts, shape.top_k) == (48, 128, 8)


def test_popularity_and_locality_measures():
    from moespac.routing import locality, top_share

    E = 20
    assert top_share(np.ones((3, E))).tolist() == [2 / E] * 3
    skewed = np.zeros((2, E))
    skewed[0, :3] = [30, 10, 10]
    assert top_share(skewed)[0] == 0.8 and np.isnan(top_share(skewed)[1])
    same = np.zeros((4, 1, E), int)
    same[:, 0, :5] = 1  # the same 5 experts every step: full reuse, 5/20 active
    assert locality([same]) == (1.0, 0.25)
    alternating = np.zeros((4, 1, E), int)
    alternating[0::2, 0, :5] = 1
    alternating[1::2, 0, 5:10] = 1
    assert locality([alternating]) == (0.0, 0.25)


def test_proxy_stats_runs_on_the_pair(pair):
    from moespac.experiments.proxy_stats import render, run

    out, _ = pair
    rows = run(out, ["gsm8k", "mt-bench"], prompts=1, max_new_tokens=12, gamma=4)
    assert [r.benchmark for r in rows] == ["gsm8k", "mt-bench"]
    for r in rows:
        assert r.prompts == 1 and r.new_tokens == 12 and r.drafted % 4 == 0
        assert (r.accepted_share == r.accepted / r.drafted
                and r.tokens_per_step == (r.accepted + r.verify_steps) / r.verify_steps)
        assert r.accepted_share <= r.alpha <= 1  # per-token rate: drafts after a rejection are not judged
        assert 0 < r.top10_share <= 1 and r.smape is not None
    assert rows[0].paper_alpha == 0.83 and "not Qwen3-30B-A3B" in render(rows, out, 4, 1, 12)


def test_cli_rejects_bad_settings_before_writing(tmp_path, capsys):
    from moespac.cli import main

    assert main(["build-proxy", "--out", str(tmp_path / "p"), "--config", "tiny", "--set", "top_k=99"]) == 2
    assert main(["build-proxy", "--out", str(tmp_path / "p"), "--config", "tiny", "--set", "layers"]) == 2
    assert main(["proxy-stats", "--pair", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "build-proxy: error: proxy config top_k = 99 must be <= experts (8)" in err
    assert "build-proxy: error: --set 'layers': expected KEY=VALUE" in err
    assert "proxy-stats: error: --pair" in err and "expected" in err
    assert not (tmp_path / "p").exists()
