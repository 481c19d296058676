"""`moespac report`: the paper's tables, figures and audit page from result records (and the Sec. 3.4 overhead)."""

from __future__ import annotations

from moespac.analysis.outputs import get_output, names
from moespac.errors import MoespacError, check_unit_interval
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("report", help="tables, figures and the audit page from result records",
                       description=__doc__.splitlines()[0])
    rsub = p.add_subparsers(dest="report_command", required=True, metavar="WHAT")

    t = rsub.add_parser("table", help="one paper table as PREFIX.csv, PREFIX.md and PREFIX.tex")
    t.add_argument("name", choices=names("table"))
    t.add_argument("inputs", nargs="+", help="result records (Table 6: the `moespac numerics --json` file)")
    t.add_argument("--out", required=True, metavar="PREFIX", help="output path without extension")
    t.set_defaults(func=run_table)

    f = rsub.add_parser("figure", help="one paper figure as PREFIX.png and PREFIX.pdf")
    f.add_argument("name", choices=names("figure"))
    f.add_argument("--group", action="append", nargs="+", default=[], metavar=("NAME", "FILE"),
                   help="a named group of input files (records or traces); repeat per group")
    f.add_argument("--out", required=True, metavar="PREFIX", help="output path without extension")
    f.set_defaults(func=run_figure)

    a = rsub.add_parser("audit", help="which of the paper's headline claims re-derive from its own tables")
    a.add_argument("--table1", default=None, help="our paper_figs/table1.csv, to compare our numbers with each claim")
    a.add_argument("--table2", default=None, help="our paper_figs/table2.csv, to compare our ablations with the claim")
    a.add_argument("--table3", default=None, help="our paper_figs/table3.csv (other models and GPUs)")
    a.add_argument("--table4", default=None, help="our paper_figs/table4.csv (batch size x draft length)")
    a.add_argument("--appendix-a1", default=None, help="our paper_figs/appendix_a1.csv (routing statistics)")
    a.add_argument("--paper-regime", default=None, metavar="RECORD",
                   help="the paper-regime study's record, to quote the consistency verdict")
    a.add_argument("--out", required=True, help="Markdown file")
    a.set_defaults(func=run_audit, io=IO(outputs=("out",), inputs=("table1", "table2", "table3", "table4",
                                                                         "appendix_a1", "paper_regime")))

    c = rsub.add_parser("consistency", help="the paper's setup inferred from its baselines, every method predicted "
                        "under it and the plausible-range verdict (from a paper-regime record)")
    c.add_argument("--record", required=True, help="the `moespac report paper-regime --json` record")
    c.add_argument("--out", required=True, metavar="PREFIX", help="PREFIX.md, PREFIX.csv, PREFIX.png and PREFIX.pdf")
    c.set_defaults(func=run_consistency, io=IO(inputs=("record",)))

    o = rsub.add_parser("overhead", help="time MoE-SpAc's estimator and balancer at Qwen3-30B-A3B's shape (measured)")
    o.add_argument("--alpha", type=float, default=0.8, help="acceptance rate that sets the verify steps")
    o.add_argument("--repeats", type=int, default=5)
    o.add_argument("--json", required=True, help="write the result record here")
    o.set_defaults(func=run_overhead, io=IO(outputs=("json",)))

    w = rsub.add_parser("whatif-locality", help="simulated tokens/s of Table 1 methods against routing locality "
                        "(synthetic traces, plus recorded ones on the same axis)")
    w.add_argument("--skews", default="0,1,2,3,4,5", help="popularity skews of the synthetic traces (0 = uniform)")
    w.add_argument("--methods", default=None, help="study methods, comma-separated (default: six Table 1 rows)")
    w.add_argument("--hardware", default="rtx4090-pcie4")
    w.add_argument("--model-spec", default="qwen3-30b-a3b")
    w.add_argument("--draft-spec", default="qwen3-4b-fp8")
    w.add_argument("--cache-ratio", type=float, default=0.25)
    w.add_argument("--tokens", type=int, default=256, help="new tokens of each synthetic trace")
    w.add_argument("--recorded", nargs=2, metavar=("SD", "AR"), help="recorded SD and AR traces, one more row")
    w.add_argument("--allow-topology-mismatch", action="store_true", help="for recorded traces of a proxy's shape")
    w.add_argument("--json", required=True, help="write the result record here")
    w.add_argument("--out", required=True, metavar="PREFIX", help="PREFIX.md, PREFIX.png and PREFIX.pdf")
    w.set_defaults(func=run_whatif_locality, io=IO(outputs=("json",), inputs=("recorded",)))

    pr = rsub.add_parser("paper-regime", help="every Table 1 method on routing fitted to the paper's A.1 statistics "
                         "(simulated), beside the paper's numbers")
    pr.add_argument("--methods", required=True, help="study methods, comma-separated")
    pr.add_argument("--benchmarks", default="all", help="'all' or comma-separated benchmark names")
    pr.add_argument("--hardware", default="rtx4090-pcie4")
    pr.add_argument("--model-spec", default="qwen3-30b-a3b")
    pr.add_argument("--draft-spec", default="qwen3-4b-fp8")
    pr.add_argument("--cache-ratio", type=float, default=0.25)
    pr.add_argument("--gamma", type=int, default=8)
    pr.add_argument("--requests", type=int, default=4)
    pr.add_argument("--new-tokens", type=int, default=256)
    pr.add_argument("--no-infer-host", dest="infer_host", action="store_false",
                    help="skip the host inferred from the paper's llama.cpp rows (replay on --hardware only)")
    pr.add_argument("--no-sweep", dest="sweep", action="store_false",
                    help="skip moving each host parameter across its plausible range (paper_figs/consistency.md)")
    pr.add_argument("--table2-methods", default="", help="Table 2's variants, comma-separated: also replayed on the "
                    "inferred host (the sourced one with --no-infer-host), Table 2's paper-regime block")
    pr.add_argument("--table2-benchmarks", default="", help="the benchmarks of those replays, comma-separated")
    pr.add_argument("--table4-benchmark", default="", help="Table 4's benchmark: MoE-SpAc on batched traces of its "
                    "routing over the grid below (Table 4's paper-regime block)")
    pr.add_argument("--table4-batch-sizes", default="", help="Table 4's batch sizes, comma-separated")
    pr.add_argument("--table4-gammas", default="", help="Table 4's draft lengths, comma-separated")
    pr.add_argument("--json", required=True, help="write the result record here")
    pr.add_argument("--out", required=True, metavar="PREFIX", help="PREFIX.csv, PREFIX.md, PREFIX.png and PREFIX.pdf")
    pr.add_argument("--traces", default=None, metavar="DIR", help="also write the study's traces there: "
                    "BENCHMARK-gGAMMA.npz (speculative) and BENCHMARK-ar.npz, the names `moespac fit-routing` writes")
    pr.add_argument("--jobs", type=int, default=1, help="processes the independent replays run over (the record "
                    "is the same for any number)")
    pr.set_defaults(func=run_paper_regime, io=IO(outputs=("json",)))

    r = rsub.add_parser("routing-stats", help="routing statistics of traces (concentration, distinct experts per "
                        "step, reuse, hot/cold accuracy, sMAPE, simulated MoE-SpAc hit rate) beside the paper's")
    r.add_argument("--trace", action="append", default=[], metavar="LABEL=PATH",
                   help="a trace (.npz: recorded, synthetic or imported) and its row label; repeat per trace")
    r.add_argument("--skews", default=None, help="also the what-if's synthetic traces at these skews, comma-separated")
    r.add_argument("--hardware", default="rtx4090-pcie4", help="hardware profile of the hit-rate simulation")
    r.add_argument("--model-spec", default="trace", help="'trace' (each trace's own spec) or a registry name "
                   "(traces mapped onto it by modulo where the topology differs)")
    r.add_argument("--cache-ratio", type=float, default=0.25, help="device expert slots / all experts (simulation)")
    r.add_argument("--out", required=True, metavar="PREFIX", help="PREFIX.csv, PREFIX.md, PREFIX.tex and PREFIX.html")
    r.set_defaults(func=run_routing_stats)


