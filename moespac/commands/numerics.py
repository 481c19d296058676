"""`moespac numerics`: the paper's Table 6 for our hybrid layer against the stock transformers layer (fp32, bf16)."""

from __future__ import annotations

from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("numerics", help="NMSE of the hybrid MoE layer vs the stock transformers layer (Table 6)")
    p.add_argument("--no-realistic", action="store_true",
                   help="skip the 2048x768, E=128 layer (2.4 GB of fp32 weights)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.set_defaults(func=run, io=IO(outputs=("json",)))


def run(args) -> int:
    from moespac.atomic import write_json
    from moespac.numerics import PAPER_WORST_NMSE, run_numerics

    rows = run_numerics(realistic=not args.no_realistic)
    print("Table 6 (ours, measured on this machine; hybrid layer vs stock transformers layer, fp32 and bf16; the bf16 "
          "hybrid against fp32 arithmetic beside the stock bf16 block's own rounding)")
    print(f"{'configuration':54s} {'fp32':>9s} {'bf16':>9s} {'bf16 rounding (stock)':>22s}")
    for r in rows:
        print(f"{r['configuration']:54s} {r['worst_nmse']:9.2e} {r['worst_nmse_bf16']:9.2e} "
              f"{r['bf16_rounding']:9.2e} ({r['stock_bf16_rounding']:.2e})")
    worst = max(max(r["worst_nmse"], r["worst_nmse_bf16"]) for r in rows)
    ok = worst <= PAPER_WORST_NMSE
    print(f"worst NMSE {worst:.2e} {'<=' if ok else '>'} {PAPER_WORST_NMSE:.1e} (paper's Table 6 bound): "
          f"{'OK' if ok else 'FAIL'}")
    if args.json:
        write_json(args.json, dict(timing="measured", rows=rows, worst_nmse=worst, bound=PAPER_WORST_NMSE, ok=ok))
    return 0 if ok else 1
