"""MLflow ingest: every result record becomes one run per study that uses it, in a SQLite store.

One serial step (the workflow's `log_mlflow` rule) does all the writing. Experiments are per study
(moespac/table1, moespac/sweep_K, ...); a run is found by its experiment and the tag `moespac.run_key` (the
record's config hash), so ingesting again skips an unchanged record and replaces a changed one. MLflow is for
browsing, never an input of the build.

What a run holds: docs/internals.md#moespactrackingpy.
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


URI_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def tracking_uri(uri: str | None = None) -> str:
    """The given URI, else $MLFLOW_TRACKING_URI, else the project's SQLite store; a scheme MLflow's stores do not
    take is refused here, in one line (MLflow raises two chained tracebacks for it)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    scheme = uri.partition("://")[0].lower() if "://" in uri else ""
    if scheme not in URI_SCHEMES:
        raise MoespacError(f"tracking URI {uri!r}: scheme {scheme!r} is not one MLflow stores runs in "
                           f"({', '.join(s for s in URI_SCHEMES if s)}, or a folder path)")
    return uri


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


SPREAD = ("std", "min", "max", "p50", "p90")  # logged beside a summary's mean only when n > 1
# the row's numbers a table reads -> their MLflow names, one name for every record kind
TABLE_METRICS = {"tps": "tokens_per_s", "latency_s": "latency_s", "acceptance_rate": "acceptance_rate",
                 "alpha": "alpha", "omega": "omega", "hit_rate": "hit_rate", "host_share": "host_share",
                 "a_over_b": "a_over_b", "hot_cold_accuracy": "hot_cold_accuracy"}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_summary(v) -> bool:
    return isinstance(v, dict) and "n" in v and "mean" in v


def metrics_of(record: dict, row: dict | None = None) -> dict[str, float]:
    """Finite numbers of `metrics` (booleans and per-request lists left out): a per-request summary is logged
    as its mean under its own name (its spread as NAME.std, ... when n > 1), and for a benchmark cell (`row`,
    from moespac.analysis.rows) the numbers its table reads under the table's names."""
    from moespac.analysis.rows import WRAPPED_METRICS

    out = {}

    def walk(obj, prefix):
        for k, v in obj.items():
            name = f"{prefix}.{k}" if prefix else str(k)
            if _is_summary(v):
                if _finite(v["mean"]):
                    out[name] = float(v["mean"])
                if (v.get("n") or 0) > 1:
                    out.update({f"{name}.{s}": float(v[s]) for s in SPREAD if _finite(v.get(s))})
            elif isinstance(v, dict):
                walk(v, name)
            elif _finite(v):
                out[name] = float(v)

    walk(record.get("metrics", {}), "")
    if row is not None:
        if row["kind"] == "wrapped":  # the table's TPS and latency under their own names, not twice
            for key in WRAPPED_METRICS.values():
                out.pop(key, None)
        out.update({name: float(row[col]) for col, name in TABLE_METRICS.items() if _finite(row.get(col))})
    bound = ((record.get("simulation") or {}).get("bounds") or {}).get("infinite_cache") or {}
    out.update({f"infinite_cache.{k}": float(bound[k]) for k in ("tokens_per_s", "latency_s") if _finite(bound.get(k))})
    share = (record.get("machine_load") or {}).get("other_cpu_share")
    if _finite(share):  # a timed run's figures beside other work: filter or sort the runs by it
        out["machine_load.other_cpu_share"] = float(share)
    return {k[:250]: v for k, v in out.items()}


def run_key(record: dict) -> str:
    return record["config_hash"]


