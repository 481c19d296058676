"""MLflow ingest: every result record becomes one run in a SQLite store, keyed by its config hash.

One serial step (the workflow's `log_mlflow` rule) does all the writing, so the store is created and
migrated once and never raced. A record's run is found by the tag `moespac.run_key` (its config hash):
ingesting again updates that run (metrics, tags, artifacts) instead of adding one, and skips it outright
when the record's content has not changed. Experiments are per study (moespac/table1, moespac/sweep_K,
...); MLflow is for browsing, never an input of the build.

Run: params = the flattened config; metrics = numeric summaries (no per-request samples); tags = timing
label, kind, hardware, model, benchmark, method, git commit, record path; artifacts = the record itself
and, for the engine runs that recorded a trace, the trace's summary. Tables and figures go to one run in
moespac/outputs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from moespac.atomic import file_lock
from moespac.errors import MoespacError

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///results/mlflow.db"
DEFAULT_ARTIFACTS = "results/mlflow/artifacts"
PREFIX = "moespac/"
KEY_TAG = "moespac.run_key"
CONTENT_TAG = "moespac.record_sha256"
MAX_PARAM = 6000  # MLflow's limit on a param value
BATCH = 100


def tracking_uri(uri: str | None = None) -> str:
    """The given URI, else $MLFLOW_TRACKING_URI, else the project's SQLite store."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def flatten(obj, prefix: str = "") -> dict:
    """{'a.b.c': leaf} for nested dicts; lists stay leaves."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = obj
    return out


def params_of(record: dict) -> dict[str, str]:
    out = {}
    for k, v in flatten(record.get("config", {})).items():
        text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        out[k[:250]] = text if len(text) <= MAX_PARAM else text[: MAX_PARAM - 20] + "...(truncated)"
    return out


def metrics_of(record: dict) -> dict[str, float]:
    """Finite numeric leaves of `metrics` (booleans and per-request lists left out)."""
    out = {}
    for k, v in flatten(record.get("metrics", {})).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k[:250]] = float(v)
    return out


def run_key(record: dict) -> str:
    return record["config_hash"]


def content_hash(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def tags_of(record: dict, path, studies: list[str]) -> dict[str, str]:
    from moespac.analysis.records import record_row

    env = record.get("environment") or {}
    tags = {KEY_TAG: run_key(record), CONTENT_TAG: content_hash(path), "moespac.timing": record["timing"],
            "moespac.kind": record["kind"], "moespac.record_path": str(path), "moespac.studies": ",".join(studies),
            "moespac.created": record.get("created", "")}
    if env.get("git_commit"):
        tags["mlflow.source.git.commit"] = env["git_commit"]
    if record["kind"] in ("bench", "wrapped"):
        row = record_row(path)
        for key in ("hardware", "model", "benchmark", "method", "label", "source"):
            if row.get(key) is not None:
                tags[f"moespac.{key}"] = str(row[key])[:5000]
        if row.get("skipped"):
            tags["moespac.skip_reason"] = str(row["skip_reason"])[:5000]
    return tags


def run_name(record: dict, tags: dict) -> str:
    parts = [tags.get("moespac.method"), tags.get("moespac.benchmark"), record["timing"], tags.get("moespac.hardware")]
    return "/".join(str(p) for p in parts if p) + f"/{record['config_hash']}" if tags.get("moespac.method") \
        else f"{record['kind']}/{record['timing']}/{record['config_hash']}"


def trace_summary(record: dict) -> dict | None:
    """What an engine run's trace holds (for records that kept a trace): steps, requests, acceptance."""
    trace = record.get("trace")
    if not isinstance(trace, dict) or not trace.get("path") or not Path(trace["path"]).is_file():
        return None
    from moespac.trace import load_trace

    t = load_trace(trace["path"])
    kinds = [t.kind(s) for s in range(t.num_steps)]
    topo = t.topology
    return dict(trace_id=t.trace_id(), path=trace["path"], model=trace.get("model"), steps=t.num_steps,
                steps_by_kind={k: kinds.count(k) for k in sorted(set(kinds))},
                tokens=int(t.steps["step_tokens"].sum()), emitted=int(t.steps["step_emitted"].sum()),
                requests=int(t.steps["step_request"].max()) + 1 if t.num_steps else 0,
                drafted=int(t.steps["step_gamma"].sum()), accepted=int(t.steps["step_accepted"].sum()),
                topology=dict(layers=topo.num_layers, experts=topo.num_experts, top_k=topo.top_k))


@dataclass
class IngestSummary:
    tracking_uri: str
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: list = field(default_factory=list)
    """Files that are not result records to load (failure records, files without a config hash)."""
    invalid: list = field(default_factory=list)
    """Records that could not be read or break the schema; each is left out, the rest are loaded."""
    runs: dict = field(default_factory=dict)


