"""llama.cpp as its users run it: plain decoding (llama-completion) and speculative decoding with a draft
model (llama-speculative-simple, the server's drafting loop, or the older llama-speculative), routed experts
kept on the host with `--cpu-moe` (the `-ot exps=CPU` override), greedy by default.

The prompt is templated here and handed to llama.cpp as raw text; tokens/s and acceptance come from llama.cpp's
own output (parse_speculative_output, parse_completion_output).

Details: docs/baselines.md#llamacpp-wrapped.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from baselines.programs import llamacpp_build
from baselines.programs._common import (add_common_arguments, benchmark_prompts, check_common_arguments, filed_under,
                                        wrapped_record)
# build() and convert() are this module's public entry points too (llamacpp.build, llamacpp.convert)
from baselines.programs.llamacpp_build import ROOT, Build, build, build_info
from baselines.programs.llamacpp_convert import OUTTYPES, check_tokenization, convert, prompt_file, tokenization_cases
from moespac.errors import MoespacError
from moespac.hashing import stable_hash

SYSTEM = "llama.cpp"
SPEC_TOOLS = ("llama-speculative-simple", "llama-speculative")
AR_TOOL = "llama-completion"


@dataclass(frozen=True)
class RunConfig:
    """How one llama.cpp request runs."""

    n_predict: int = 128
    """New tokens to generate (-n); generation also stops at an end-of-generation token unless ignore_eos."""
    draft_max: int = 8
    """Draft length γ (--spec-draft-n-max); with --spec-draft-p-min 0 (the default) every round drafts γ."""
    threads: int | None = None
    """CPU threads (-t); None = all cores."""
    cpu_moe: bool = True
    """Keep routed experts on the host (--cpu-moe, i.e. -ot exps=CPU)."""
    ctx_size: int = 2048
    """Context size (-c)."""
    seed: int = 0
    """Sampler seed (--seed)."""
    temperature: float = 0.0
    """Sampling temperature (--temp); 0 = greedy."""
    ignore_eos: bool = False
    """Do not stop at end-of-generation tokens (--ignore-eos); a speculative round may still overshoot n_predict."""
    spec_tool: str = "llama-speculative-simple"
    """Speculative decoder: llama-speculative-simple (server-style loop) or llama-speculative (tree drafts)."""

    def __post_init__(self):
        if self.n_predict < 1:
            raise MoespacError(f"n_predict {self.n_predict} must be >= 1")
        if self.draft_max < 1:
            raise MoespacError(f"draft_max {self.draft_max} must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise MoespacError(f"threads {self.threads} must be >= 1")
        if self.ctx_size <= self.n_predict:
            raise MoespacError(f"ctx_size {self.ctx_size} must exceed n_predict {self.n_predict}")
        if self.temperature < 0:
            raise MoespacError(f"temperature {self.temperature} must be >= 0")
        if self.spec_tool not in SPEC_TOOLS:
            raise MoespacError(f"spec_tool {self.spec_tool!r}: one of {', '.join(SPEC_TOOLS)}")


def command_line(bin_dir: str | os.PathLike, target_gguf, prompt_path, cfg: RunConfig, draft_gguf=None,
                 cuda: bool = False) -> list[str]:
    """The exact llama.cpp command for one request (speculative when `draft_gguf` is given)."""
    tool = cfg.spec_tool if draft_gguf else AR_TOOL
    cmd = [str(Path(bin_dir) / tool), "-m", str(target_gguf), "-f", str(prompt_path), "--no-escape",
           "-n", str(cfg.n_predict), "-c", str(cfg.ctx_size), "--temp", str(cfg.temperature),
           "--seed", str(cfg.seed), "-t", str(cfg.threads or os.cpu_count() or 1)]
    if draft_gguf:
        # a plain draft GGUF names no speculative type, and the default type is "none"
        cmd += ["-md", str(draft_gguf), "--spec-type", "draft-simple", "--spec-draft-n-max", str(cfg.draft_max),
                "--spec-draft-p-min", "0"]
    else:
        cmd += ["-no-cnv"]  # a raw completion: no conversation mode, no llama.cpp chat template
    if cfg.cpu_moe:
        cmd += ["--cpu-moe"]
    if cuda:
        cmd += ["-ngl", "all"] + (["-ngld", "all"] if draft_gguf else [])
    if cfg.ignore_eos:
        cmd += ["--ignore-eos"]
    return cmd


# ---- llama.cpp's own output

_NUM = r"([-+]?(?:\d+\.?\d*|nan|inf))"


def _find(pattern: str, text: str, what: str, cast=float):
    m = re.findall(pattern, text)
    if not m:
        raise MoespacError(f"llama.cpp output has no {what} line (pattern {pattern!r})")
    last = m[-1]
    return tuple(cast(x) for x in last) if isinstance(last, tuple) else cast(last)


def parse_speculative_output(text: str) -> dict:
    """Prefill/decode timing and drafts from llama-speculative(-simple)'s summary lines."""
    n_in, enc_s, _ = _find(rf"encoded\s+(\d+) tokens in\s+{_NUM} seconds, speed:\s+{_NUM} t/s", text, "'encoded'")
    n_out, dec_s, speed = _find(rf"decoded\s+(\d+) tokens in\s+{_NUM} seconds, speed:\s+{_NUM} t/s", text, "'decoded'")
    drafted = int(_find(r"n_drafted\s*=\s*(\d+)", text, "'n_drafted'"))
    accepted = int(_find(r"n_accept\s*=\s*(\d+)", text, "'n_accept'"))
    return dict(prompt_tokens=int(n_in), prefill_s=enc_s, new_tokens=int(n_out), decode_s=dec_s,
                decode_tokens_per_s=speed, latency_s=enc_s + dec_s, drafted=drafted, accepted=accepted,
                acceptance_rate=accepted / drafted if drafted else None,
                draft_max=int(_find(r"n_draft\s*=\s*(\d+)", text, "'n_draft'")))