def run_table(args) -> int:
    from moespac.analysis.rows import for_table, load_rows
    from moespac.analysis.render import write_table

    table = get_output(args.name, "table")
    if table.reads_file:
        long, blocks = table.load()(args.inputs[0])
    else:
        rows = for_table(load_rows(args.inputs), args.name)
        if rows.empty:
            raise MoespacError(f"{args.name}: no result records among the inputs")
        long, blocks = table.load()(rows)
    paths = write_table(args.out, table.title, long, blocks)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def run_figure(args) -> int:
    groups = {}
    for name, *files in args.group:
        groups.setdefault(name, []).extend(files)
    paths = get_output(args.name, "figure").load()(groups, args.out)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def run_audit(args) -> int:
    from moespac.analysis.audit import write_audit

    write_audit(args.out, **{k: getattr(args, k) for k in ("table1", "table2", "table3", "table4", "appendix_a1",
                                                             "paper_regime")})
    print(f"wrote {args.out}")
    return 0


def run_consistency(args) -> int:
    from moespac.analysis.consistency import write
    from moespac.bench.record_files import read_record

    record = read_record(args.record)
    if record.get("kind") != "paper-regime":
        raise MoespacError(f"--record {args.record}: a {record.get('kind')!r} record, not a paper-regime one")
    print("wrote " + ", ".join(map(str, write(record, args.out))))
    return 0


