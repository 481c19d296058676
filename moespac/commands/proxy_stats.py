"""`moespac proxy-stats`: acceptance rate, expert popularity and locality of a proxy pair, next to the paper's
numbers."""

from __future__ import annotations

from moespac.commands._common import finite
from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("proxy-stats",
                       help="measure a proxy pair: acceptance per benchmark, expert popularity, locality")
    p.add_argument("--pair", required=True, help="folder with target/ and draft/ (from `moespac build-proxy`)")
    p.add_argument("--benchmarks", default="all", help="'all' or comma-separated benchmark names")
    p.add_argument("--prompts", type=int, default=10, help="prompts per benchmark (seeded sample)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=8, help="draft length")
    p.add_argument("--temperature", type=finite, default=0.0, help="0 = greedy; > 0 = speculative sampling")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt sample and of sampling")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads: a fixed count, so two runs sample the same tokens")
    p.add_argument("--json", default=None, help="write a result record (timing: measured) here")
    p.add_argument("--trace-dir", default=None, help="write one activation trace per benchmark (NAME.npz) here")
    p.add_argument("--markdown", default=None, help="also write the printed table to this Markdown file")
    p.set_defaults(func=run, io=IO(outputs=("json", "markdown"), inputs=("pair",)))


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from moespac.bench.record_files import write_result
    from moespac.datasets import BENCHMARKS
    from moespac.experiments import proxy_stats
    from moespac.record import make_record

    names = list(BENCHMARKS) if args.benchmarks.strip().lower() == "all" else \
        [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    if not names:
        raise MoespacError("--benchmarks: give 'all' or at least one benchmark name")
    if args.threads < 1:
        raise MoespacError(f"--threads {args.threads} must be >= 1")
    threads = args.threads
    torch.set_num_threads(threads)
    with tqdm(total=len(names) * args.prompts, desc="proxy-stats", unit="prompt", leave=False) as bar:
        rows = proxy_stats.run(args.pair, names, args.prompts, args.max_new_tokens, args.gamma, args.seed,
                               args.temperature, args.trace_dir, progress=bar.update)
    text = proxy_stats.render(rows, args.pair, args.gamma, args.prompts, args.max_new_tokens, args.temperature)
    print(text)
    if args.markdown:
        from moespac.atomic import write_text

        write_text(args.markdown, f"# Proxy pair statistics next to the paper's (timing: none, counts of the engine's "
                   f"routing on the proxy pair)\n\n```\n{text}\n```\n")
    if args.json:
        config = dict(pair=args.pair, benchmarks=names, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                      gamma=args.gamma, seed=args.seed, temperature=args.temperature, threads=threads)
        write_result(args.json, make_record("proxy-stats", "measured", config,
                                            dict(benchmarks=proxy_stats.to_dicts(rows)),
                                            paper=proxy_stats.paper_reference(), model="locally trained proxy pair"))
        print(f"record: {args.json}")
    return 0
