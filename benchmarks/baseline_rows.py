"""Does each Table 1 baseline behave as its own system on the workload the tables use?

Replays the default study's Table 1 traces (one per benchmark) and, with --paper-regime, the paper-regime
traces (moespac/sim/paper_routing.py) through the given policy specs, side by side in one run, and prints per
row: mean tokens/s, hit rate, GiB copied per token, host share and the policy's own statistics, then every
pair of rows whose 95 % intervals overlap on all benchmarks (rows that a table cannot tell apart).

    python benchmarks/baseline_rows.py --results results specexp specexp:buffers=false fate mixtral-offloading
    python benchmarks/baseline_rows.py --paper-regime specexp fate
    python benchmarks/baseline_rows.py --results old/results @specexp specexp   # the old run's cells beside a replay

A spec `@<method>` reads that Table 1 method's records of the `--results` run (what that run's code computed)
instead of replaying: before and after side by side.

Timing: simulated. `--results` is the folder of a finished default study (its traces under
traces/<pair>/<benchmark>/); the cells are replayed as `simulate_cell` replays them (rtx4090-pcie4,
qwen3-30b-a3b expert sizes, cache ratio 0.25, the other benchmarks' traces as the profiling run).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from moespac.analysis.intervals import mean_interval, separate
from moespac.catalogue import METHODS
from moespac.registry import make_policy
from moespac.sim.simulate import SimConfig, simulate

BENCHMARKS = ("mmlu-pro", "mt-bench", "gsm8k", "humaneval", "alpaca", "cnn-dm", "qa")
STATS = ("speculation_misses", "ran_as_predicted", "prefetch_accuracy")


def table1_cells(results: Path, pair: str, spec: str, draft: bool):
    """(benchmark, SimConfig kwargs) of each Table 1 cell, as the workflow's simulate_cell builds them."""
    name = "g8-b1-n512.npz" if draft else "g0-b1-n512.npz"
    traces = {b: results / "traces" / pair / b / name for b in BENCHMARKS}
    for b, path in traces.items():
        yield b, dict(trace=str(path), policy=spec, hardware="rtx4090-pcie4", model_spec="qwen3-30b-a3b",
                      draft_spec="qwen3-4b-fp8" if draft else None, cache_ratio=0.25, allow_topology_mismatch=True,
                      bounds=False, profile_traces=tuple(str(p) for o, p in traces.items() if o != b))


def paper_regime_cells(spec: str, draft: bool, requests: int, new_tokens: int):
    """(benchmark, SimConfig kwargs, trace) on the paper-regime traces the `paper_regime` rule replays."""
    from moespac.models.specs import get_spec
    from moespac.sim import paper_routing as pr

    model = get_spec("qwen3-30b-a3b")
    targets, smape = pr.paper_targets()
    fitted, _ = pr.fit_routing(model, targets, smape, gamma=8, seed=0)
    params, _ = pr.fill_missing(fitted, list(BENCHMARKS))
    shape = pr.Shape(requests=requests, new_tokens=new_tokens, gamma=8)
    for b in BENCHMARKS:
        seed = 1000 * list(pr.BENCHMARK_ORDER).index(b)
        trace = pr.paper_regime_trace(model, params[b], shape, seed=seed, benchmark=b, ar=not draft)
        yield b, dict(trace=trace.trace_id(), policy=spec, hardware="rtx4090-pcie4", model_spec="trace",
                      draft_spec="qwen3-4b-fp8", cache_ratio=0.25, bounds=False), trace


def recorded_cells(results: Path, pair: str, method: str):
    """(benchmark, record) of a finished run's Table 1 cells of `method` (a catalogue slug)."""
    import json

    from moespac.catalogue import get_method

    draft, gamma = ("qwen3-4b-fp8", 8) if get_method(method).draft else ("none", 0)
    cell = f"g{gamma}-b1-n512-c0.25.json"
    for b in BENCHMARKS:
        path = results / "simulated" / "rtx4090-pcie4" / "qwen3-30b-a3b" / draft / pair / b / method / cell
        yield b, json.loads(path.read_text())


def row(spec: str, cells) -> dict:
    tps, ci, hit, gib, host, stats = [], [], [], [], [], {}
    for bench, kwargs, *trace in cells:
        rec = kwargs if "metrics" in kwargs else simulate(SimConfig(**kwargs), trace=trace[0] if trace else None)
        m = rec["metrics"]
        per_request = [r["tokens_per_s"] for r in rec["requests"]]
        tps.append(float(np.mean(per_request)))
        ci.append(mean_interval(per_request))
        hit.append(m["hit_rate"] or 0.0)
        host.append(m["host_share"] or 0.0)
        tokens = sum(r.get("tokens", r.get("new_tokens", 0)) for r in rec["requests"])
        gib.append(m["counters"]["bytes_copied"] / 2 ** 30 / tokens)
        for k, v in (rec["policy"].get("stats") or {}).items():
            if k in STATS and isinstance(v, (int, float)):
                stats.setdefault(k, []).append(v)
    return dict(spec=spec, tps=tps, ci=ci, hit=hit, gib=gib, host=host, stats=stats)


def print_row(r: dict) -> None:
    extra = "  ".join(f"{k} {np.mean(v):.3f}" for k, v in r["stats"].items())
    print(f"{r['spec']:40s} tok/s {np.mean(r['tps']):7.2f}  hit {np.mean(r['hit']):.3f}  GiB/token "
          f"{np.mean(r['gib']):7.3f}  host {np.mean(r['host']):.3f}  {extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", help="policy specs, name[:key=value,...] (moespac policy list)")
    ap.add_argument("--results", type=Path, default=Path("results"), help="a finished default study's results/")
    ap.add_argument("--pair", default="proxy-shape", help="the pair whose traces Table 1 replays")
    ap.add_argument("--paper-regime", action="store_true", help="replay paper-regime traces instead")
    ap.add_argument("--requests", type=int, default=2, help="paper-regime requests per benchmark")
    ap.add_argument("--new-tokens", type=int, default=256, help="paper-regime tokens per request")
    args = ap.parse_args()
    rows = []
    for spec in args.specs:
        if spec.startswith("@"):
            rows.append(row(spec, recorded_cells(args.results, args.pair, spec[1:])))
            print_row(rows[-1])
            continue
        # a speculative row replays the draft trace: the policy says so, or the catalogue's row for this spec does
        draft = make_policy(spec).needs_draft or any(m.draft and m.policy == spec for m in METHODS.values())
        cells = (paper_regime_cells(spec, draft, args.requests, args.new_tokens) if args.paper_regime
                 else table1_cells(args.results, args.pair, spec, draft))
        rows.append(row(spec, cells))
        print_row(rows[-1])
    print("\nrows whose intervals overlap on every benchmark (a table cannot tell them apart):")
    clash = [(a["spec"], b["spec"]) for a, b in itertools.combinations(rows, 2)
             if not any(separate(x, y) for x, y in zip(a["ci"], b["ci"]))]
    print("\n".join(f"  {a}  ~  {b}" for a, b in clash) or "  none")


if __name__ == "__main__":
    main()