def content_hash(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def table_row(record: dict, path) -> dict | None:
    """The table row of a benchmark cell (bench and wrapped records); None for the other kinds."""
    from moespac.analysis.rows import record_row

    return record_row(path, record) if record["kind"] in ("bench", "wrapped") else None


def tags_of(record: dict, path, study: str, studies: list[str], row: dict | None) -> dict[str, str]:
    from moespac.analysis.rows import machine_name

    env = record.get("environment") or {}
    tags = {KEY_TAG: run_key(record), CONTENT_TAG: content_hash(path), "moespac.timing": record["timing"],
            "moespac.kind": record["kind"], "moespac.record_path": str(path), "moespac.study": study,
            "moespac.studies": ",".join(studies)}
    if env.get("git_commit"):
        tags["mlflow.source.git.commit"] = env["git_commit"]
    if record["timing"] != "simulated" and env.get("cpu"):
        tags["moespac.hardware"] = machine_name(env)
    if row is not None:
        for key in ("hardware", "model", "benchmark", "method", "label", "source"):
            if row.get(key) is not None:
                tags[f"moespac.{key}"] = str(row[key])[:5000]
        if row.get("skipped"):
            tags["moespac.skip_reason"] = str(row["skip_reason"])[:5000]
    return tags


def run_times(record: dict, path) -> tuple[int, int]:
    """(start, end) in ms since the epoch: when the run itself ran (`started`, `created`); a simulated record
    holds no clock reading, so both are the time its file was written."""
    import calendar
    import time

    def ms(stamp):
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) * 1000

    if record.get("created"):
        end = ms(record["created"])
        return (ms(record["started"]) if record.get("started") else end), end
    written = int(Path(path).stat().st_mtime * 1000)
    return written, written


def prompt_set(record: dict):
    """The prompts a benchmark cell ran (id, turn, prompt tokens) as an MLflow dataset input named after the
    benchmark, its source the committed prompt file (offline) or the hub dataset; None without requests."""
    import warnings

    import pandas as pd
    from mlflow.data.pandas_dataset import from_pandas
    from mlflow.entities import DatasetInput, InputTag

    from moespac.datasets import DATA_DIR, get_benchmark

    bench, requests = record.get("benchmark"), record.get("requests")
    name = bench.get("name") if isinstance(bench, dict) else record["config"].get("benchmark")
    if not name or not isinstance(requests, list) or not requests:
        return None
    frame = pd.DataFrame([dict(prompt_id=str(r.get("prompt_id", r.get("id"))), turn=int(r.get("turn") or 1),
                               prompt_tokens=r.get("prompt_tokens")) for r in requests])
    try:
        info = get_benchmark(name)
    except MoespacError:  # not one of the seven: no prompt file to name as the source
        return None
    source = (f"https://huggingface.co/datasets/{info.hub_id}" if record["config"].get("source") == "hub"
              else str(DATA_DIR / f"{info.name}.jsonl"))
    with warnings.catch_warnings():  # MLflow's own: the local-file source is "ambiguous" (it registers it twice),
        warnings.simplefilter("ignore")  # integer columns cannot hold NaN, a pandas 4 deprecation in its digest
        entity = from_pandas(frame, source=source, name=info.name)._to_mlflow_entity()
    return DatasetInput(entity, [InputTag("mlflow.data.context", "prompts")])


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
    stale: int = 0
    """Runs deleted because their record file now holds another configuration (e.g. a changed profile)."""
    skipped: list = field(default_factory=list)
    """Files that are not result records to load (failure records, files without a config hash)."""
    invalid: list = field(default_factory=list)
    """Records that could not be read or break the schema; each is left out, the rest are loaded."""
    runs: dict = field(default_factory=dict)
    """Record path -> {study: its run id} ('outputs' -> {'outputs': run id})."""


EXPERIMENT_KIND = "custom_model_development"  # MLflow's tag value for a training/benchmark experiment: the
# UI then opens its runs table, not the GenAI view (traces, evaluations) that an untagged new experiment gets


