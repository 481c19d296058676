"""MLflow ingest: one run per result record and study, keyed by config hash, idempotent; one metric vocabulary
for every record kind; read back through the REST API."""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from moespac.tracking import CONTENT_TAG, KEY_TAG, flatten, ingest, metrics_of, params_of
from records import simulated_record


def bench_record(policy="moespac", benchmark="gsm8k", gamma=8, tps=12.5):
    """A schema-valid simulated bench record with these values (tests/records.py) and a NaN and a boolean metric;
    filed under the method of the policy's name (each policy used here is one)."""
    rec = simulated_record(benchmark, tps, method=policy, policy=policy, gamma=gamma, target="proxy/target",
                           draft="proxy/draft" if gamma else None)
    rec["metrics"].update(hot_cold_accuracy=float("nan"), flag=True)
    return rec


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory):
    """An empty MLflow SQLite store, created and migrated once (migrations cost seconds)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def db_uri(tmp_path, migrated_db):
    shutil.copy(migrated_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    out = {}
    for name, kw in dict(spac=dict(), lru=dict(policy="lru", gamma=0, tps=7.0),
                         spac_cnn=dict(benchmark="cnn-dm", tps=10.0)).items():
        path = d / f"{name}.json"
        path.write_text(json.dumps(bench_record(**kw)))
        out[name] = path
    return out


def test_flatten_params_and_metrics_keep_what_mlflow_can_hold():
    rec = bench_record()
    assert flatten({"a": {"b": 1, "c": [1, 2]}}) == {"a.b": 1, "a.c": [1, 2]}
    params = params_of(rec)
    assert params["policy"] == "moespac" and params["gamma"] == "8" and params["draft"] == "proxy/draft"
    assert params_of(bench_record(gamma=0))["draft"] == "null"  # JSON for everything but strings
    metrics = metrics_of(rec)
    assert metrics["tokens_per_s"] == 12.5 and metrics["counters.hits"] == float(rec["metrics"]["counters"]["hits"])
    assert metrics["tokens_per_s.std"] == 0.5  # two requests: the spread beside the mean
    assert "hot_cold_accuracy" not in metrics and "flag" not in metrics  # NaN and booleans are not metrics
    assert "acceptance_rate" in metrics
    # one request: a summary is its mean alone, not seven copies of one number
    single = bench_record()
    for name, value in single["metrics"].items():
        if isinstance(value, dict) and "n" in value:
            value["n"] = 1
    names = set(metrics_of(single))
    assert "tokens_per_s" in names and not {n for n in names if n.startswith("tokens_per_s.")}
    assert len(names) < len(metrics)


def test_every_record_kind_logs_the_tables_tps_under_one_name(tmp_path):
    """A wrapped record's decode tokens/s and an engine record's per-request mean are the same column,
    `tokens_per_s`, equal to the table row's TPS; the machine is named one way for both kinds."""
    from moespac.analysis.rows import record_row
    from moespac.record import make_record
    from moespac.tracking import table_row, tags_of

    requests = [dict(id="gsm8k/1", new_tokens=8, decode_s=0.5, prefill_s=0.1, decode_tokens_per_s=14.0,
                     latency_s=0.6, prompt_tokens=12)]
    from baselines.programs._common import wrapped_record

    wrapped = wrapped_record("accelerate", dict(system="accelerate", model_pair=str(tmp_path / "pair"),
                                                benchmark="gsm8k", max_new_tokens=8), requests, method="accelerate")
    path = tmp_path / "w.json"
    path.write_text(json.dumps(wrapped))
    row = record_row(path)
    metrics = metrics_of(wrapped, table_row(wrapped, path))
    assert metrics["tokens_per_s"] == row["tps"] == 14.0 and metrics["latency_s"] == row["latency_s"] == 0.6
    assert "decode_tokens_per_s_mean" not in metrics and "latency_s_mean" not in metrics
    measured = make_record("bench", "measured", {"benchmark": "gsm8k"}, {})
    for env in (wrapped["environment"], measured["environment"]):
        assert tags_of(dict(measured, environment=env), path, "table1", ["table1"], None)["moespac.hardware"] \
            == row["hardware"]


