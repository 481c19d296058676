"""Convert a Hugging Face model folder to GGUF with llama.cpp's bundled converter, and check its tokeniser.

A vocabulary trained here is unknown to the converter's pre-tokenizer table, so the type is stated
(_convert_gguf.py). Stating the wrong type would make llama.cpp split text differently from transformers,
so check_tokenization compares llama-tokenize's ids with the transformers ids on the benchmark prompts
and a few awkward strings; the comparison goes into the result record.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from baselines.programs._common import run_logged
from moespac.atomic import write_json
from moespac.errors import MoespacError

WRAPPER = Path(__file__).with_name("_convert_gguf.py")
OUTTYPES = ("f32", "f16", "bf16", "q8_0")

CHECK_STRINGS = (
    "Hello world! It's 2026, isn't it? They'll say we'd've known.",
    "  two leading spaces\n\n\tand a tab,   three spaces   ",
    "numbers 3 33 333 3333 33333 and 3.14159, 1e-5, $1,000.50",
    "unicode: café naïve Ünïcödé 日本語 🚀🦙",
    "code:\n    def f(x):\n        return x**2  # square\n",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
)
"""Strings whose splitting depends on the pre-tokenizer (spaces, digits, contractions, bytes, specials)."""


def detect_pre_tokenizer(model_dir: str | os.PathLike) -> str | None:
    """llama.cpp's pre-tokenizer type for a tokenizer.json, or None to let the converter detect it.

    A plain `ByteLevel` pre-tokenizer with its regex on is GPT-2's split: llama.cpp type 'gpt-2'. Anything
    else (e.g. a hub model's own Split regex) is left to the converter's hash table.
    """
    path = Path(model_dir) / "tokenizer.json"
    try:
        pre = json.loads(path.read_text()).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    return None


def _weights_fingerprint(model_dir: Path) -> list:
    """Cheap identity of a model folder: hashes of its small files, size and mtime of its weights."""
    out = []
    for f in sorted(model_dir.iterdir()):
        if not f.is_file():
            continue
        if f.suffix in (".json", ".jinja", ".txt", ".model"):
            out.append([f.name, hashlib.sha256(f.read_bytes()).hexdigest()[:16]])
        elif f.suffix in (".safetensors", ".bin"):
            st = f.stat()
            out.append([f.name, st.st_size, int(st.st_mtime)])
    return out


def convert(model_dir: str | os.PathLike, out_gguf: str | os.PathLike, source_dir: str | os.PathLike,
            outtype: str = "f32", pre_tokenizer: str | None = "auto", source_id: str = "") -> dict:
    """Write `out_gguf` from `model_dir` (skipped when its stamp says the same inputs made it); returns the stamp."""
    model_dir, out_gguf, source_dir = Path(model_dir), Path(out_gguf), Path(source_dir)
    if outtype not in OUTTYPES:
        raise MoespacError(f"GGUF outtype {outtype!r}: one of {', '.join(OUTTYPES)}")
    if pre_tokenizer == "auto":
        pre_tokenizer = detect_pre_tokenizer(model_dir)
    stamp = dict(model_dir=str(model_dir.resolve()), model=_weights_fingerprint(model_dir), outtype=outtype,
                 pre_tokenizer=pre_tokenizer, converter=source_id or str(source_dir))
    stamp_path = out_gguf.with_name(out_gguf.name + ".stamp.json")
    try:
        if out_gguf.is_file() and json.loads(stamp_path.read_text()) == stamp:
            return stamp
    except (OSError, ValueError):
        pass
    stamp_path.unlink(missing_ok=True)
    out_gguf.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_gguf.with_name(out_gguf.name + ".tmp")
    run_logged([sys.executable, WRAPPER, source_dir, pre_tokenizer or "", model_dir,
                "--outfile", tmp, "--outtype", outtype],
               out_gguf.with_name(out_gguf.name + ".log"), what=f"convert_hf_to_gguf {model_dir}")
    os.replace(tmp, out_gguf)
    write_json(stamp_path, stamp)
    return stamp


def prompt_file(text: str, directory: str | os.PathLike | None = None) -> Path:
    """A file holding `text` for llama.cpp's `-f`, which drops one trailing newline: so we add one."""
    fd, path = tempfile.mkstemp(prefix="prompt-", suffix=".txt", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text + "\n")
    return Path(path)


def parse_token_ids(stdout: str) -> list[int]:
    """The id list llama-tokenize prints with --ids, e.g. '[12, 7, 301]'."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("[")]
    if not lines:
        raise MoespacError(f"llama-tokenize printed no id list: {stdout[-300:]!r}")
    body = lines[-1].strip("[]").strip()
    return [int(x) for x in body.split(",")] if body else []


def llama_token_ids(tokenize_bin: str, gguf: str | os.PathLike, text: str) -> list[int]:
    """Ids llama.cpp gives `text`: special tokens parsed, BOS as the model says (like its runners).

    The text goes in on stdin, byte for byte (llama-tokenize keeps a file's trailing newline, unlike the
    runners' `-f`, so a file would need different handling here than in prompt_file).
    """
    res = subprocess.run([tokenize_bin, "-m", str(gguf), "--stdin", "--ids", "--no-escape", "--log-disable"],
                         input=text.encode("utf-8"), capture_output=True, timeout=300)
    if res.returncode != 0:
        raise MoespacError(f"llama-tokenize failed (exit {res.returncode}): "
                           f"{res.stderr.decode(errors='replace')[-500:]}")
    return parse_token_ids(res.stdout.decode("utf-8", errors="replace"))


def check_tokenization(tokenize_bin: str, gguf: str | os.PathLike, cases: list[tuple[str, str, list[int]]]) -> dict:
    """Compare llama.cpp's ids with transformers' for each (label, text, ids); summary plus the mismatches."""
    mismatches = []
    for label, text, expected in cases:
        got = llama_token_ids(tokenize_bin, gguf, text)
        if got != list(expected):
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            mismatches.append(dict(label=label, text=text[:200], first_difference=first,
                                   transformers=list(expected)[max(0, first - 3):first + 5],
                                   llamacpp=got[max(0, first - 3):first + 5],
                                   transformers_len=len(expected), llamacpp_len=len(got)))
    return dict(strings=len(cases), matched=len(cases) - len(mismatches), match=not mismatches,
                mismatches=mismatches)


def tokenization_cases(tokenizer, prompts) -> list[tuple[str, str, list[int]]]:
    """The benchmark prompts as run (text, our ids) plus CHECK_STRINGS by the transformers tokenizer."""
    cases = [(p.id, p.text, p.ids) for p in prompts]
    cases += [(f"check/{i}", s, tokenizer(s, add_special_tokens=False)["input_ids"])
              for i, s in enumerate(CHECK_STRINGS)]
    return cases