def run_overhead(args) -> int:
    from moespac.bench.record_files import write_result
    from moespac.experiments.overhead import PAPER, measure
    from moespac.record import make_record

    if not 0 <= args.alpha < 1 or args.repeats < 1:
        raise MoespacError("--alpha must lie in [0, 1) and --repeats be >= 1")
    m = measure(alpha=args.alpha, repeats=args.repeats)
    config = dict(study="scheduler-overhead", alpha=args.alpha, repeats=args.repeats, shape=list(m["shape"]),
                  gamma=m["gamma"])
    write_result(args.json, make_record("overhead", "measured", config, m, paper=PAPER))
    print(f"estimator {m['estimator_ms_per_step']:.4f} ms/step (paper {PAPER['estimator_ms_per_step']}), "
          f"tau {m['tau_ms_per_generation']:.3f} ms/generation (paper {PAPER['tau_ms_per_generation']}), "
          f"state {m['state_kb']:.1f} KiB (paper ~{PAPER['state_kb']:.0f} KB); timing: measured")
    return 0


def run_whatif_locality(args) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from moespac.analysis.whatif_page import locality_frame, plot_locality, render_locality
    from moespac.atomic import write_text
    from moespac.bench.record_files import write_result
    from moespac.experiments.whatif import LocalitySweep, run_locality_sweep
    from moespac.trace import load_trace

    try:
        skews = tuple(float(v) for v in args.skews.split(","))
    except ValueError:
        raise MoespacError(f"--skews {args.skews!r}: comma-separated numbers") from None
    options = dict(skews=skews, hardware=args.hardware, model_spec=args.model_spec, draft_spec=args.draft_spec,
                   cache_ratio=args.cache_ratio, tokens=args.tokens,
                   allow_topology_mismatch=args.allow_topology_mismatch)
    if args.methods:
        options["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    cfg = LocalitySweep(**options)
    recorded = None
    if args.recorded:
        sd, ar = (load_trace(p) for p in args.recorded)
        recorded = (Path(args.recorded[0]).parent.name, sd, ar)  # the benchmark folder of the trace
    record = run_locality_sweep(cfg, recorded, progress=lambda it, n: tqdm(it, total=n, desc="traces"))
    write_result(args.json, record)
    md = render_locality(record)
    write_text(f"{args.out}.md", md)
    write_text(f"{args.out}.csv", locality_frame(record).to_csv(index=False))
    paths = [args.json, f"{args.out}.csv", f"{args.out}.md"] + [str(p) for p in plot_locality(record, args.out)]
    print(md)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def run_routing_stats(args) -> int:
    """No result record: the schema's kinds name the commands that write them, none of which this is."""
    from pathlib import Path

    from moespac.analysis import routing_stats as rs
    from moespac.trace import load_trace

    check_unit_interval("--cache-ratio", args.cache_ratio)
    cases = []
    for arg in args.trace:
        label, sep, path = arg.partition("=")
        if not sep or not label.strip() or not path.strip():
            raise MoespacError(f"--trace {arg!r}: expected LABEL=PATH")
        if not Path(path).is_file():
            raise MoespacError(f"--trace {arg!r}: no such trace file {path}")
        try:
            cases.append((label.strip(), load_trace(path)))
        except MoespacError as e:
            raise MoespacError(f"--trace {arg!r}: {e}") from None
    if args.skews:
        try:
            skews = [float(v) for v in args.skews.split(",") if v.strip()]
        except ValueError:
            raise MoespacError(f"--skews {args.skews!r}: comma-separated numbers") from None
        if any(s < 0 for s in skews):
            raise MoespacError(f"--skews {args.skews!r}: skews must be >= 0")
        cases += [(f"what-if skew {s:g}", rs.whatif_trace(s)) for s in skews]
    if not cases:
        raise MoespacError("routing-stats: give at least one --trace LABEL=PATH (or --skews)")
    rows = []
    for label, trace in cases:
        try:
            stats = rs.routing_stats(trace, hardware=args.hardware, model_spec=args.model_spec,
                                     cache_ratio=args.cache_ratio)
        except MoespacError as e:
            raise MoespacError(f"routing-stats {label!r}: {e}") from None
        rows.append((label, trace, stats))
    paths = rs.write(args.out, rows)
    print(Path(paths[1]).read_text(encoding="utf-8"))
    print("wrote " + ", ".join(map(str, paths)) + " (no result record: no record kind fits a table of traces)")
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in _names(text))
    except ValueError:
        raise MoespacError(f"{flag} {text!r}: comma-separated whole numbers") from None


