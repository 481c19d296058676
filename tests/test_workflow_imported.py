"""Bring your own routing in the pipeline: a pair of kind `imported` (a serving stack's per-token routing, no
models) drives the simulated cells. The trace rule runs `moespac import-trace` on the pair's file of each
benchmark, the cells replay it, the record names the model that routed; bad uses fail before any job."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from test_import_trace import routing, sglang_response, write_lines
from test_workflow import TINY, assert_refused_before_any_job, snakemake

SPEC = "qwen3-30b-a3b"  # 48 MoE layers x 128 experts, top-8


def imported_config(tmp_path, edit=None):
    rng = np.random.default_rng(0)
    (tmp_path / "dumps").mkdir(exist_ok=True)
    responses = [sglang_response(f"q{i}", routing(rng, p + c - 1, 48, 8, 128), p, accept_rate=0.6, verify_ct=4)
                 for i, (p, c) in enumerate([(5, 12), (4, 9), (6, 10)])]
    write_lines(tmp_path / "dumps" / "gsm8k.jsonl", responses)
    config = yaml.safe_load(TINY.read_text())
    config["pairs"]["served"] = {"imported": {"format": "sglang", "model_spec": SPEC, "model": "Qwen/Qwen3-30B-A3B",
                                              "files": {"gsm8k": "dumps/gsm8k.jsonl"}},
                                 "label": "Qwen3-30B-A3B routing served by SGLang (imported)"}
    config["simulation"].update(pair="served", limit=2)
    config["table4"]["batch_sizes"] = [1]
    if edit:
        edit(config)
    path = tmp_path / "imported.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


CELL = f"results/simulated/rtx4090-pcie4/{SPEC}/qwen3-4b-fp8/served/gsm8k/moespac/g4-b1-n6-c0.25.json"


def test_an_imported_pair_drives_the_simulated_cells(tmp_path):
    config = imported_config(tmp_path)
    plan = snakemake("-n", "-p", "--cores", 1, "--configfile", config, cwd=tmp_path)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert "moespac import-trace dumps/gsm8k.jsonl --format sglang" in plan.stdout
    assert "--from-trace results/traces/served/gsm8k/g4-b1-n6.npz" in plan.stdout
    r = snakemake(CELL, "--cores", 1, "--configfile", config, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = json.loads((tmp_path / CELL).read_text())
    c = rec["config"]
    assert c["source"] == "imported" and c["imported"]["format"] == "sglang-routed-experts"
    assert c["target_id"] == "Qwen/Qwen3-30B-A3B" and rec["benchmark"]["source"] == "imported"
    assert rec["counts"]["requests"] == 2  # simulation.limit: the file's first two requests
    trace = json.loads((tmp_path / "results/traces/served/gsm8k/g4-b1-n6.json").read_text())
    assert trace["kind"] == "import-trace" and trace["max_new_tokens"] == 6 and trace["limit"] == 2
    assert trace["decoded_tokens"] == 2 * 5  # cut to the cell's 6 new tokens (12 and 9 served): 5 rows each


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["engine"].update(pair="served"), ["engine.pair", "'served' is imported routing"]),
    (lambda c: c["table4"].update(batch_sizes=[1, 2]), ["table4.batch_sizes", "one request at a time"]),
    (lambda c: c["table1"].update(methods=["moespac", "fate"]), ["table1.methods", "'fate'", "cross_layer_topk"]),
    (lambda c: c.update(benchmarks=["gsm8k", "humaneval"]), ["'benchmarks'", "'humaneval' has no file"]),
    (lambda c: c["pairs"]["served"]["imported"]["files"].update(gsm9k="x.jsonl"), ["files.gsm9k", "gsm9k"]),
    (lambda c: c["pairs"]["served"].update(build="tiny"), ["pairs", "served"]),
], ids=["engine-pair", "batch", "cross-layer-method", "missing-file", "unknown-benchmark", "two-kinds"])
def test_bad_imported_config_fails_before_any_job_naming_the_key(tmp_path, edit, needles):
    assert_refused_before_any_job(tmp_path, imported_config(tmp_path, edit), needles)
