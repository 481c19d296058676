"""`moespac bench`: a benchmark's prompts through the engine (or its trace through the simulator) -> one record."""

from __future__ import annotations

from pathlib import Path

from moespac.commands._common import add_engine_args, add_model_args, finite
from moespac.configargs import add_field_args, config_from_args
from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    from moespac.bench.harness import TIMINGS, TURNS, BenchConfig
    from moespac.datasets import BENCHMARKS, SOURCES

    p = sub.add_parser("bench", help="run a benchmark with the paper's protocol and write a result record",
                       description=__doc__.splitlines()[0])
    add_model_args(p, target_required=False)  # --model-pair may name it instead
    p.add_argument("--model-pair", default=None, metavar="DIR",
                   help="folder holding target/ and draft/ (a proxy or micro pair), instead of --target/--draft")
    p.add_argument("--no-draft", action="store_true", help="autoregressive decoding (same as --gamma 0)")
    add_engine_args(p)
    p.set_defaults(policy=None)
    p.add_argument("--method", default=None, metavar="NAME",
                   help="the table row this run is (`moespac policy list`, e.g. hybrimoe, moespac-no-sd): sets "
                        "--policy and, for a method without a draft, --no-draft; recorded, so tables read it")
    # flags of BenchConfig's fields: its docstrings are their help, its defaults theirs (moespac/configargs.py)
    g = p.add_argument_group("protocol")
    add_field_args(g, BenchConfig, "benchmark", "source", "limit", "turns", "batch_size", "max_new_tokens",
                   "ignore_eos", "temperature", "warmup", "seed", "self_draft_lookahead",
                   source=dict(choices=SOURCES), turns=dict(choices=TURNS), limit=dict(metavar="N"),
                   temperature=dict(type=finite),
                   benchmark=dict(type=benchmark_name, metavar="NAME",
                                  help=f"one of {', '.join(BENCHMARKS)} (the paper's names and aliases accepted)"))
    t = p.add_argument_group("timing")
    add_field_args(t, BenchConfig, "timing", "hardware", "model_spec", "draft_spec", "allow_topology_mismatch",
                   "from_trace", "warmup_steps", "profile_traces", "bounds", timing=dict(choices=TIMINGS),
                   from_trace=dict(metavar="TRACE"), warmup_steps=dict(metavar="N"),
                   profile_traces=dict(flag="--profile-trace", action="append", default=[], metavar="TRACE"))
    p.add_argument("--trace", default=None, metavar="OUT", help="keep the activation trace (.npz) here")
    p.add_argument("--out", required=True, metavar="RESULT.json", help="result record (on error: RESULT.failure.json)")
    p.add_argument("--skip-valid", action="store_true",
                   help="do nothing when --out already holds a valid record of this config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, io=IO(outputs=("out", "trace"), inputs=("from_trace", "target", "draft", "model_pair")))


def benchmark_name(value: str) -> str:
    """argparse type: a known benchmark, refused while the command line is parsed (before any other error)."""
    import argparse

    from moespac.datasets import get_benchmark

    try:
        get_benchmark(value)
    except MoespacError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def model_refs(args) -> tuple[str | None, str | None]:
    """(target, draft) from --model-pair DIR or --target/--draft."""
    if args.model_pair:
        if args.target or args.draft:
            raise MoespacError("--model-pair names both models; drop --target/--draft")
        pair = Path(args.model_pair)
        if not (pair / "target").is_dir():
            raise MoespacError(f"--model-pair {pair}: no target/ folder inside (build one with `moespac make-micro "
                               f"--out {pair}` or `moespac build-proxy --out {pair}`)")
        draft = pair / "draft"
        return str(pair / "target"), str(draft) if draft.is_dir() else None
    if not args.target and not args.from_trace:
        raise MoespacError("give --model-pair DIR or --target (and --draft), or --from-trace with --timing simulated")
    return args.target, args.draft


def run(args) -> int:
    from moespac.bench.harness import BenchConfig, run_to_file

    target, draft = model_refs(args)
    policy, no_draft = args.policy, args.no_draft
    if args.method is not None:
        from moespac.catalogue import get_method

        method = get_method(args.method)
        policy = method.policy if policy is None else policy  # a different --policy is refused by the harness
        no_draft = no_draft or (not method.draft and args.timing == "measured")
    cfg = config_from_args(BenchConfig, args, target=target, draft=None if no_draft else draft,
                           policy=policy or BenchConfig.policy, gamma=0 if no_draft else args.gamma,
                           profile_traces=tuple(args.profile_traces))
    record = run_to_file(cfg, args.out, trace_out=args.trace, progress=not args.no_progress, skip_valid=args.skip_valid)
    print(summary_text(record))
    print(f"record: {args.out}")
    return 0


def summary_text(record: dict) -> str:
    m, c, b = record["metrics"], record["counts"], record["benchmark"]
    fmt = lambda x, spec=".3f": "n/a" if x is None else format(x, spec)  # noqa: E731
    lines = [
        f"{record['timing']}: {record['policy']['spec']} on {b['label']} ({b['source']}), "
        f"{c['requests']} requests of {c['prompts']} prompts, {c['skipped']} skipped, {c['warmup']} warm-up",
        f"  tokens/s {fmt(m['tokens_per_s']['mean'], '.2f')} (decode, mean per request), "
        f"{fmt(m['throughput_tokens_per_s'], '.2f')} overall; latency {fmt(m['latency_s']['mean'])} s "
        f"(prefill {fmt(m['prefill_s']['mean'])} s), {fmt(m['tokens_per_request']['mean'], '.1f')} tokens per request",
        f"  alpha {fmt(m.get('alpha'))} (accepted/drafted {fmt(m['acceptance_rate'])}), omega {fmt(m['omega'], '.2f')} "
        f"(Eq. 1 from alpha: {fmt(m['omega_from_alpha'], '.2f')}); hit rate {fmt(m['hit_rate'])}, host share "
        f"{fmt(m['host_share'])}, link {m['link_bytes'] / 2**20:.1f} MiB",
        f"  hot/cold accuracy {fmt(m['hot_cold_accuracy'])}, sMAPE {fmt(m['smape'])}, expert cost ratio a/b "
        f"{fmt((m['expert_cost_ratio'] or {}).get('a_over_b'))}",
        f"  trace {record['trace']['id']} from {record['trace']['model']}",
    ]
    if record["profile"]:
        lines.append(f"  profile {record['profile']['name']} (sha256 {record['profile']['sha256'][:12]}), "
                     f"model spec {record['simulation']['model_spec']}, draft charged "
                     f"{record['simulation']['draft']['spec']} ({record['simulation']['draft']['source']})")
    return "\n".join(lines)