def test_ingest_is_idempotent_and_updates_changed_records(tmp_path, records, db_uri):
    uri = db_uri
    studies = {"table1": [str(records["spac"]), str(records["lru"])], "table2": [str(records["spac"]),
                                                                              str(records["spac_cnn"])]}
    first = ingest(studies, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (first.created, first.updated, first.unchanged) == (4, 0, 0)  # spac serves both studies: a run in each
    again = ingest(studies, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (again.created, again.updated, again.unchanged) == (0, 0, 4)
    assert again.runs == first.runs
    # the same config measured again (new content, same config hash): its run is replaced, not duplicated
    changed = tmp_path / "spac.json"
    rec = json.loads(Path(records["spac"]).read_text())
    rec["metrics"]["tokens_per_s"]["mean"] = 99.0
    changed.write_text(json.dumps(rec))
    third = ingest({"table1": [str(changed)]}, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (third.created, third.updated) == (0, 1)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = {e.name: e for e in client.search_experiments()}
    assert {"moespac/table1", "moespac/table2"} <= set(exps)
    for name in ("moespac/table1", "moespac/table2"):  # described, and opened as a runs table (not GenAI)
        assert exps[name].tags["mlflow.experimentKind"] == "custom_model_development"
        assert exps[name].tags["mlflow.note.content"].startswith(f"Table {name[-1]}:")
    runs = client.search_runs([e.experiment_id for e in exps.values()])
    assert len(runs) == 4 and len({(r.info.experiment_id, r.data.tags[KEY_TAG]) for r in runs}) == 4
    spac = client.get_run(third.runs[str(changed)]["table1"])
    assert spac.data.metrics["tokens_per_s"] == 99.0 and spac.data.tags["moespac.studies"] == "table1"
    assert client.get_run(first.runs[str(records["spac"])]["table1"]).info.lifecycle_stage == "deleted"
    assert spac.info.experiment_id == exps["moespac/table1"].experiment_id
    assert spac.data.tags["moespac.timing"] == "simulated" and spac.data.tags["moespac.method"] == "moespac"
    assert spac.data.tags[CONTENT_TAG]
    assert [a.path for a in client.list_artifacts(spac.info.run_id, "record")] == ["record/spac.json"]
    # the record of both studies is a run in each, the same cell in both
    in_table2 = client.get_run(first.runs[str(records["spac"])]["table2"])
    assert in_table2.info.experiment_id == exps["moespac/table2"].experiment_id
    assert in_table2.data.tags[KEY_TAG] == spac.data.tags[KEY_TAG] and in_table2.data.tags["moespac.study"] == "table2"
    # the prompt set is the run's input dataset, named after the benchmark, its source the committed prompt file
    [prompts] = in_table2.inputs.dataset_inputs
    assert prompts.dataset.name == "gsm8k" and json.loads(prompts.dataset.source)["uri"].endswith("gsm8k.jsonl")
    assert {t.key: t.value for t in prompts.tags}["mlflow.data.context"] == "prompts"


def test_a_record_rewritten_with_another_config_leaves_no_stale_run(tmp_path, db_uri):
    """A cell's file rewritten under another configuration (here another hardware profile hash, as a changed
    profile gives) keeps one run: the old one describes a record that no longer exists, and is deleted."""
    from mlflow.tracking import MlflowClient

    cell, other = tmp_path / "cell.json", tmp_path / "other.json"
    cell.write_text(json.dumps(bench_record()))
    other.write_text(json.dumps(bench_record(policy="lru", gamma=0, tps=7.0)))
    studies = {"table1": [str(cell), str(other)], "table2": [str(cell)]}
    first = ingest(studies, uri=db_uri, artifact_root=str(tmp_path / "art"))
    rec = simulated_record("gsm8k", 11.0, method="moespac", policy="moespac", gamma=8, target="proxy/target",
                           draft="proxy/draft",
                           hardware_sha256="another-profile")
    cell.write_text(json.dumps(rec))
    only_table1 = ingest({"table1": [str(cell), str(other)]}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert (only_table1.created, only_table1.stale, only_table1.unchanged) == (1, 1, 1)
    client = MlflowClient(tracking_uri=db_uri)
    assert client.get_run(first.runs[str(cell)]["table1"]).info.lifecycle_stage == "deleted"
    # table2 was not loaded this time: its run of the old record stays until table2 is loaded again
    assert client.get_run(first.runs[str(cell)]["table2"]).info.lifecycle_stage == "active"
    both = ingest(studies, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert (both.created, both.stale) == (1, 1)
    exps = [e.experiment_id for e in client.search_experiments() if e.name.startswith("moespac/")]
    paths = [r.data.tags["moespac.record_path"] for r in client.search_runs(exps)]
    assert sorted(paths) == sorted([str(cell), str(other), str(cell)])  # one run per (study, file)


def test_runs_start_and_end_when_the_run_ran(tmp_path, db_uri):
    """A timed record's run starts and ends at the record's own times (not the ingest's); a simulated record is
    timeless, so its run is placed at the time its file was written."""
    import calendar
    import os

    from mlflow.tracking import MlflowClient

    from moespac.record import make_record

    timed = make_record("overhead", "measured", {"alpha": 0.8}, {"x": 1.0})
    timed.update(started="2026-01-02T03:04:05Z", created="2026-01-02T03:14:05Z")
    timed_path = tmp_path / "timed.json"
    timed_path.write_text(json.dumps(timed))
    sim_path = tmp_path / "sim.json"
    sim_path.write_text(json.dumps(bench_record()))
    os.utime(sim_path, (1_700_000_000, 1_700_000_000))
    summary = ingest({"overhead": [str(timed_path)], "table1": [str(sim_path)]}, uri=db_uri,
                     artifact_root=str(tmp_path / "art"))
    client = MlflowClient(tracking_uri=db_uri)
    run = client.get_run(summary.runs[str(timed_path)]["overhead"]).info
    start = calendar.timegm((2026, 1, 2, 3, 4, 5, 0, 0, 0)) * 1000
    assert (run.start_time, run.end_time) == (start, start + 600_000)
    sim = client.get_run(summary.runs[str(sim_path)]["table1"]).info
    assert sim.start_time == sim.end_time == 1_700_000_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(base, endpoint, body):
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_mlflow_server_rest_api_shows_one_run_per_record(tmp_path, records, db_uri):
    uri = db_uri
    ingest({"table1": [str(p) for p in records.values()]}, uri=uri, artifact_root=str(tmp_path / "art"))
    ingest({"table1": [str(p) for p in records.values()]}, uri=uri, artifact_root=str(tmp_path / "art"))
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, "mlflow server exited"
            assert time.time() < deadline, "mlflow server did not come up"
            time.sleep(1)
        exps = _post(base, "experiments/search", {"max_results": 100})["experiments"]
        ids = [e["experiment_id"] for e in exps if e["name"].startswith("moespac/")]
        runs = _post(base, "runs/search", {"experiment_ids": ids, "max_results": 100}).get("runs", [])
        assert len(runs) == len(records)
        by_key = {t["value"]: r for r in runs for t in r["data"]["tags"] if t["key"] == KEY_TAG}
        for path in records.values():
            rec = json.loads(path.read_text())
            run = by_key[rec["config_hash"]]
            params = {p["key"]: p["value"] for p in run["data"]["params"]}
            metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
            assert params["policy"] == rec["config"]["policy"] and params["benchmark"] == rec["config"]["benchmark"]
            assert metrics["tokens_per_s"] == rec["metrics"]["tokens_per_s"]["mean"]
            assert metrics["latency_s"] == rec["metrics"]["latency_s"]["mean"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_bad_records_are_left_out_one_line_each_and_the_rest_load(tmp_path, records, db_uri, capsys):
    """A corrupt file, JSON that is not a record, and a record that breaks the schema among good ones: each is
    left out with one line naming its file, every good record after them still loads, and the CLI exits 1."""
    from moespac.cli import main

    torn = tmp_path / "torn.json"
    torn.write_text(records["spac"].read_text()[:200])
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    wrong = tmp_path / "wrong.json"
    rec = json.loads(records["lru"].read_text())
    rec["metrics"]["tokens_per_s"] = "fast"
    wrong.write_text(json.dumps(rec))
    paths = [str(torn), str(listed), str(wrong), str(records["spac"]), str(records["spac_cnn"])]
    summary = ingest({"table1": paths}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert summary.created == 2 and [b["path"] for b in summary.invalid] == paths[:3]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith(f"record {p}: left out: ") for line, p in zip(err, paths))
    assert "tokens_per_s" in err[2]
    rc = main(["track", "ingest", "--tracking-uri", db_uri, "--artifact-root", str(tmp_path / "art"),
               "--study", "table1", *paths])
    assert rc == 1 and "0 runs created" in capsys.readouterr().out


_CONCURRENT = """
import sys
from moespac.tracking import ingest
ingest({"table1": sys.argv[3:]}, uri=sys.argv[1], artifact_root=sys.argv[2])
"""


def test_two_concurrent_ingests_make_one_run_per_record(tmp_path, db_uri):
    paths = []
    for i, policy in enumerate(["moespac", "lru", "lfu", "hybrimoe"] * 3):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(bench_record(policy=policy, benchmark=f"b{i}", tps=float(i))))
        paths.append(str(path))
    args = [sys.executable, "-c", _CONCURRENT, db_uri, str(tmp_path / "art"), *paths]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=db_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.tags[KEY_TAG] for r in runs) == sorted(json.loads(Path(p).read_text())["config_hash"]
                                                                 for p in paths)


def test_a_run_left_running_by_a_killed_ingest_is_finished_by_the_rerun(tmp_path, records, db_uri):
    """kill -9 after the run's content was tagged but before it was marked finished: the rerun redoes it."""
    from mlflow.tracking import MlflowClient

    path = str(records["spac"])
    first = ingest({"table1": [path]}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    client = MlflowClient(tracking_uri=db_uri)
    run_id = first.runs[path]["table1"]
    client.update_run(run_id, status="RUNNING")  # what a kill between the last two calls leaves
    again = ingest({"table1": [path]}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert (again.created, again.updated, again.unchanged) == (0, 1, 0)
    redone = client.get_run(again.runs[path]["table1"]).info
    assert redone.status == "FINISHED" and client.get_run(run_id).info.lifecycle_stage == "deleted"
    exps = [e.experiment_id for e in client.search_experiments()]
    assert [r.info.run_id for r in client.search_runs(exps)] == [redone.run_id]


def test_two_generate_runs_that_differ_only_by_prompt_are_two_runs(tmp_path, micro_dir, db_uri):
    from moespac.cli import main

    paths = []
    for i, prompt in enumerate(["Hello", "Goodbye"]):
        path = tmp_path / f"g{i}.json"
        assert main(["generate", "--target", str(micro_dir / "target"), "--draft", str(micro_dir / "draft"), "--prompt",
                     prompt, "--max-new-tokens", "2", "--greedy", "--json", str(path)]) == 0
        paths.append(str(path))
    hashes = {json.loads(Path(p).read_text())["config_hash"] for p in paths}
    assert len(hashes) == 2  # every input that changes a result is in the hash
    summary = ingest({"smoke": paths}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert summary.created == 2 and not summary.invalid


def test_kill_9_mid_ingest_then_rerun_leaves_one_finished_run_per_record(tmp_path, db_uri):
    """A real SIGKILL once the first run exists (the rest unwritten or half-written), then the same ingest again:
    every record has exactly one run and every run is FINISHED."""
    import signal

    from mlflow.tracking import MlflowClient

    paths = []
    for i in range(40):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(bench_record(policy="lru", benchmark=f"b{i}", tps=float(i))))
        paths.append(str(path))
    args = [sys.executable, "-c", _CONCURRENT, db_uri, str(tmp_path / "art"), *paths]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = MlflowClient(tracking_uri=db_uri)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        exps = [e.experiment_id for e in client.search_experiments()]
        if exps and client.search_runs(exps, max_results=1):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the ingest finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    summary = ingest({"table1": paths}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert len(runs) == len(paths) == len({r.data.tags[KEY_TAG] for r in runs})
    assert all(r.info.status == "FINISHED" for r in runs)
    assert summary.created + summary.updated + summary.unchanged == len(paths)
