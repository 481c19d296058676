"""`moespac manifest`: list a study's weights, traces and simulated records by content hash, and check a rerun
against a committed list (reproduced bit for bit, or the first stage that differs and why)."""

from __future__ import annotations

from pathlib import Path

from moespac.iopaths import IO

DEFAULT = "paper_figs/MANIFEST.json"


def register(sub) -> None:
    p = sub.add_parser("manifest",
                       help="content hashes of a study's weights, traces and simulated records; check a rerun",
                       description=__doc__.splitlines()[0])
    msub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    w = msub.add_parser("write", help="list results/ into a manifest (what paper_figs/ was made from)")
    w.add_argument("--results", default="results", help="the study's results folder")
    w.add_argument("--study", default="default", help="the config it ran (named in the manifest)")
    w.add_argument("--out", default=DEFAULT, help="manifest to write")
    w.set_defaults(func=run_write, io=IO(outputs=("out",), inputs=("results",)))
    c = msub.add_parser("check", help="compare results/ with a manifest; exit 1 when anything differs")
    c.add_argument("manifest", nargs="?", default=DEFAULT, help="the manifest to check against")
    c.add_argument("--results", default="results", help="the rerun's results folder")
    c.set_defaults(func=run_check)


def run_write(args) -> int:
    from moespac.manifest import write_manifest

    m = write_manifest(Path(args.results), Path(args.out), args.study)
    print(f"{args.out}: " + ", ".join(f"{len(v)} {k}" for k, v in m["stages"].items()))
    return 0


def run_check(args) -> int:
    from moespac.manifest import compare, load_manifest, render

    report = compare(load_manifest(Path(args.manifest)), Path(args.results))
    print(render(report, args.manifest))
    return 0 if report["reproduced"] else 1