def run_paper_regime(args) -> int:
    from tqdm import tqdm

    from moespac.analysis.paper_regime_page import frame, plot, render
    from moespac.atomic import write_text
    from moespac.bench.record_files import write_result
    from moespac.datasets import BENCHMARKS
    from moespac.experiments.paper_regime import PaperRegimeStudy, run_study

    if args.jobs < 1:
        raise MoespacError(f"--jobs {args.jobs} must be >= 1")
    benchmarks = tuple(BENCHMARKS) if args.benchmarks == "all" else tuple(b.strip() for b in args.benchmarks.split(","))
    cfg = PaperRegimeStudy(methods=_names(args.methods), benchmarks=benchmarks,
                           hardware=args.hardware, model_spec=args.model_spec, draft_spec=args.draft_spec,
                           cache_ratio=args.cache_ratio, gamma=args.gamma, requests=args.requests,
                           new_tokens=args.new_tokens, infer_host=args.infer_host, sweep=args.sweep,
                           table2_methods=_names(args.table2_methods), table2_benchmarks=_names(args.table2_benchmarks),
                           table4_benchmark=args.table4_benchmark, table4_batch_sizes=_ints(args.table4_batch_sizes,
                                                                                            "--table4-batch-sizes"),
                           table4_gammas=_ints(args.table4_gammas, "--table4-gammas"))
    record = run_study(cfg, progress=lambda it, n, what: tqdm(it, total=n, desc=what), traces_dir=args.traces,
                       jobs=args.jobs)
    write_result(args.json, record)
    md = render(record)
    write_text(f"{args.out}.md", md)
    write_text(f"{args.out}.csv", frame(record).to_csv(index=False))
    plot(record, args.out)
    print(md)
    return 0
