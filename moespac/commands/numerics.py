"""`moespac numerics`: the paper's Table 6 for our hybrid layer against the stock transformers layer (fp32)."""

from __future__ import annotations

from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("numerics", help="NMSE of the hybrid MoE layer vs the stock transformers layer (Table 6)")
    p.add_argument("--no-realistic", action="store_true", help="skip the 2048x768, E=128 layer (2.4 GB of fp32 weights)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.set_defaults(func=run, io=IO(outputs=("json",)))


def run(args) -> int:
    from moespac.atomic import write_json
    from moespac.numerics import PAPER_WORST_NMSE, run_numerics

    rows = run_numerics(realistic=not args.no_realistic)
    print("Table 6 (ours, measured on this machine, fp32; hybrid layer vs stock transformers layer)")
    print(f"{'configuration':58s} {'tokens':12s} {'cache ratios':16s} worst NMSE")
    for r in rows:
        print(f"{r['configuration']:58s} {str(r['tokens']):12s} {str(r['cache_ratios']):16s} {r['worst_nmse']:.2e}")
    worst = max(r["worst_nmse"] for r in rows)
    ok = worst <= PAPER_WORST_NMSE
    print(f"worst NMSE {worst:.2e} {'<=' if ok else '>'} {PAPER_WORST_NMSE:.1e} (paper's Table 6 bound): {'OK' if ok else 'FAIL'}")
    if args.json:
        write_json(args.json, dict(timing="measured", rows=rows, worst_nmse=worst, bound=PAPER_WORST_NMSE, ok=ok))
    return 0 if ok else 1