class Store:
    """An MLflow client over one store, with the experiments and run keys it already holds."""

    def __init__(self, uri: str, artifact_root: str):
        from mlflow.tracking import MlflowClient

        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)  # creates / migrates the SQLite schema once, here
        self.artifact_root = Path(artifact_root).resolve()
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, object] = {}  # run key -> Run
        for exp in self.client.search_experiments():
            if exp.name.startswith(PREFIX):
                self.experiments[exp.name] = exp.experiment_id
        for run in self._search(list(self.experiments.values())):
            key = run.data.tags.get(KEY_TAG)
            if key:
                self.runs[key] = run

    def _search(self, experiment_ids: list[str]):
        token, out = None, []
        while experiment_ids:
            page = self.client.search_runs(experiment_ids, max_results=1000, page_token=token)
            out += list(page)
            token = page.token
            if not token:
                break
        return out

    def experiment(self, study: str) -> str:
        name = f"{PREFIX}{study}"
        if name not in self.experiments:
            location = (self.artifact_root / study).as_uri()
            self.experiments[name] = self.client.create_experiment(name, artifact_location=location)
        return self.experiments[name]

    def log(self, run_id: str, params: dict, metrics: dict, tags: dict) -> None:
        import time

        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        params_l = [Param(k, v) for k, v in params.items()]
        metrics_l = [Metric(k, v, now, 0) for k, v in metrics.items()]
        tags_l = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(params_l), len(metrics_l), len(tags_l)), BATCH):
            self.client.log_batch(run_id, metrics=metrics_l[i:i + BATCH], params=params_l[i:i + BATCH],
                                  tags=tags_l[i:i + BATCH])


def ingest(studies: dict[str, list[str]], outputs: list[str] = (), uri: str | None = None,
           artifact_root: str = DEFAULT_ARTIFACTS) -> IngestSummary:
    """Load every record of every study; a record in several studies is filed under the first one."""
    uri = tracking_uri(uri)
    # one ingest at a time per store: the second reads the runs the first made, so they converge to one run
    # per record (MLflow has no unique key on a tag to enforce it)
    with file_lock(_lock_path(uri, artifact_root)):
        store = Store(uri, artifact_root)
        summary = IngestSummary(uri)
        membership: dict[str, list[str]] = {}
        for study, paths in studies.items():
            for p in paths:
                membership.setdefault(str(p), []).append(study)
        for path, member_of in membership.items():
            record = _read(path, summary)
            if record is not None:
                summary.runs[path] = _ingest_one(store, record, path, member_of, summary)
        if outputs:
            summary.runs["outputs"] = _ingest_outputs(store, list(outputs), summary)
    return summary


def _lock_path(uri: str, artifact_root: str) -> Path:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):] + ".lock")
    return Path(artifact_root) / ".ingest.lock"


def _read(path: str, summary: IngestSummary) -> dict | None:
    """The record at `path` if it is one to load; otherwise None, with the reason noted (and printed, one line)."""
    from moespac.bench.records import validate_record

    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        reason = f"cannot read ({str(e).splitlines()[0]})"
        record = None
    else:
        if not isinstance(record, dict):
            reason = f"not a record (a JSON {type(record).__name__})"
            record = None
        elif record.get("kind") == "failure" or "config_hash" not in record:
            summary.skipped.append(dict(path=path, reason="a failure record" if record.get("kind") == "failure"
                                        else "no config_hash (not a result record)"))
            return None
        else:
            try:
                return validate_record(record)
            except MoespacError as e:
                reason = str(e).removeprefix("record: ")
    summary.invalid.append(dict(path=path, reason=reason))
    print(f"record {path}: left out: {reason}", file=sys.stderr)
    return None


def _ingest_one(store: Store, record: dict, path: str, studies: list[str], summary: IngestSummary) -> str:
    key = run_key(record)
    tags = tags_of(record, path, studies)
    old = store.runs.get(key)
    if (old is not None and old.data.tags.get(CONTENT_TAG) == tags[CONTENT_TAG]
            and old.info.status == "FINISHED"):  # ingested before, unchanged (an interrupted one is redone)
        summary.unchanged += 1
        return old.info.run_id
    if old is None:
        run = store.client.create_run(store.experiment(studies[0]), run_name=run_name(record, tags),
                                      tags={KEY_TAG: key})
        run_id = run.info.run_id
        summary.created += 1
    else:
        run_id = old.info.run_id
        summary.updated += 1
    # params are immutable in MLflow and the same config hash means the same params: log the missing ones
    have = old.data.params if old is not None else {}
    params = {k: v for k, v in params_of(record).items() if k not in have}
    content = tags.pop(CONTENT_TAG)
    store.log(run_id, params, metrics_of(record), tags)
    store.client.log_artifact(run_id, path, artifact_path="record")
    trace = trace_summary(record)
    if trace is not None:
        store.client.log_dict(run_id, trace, "trace_summary.json")
    store.client.set_tag(run_id, CONTENT_TAG, content)
    store.client.set_terminated(run_id, "FINISHED")  # last: a run interrupted before this is redone
    store.runs[key] = store.client.get_run(run_id)
    return run_id


def _ingest_outputs(store: Store, outputs: list[str], summary: IngestSummary) -> str:
    """Tables, figures and the audit page as artifacts of one run (moespac/outputs, key 'outputs')."""
    digest = hashlib.sha256()
    for p in sorted(outputs):
        digest.update(p.encode())
        digest.update(Path(p).read_bytes())
    content = digest.hexdigest()[:16]
    old = store.runs.get("outputs")
    if old is not None and old.data.tags.get(CONTENT_TAG) == content and old.info.status == "FINISHED":
        return old.info.run_id
    if old is None:
        run_id = store.client.create_run(store.experiment("outputs"), run_name="paper_figs",
                                         tags={KEY_TAG: "outputs"}).info.run_id
    else:
        run_id = old.info.run_id
    for p in outputs:
        store.client.log_artifact(run_id, p, artifact_path=str(Path(p).parent))
    store.client.set_tag(run_id, CONTENT_TAG, content)
    store.client.set_terminated(run_id, "FINISHED")
    store.runs["outputs"] = store.client.get_run(run_id)
    return run_id