def study_description(study: str) -> str:
    """What an experiment holds, for its MLflow description."""
    from moespac.analysis.outputs import OUTPUTS

    if study in OUTPUTS and OUTPUTS[study].kind == "table":
        return (f"{OUTPUTS[study].title}: one run per cell of the table (result record), timing label in tag "
                "moespac.timing.")
    if study.startswith("sweep_"):
        return (f"Sweep of {study.removeprefix('sweep_')} (Figures 5-7): one run per point and method "
                "(result record), timing label in tag moespac.timing.")
    return {"traces": "Engine runs that recorded the activation traces the simulated cells replay (measured).",
            "overhead": "MoE-SpAc's scheduler overhead (Section 3.4), measured on this machine.",
            "smoke": "Smoke runs of the engine on each supported architecture (measured).",
            "outputs": "The regenerated tables, figures and audit page (paper_figs/) as artifacts of one run."
            }.get(study, f"Result records of study {study!r}.")


class Store:
    """An MLflow client over one store, with the experiments and the runs (by experiment and key) it holds."""

    def __init__(self, uri: str, artifact_root: str):
        from mlflow.tracking import MlflowClient

        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)  # creates / migrates the SQLite schema once, here
        self.artifact_root = Path(artifact_root).resolve()
        self.experiments: dict[str, str] = {}
        self._described: set[str] = set()
        self.runs: dict[tuple[str, str], object] = {}  # (experiment id, run key) -> Run
        for exp in self.client.search_experiments():
            if exp.name.startswith(PREFIX):
                self.experiments[exp.name] = exp.experiment_id
        for run in self._search(list(self.experiments.values())):
            key = run.data.tags.get(KEY_TAG)
            if key:
                self.runs[run.info.experiment_id, key] = run

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
        """The study's experiment (created on first use), with its description and kind set."""
        name = f"{PREFIX}{study}"
        if name not in self.experiments:
            location = (self.artifact_root / study).as_uri()
            self.experiments[name] = self.client.create_experiment(name, artifact_location=location)
        if name not in self._described:  # also an experiment made by an older ingest
            self.client.set_experiment_tag(self.experiments[name], "mlflow.note.content", study_description(study))
            self.client.set_experiment_tag(self.experiments[name], "mlflow.experimentKind", EXPERIMENT_KIND)
            self._described.add(name)
        return self.experiments[name]

    def log(self, run_id: str, params: dict, metrics: dict, tags: dict, at_ms: int) -> None:
        from mlflow.entities import Metric, Param, RunTag

        params_l = [Param(k, v) for k, v in params.items()]
        metrics_l = [Metric(k, v, at_ms, 0) for k, v in metrics.items()]
        tags_l = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(params_l), len(metrics_l), len(tags_l)), BATCH):
            self.client.log_batch(run_id, metrics=metrics_l[i:i + BATCH], params=params_l[i:i + BATCH],
                                  tags=tags_l[i:i + BATCH])


def ingest(studies: dict[str, list[str]], outputs: list[str] = (), uri: str | None = None,
           artifact_root: str = DEFAULT_ARTIFACTS) -> IngestSummary:
    """Load every record of every study: one run per (study, record)."""
    uri = tracking_uri(uri)
    # one ingest at a time per store: the second reads the runs the first made, so they converge to one run
    # per record and study (MLflow has no unique key on a tag to enforce it)
    with file_lock(_lock_path(uri, artifact_root)):
        store = Store(uri, artifact_root)
        summary = IngestSummary(uri)
        membership: dict[str, list[str]] = {}
        for study, paths in studies.items():
            for p in paths:
                member_of = membership.setdefault(str(p), [])
                if study not in member_of:
                    member_of.append(study)
        for path, member_of in membership.items():
            record = _read(path, summary)
            if record is not None:
                row = table_row(record, path)
                summary.runs[path] = {study: _ingest_one(store, record, path, study, member_of, row, summary)
                                      for study in member_of}
        _drop_stale(store, summary)
        if outputs:
            summary.runs["outputs"] = {"outputs": _ingest_outputs(store, list(outputs), summary)}
    return summary