def parse_completion_output(text: str) -> dict:
    """Prefill/decode timing from llama-completion's performance summary (its `eval` figures for decode).

    `eval time = T ms / N runs (..., X tokens per second)` counts the forward passes of generated tokens:
    the first new token comes from the prompt pass, so a request that generated N+1 tokens shows N runs.
    """
    p_ms, p_n = _find(rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens", text, "'prompt eval time'")
    e_ms, e_n, _, tps = _find(rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) runs\s*\(\s*{_NUM} ms per token,"
                              rf"\s*{_NUM} tokens per second\)", text, "'eval time ... runs'")
    sampling = re.findall(rf"sampling time =\s*{_NUM} ms", text)
    return dict(prompt_tokens=int(p_n), prefill_s=p_ms / 1e3, new_tokens=int(e_n) + 1, decode_runs=int(e_n),
                decode_s=e_ms / 1e3, decode_tokens_per_s=tps, latency_s=(p_ms + e_ms) / 1e3,
                sampling_s=float(sampling[-1]) / 1e3 if sampling else None)


def run(build_: Build, target_gguf, prompt_text: str, cfg: RunConfig, draft_gguf=None, workdir=None) -> dict:
    """One request: run llama.cpp on `prompt_text` and return its parsed timings plus the command line."""
    path = prompt_file(prompt_text, workdir)
    try:
        return execute(command_line(build_.bin_dir, target_gguf, path, cfg, draft_gguf, build_.cuda),
                       speculative=draft_gguf is not None)
    finally:
        path.unlink(missing_ok=True)


def execute(cmd: list[str], speculative: bool, attempts: int = 3) -> dict:
    """Run a llama.cpp command; its parsed summary, wall time, attempts and the command (MoespacError on failure).

    llama.cpp logs through a background thread that it does not flush at exit; our sdist build flushes it
    (llamacpp_build.flush_log_at_exit), but a user's checkout may still lose a successful run's summary lines
    now and then: such a run is repeated (up to `attempts` times in all).
    """
    for attempt in range(1, attempts + 1):
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        output = res.stdout + "\n" + res.stderr
        if res.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-12:])
            raise MoespacError(f"{Path(cmd[0]).name} failed (exit {res.returncode}):\n{tail}")
        try:
            parsed = parse_speculative_output(output) if speculative else parse_completion_output(output)
        except MoespacError:
            if attempt == attempts:
                raise
            continue
        return dict(parsed, wall_s=wall, attempts=attempt, command=cmd)


