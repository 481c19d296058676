"""MoE-SpAc as released by its authors: the llama.cpp fork github.com/lshAlgorithm/MoE-SpAc, so our
reimplementation can be set against the authors' code on the same GPU.

Where CUDA, nvcc or github.com is missing, or the model's shape is not the one the release hard-codes
(Qwen3-30B-A3B), the run writes a record with `skipped: true` and the reason and exits 0.
UNTESTED: the clone/build/convert/run path has never executed.

Details: docs/baselines.md#moe-spac-release-wrapped.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

from baselines.programs._common import (RESOURCES, add_common_arguments, benchmark_prompts, check_common_arguments,
                                        cuda_missing_reason, filed_under, nvcc_missing_reason, run_logged,
                                        skipped_record, wrapped_record)
from moespac.errors import MoespacError

SYSTEM = "moe-spac-release"
REPO_URL = "https://github.com/lshAlgorithm/MoE-SpAc"
COMMIT = "77bb9cf1e3"
"""Release commit examined in spec/baselines.md (a prefix; resolved in the clone)."""
ROOT = RESOURCES / "moespac-release"
EXPERTS_ON_HOST = r"\.ffn_(up|down|gate)_exps=CPU"


def add_arguments(p) -> None:
    add_common_arguments(p)
    g = p.add_argument_group("MoE-SpAc release")
    g.add_argument("--commit", default=COMMIT, help="release commit to build (default: %(default)s)")
    g.add_argument("--draft-max", type=int, default=8, help="draft length (--draft; default %(default)s)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")


def network_missing_reason(host: str = "github.com", timeout: float = 5.0) -> str | None:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return None
    except OSError as e:
        return f"{host} is unreachable ({e.__class__.__name__}: {e}); the release is built from its public repository"


def model_shape(model_dir: Path) -> tuple[int, int]:
    """(MoE layers, routed experts per layer) from a model's config.json."""
    cfg = json.loads((model_dir / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    return int(cfg["num_hidden_layers"]), int(experts or 0)


def release_shape(clone: Path) -> tuple[int, int]:
    """(NLAYERS, NEXPERTS) as #defined in the release's ggml-backend.cpp."""
    text = (clone / "ggml" / "src" / "ggml-backend.cpp").read_text(errors="replace")
    found = {k: re.search(rf"#define\s+{k}\s+(\d+)", text) for k in ("NLAYERS", "NEXPERTS")}
    if not all(found.values()):
        raise MoespacError(f"{clone}: NLAYERS/NEXPERTS not found in ggml/src/ggml-backend.cpp")
    return int(found["NLAYERS"].group(1)), int(found["NEXPERTS"].group(1))


def skip_reason() -> str | None:
    """Why the release cannot run here (checked without touching the network first), or None."""
    reason = cuda_missing_reason() or nvcc_missing_reason()
    if reason:
        return f"the MoE-SpAc release is a CUDA build: {reason}"
    return network_missing_reason()


def config_of(args) -> dict:
    return dict(system=SYSTEM, model_pair=str(args.model_pair), benchmark=args.benchmark, limit=args.limit,
                seed=args.seed, max_new_tokens=args.max_new_tokens, max_context=args.max_context,
                temperature=args.temperature, ignore_eos=args.ignore_eos, commit=args.commit, draft_max=args.draft_max,
                speculative=True)


def clone(commit: str, dest: Path) -> Path:
    if not (dest / ".git").is_dir():
        run_logged(["git", "clone", REPO_URL, dest], ROOT / "logs" / "clone.log", what="git clone")
    run_logged(["git", "-C", dest, "checkout", "--force", commit], ROOT / "logs" / "clone.log", what="git checkout")
    return dest


def command_line(bin_dir: str, target_gguf, draft_gguf, prompt_path, args) -> list[str]:
    """The release README's llama-speculative invocation, with our prompt file, length, seed and sampling
    (its --temp; --ignore-eos biases end-of-generation tokens to -inf, as upstream llama.cpp does)."""
    cmd = [str(Path(bin_dir) / "llama-speculative"), "-m", str(target_gguf), "-md", str(draft_gguf),
           "-f", str(prompt_path), "--no-escape", "-ot", EXPERTS_ON_HOST, "-n", str(args.max_new_tokens),
           "-c", str(args.max_context), "-s", str(args.seed), "--draft", str(args.draft_max),
           "--temp", str(args.temperature), "-t", str(args.threads or os.cpu_count() or 1), "-ngl", "99", "-ngld", "99"]
    return cmd + (["--ignore-eos"] if args.ignore_eos else [])


def run_benchmark(args) -> dict:
    from baselines.programs.llamacpp import execute
    from baselines.programs.llamacpp_build import build, build_info
    from baselines.programs.llamacpp_convert import convert, prompt_file
    from moespac.models.loading import load_tokenizer

    check_common_arguments(args)
    pair = Path(args.model_pair)
    reason = skip_reason()
    if reason:
        return skipped_record(SYSTEM, config_of(args), method=filed_under(args, "moespac-release"), reason=reason)
    src = clone(args.commit, ROOT / "src")
    want, have = release_shape(src), model_shape(pair / "target")
    if want != have:
        return skipped_record(SYSTEM, config_of(args), method=filed_under(args, "moespac-release"), reason=(
            f"the release hard-codes {want[0]} layers x {want[1]} experts (Qwen3-30B-A3B); the target has "
            f"{have[0]} x {have[1]}; its README says to edit NLAYERS/NEXPERTS and rebuild for another model"))
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    b = build(src_dir=src, out=ROOT / f"build-{commit[:10]}", cuda="on", targets=("llama-speculative",))
    target_gguf, draft_gguf = (ROOT / "gguf" / f"{pair.resolve().name}-{commit[:10]}-{r}-f16.gguf"
                               for r in ("target", "draft"))
    conversion = {r: convert(pair / r, g, src, "f16", source_id=b.source)
                  for r, g in (("target", target_gguf), ("draft", draft_gguf))}
    tok = load_tokenizer(str(pair / "target"))
    prompts, skipped = benchmark_prompts(tok, args.benchmark, args.limit, args.seed, args.max_context,
                                         args.max_new_tokens)
    requests = []
    for p in prompts:
        path = prompt_file(p.text)
        try:
            requests.append(dict(id=p.id,
                                 **execute(command_line(b.bin_dir, target_gguf, draft_gguf, path, args), True)))
        finally:
            path.unlink(missing_ok=True)
    return wrapped_record(SYSTEM, dict(config_of(args), commit=commit), requests,
                          method=filed_under(args, "moespac-release"), build=build_info(b), conversion=conversion,
                          skipped_prompts=skipped, untested_code_path=True)


def main(args) -> int:
    from baselines.programs._common import write_and_report

    return write_and_report("moe-spac-release", run_benchmark(args), args.out)
