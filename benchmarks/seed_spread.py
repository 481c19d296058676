"""How far a headline cell moves with another training seed of the proxy, beside how far it moves between
requests (the tables' interval): a proxy pair trained at several seeds, one SD trace each, replayed at
Qwen3-30B-A3B's expert sizes as Table 1 replays its traces.

    python benchmarks/seed_spread.py              # 3 seeds of a shortened routing-shape pair (12 x 128, top-8)
    python benchmarks/seed_spread.py --seeds 0 1 2 3 --no-shorten --benchmark gsm8k   # the study's own build

The tables' intervals cover requests of one trained proxy (docs/reproducibility.md). A difference between two
methods is only worth calling where it exceeds both: this prints, per method, the mean over seeds, the range
between seeds and the mean half-width of the per-seed request intervals, and the same for MoE-SpAc's gain over
each baseline (timing: simulated).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

METHODS = {"moespac": "sd", "llamacpp-sd": "sd", "hybrimoe": "ar", "llamacpp": "ar"}
"""Each method and the trace it replays: with the draft (sd) or its autoregressive view (ar)."""
SHORTEN = ["layers=12", "target_steps=200", "draft_steps=60", "onpolicy_prompts=8", "corpus_chars=1000000"]
"""The study's routing-shape pair (12 of its layers) trained for fewer steps, so that several seeds fit in minutes."""


def run(*args: str) -> None:
    subprocess.run(["moespac", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cells(tmp: Path, seed: int, args) -> dict[str, dict]:
    """One seed: train the pair, record one SD trace, derive its AR view, replay every method."""
    pair, sd, ar = tmp / f"pair{seed}", tmp / f"sd{seed}.npz", tmp / f"ar{seed}.npz"
    sets = [a for kv in (SHORTEN if args.shorten else []) + args.set for a in ("--set", kv)]
    run("build-proxy", "--config", args.config, "--seed", str(seed), "--out", str(pair), "--force", *sets)
    run("bench", "--model-pair", str(pair), "--benchmark", args.benchmark, "--limit", str(args.requests),
        "--max-new-tokens", str(args.new_tokens), "--gamma", str(args.gamma), "--warmup", "0", "--no-progress",
        "--trace", str(sd), "--out", str(tmp / f"bench{seed}.json"))
    run("derive-ar-trace", str(sd), "--out", str(ar))
    out = {}
    for method, view in METHODS.items():
        rec = tmp / f"{method}{seed}.json"
        run("simulate", "--trace", str(sd if view == "sd" else ar), "--policy", method, "--hardware", args.hardware,
            "--cache-ratio", str(args.cache_ratio), "--model-spec", args.model_spec, "--allow-topology-mismatch",
            "--json", str(rec))
        per = json.loads(rec.read_text())["requests"]
        out[method] = [r["tokens_per_s"] for r in per]
    return out


def t_halfwidth(xs: list[float]) -> float | None:
    from scipy import stats

    if len(xs) < 2:
        return None
    return float(stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", default="qwen3-30b-shape", help="proxy config (build-proxy --config)")
    ap.add_argument("--no-shorten", dest="shorten", action="store_false", help="train as the study does")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more build-proxy --set")
    ap.add_argument("--model-spec", default="qwen3-30b-a3b", help="expert sizes the replay charges")
    ap.add_argument("--benchmark", default="mt-bench")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--hardware", default="rtx4090-pcie4")
    ap.add_argument("--cache-ratio", type=float, default=0.25)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {seed: cells(Path(tmp), seed, args) for seed in args.seeds}
    shortened = f" (shortened: {', '.join(SHORTEN)})" if args.shorten else ""
    print(f"{args.config} pair{shortened}, seeds {args.seeds}, {args.benchmark}, {args.requests} requests x "
          f"{args.new_tokens} tokens, gamma {args.gamma}, {args.model_spec} experts on {args.hardware}, "
          f"cache ratio {args.cache_ratio} (timing: simulated)")
    print(f"{'':24} {'mean over seeds':>16} {'range of seeds':>16} {'request CI half-width':>22}")
    series = {m: [statistics.mean(runs[s][m]) for s in args.seeds] for m in METHODS}
    for m, means in series.items():
        half = [h for s in args.seeds if (h := t_halfwidth(runs[s][m])) is not None]
        print(f"{m + ' TPS':24} {statistics.mean(means):16.2f} {max(means) - min(means):16.2f} "
              f"{statistics.mean(half) if half else float('nan'):22.2f}")
    for base in [m for m in METHODS if m != "moespac"]:
        gains = [100 * (a / b - 1) for a, b in zip(series["moespac"], series[base])]
        print(f"{'MoE-SpAc vs ' + base:24} {statistics.mean(gains):+15.1f}% {max(gains) - min(gains):15.1f}pp "
              f"{'per seed: ' + ', '.join(f'{g:+.1f}%' for g in gains):>22}")


if __name__ == "__main__":
    main()