# ---- `moespac wrapped llamacpp`

def add_build_arguments(p) -> None:
    g = p.add_argument_group("llama.cpp build")
    g.add_argument("--llamacpp-src", default=None,
                   help=f"build this llama.cpp checkout instead of the PyPI sdist (also ${llamacpp_build.SRC_ENV})")
    g.add_argument("--build-dir", default=None, help="build folder (default: resources/llamacpp/<version>-<cpu|cuda>)")
    g.add_argument("--cuda", default="auto", choices=["auto", "on", "off"],
                   help="CUDA build: auto = when a GPU and nvcc are present (default: %(default)s)")
    g.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")


def add_arguments(p) -> None:
    add_common_arguments(p)
    add_build_arguments(p)
    g = p.add_argument_group("llama.cpp run")
    g.add_argument("--draft", action="store_true", help="speculative decoding with DIR/draft (-md)")
    g.add_argument("--draft-max", type=int, default=8, help="draft length γ (--spec-draft-n-max; default %(default)s)")
    g.add_argument("--spec-tool", default=RunConfig.spec_tool, choices=SPEC_TOOLS,
                   help="speculative decoder (default: %(default)s)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--no-cpu-moe", action="store_true", help="do not keep routed experts on the host")
    g.add_argument("--outtype", default="f32", choices=OUTTYPES,
                   help="GGUF weight type (default: %(default)s, like our fp32 engine on a CPU)")
    g.add_argument("--gguf-dir", default=None,
                   help="where converted models go (default: resources/llamacpp/gguf/<pair>)")
    g.add_argument("--allow-token-mismatch", action="store_true",
                   help="run even if llama.cpp tokenises the prompts differently from transformers (recorded)")


def gguf_paths(pair: Path, outtype: str, gguf_dir=None) -> tuple[Path, Path]:
    """(target, draft) GGUF paths for a model pair: one folder per pair location, one file per weight type."""
    folder = (Path(gguf_dir) if gguf_dir
              else ROOT / "gguf" / f"{pair.resolve().name}-{stable_hash(str(pair.resolve()), 8)}")
    return folder / f"target-{outtype}.gguf", folder / f"draft-{outtype}.gguf"


