"""`moespac derive-ar-trace`: the autoregressive trace of the tokens a speculative trace kept (no engine run)."""

from __future__ import annotations

import argparse

from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("derive-ar-trace", help="the AR trace of a batch-1 speculative trace's kept tokens",
                       description=__doc__.splitlines()[0],
                       epilog="Why the routing is the AR run's: moespac/ar_trace.py.")
    p.add_argument("trace", metavar="SD_TRACE", help="a speculative trace recorded by `moespac bench` (batch 1)")
    p.add_argument("--out", required=True, help="AR trace to write (.npz)")
    p.add_argument("--json", default=None, metavar="RECORD", help="write a small record of the derivation here")
    p.set_defaults(func=run, io=IO(outputs=("out", "json"), inputs=("trace",), positional=("trace",)))


def run(args: argparse.Namespace) -> int:
    from moespac.ar_trace import ar_from_speculative
    from moespac.atomic import write_json
    from moespac.trace import load_trace

    sd = load_trace(args.trace)
    ar = ar_from_speculative(sd, f"trace {args.trace}")
    ar.save(args.out)
    dropped = int(sd.steps["step_tokens"].sum() - ar.steps["step_tokens"].sum())
    summary = dict(kind="derive-ar-trace", source=args.trace, source_trace_id=sd.trace_id(), out=args.out,
                   trace_id=ar.trace_id(), steps=ar.num_steps, rows_kept=int(ar.steps["step_tokens"].sum()),
                   rows_dropped=dropped, note=ar.meta["derived"])
    if args.json:
        write_json(args.json, summary)
    print(f"{args.out}: {ar.num_steps} steps ({summary['rows_kept']} routing rows kept, {dropped} rejected-draft rows "
          f"dropped) from {sd.num_steps} steps of {args.trace}")
    return 0
