"""`moespac simulate`: replay a trace through a policy on a hardware profile (timing: simulated)."""

from __future__ import annotations

import argparse

from moespac.bench.records import write_result
from moespac.commands._common import add_profile_trace_arg, add_warmup_steps_arg, finite, warmup_steps_option
from moespac.configargs import add_field_args


def register(sub) -> None:
    from moespac.sim.simulate import SimConfig

    p = sub.add_parser("simulate", help="replay an activation trace through a policy on a hardware profile",
                       description=__doc__.splitlines()[0])
    # flags of SimConfig's fields: its docstrings are their help, its defaults theirs (moespac/configargs.py)
    add_field_args(p, SimConfig, "trace", "policy", "hardware", "model_spec", "draft_spec", "cache_ratio", "cache_gib",
                   trace=dict(metavar="TRACE"), cache_ratio=dict(type=finite), cache_gib=dict(type=finite))
    p.add_argument("--per-layer-cache", action="store_true", help="partition the slots evenly per layer")
    add_field_args(p, SimConfig, "expert_dtype", "allow_topology_mismatch", "warm_cache")
    p.add_argument("--no-bounds", action="store_true", help="skip the infinite-cache bound and the oracle")
    add_warmup_steps_arg(p)
    add_profile_trace_arg(p)
    p.add_argument("--json", default=None, metavar="OUT", help="write the result record here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moespac.commands._common import check_output_paths
    from moespac.sim.simulate import SimConfig, simulate

    check_output_paths(args, "json")

    cfg = SimConfig(trace=args.trace, policy=args.policy, hardware=args.hardware, model_spec=args.model_spec,
                    draft_spec=args.draft_spec, cache_ratio=args.cache_ratio, cache_gib=args.cache_gib,
                    per_layer=args.per_layer_cache, expert_dtype=args.expert_dtype,
                    allow_topology_mismatch=args.allow_topology_mismatch, warm_cache=args.warm_cache,
                    bounds=not args.no_bounds, profile_traces=tuple(args.profile_trace), **warmup_steps_option(args))
    record = simulate(cfg)
    if args.json:
        write_result(args.json, record)
    print(summary_text(record))
    return 0


def summary_text(record: dict) -> str:
    m, c = record["metrics"], record["cache"]
    lines = [
        f"simulated: {record['policy']['name']} on {record['profile']['name']} "
        f"(sha256 {record['profile']['sha256'][:12]}), model {record['model_spec']}, trace {record['trace']['id'] or '?'}",
        f"  cache {c['slots']} slots ({c['ratio']:.1%}){'' if c['fits_device_memory'] else ' - more than fits in device memory'}; "
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
