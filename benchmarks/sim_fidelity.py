"""Simulated versus measured: replay the engine's own trace on a calibrated profile and compare with the
engine's measured record of the same run. Goal: decode tokens/s within 25 %.

    moespac calibrate --out results/sim/here.yaml
    moespac generate --target T --draft D ... --trace run.npz --json run.json
    python benchmarks/sim_fidelity.py --trace run.npz --measured run.json --hardware results/sim/here.yaml

Policy, cache size and per-layer partition are read from the measured record's config (override with
flags); the target spec is the trace's, the draft the record's folder.
"""

from __future__ import annotations

import argparse
import json

from moespac.sim.simulate import SimConfig, simulate
from moespac.trace import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--measured", required=True, help="the engine's result record (JSON) of the traced run")
    ap.add_argument("--hardware", required=True, help="profile of the machine that ran it (moespac calibrate)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--cache-ratio", type=float, default=None)
    args = ap.parse_args()

    measured = json.loads(open(args.measured).read())
    cfg, m = measured.get("config", {}), measured["metrics"]
    if measured.get("timing") not in (None, "measured"):
        raise SystemExit(f"{args.measured}: timing {measured.get('timing')!r}, expected a measured record")
    trace = load_trace(args.trace)
    sim = simulate(SimConfig(
        trace=args.trace, policy=args.policy or cfg.get("policy", "lru"), hardware=args.hardware,
        draft_spec=cfg.get("draft"), cache_ratio=args.cache_ratio if args.cache_ratio is not None else cfg.get("cache_ratio"),
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
    print(f"{'':18s} {'measured':>12s} {'simulated':>12s} {'sim/meas':>9s}")
    for name, meas, simv in rows:
        ratio = f"{simv / meas:9.3f}" if meas else f"{'n/a':>9s}"
        print(f"{name:18s} {meas if meas is not None else float('nan'):12.4g} {simv:12.4g} {ratio}")
    err = s["tokens_per_s"] / rows[0][1] - 1 if rows[0][1] else float("nan")
    print(f"decode tokens/s: simulated {err:+.1%} against measured (goal within 25 %)")
    print("decode time, simulated: " + ", ".join(f"{k} {v:.4f}s" for k, v in d.items()))


if __name__ == "__main__":
    main()
