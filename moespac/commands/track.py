"""`moespac track ingest`: load result records into MLflow (SQLite), one run per record, keyed by config hash."""

from __future__ import annotations

from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("track", help="MLflow: load result records into the tracking store")
    tsub = p.add_subparsers(dest="track_command", required=True, metavar="ACTION")
    i = tsub.add_parser("ingest", help="one run per record (idempotent: keyed by config hash), experiment per study",
                        description=__doc__.splitlines()[0])
    i.add_argument("--study", action="append", nargs="+", default=[], metavar=("NAME", "RECORD"),
                   help="a study (experiment moespac/NAME) and its records; repeat per study")
    i.add_argument("--outputs", nargs="*", default=[], help="tables and figures, logged as artifacts of one run")
    i.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db)")
    i.add_argument("--artifact-root", default="results/mlflow/artifacts", help="folder for new experiments' artifacts")
    i.add_argument("--summary", default=None, help="write what was created / updated here (JSON)")
    i.set_defaults(func=run_ingest, io=IO(outputs=("summary",), inputs=("outputs",)))


def run_ingest(args) -> int:
    import logging
    import os
    from dataclasses import asdict

    from moespac.atomic import write_json
    from moespac.tracking import ingest

    logging.getLogger("alembic").setLevel(logging.WARNING)
    studies: dict[str, list[str]] = {}
    for name, *records in args.study:
        studies.setdefault(name, []).extend(records)
    for path in args.outputs:
        if not os.path.isfile(path):
            raise MoespacError(f"--outputs {path}: no such file")
    if not studies and not args.outputs:
        raise MoespacError("nothing to ingest: give --study NAME RECORD... or --outputs")
    summary = ingest(studies, args.outputs, args.tracking_uri, args.artifact_root)
    for skipped in summary.skipped:
        print(f"record {skipped['path']}: skipped: {skipped['reason']}")
    print(f"MLflow {summary.tracking_uri}: {summary.created} runs created, {summary.updated} updated, "
          f"{summary.unchanged} unchanged, {summary.stale} stale deleted, {len(summary.skipped)} skipped, "
          f"{len(summary.invalid)} left out as invalid")
    if args.summary:
        write_json(args.summary, asdict(summary))
    return 1 if summary.invalid else 0
