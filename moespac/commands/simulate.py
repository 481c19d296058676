"""`moespac simulate`: replay a trace through a policy on a hardware profile (timing: simulated).

A trace `moespac bench` recorded (or one imported for a benchmark) holds its requests' facts: its replay is a
table cell, written by the one path every simulated cell takes (`moespac bench --timing simulated --from-trace`,
its record and its printout). Any other trace (synthetic, or imported without a benchmark) names no benchmark:
its replay is the simulator's own record (kind 'simulate'), which tables do not read.
"""

from __future__ import annotations

import argparse
import dataclasses

from moespac.bench.record_files import write_result
from moespac.commands._common import add_cache_args
from moespac.configargs import add_field_args, config_from_args
from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    from moespac.sim.simulate import SimConfig

    p = sub.add_parser("simulate", help="replay an activation trace through a policy on a hardware profile",
                       description=__doc__.splitlines()[0])
    # flags of SimConfig's fields: its docstrings are their help, its defaults theirs (moespac/configargs.py)
    add_field_args(p, SimConfig, "trace", "policy", "hardware", "model_spec", "draft_spec", trace=dict(metavar="TRACE"))
    add_cache_args(p)
    add_field_args(p, SimConfig, "expert_dtype", "allow_topology_mismatch", "warm_cache", "bounds", "warmup_steps",
                   "profile_traces", warmup_steps=dict(metavar="N"),
                   profile_traces=dict(flag="--profile-trace", action="append", default=[], metavar="TRACE"))
    p.add_argument("--method", default=None, metavar="NAME",
                   help="a bench trace's replay: the table row it is a cell of (`moespac policy list`), as "
                        "`moespac bench --method`")
    p.add_argument("--json", default=None, metavar="OUT", help="write the result record here")
    p.set_defaults(func=run, io=IO(outputs=("json",), inputs=("trace",)))


def run(args: argparse.Namespace) -> int:
    from moespac.sim.simulate import SimConfig, simulate
    from moespac.trace import load_trace

    cfg = config_from_args(SimConfig, args, profile_traces=tuple(args.profile_traces))
    trace = load_trace(cfg.trace)
    if isinstance(trace.meta.get("bench"), dict):
        return _bench_cell(args, cfg, trace)
    if args.method:
        raise MoespacError(f"--method {args.method}: trace {cfg.trace} names no benchmark (it was not recorded by "
                           "`moespac bench` nor imported for one), so its replay is no table cell")
    record = simulate(cfg, trace)
    if args.json:
        write_result(args.json, record)
    print(summary_text(record))
    return 0


def _bench_cell(args, cfg, trace) -> int:
    """The replay of a bench trace: the cell `moespac bench --timing simulated --from-trace` writes."""
    from moespac.bench.harness import BenchConfig, run_bench, run_to_file
    from moespac.commands.bench import summary_text as cell_text

    # a cell is the paper's protocol: cold requests, the spec's dtype
    if cfg.expert_dtype is not None or cfg.warm_cache:
        raise MoespacError(f"trace {cfg.trace} is a benchmark's: its replay is a table cell, which has no "
                           "--expert-dtype or --warm-cache (drop them, or replay a trace that names no benchmark)")
    shared = {f.name for f in dataclasses.fields(BenchConfig)} & {f.name for f in dataclasses.fields(cfg)}
    bench = BenchConfig(benchmark=trace.meta["bench"]["config"]["benchmark"], timing="simulated", from_trace=cfg.trace,
                        method=args.method, **{name: getattr(cfg, name) for name in shared})
    record = run_to_file(bench, args.json) if args.json else run_bench(bench)
    print(cell_text(record))
    return 0


def summary_text(record: dict) -> str:
    m, c = record["metrics"], record["cache"]
    lines = [
        f"simulated: {record['policy']['name']} on {record['profile']['name']} "
        f"(sha256 {record['profile']['sha256'][:12]}), model {record['model_spec']}, "
        f"trace {record['trace']['id'] or '?'}",
        f"  cache {c['slots']} slots ({c['ratio']:.1%})"
        f"{'' if c['fits_device_memory'] else ' - more than fits in device memory'}; "
        f"draft {record['draft']['spec']} ({record['draft']['source']})",
        f"  {m['tokens_per_s']:.2f} tokens/s decode, latency {m['latency_s']:.3f} s "
        f"(prefill {m['prefill_latency_s']:.3f} s), hit rate {m['hit_rate']:.3f}, host share {m['host_share']:.3f}",
        f"  link {m['link_bytes'] / 2**30:.2f} GiB, busy {m['link_utilisation']:.1%}",
        "  decode time: " + ", ".join(f"{k} {v:.3f}s" for k, v in m["breakdown_decode_s"].items()),
    ]
    if record.get("topology_mapping"):
        lines.append(f"  topology mapped: {record['topology_mapping']}")
    if "bounds" in record:
        b, d = record["bounds"], record["distance"]
        oracle = f"{b['oracle']['tokens_per_s']:.2f} tokens/s" if b["oracle"] else "n/a (warm cache)"
        lines.append(f"  bounds: infinite cache {b['infinite_cache']['tokens_per_s']:.2f} tokens/s (a true bound), "
                     f"oracle {oracle} (a reference); this policy reaches "
                     f"{_pct(d['of_infinite_cache'])} and {_pct(d['of_oracle'])} of them")
    return "\n".join(lines)


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"
