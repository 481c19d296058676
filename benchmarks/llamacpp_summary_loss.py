"""How often a successful llama.cpp speculative run loses the summary lines its figures come from, on a busy
machine, with the vendored source as shipped and with `flush_log_at_exit` (baselines/programs/llamacpp_build.py).

    python benchmarks/llamacpp_summary_loss.py                  # 30 runs each, two busy loops beside them
    python benchmarks/llamacpp_summary_loss.py --runs 10 --load 0 --work /tmp/lsl

Builds llama-speculative-simple twice from the pinned sdist's tree (as shipped, then with the flush; the second
build recompiles one file), converts a micro pair to GGUF, and runs the same 64-token request `--runs` times
with each binary while `--load` CPU-bound loops run. Prints the runs whose 'encoded'/'decoded' lines are
missing, per build. llama.cpp prints its log from a thread it does not join at exit (llama.cpp issue 22142).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def lost_summaries(bin_dir: Path, gguf: Path, prompt: Path, runs: int) -> int:
    from baselines.programs.llamacpp import RunConfig, command_line, parse_speculative_output
    from moespac.errors import MoespacError

    cmd = command_line(bin_dir, gguf / "target.gguf", prompt, RunConfig(n_predict=64), draft_gguf=gguf / "draft.gguf")
    lost = 0
    for _ in range(runs):
        res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            sys.exit(f"{cmd[0]} failed (exit {res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
        try:
            parse_speculative_output(res.stdout + "\n" + res.stderr)
        except MoespacError:
            lost += 1
    return lost


def main() -> None:
    from baselines.programs import llamacpp_build as lb
    from baselines.programs.llamacpp_convert import convert
    from moespac.models.micro import make_micro

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="requests per build (default: %(default)s)")
    ap.add_argument("--load", type=int, default=2, help="CPU-bound loops beside the runs (default: %(default)s)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="llamacpp-summary-"))
    tarball = lb.fetch_sdist()
    src = work / tarball.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    if not src.is_dir():  # our own copy: the cached sdist tree is built patched
        with tarfile.open(tarball) as tf:
            tf.extractall(work, filter="tar")
    shipped = {rel: (src / rel).read_text().replace(lb.FLUSH_LINE, "") for rel in lb.FLUSHED_TOOLS}
    pair = make_micro(work / "micro", "qwen3_moe", seed=0)
    prompt = work / "prompt.txt"
    prompt.write_text("hello world, this is a prompt " * 4)
    target = "llama-speculative-simple"
    b = lb.build(src_dir=src, out=work / "build", cuda="off", targets=(target,))  # a checkout: built unchanged
    gguf = work / "gguf"
    for m in ("target", "draft"):
        convert(pair / m, gguf / f"{m}.gguf", b.source_dir, "f32", source_id=b.source)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        for label in ("as shipped", "with flush_log_at_exit"):
            for rel, text in shipped.items():  # rewritten, so the tool is recompiled from this text
                (src / rel).write_text(text)
            if label != "as shipped":
                lb.flush_log_at_exit(src)
            subprocess.run(["cmake", "--build", str(work / "build" / "build"), "--target", target], check=True,
                           capture_output=True)
            t0 = time.perf_counter()
            lost = lost_summaries(Path(b.bin_dir), gguf, prompt, args.runs)
            print(f"{label}: {lost} of {args.runs} runs lost their summary lines "
                  f"({time.perf_counter() - t0:.0f} s, {args.load} busy loops)", flush=True)
    finally:
        for p in loops:
            p.kill()


if __name__ == "__main__":
    main()
