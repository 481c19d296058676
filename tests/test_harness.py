"""`moespac bench` on a micro pair: records that validate, simulated records, skips, failures, stale records."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from moespac import datasets
from moespac.bench import harness
from moespac.bench.record_files import SCHEMA_PATH, failure_path, load_valid_record, validate_record, write_result
from moespac.cli import main
from moespac.engine import speculative
from moespac.errors import MoespacError
from moespac.hashing import stable_hash
from moespac.sim.profile import load_profile
from moespac.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent


def bench(pair, out, *extra):
    return main(["bench", "--model-pair", str(pair), "--gamma", "2", "--no-progress", "--out", str(out),
                 *map(str, extra)])


@pytest.fixture(scope="module")
def measured(micro_dir, tmp_path_factory):
    """A measured gsm8k record (2 prompts, 8 new tokens, 1 warm-up call) and its trace."""
    d = tmp_path_factory.mktemp("bench")
    out, trace = d / "gsm8k.json", d / "gsm8k.npz"
    assert bench(micro_dir, out, "--benchmark", "gsm8k", "--limit", 2, "--max-new-tokens", 8, "--trace", trace) == 0
    return out, trace


def test_measured_record_validates_and_accounts_for_every_request(measured):
    out, trace_path = measured
    rec = validate_record(out)
    assert rec["kind"] == "bench" and rec["timing"] == "measured" and rec["profile"] is None
    assert rec["config_hash"] == stable_hash(rec["config"])
    assert rec["config"]["gamma"] == 2 and rec["config"]["max_new_tokens"] == 8 and rec["config"]["batch_size"] == 1
    assert rec["counts"] == {"prompts": 2, "requests": 2, "skipped": 0, "warmup": 1}
    assert rec["models"]["target_id"].startswith("micro") and "@" in rec["models"]["target_id"]
    reqs, calls, m = rec["requests"], rec["calls"], rec["metrics"]
    assert [r["call"] for r in reqs] == [0, 1] and [c["size"] for c in calls] == [1, 1]
    for r, c in zip(reqs, calls):
        assert r["prefill_s"] == c["prefill_s"] > 0 and r["decode_s"] == c["decode_s"] > 0
        assert r["latency_s"] == r["prefill_s"] + r["decode_s"]
        assert 1 <= r["new_tokens"] <= 8 and r["drafted"] == 2 * r["steps"]
        assert r["tokens_per_s"] == (r["new_tokens"] - 1) / r["decode_s"]
    assert m["new_tokens"] == sum(r["new_tokens"] for r in reqs)
    assert m["acceptance_rate"] == m["accepted"] / m["drafted"]
    # the paper's alpha: a step accepts drafts until its first rejection, so alpha = accepted / (accepted + rejected)
    rejected = sum(r["rejected"] for r in reqs)
    assert all(r["accepted"] + 2 * r["rejected"] <= 2 * r["steps"] for r in reqs)  # a rejecting step accepts < 2
    a = m["alpha"]
    assert a == m["accepted"] / (m["accepted"] + rejected)
    assert m["omega_from_alpha"] == pytest.approx((1 - a ** 3) / (1 - a) if a < 1 else 3.0)
    assert m["link_bytes"] == sum(c["counters"]["bytes_copied"] for c in calls)
    cnt = m["counters"]
    assert m["hit_rate"] == cnt["hits"] / (cnt["hits"] + cnt["loads"] + cnt["host"])
    assert m["latency_s"]["n"] == 2 and m["latency_s"]["mean"] == pytest.approx(sum(r["latency_s"] for r in reqs) / 2)
    assert 0 <= m["hot_cold_accuracy"] <= 1 and m["smape"] is not None
    trace = load_trace(trace_path)  # one trace for the run; the warm-up call is not in it
    assert rec["trace"]["id"] == trace.trace_id() and rec["trace"]["path"] == str(trace_path)
    assert sorted(set(trace.steps["step_request"].tolist())) == [0, 1]
    assert trace.meta["bench"]["rows"] == [{k: r[k] for k in trace.meta["bench"]["rows"][0]} for r in reqs]


def test_the_warm_up_profiles_on_prompts_that_are_not_measured(measured):
    """The warm-up call is the measured run's profiling run (Fiddler's popularity, MoE-Infinity's matrix): it
    runs a prompt of the benchmark that is not measured, and the record says so."""
    out, trace_path = measured
    rec = validate_record(out)
    window = rec["policy"]["warmup_window"]
    assert window["source"] == "1 warm-up call(s) on other prompts, not measured" and window["entries"] > 0


def test_simulated_record_replays_the_trace_on_a_profile(measured, tmp_path):
    out, trace_path = measured
    sim_out = tmp_path / "sim.json"
    assert main(["bench", "--benchmark", "gsm8k", "--timing", "simulated", "--hardware", "rtx4090-pcie4",
                 "--from-trace", str(trace_path), "--out", str(sim_out)]) == 0
    rec, ref = validate_record(sim_out), json.loads(out.read_text())
    assert rec["timing"] == "simulated" and rec["profile"]["name"] == "rtx4090-pcie4"
    assert rec["profile"]["sha256"] == load_profile("rtx4090-pcie4").sha256 == rec["config"]["hardware_sha256"]
    assert rec["trace"]["id"] == ref["trace"]["id"] == rec["config"]["trace_id"]
    assert rec["trace"]["model"] == ref["models"]["target"] and rec["counts"]["warmup"] == 0
    facts = ("id", "new_tokens", "drafted", "accepted", "steps")
    assert [{k: r[k] for k in facts} for r in rec["requests"]] == [{k: r[k] for k in facts} for r in ref["requests"]]
    assert rec["requests"][0]["decode_s"] != ref["requests"][0]["decode_s"]  # replayed, not copied
    assert rec["config_hash"] != ref["config_hash"] and rec["simulation"]["model_spec"] == ref["models"]["target_id"]
    # a trace of another benchmark is refused, naming both
    assert main(["bench", "--benchmark", "qa", "--timing", "simulated", "--hardware", "h200",
                 "--from-trace", str(trace_path), "--out", str(tmp_path / "x.json")]) == 2



def test_a_record_carries_the_method_it_was_filed_under_and_tables_read_it(measured, tmp_path, capsys):
    from moespac.analysis.rows import record_row

    _, trace_path = measured  # recorded with the draft (gamma 2)
    replay = ["bench", "--benchmark", "gsm8k", "--timing", "simulated", "--hardware", "h200", "--no-bounds",
              "--from-trace", str(trace_path)]
    assert main([*replay, "--method", "hybrimoe-k2", "--out", str(tmp_path / "x.json")]) == 2  # K: MoE-SpAc's only
    assert "unknown method 'hybrimoe-k2'" in capsys.readouterr().err
    # the same policy and trace, filed under two rows: one run, two names (the hash says what ran)
    assert main([*replay, "--method", "lru-sd", "--out", str(tmp_path / "lru-sd.json")]) == 0
    assert main([*replay, "--policy", "lru", "--out", str(tmp_path / "plain.json")]) == 0
    named, plain = validate_record(tmp_path / "lru-sd.json"), validate_record(tmp_path / "plain.json")
    assert named["method"] == "lru-sd" and plain["method"] is None and named["config_hash"] == plain["config_hash"]
    assert (record_row("a", named)["method"], record_row("a", named)["label"]) == ("lru-sd", "LRU w/ SD (reference)")
    assert record_row("b", plain)["method"] == "lru w/ SD"  # no method: named by its policy spec, never guessed
    # a method that is not this run is refused before anything runs, naming both
    capsys.readouterr()
    assert main([*replay, "--method", "lru", "--out", str(tmp_path / "ar.json")]) == 2  # AR row, drafted trace
    err = capsys.readouterr().err
    assert "method 'lru' is policy 'lru' without a draft; this run is policy 'lru' with a draft" in err
    assert main([*replay, "--method", "moespac", "--policy", "lru", "--out", str(tmp_path / "m.json")]) == 2
    assert "method 'moespac' is policy 'moespac' with a draft; this run is policy 'lru'" in capsys.readouterr().err
    assert not any((tmp_path / n).exists() for n in ("ar.json", "m.json", "x.json"))

def test_batch_of_two_with_second_turns_simulated(micro_dir, tmp_path):
    # the target drafting for itself accepts every draft: 1 prefill token + one step of 2 drafts + 1 bonus
    out, target = tmp_path / "mt.json", str(micro_dir / "target")
    assert main(["bench", "--target", target, "--draft", target, "--gamma", "2", "--benchmark", "mt-bench",
                 "--limit", "2", "--batch-size", "2", "--max-new-tokens", "4", "--ignore-eos", "--timing", "simulated",
                 "--hardware", "h200", "--no-progress", "--out", str(out)]) == 0
    rec = validate_record(out)
    assert rec["config"]["batch_size"] == 2 and rec["counts"]["requests"] == 4
    assert [c["size"] for c in rec["calls"]] == [2, 2]
    first, second = rec["requests"][:2], rec["requests"][2:]
    assert [r["turn"] for r in first] == [1, 1] and [r["turn"] for r in second] == [2, 2]
    for a, b in zip(first, second):  # turn 2 = turn 1, the model's answer, then the second question
        assert b["id"] == f"{a['prompt_id']}#2" and b["call"] == 1 and b["prompt_tokens"] > a["prompt_tokens"]
        assert a["decode_s"] == rec["calls"][0]["decode_s"]
    facts = {(r["new_tokens"], r["steps"], r["drafted"], r["accepted"], r["omega"]) for r in rec["requests"]}
    assert facts == {(4, 1, 2, 2, 3.0)}
    m = rec["metrics"]
    assert (m["acceptance_rate"], m["alpha"], m["omega"], m["omega_from_alpha"]) == (1.0, 1.0, 3.0, 3.0)


def test_omega_from_alpha_and_summary_stats():
    from moespac.scheduler.metrics import omega

    assert omega(2, 0.5) == 1.75 and omega(8, 1.0) == 9.0
    assert omega(8, 0.0) == 1.0 and omega(8, None) is None and omega(0, 0.5) is None
    s = harness.stats([4.0, None, 1.0, 3.0, 2.0])
    assert s == dict(n=4, mean=2.5, std=pytest.approx(1.25 ** 0.5), p50=2.5, p90=pytest.approx(3.7), min=1.0, max=4.0)
    assert harness.stats([None])["mean"] is None


def test_prompt_longer_than_the_context_is_a_counted_skip(micro_dir, tmp_path):
    pair = tmp_path / "pair"
    shutil.copytree(micro_dir, pair)
    from moespac.models.loading import load_tokenizer

    tok = load_tokenizer(str(pair / "target"))
    prompts = datasets.seeded_sample(datasets.load_benchmark("qa"), 2, 0)
    lengths = {p.id: len(datasets.format_prompt(p, tok)) for p in prompts}
    short, long = sorted(lengths, key=lengths.get)
    assert lengths[short] < lengths[long]
    config = json.loads((pair / "target" / "config.json").read_text())
    config["max_position_embeddings"] = lengths[short] + 4 + 2 + 1  # the short prompt fits exactly
    (pair / "target" / "config.json").write_text(json.dumps(config))
    out = tmp_path / "qa.json"
    assert bench(pair, out, "--benchmark", "qa", "--limit", 2, "--max-new-tokens", 4, "--warmup", 0) == 0
    rec = validate_record(out)
    assert rec["counts"] == {"prompts": 2, "requests": 1, "skipped": 1, "warmup": 0}
    assert rec["requests"][0]["prompt_id"] == short and rec["skipped"][0]["id"] == long
    assert "exceeds the context" in rec["skipped"][0]["reason"]


def test_error_mid_run_writes_a_failure_record_and_spares_other_records(micro_dir, measured, tmp_path, monkeypatch):
    other = tmp_path / "other.json"
    shutil.copy(measured[0], other)
    before = other.read_bytes()
    real, calls = speculative.generate_batch, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom on the second prompt")
        return real(*args, **kwargs)

    monkeypatch.setattr(speculative, "generate_batch", flaky)
    out = tmp_path / "run.json"
    with pytest.raises(RuntimeError, match="boom"):
        bench(micro_dir, out, "--benchmark", "gsm8k", "--limit", 2, "--max-new-tokens", 4, "--warmup", 0)
    assert not out.exists() and len(calls) == 2
    fail = validate_record(failure_path(out))
    assert fail["kind"] == "failure" and fail["failed_kind"] == "bench"
    assert fail["error"]["last_line"] == "RuntimeError: boom on the second prompt"
    assert fail["config"]["benchmark"] == "gsm8k" and fail["config"]["max_new_tokens"] == 4
    assert other.read_bytes() == before and load_valid_record(other) is not None
    assert load_valid_record(out) is None  # missing: a pipeline reruns it
    write_result(out, json.loads(other.read_text()))  # a later success removes the stale failure record
    assert not failure_path(out).exists() and load_valid_record(out) is not None


def test_sigterm_mid_bench_writes_a_failure_record(micro_dir, tmp_path):
    """Snakemake and Slurm stop a job with SIGTERM: the run unwinds as from Ctrl-C, leaves its failure record
    (and no result), and exits 143."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "moespac", "bench", "--model-pair", str(micro_dir), "--gamma", "2", "--no-progress",
           "--benchmark", "gsm8k", "--limit", "50", "--max-new-tokens", "1024", "--warmup", "0", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    # past imports and model loading (both models' 'Loading weights ... 100%'), into the prompts, however slow the
    # machine: a fixed sleep sent the signal mid-import on a busy one. The run itself takes over a minute here
    # (50 prompts x 1024 tokens), so the signal comes while it generates.
    deadline = time.monotonic() + 300
    while "".join(chunks).count("100%|") < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    assert proc.poll() is None, "".join(chunks)[-2000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(chunks)
    assert proc.returncode == 143, err[-2000:]
    assert "terminated" in err and not out.exists()
    fail = validate_record(failure_path(out))
    assert fail["kind"] == "failure" and fail["failed_kind"] == "bench"


def test_load_valid_record_refuses_truncated_partial_invalid_failed_and_stale(measured, tmp_path, caplog):
    good = json.loads(measured[0].read_text())
    path = tmp_path / "r.json"
    path.write_text(json.dumps(good))
    assert load_valid_record(path, good["config_hash"]) == good

    def refused(text, needle):
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert load_valid_record(path) is None
        assert needle in caplog.text, caplog.text

    full = json.dumps(good)
    refused(full[: len(full) // 2], "not valid JSON")
    partial = dict(good, requests=good["requests"][:1])
    refused(json.dumps(partial), "partial")
    refused(json.dumps(dict(good, timing="guessed")), "schema violation at timing")
    no_metric = dict(good, metrics={k: v for k, v in good["metrics"].items() if k != "hit_rate"})
    refused(json.dumps(no_metric), "hit_rate")
    path.write_text(full)
    assert load_valid_record(path, "0" * 12) is None  # another config's record
    failure_path(path).write_text("{}")
    assert load_valid_record(path) is None  # the latest attempt failed


def test_skip_valid_reuses_the_record_of_the_same_config_only(micro_dir, measured, tmp_path, monkeypatch):
    out = tmp_path / "gsm8k.json"
    shutil.copy(measured[0], out)

    def engine_run(*args, **kwargs):
        raise RuntimeError("engine ran")

    monkeypatch.setattr(harness, "engine_run", engine_run)
    args = ["--benchmark", "gsm8k", "--limit", 2, "--max-new-tokens", 8, "--skip-valid"]
    assert bench(micro_dir, out, *args) == 0
    with pytest.raises(RuntimeError, match="engine ran"):
        bench(micro_dir, out, *args[:-2], 7, "--skip-valid")


def test_unknown_benchmark_is_a_one_line_error_naming_it(micro_dir, tmp_path, capsys):
    with pytest.raises(MoespacError, match="unknown benchmark 'squad'.*gsm8k"):
        harness.BenchConfig(benchmark="squad", target=str(micro_dir / "target"))
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as stop:  # refused while the command line is parsed, as argparse refuses
        bench(micro_dir, out, "--benchmark", "squad")
    assert stop.value.code == 2
    assert "argument --benchmark: unknown benchmark 'squad'; known: mmlu-pro" in capsys.readouterr().err
    assert not out.exists() and not failure_path(out).exists()


def test_schema_accepts_generate_and_simulate_records(micro_dir, tmp_path):
    gen, trace, sim = tmp_path / "gen.json", tmp_path / "gen.npz", tmp_path / "sim.json"
    assert main(["generate", "--target", str(micro_dir / "target"), "--draft", str(micro_dir / "draft"), "--greedy",
                 "--prompt", "hi", "--max-new-tokens", "3", "--json", str(gen), "--trace", str(trace)]) == 0
    assert main(["simulate", "--trace", str(trace), "--policy", "lru", "--hardware", "h200", "--json", str(sim)]) == 0
    assert validate_record(gen)["kind"] == "generate" and validate_record(sim)["kind"] == "simulate"
    with pytest.raises(MoespacError, match="schema violation"):
        validate_record(dict(json.loads(sim.read_text()), timing="measured"))


def test_workflow_schema_points_at_the_packaged_schema():
    pointer = ROOT / "workflow" / "schemas" / "result.schema.json"
    ref = json.loads(pointer.read_text())["$ref"]
    assert (pointer.parent / ref).resolve() == SCHEMA_PATH.resolve()
