"""What every wrapped system shares: the benchmark prompts as text and ids, CUDA checks, and the record."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from moespac.errors import MoespacError

REPO = Path(__file__).resolve().parents[2]
RESOURCES = REPO / "resources"


def add_common_arguments(p) -> None:
    """Arguments of every `moespac wrapped SYSTEM` run."""
    p.add_argument("--model-pair", required=True, help="folder with target/ and draft/ (make-micro, build-proxy)")
    p.add_argument("--benchmark", default="gsm8k", help="benchmark prompt set (default: %(default)s)")
    p.add_argument("--limit", type=int, default=3,
                   help="number of prompts, a seeded sample; more than the set has = all (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="prompt sample and sampler seed (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--max-context", type=int, default=2048,
                   help="context size; prompts that do not fit with --max-new-tokens are skipped "
                        "(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature, seeded by --seed; 0 = greedy")
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at end-of-sequence: always generate --max-new-tokens tokens")
    p.add_argument("--method", default=None, metavar="NAME",
                   help="the table row this run is (default: the system's name, '-sd' when it drafts); recorded")
    p.add_argument("--out", required=True, help="result record (JSON)")


def check_common_arguments(args) -> None:
    if args.temperature < 0:
        raise MoespacError(f"--temperature {args.temperature} must be >= 0")
    if args.limit < 1:
        raise MoespacError(f"--limit {args.limit} must be >= 1")
    if args.max_new_tokens < 1:
        raise MoespacError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    pair = Path(args.model_pair)
    for sub in ("target", "draft"):
        if not (pair / sub / "config.json").is_file():
            raise MoespacError(f"--model-pair {pair}: no {sub}/config.json (expected DIR/target and DIR/draft)")


# ---- prompts

@dataclass(frozen=True)
class PromptText:
    """One benchmark prompt as the exact text handed to an external system and the ids our engine uses."""

    id: str
    text: str
    """First user turn after the chat template (with the generation prompt), or the plain turn without one."""
    ids: list[int]
    """Token ids of `text` by the transformers tokenizer (moespac.datasets.format_prompt)."""
    templated: bool
    """True when `text` already holds the chat template's special tokens (no BOS/template to add)."""


def benchmark_prompts(tokenizer, benchmark: str, limit: int, seed: int, max_context: int, max_new_tokens: int):
    """(prompts that fit as PromptText, [(id, reason) skipped]) for the first turn of each sampled prompt.

    `limit` prompts are drawn as load_benchmark draws them; a limit above the set's size takes them all.
    """
    from moespac.datasets import chat_text, encode_prompts, load_benchmark, seeded_sample

    prompts = seeded_sample(load_benchmark(benchmark), limit, seed)
    encoded = encode_prompts(prompts, tokenizer, max_context=max_context, max_new_tokens=max_new_tokens)
    out = []
    for prompt, ids in encoded.items:
        text = chat_text(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        out.append(PromptText(prompt.id, prompt.turns[0] if text is None else text, ids, text is not None))
    return out, encoded.skipped


# ---- machine checks

def cuda_missing_reason() -> str | None:
    """None when a CUDA GPU is visible to torch, else why not (a skip reason for CUDA-only systems)."""
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA GPU visible to torch (torch {torch.__version__}, "
                f"{'built with CUDA ' + built if built else 'a CPU-only build'})")
    return None


def nvcc_missing_reason() -> str | None:
    """None when the CUDA compiler is on PATH (needed to build a CUDA system from source), else why not."""
    if shutil.which("nvcc") is None:
        return "the CUDA compiler nvcc is not on PATH (install the CUDA toolkit to build with -DGGML_CUDA=ON)"
    return None


def run_logged(cmd: list[str], log: Path, cwd: Path | None = None, env: dict | None = None, what: str = "") -> None:
    """Run `cmd` with its output appended to `log`; on failure raise MoespacError quoting the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        rc = subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise MoespacError(f"{what or cmd[0]} failed (exit {rc}); log {log}, last lines:\n{tail}")


# ---- records

def summarize(requests: list[dict]) -> dict:
    """Totals and rates over per-request results (decode tokens/s as total tokens over total decode time)."""
    n_tok = sum(r["new_tokens"] for r in requests)
    decode_s = sum(r["decode_s"] for r in requests)
    out = dict(
        requests=len(requests), new_tokens=n_tok, decode_s=decode_s,
        prefill_s=sum(r["prefill_s"] for r in requests),
        decode_tokens_per_s=n_tok / decode_s if decode_s > 0 else None,
        decode_tokens_per_s_mean=((sum(r["decode_tokens_per_s"] for r in requests) / len(requests))
                                  if requests else None),
        latency_s_mean=(sum(r["latency_s"] for r in requests) / len(requests)) if requests else None,
    )
    drafted = sum(r.get("drafted") or 0 for r in requests)
    if any("drafted" in r for r in requests):
        accepted = sum(r.get("accepted") or 0 for r in requests)
        out.update(drafted=drafted, accepted=accepted, acceptance_rate=accepted / drafted if drafted else None)
    return out


def pair_models(model_pair: str) -> dict:
    """The pair's models by the ids the engine's records use (`parent/folder@hash`), so a wrapped row and a
    measured row of one model name it the same way."""
    from moespac.hashing import model_id

    pair = Path(model_pair)
    return dict(target_id=model_id(str(pair / "target")), draft_id=model_id(str(pair / "draft")))


def filed_under(args, name: str) -> str:
    """The table row a run is filed under: --method, else the system's CLI name ('-sd' when it drafts)."""
    return getattr(args, "method", None) or (f"{name}-sd" if getattr(args, "draft", False) else name)


def wrapped_record(system: str, config: dict, requests: list[dict], method: str, **extra) -> dict:
    """A result record of a completed wrapped run: per-request results and their summary as metrics; `method` is
    the table row it is filed under (beside the config, not in its hash)."""
    from moespac.record import make_record

    return make_record("wrapped", "wrapped", config, summarize(requests), method=method, system=system, skipped=False,
                       requests=requests, models=pair_models(config["model_pair"]), **extra)


def skipped_record(system: str, config: dict, reason: str, method: str, **extra) -> dict:
    """A record saying the system could not run here and why; the pipeline goes on (exit 0)."""
    from moespac.record import make_record

    return make_record("wrapped", "wrapped", config, {}, method=method, system=system, skipped=True, skip_reason=reason,
                       models=pair_models(config["model_pair"]), **extra)


def write_and_report(label: str, record: dict, out) -> int:
    """Write a wrapped record atomically and print its one-line summary (or its skip reason)."""
    from moespac.bench.record_files import write_result

    write_result(out, record)
    if record["skipped"]:
        print(f"{label}: skipped: {record['skip_reason']}")
    else:
        print(f"{label}: {record['metrics']['decode_tokens_per_s']:.2f} tok/s decode (wrapped)")
    print(f"record: {out}")
    return 0
