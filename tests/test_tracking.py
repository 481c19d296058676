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

from moespac.record import make_record
from moespac.tracking import CONTENT_TAG, KEY_TAG, flatten, ingest, metrics_of, params_of


def bench_record(policy="moespac", benchmark="gsm8k", gamma=8, tps=12.5, timing="simulated"):
    config = dict(benchmark=benchmark, policy=policy, gamma=gamma, batch_size=1, max_new_tokens=64, cache_ratio=0.25,
                  timing=timing, hardware="rtx4090-pcie4", model_spec="qwen3-30b-a3b", target="proxy/target",
                  target_id="proxy/target@abc", draft="proxy/draft" if gamma else None)
    metrics = dict(requests=2, tokens_per_s=dict(n=2, mean=tps, std=0.5), latency_s=dict(n=2, mean=5.0),
                   acceptance_rate=0.75 if gamma else None, hit_rate=0.5, counters=dict(hits=10, loads=0),
                   hot_cold_accuracy=float("nan"), flag=True)
    return make_record("bench", timing, config, metrics, requests=[dict(id="a", tokens_per_s=tps)],
                       simulation=dict(topology_mapping=None, draft=dict(spec="qwen3-4b-fp8")))


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
    assert metrics["tokens_per_s.mean"] == 12.5 and metrics["counters.hits"] == 10.0
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
            assert metrics["latency_s.mean"] == 5.0
    finally:
        server.terminate()
        server.wait(timeout=30)
