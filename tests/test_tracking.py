"""MLflow ingest: one run per result record, keyed by config hash, idempotent; read back through the REST API."""

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
    """A schema-valid simulated bench record with these values (tests/records.py) and a NaN and a boolean metric."""
    rec = simulated_record(benchmark, tps, policy=policy, gamma=gamma, target="proxy/target",
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
    assert metrics["tokens_per_s.mean"] == 12.5 and metrics["counters.hits"] == float(rec["metrics"]["counters"]["hits"])
    assert "hot_cold_accuracy" not in metrics and "flag" not in metrics  # NaN and booleans are not metrics
    assert "acceptance_rate" in metrics


def test_ingest_is_idempotent_and_updates_changed_records(tmp_path, records, db_uri):
    uri = db_uri
    studies = {"table1": [str(records["spac"]), str(records["lru"])], "table2": [str(records["spac"]),
                                                                              str(records["spac_cnn"])]}
    first = ingest(studies, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (first.created, first.updated, first.unchanged) == (3, 0, 0)
    again = ingest(studies, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (again.created, again.updated, again.unchanged) == (0, 0, 3)
    assert again.runs == first.runs
    # the same config measured again (new content, same config hash): the run is updated, not duplicated
    changed = tmp_path / "spac.json"
    rec = json.loads(Path(records["spac"]).read_text())
    rec["metrics"]["tokens_per_s"]["mean"] = 99.0
    changed.write_text(json.dumps(rec))
    third = ingest({"table1": [str(changed)]}, uri=uri, artifact_root=str(tmp_path / "art"))
    assert (third.created, third.updated) == (0, 1)
    assert third.runs[str(changed)] == first.runs[str(records["spac"])]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = {e.name: e.experiment_id for e in client.search_experiments()}
    assert {"moespac/table1", "moespac/table2"} <= set(exps)
    runs = client.search_runs(list(exps.values()))
    assert len(runs) == 3 and len({r.data.tags[KEY_TAG] for r in runs}) == 3
    spac = client.get_run(first.runs[str(records["spac"])])
    assert spac.data.metrics["tokens_per_s.mean"] == 99.0 and spac.data.tags["moespac.studies"] == "table1"
    assert spac.info.experiment_id == exps["moespac/table1"]  # filed under its first study
    assert spac.data.tags["moespac.timing"] == "simulated" and spac.data.tags["moespac.method"] == "moespac"
    assert spac.data.tags[CONTENT_TAG]
    assert [a.path for a in client.list_artifacts(spac.info.run_id, "record")] == ["record/spac.json"]


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
            assert metrics["tokens_per_s.mean"] == rec["metrics"]["tokens_per_s"]["mean"]
            assert metrics["latency_s.mean"] == rec["metrics"]["latency_s"]["mean"]
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
    run_id = first.runs[path]
    client.update_run(run_id, status="RUNNING")  # what a kill between the last two calls leaves
    again = ingest({"table1": [path]}, uri=db_uri, artifact_root=str(tmp_path / "art"))
    assert (again.created, again.updated, again.unchanged) == (0, 1, 0) and again.runs[path] == run_id
    assert client.get_run(run_id).info.status == "FINISHED"


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