def run_benchmark(args) -> dict:
    """Build, convert, check tokenisation, run every prompt; returns the result record."""
    from moespac.models.loading import load_tokenizer

    check_common_arguments(args)
    cfg = RunConfig(n_predict=args.max_new_tokens, draft_max=args.draft_max, threads=args.threads,
                    cpu_moe=not args.no_cpu_moe, ctx_size=args.max_context, seed=args.seed,
                    temperature=args.temperature, ignore_eos=args.ignore_eos, spec_tool=args.spec_tool)
    pair = Path(args.model_pair)
    b = build(src_dir=args.llamacpp_src, out=args.build_dir, cuda=args.cuda, jobs=args.jobs)
    target_gguf, draft_gguf = gguf_paths(pair, args.outtype, args.gguf_dir)
    conversion = {"target": convert(pair / "target", target_gguf, b.source_dir, args.outtype, source_id=b.source)}
    if args.draft:
        conversion["draft"] = convert(pair / "draft", draft_gguf, b.source_dir, args.outtype, source_id=b.source)
    tokenizer = load_tokenizer(str(pair / "target"))
    prompts, skipped = benchmark_prompts(tokenizer, args.benchmark, args.limit, args.seed, args.max_context,
                                         args.max_new_tokens)
    if not prompts:
        raise MoespacError(f"no prompt of {args.benchmark!r} fits a context of {args.max_context} with "
                           f"{args.max_new_tokens} new tokens")
    check = check_tokenization(b.tool("llama-tokenize"), target_gguf, tokenization_cases(tokenizer, prompts))
    if not check["match"] and not args.allow_token_mismatch:
        m = check["mismatches"][0]
        raise MoespacError(f"llama.cpp tokenises {len(check['mismatches'])} of {check['strings']} strings differently "
                           f"from transformers (first: {m['label']} at token {m['first_difference']}: "
                           f"{m['llamacpp']} vs {m['transformers']}); pass --allow-token-mismatch to run anyway")
    requests = []
    for p in prompts:
        r = run(b, target_gguf, p.text, cfg, draft_gguf if args.draft else None)
        requests.append(dict(id=p.id, prompt_tokens_transformers=len(p.ids), **r))
        rate = f", acceptance {r['acceptance_rate']:.3f}" if r.get("acceptance_rate") is not None else ""
        print(f"{p.id}: {r['new_tokens']} tokens, decode {r['decode_tokens_per_s']:.2f} tok/s (wrapped){rate}")
    config = dict(system=SYSTEM, model_pair=str(pair), benchmark=args.benchmark, limit=args.limit, seed=args.seed,
                  max_new_tokens=args.max_new_tokens, max_context=args.max_context, speculative=bool(args.draft),
                  run=asdict(cfg), outtype=args.outtype, cuda=b.cuda, version=b.version)
    return wrapped_record(
        SYSTEM, config, requests, method=filed_under(args, "llamacpp"), build=build_info(b), conversion=conversion,
        tokenization_check=check, skipped_prompts=skipped,
        definitions=dict(
            decode_tokens_per_s=("speculative: llama.cpp's 'decoded N tokens in T seconds' (whole draft+verify loop, "
                                 "sampling included); plain: its 'eval time ... tokens per second' (forward passes of "
                                 "generated tokens; sampling_s reported apart)"),
            prefill_s="speculative: 'encoded' time (target and draft prompt passes); plain: 'prompt eval time'",
            cpu_moe=("routed experts on the host; on a CPU-only build every weight is on the host anyway" if not b.cuda
                     else "routed experts on the host, every other weight on the GPU (-ngl all)")))


def main(args) -> int:
    from moespac.bench.record_files import write_result

    record = run_benchmark(args)
    write_result(args.out, record)
    m = record["metrics"]
    rate = f"   acceptance {m['acceptance_rate']:.3f}" if m.get("acceptance_rate") is not None else ""
    print(f"llama.cpp {'speculative' if args.draft else 'plain'}: {m['decode_tokens_per_s']:.2f} tok/s decode "
          f"(wrapped, {m['requests']} prompts, {m['new_tokens']} tokens){rate}   tokenisation match: "
          f"{record['tokenization_check']['match']}")
    print(f"record: {args.out}")
    return 0


def main_build(args) -> int:
    """`moespac wrapped build-llamacpp`: the cacheable build step; prints (and optionally writes) the build."""
    from moespac.atomic import write_json

    b = build(src_dir=args.llamacpp_src, out=args.build_dir, cuda=args.cuda, jobs=args.jobs)
    info = build_info(b)
    if args.json:
        write_json(args.json, info)
    kind = "CUDA" if b.cuda else f"CPU ({b.cpu_only_reason})"
    print(f"llama.cpp {b.version} ({b.llama_commit}), {kind} build: {b.bin_dir}")
    return 0
