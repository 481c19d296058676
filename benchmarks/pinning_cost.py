"""What pinning the CPU kernels to AVX2 costs (moespac/pinning.py): one command timed with the pin and without
(MOESPAC_NATIVE_KERNELS=1, the libraries choose by CPU), alternating, side by side in one run.

    python benchmarks/pinning_cost.py                        # the default study's longest jobs, shortened
    python benchmarks/pinning_cost.py --repeats 3 -- moespac build-proxy --config tiny --out /tmp/p --force

The default commands are the work the pin touches most in the default study: a shortened proxy training at
the routing-shape proxy's widths (12 x 128 experts; its builds are half the study's job-seconds) and a
trace recording on the micro pair. Prints each wall time and the ratio pinned / native (median of repeats).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULTS = [
    ["moespac", "build-proxy", "--config", "qwen3-30b-shape", "--set", "layers=12", "--set", "target_steps=60",
     "--set", "draft_steps=20", "--set", "onpolicy_prompts=8", "--set", "corpus_chars=1000000", "--force", "--out",
     "{tmp}/proxy"],
    ["moespac", "bench", "--model-pair", "{tmp}/micro", "--benchmark", "mt-bench", "--limit", "4", "--max-new-tokens",
     "128", "--gamma", "4", "--warmup", "0", "--no-progress", "--trace", "{tmp}/t.npz", "--out", "{tmp}/r.json"],
]


def timed(cmd: list[str], native: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MOESPAC_NATIVE_KERNELS"}
    if native:
        env["MOESPAC_NATIVE_KERNELS"] = "1"
    t0 = time.perf_counter()
    subprocess.run(cmd, env=dict(env, OMP_NUM_THREADS="1"), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("cmd", nargs="*", help="one command to time instead of the defaults (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["moespac", "make-micro", "--out", f"{tmp}/micro"], check=True, stdout=subprocess.DEVNULL)
        cmds = [args.cmd] if args.cmd else [[a.format(tmp=tmp) for a in c] for c in DEFAULTS]
        for cmd in cmds:
            pinned, native = [], []
            for _ in range(args.repeats):  # alternate, so a change in the machine's load falls on both
                pinned.append(timed(cmd, native=False))
                native.append(timed(cmd, native=True))
            p, n = statistics.median(pinned), statistics.median(native)
            print(f"{' '.join(cmd[:4])} ...: pinned {p:.1f} s, native {n:.1f} s, pinned / native {p / n:.3f} "
                  f"(median of {args.repeats}; each: pinned {[round(x, 1) for x in pinned]}, "
                  f"native {[round(x, 1) for x in native]})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
