"""`moespac fit-routing`: paper-regime routing at a model's own depth, fitted per benchmark to the routing
statistics the paper reports (alpha and a/b of App. A.1, sMAPE of App. B.1), never to a throughput; writes the
parameters with the residual of every statistic, and optionally the traces."""

from __future__ import annotations

from moespac.commands._common import ints
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("fit-routing", help="fit paper-regime routing to the paper's A.1 / B.1 statistics; write traces",
                       description=__doc__.splitlines()[0])
    p.add_argument("--model-spec", default="qwen3-30b-a3b", help="the model whose topology the traces take")
    p.add_argument("--benchmarks", default="all", help="'all' or comma-separated benchmark names")
    p.add_argument("--gamma", type=int, default=8, help="draft length of the speculative traces (a/b is fitted at it)")
    p.add_argument("--requests", type=int, default=4, help="requests per trace")
    p.add_argument("--new-tokens", type=int, default=256, help="new tokens per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=ints, default=None, metavar="N,N,...",
                   help="also measure the statistics over these trace seeds (the spread a rerun elsewhere could see)")
    p.add_argument("--json", required=True, help="write the fit here")
    p.add_argument("--traces", default=None, metavar="DIR",
                   help="write BENCHMARK-gGAMMA.npz (speculative) and BENCHMARK-ar.npz (the same kept tokens, AR)")
    p.set_defaults(func=run, io=IO(outputs=("json",)))


def run(args) -> int:
    import dataclasses
    from pathlib import Path

    from moespac.atomic import write_json
    from moespac.datasets import BENCHMARKS, get_benchmark
    from moespac.errors import MoespacError
    from moespac.models.specs import get_spec
    from moespac.sim import paper_routing as pr

    if args.gamma < 1 or args.requests < 1 or args.new_tokens < 2:
        raise MoespacError("--gamma and --requests must be >= 1, --new-tokens >= 2")
    spec = get_spec(args.model_spec)
    names = (list(BENCHMARKS) if args.benchmarks == "all"
             else [get_benchmark(b).name for b in args.benchmarks.split(",")])
    targets, smape_target = pr.paper_targets()
    fitted, smape_note = pr.fit_routing(spec, {b: t for b, t in targets.items()}, smape_target, gamma=args.gamma,
                                        seed=args.seed, log=lambda m: print(m, flush=True))
    params, fill_rule = pr.fill_missing(fitted, names)
    shape = pr.Shape(requests=args.requests, new_tokens=args.new_tokens, gamma=args.gamma)
    rows = {}
    print(f"{'benchmark':10s} {'alpha':>13s} {'a/b':>13s} {'sMAPE':>6s}  parameters (target / measured)")
    for bench in names:
        drawn = pr.Sequences(spec, params[bench], shape, seed=args.seed)  # the SD trace's draws, and its AR twin's
        trace = pr.paper_regime_trace(spec, params[bench], shape, seed=args.seed, benchmark=bench, sequences=drawn)
        got = pr.measured_statistics(trace)
        want = targets.get(bench, {})
        row = dict(params=dataclasses.asdict(params[bench]), target=dict(want, smape=smape_target), measured=got,
                   residual={k: got[k] - v for k, v in dict(want, smape=smape_target).items()},
                   filled=bench not in fitted)
        if args.seeds:
            per_seed = [pr.measured_statistics(pr.paper_regime_trace(spec, params[bench], shape, seed=s,
                                                                     self_draft=False)) for s in args.seeds]
            row["seed_spread"] = {k: [min(m[k] for m in per_seed), max(m[k] for m in per_seed)] for k in got}
        rows[bench] = row
        if args.traces:
            out = Path(args.traces)
            trace.save(out / pr.trace_name(bench, args.gamma))
            pr.paper_regime_trace(spec, params[bench], shape, seed=args.seed, benchmark=bench, ar=True,
                                  sequences=drawn).save(out / pr.trace_name(bench, args.gamma, ar=True))
        fmt = lambda k: f"{want[k]:.2f} / {got[k]:.3f}" if k in want else f"  -  / {got[k]:.3f}"
        print(f"{bench:10s} {fmt('alpha'):>13s} {fmt('a_over_b'):>13s} {got['smape']:6.3f}  temperature "
              f"{params[bench].temperature:.3f}, persistence {params[bench].persistence:.4f}"
              + (" (filled)" if bench not in fitted else ""))
    for note in (fill_rule, smape_note):
        if note:
            print(f"note: {note}")
    write_json(args.json, dict(kind="fit-routing", source=pr.SOURCE, model_spec=spec.name,
                               shape=dataclasses.asdict(shape), seed=args.seed, smape_target=smape_target,
                               smape_note=smape_note, fill_rule=fill_rule,
                               reads=sorted(pr.ROUTING_QUANTITIES) + ["smape"], benchmarks=rows))
    return 0