def _drop_stale(store: Store, summary: IngestSummary) -> None:
    """Delete the runs of a record file loaded now whose run key is not the file's: the file was rewritten with
    another configuration (its config hash changed), so the old run describes a record that no longer exists."""
    current = {run_id for by_study in summary.runs.values() for run_id in by_study.values()}
    loaded = {(store.experiments[f"{PREFIX}{study}"], path)
              for path, by_study in summary.runs.items() for study in by_study}
    for (experiment, key), run in list(store.runs.items()):
        if (experiment, run.data.tags.get("moespac.record_path")) in loaded and run.info.run_id not in current:
            store.client.delete_run(run.info.run_id)
            del store.runs[experiment, key]
            summary.stale += 1


def _lock_path(uri: str, artifact_root: str) -> Path:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):] + ".lock")
    return Path(artifact_root) / ".ingest.lock"


def _read(path: str, summary: IngestSummary) -> dict | None:
    """The record at `path` if it is one to load; otherwise None, with the reason noted (and printed, one line)."""
    from moespac.bench.record_files import validate_record

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


def _ingest_one(store: Store, record: dict, path: str, study: str, studies: list[str], row: dict | None,
                summary: IngestSummary) -> str:
    key = run_key(record)
    tags = tags_of(record, path, study, studies, row)
    experiment = store.experiment(study)
    old = store.runs.get((experiment, key))
    if old is not None and old.data.tags.get(CONTENT_TAG) == tags[CONTENT_TAG] and old.info.status == "FINISHED":
        summary.unchanged += 1  # ingested before, unchanged (an interrupted one is redone)
        return old.info.run_id
    if old is not None:  # a changed or half-written run is replaced: MLflow cannot move a run's start time
        store.client.delete_run(old.info.run_id)
    start, end = run_times(record, path)
    run = store.client.create_run(experiment, start_time=start, run_name=run_name(record, tags), tags={KEY_TAG: key})
    run_id = run.info.run_id
    content = tags.pop(CONTENT_TAG)
    store.log(run_id, params_of(record), metrics_of(record, row), tags, end)
    prompts = prompt_set(record) if row is not None else None
    if prompts is not None:
        store.client.log_inputs(run_id, [prompts])
    store.client.log_artifact(run_id, path, artifact_path="record")
    trace = trace_summary(record)
    if trace is not None:
        store.client.log_dict(run_id, trace, "trace_summary.json")
    store.client.set_tag(run_id, CONTENT_TAG, content)
    store.client.set_terminated(run_id, "FINISHED", end_time=end)  # last: a run interrupted before this is redone
    if old is None:
        summary.created += 1
    else:
        summary.updated += 1
    store.runs[experiment, key] = store.client.get_run(run_id)
    return run_id


def _ingest_outputs(store: Store, outputs: list[str], summary: IngestSummary) -> str:
    """Tables, figures and the audit page as artifacts of one run (moespac/outputs, key 'outputs')."""
    digest = hashlib.sha256()
    for p in sorted(outputs):
        digest.update(p.encode())
        digest.update(Path(p).read_bytes())
    content = digest.hexdigest()[:16]
    experiment = store.experiment("outputs")
    old = store.runs.get((experiment, "outputs"))
    if old is not None and old.data.tags.get(CONTENT_TAG) == content and old.info.status == "FINISHED":
        return old.info.run_id
    if old is None:
        run_id = store.client.create_run(experiment, run_name="paper_figs",
                                         tags={KEY_TAG: "outputs"}).info.run_id
    else:
        run_id = old.info.run_id
    for p in outputs:
        store.client.log_artifact(run_id, p, artifact_path=str(Path(p).parent))
    store.client.set_tag(run_id, CONTENT_TAG, content)
    store.client.set_terminated(run_id, "FINISHED")
    store.runs[experiment, "outputs"] = store.client.get_run(run_id)
    return run_id
