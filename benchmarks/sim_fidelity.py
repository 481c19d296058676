"""Simulated versus measured: replay the engine's own trace on a calibrated profile and compare with the
engine's measured records of the same run. Goal: decode tokens/s within 10 %.

    moespac calibrate --threads 1 --out here.yaml
    moespac generate --target T --draft D ... --seed 0 --trace run.npz --json run1.json   # then run2, run3 (same seed)
    python benchmarks/sim_fidelity.py --trace run.npz --measured run1.json run2.json run3.json --hardware here.yaml

Runs of one seed route the same tokens, so one trace serves them all; the measured figures are the median
over the runs (a small VM's timings vary by 5-15 % from run to run). Policy, cache size and per-layer
partition are read from the first record's config (override with flags); the target spec is the trace's,
the draft the record's folder.
"""

from __future__ import annotations

import argparse
import json
import statistics

from moespac.sim.simulate import SimConfig, simulate
from moespac.trace import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--measured", required=True, nargs="+", help="the engine's result records (JSON) of runs of the "
                    "traced configuration and seed")
    ap.add_argument("--hardware", required=True, help="profile of the machine that ran it (moespac calibrate)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--cache-ratio", type=float, default=None)
    args = ap.parse_args()

    records = [json.loads(open(path).read()) for path in args.measured]
    for path, rec in zip(args.measured, records):
        if rec.get("timing") not in (None, "measured"):
            raise SystemExit(f"{path}: timing {rec.get('timing')!r}, expected a measured record")
        if rec.get("config") != records[0].get("config"):
            raise SystemExit(f"{path}: another configuration than {args.measured[0]}")
    cfg = records[0].get("config", {})
    m = {k: statistics.median(r["metrics"][k] for r in records) for k, v in records[0]["metrics"].items()
         if isinstance(v, (int, float)) and all(isinstance(r["metrics"].get(k), (int, float)) for r in records)}
    trace = load_trace(args.trace)
    sim = simulate(SimConfig(
        trace=args.trace, policy=args.policy or cfg.get("policy", "lru"), hardware=args.hardware,
        draft_spec=cfg.get("draft"),
        cache_ratio=args.cache_ratio if args.cache_ratio is not None else cfg.get("cache_ratio"),
        cache_gib=None if args.cache_ratio is not None else cfg.get("cache_gib"), per_layer=bool(cfg.get("per_layer")),
        bounds=False), trace=trace)
    s = sim["metrics"]
    d = s["breakdown_decode_s"]
    sim_draft = d["draft"]
    rows = [
        ("decode tokens/s", m.get("tokens_per_second", m.get("tokens_per_s")), s["tokens_per_s"]),
        ("prefill s", m.get("prefill_s"), s["prefill_s"]),
        ("decode s", m.get("decode_s"), s["decode_s"]),
        ("  draft s", m.get("draft_s"), sim_draft),
        ("  target s", m.get("target_s"), s["decode_s"] - sim_draft),
        ("hit rate", m.get("hit_rate"), s["hit_rate"]),
        ("host share", m.get("host_share"), s["host_share"]),
        ("bytes copied", m.get("bytes_copied"), s["link_bytes"]),
    ]
    print(f"trace {trace.trace_id()} ({trace.num_steps} steps), policy {sim['policy']['name']}, "
          f"profile {sim['profile']['name']} ({sim['profile']['sha256'][:12]}), cache {sim['cache']['slots']} slots")
    spread = [r["metrics"].get("tokens_per_second") for r in records]
    print(f"measured runs: {len(records)}, decode tokens/s " + ", ".join(f"{v:.1f}" for v in spread))
    print(f"{'':18s} {'measured':>12s} {'simulated':>12s} {'sim/meas':>9s}")
    for name, meas, simv in rows:
        ratio = f"{simv / meas:9.3f}" if meas else f"{'n/a':>9s}"
        print(f"{name:18s} {meas if meas is not None else float('nan'):12.4g} {simv:12.4g} {ratio}")
    err = s["tokens_per_s"] / rows[0][1] - 1 if rows[0][1] else float("nan")
    print(f"decode tokens/s: simulated {err:+.1%} against the measured median (goal within 10 %: "
          f"{'met' if abs(err) <= 0.10 else 'missed'})")
    print("decode time, simulated: " + ", ".join(f"{k} {v:.4f}s" for k, v in d.items()))


if __name__ == "__main__":
    main()
