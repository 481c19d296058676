"""The Snakemake workflow: dry runs of the shipped configs, lint, config errors that name the key before any
job runs, and one tiny study end to end (micro pair, one benchmark, a few tokens, sweeps of two values)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from moespac.analysis.labels import unlabelled
from moespac.bench.record_files import read_record, validate_record
from moespac.cli import main
from moespac.tracking import KEY_TAG

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "tests" / "fixtures" / "workflow_tiny.yaml"
BIN = Path(sys.executable).parent


# the repository's workflow, with its workflow profile (Snakemake finds profiles/default itself only when it runs
# from the repository root, as the README does; these runs are elsewhere)
WORKFLOW = ["-s", str(REPO / "workflow" / "Snakefile"), "--workflow-profile", str(REPO / "profiles" / "default")]


def snakemake(*args, cwd=REPO, timeout=900, env=None):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg", **(env or {}))
    return subprocess.run([str(BIN / "snakemake"), *WORKFLOW, *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=timeout)


def job_counts(out: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run."""
    lines = out[out.index("Job stats:"):].splitlines()[3:]
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.parametrize("configfile", [None, "config/paper.yaml"])
def test_dry_run_of_the_shipped_configs(configfile, tmp_path):
    args = ["-n", "--quiet", "rules"] + (["--configfile", REPO / configfile] if configfile else [])
    r = snakemake(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    counts = job_counts(r.stdout)
    assert counts["simulate_cell"] > 100 and counts["record_trace"] >= 14 and counts["paper_figure"] == 8
    assert counts["paper_table"] == 6 and counts["log_mlflow"] == 1 and counts["bench_measured"] >= 14
    assert counts["bench_wrapped"] == 21  # Accelerate, vLLM and the authors' release on the seven benchmarks
    if configfile:  # the paper's models come from the hub; Table 3's hub pairs name no draft (the paper's are
        # unnamed), so their entries replay their fallbacks: the two routing shapes Qwen3's traces lack are trained
        assert counts["link_hub_pair"] == 2 and counts["build_proxy_pair"] == 2
        assert ("table3.models[0] (deepseek-v2-lite): traces of proxy-shape-64x6: deepseek-v2-lite"
                in r.stdout + r.stderr)
    else:
        # proxy, proxy-shape and Table 3's two other routing shapes (256 experts top-8, 64 top-6)
        assert counts["build_proxy_pair"] == 4 and counts["build_llamacpp"] == 1 and counts["bench_llamacpp"] == 14


def test_lint_is_clean():
    r = snakemake("--lint")
    assert r.returncode == 0, r.stdout + r.stderr


def bad_config(tmp_path, edit) -> Path:
    config = yaml.safe_load(TINY.read_text())
    edit(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["engine"].update(speed=3), ["speed", "engine"]),  # unknown key
    (lambda c: c["engine"].update(limit="two"), ["limit", "engine"]),  # wrong type
    (lambda c: c["table2"].update(benchmarks=["gsm9k"]), ["table2.benchmarks[0]", "gsm9k"]),
    (lambda c: c["table1"].update(methods=["moespac", "hybrimo"]), ["table1.methods[1]", "hybrimo"]),
    (lambda c: c["simulation"].update(hardware="rtx5090"), ["simulation.hardware", "rtx5090"]),
    (lambda c: c["smoke"].update(policy="moespac:nope=1"), ["smoke.policy", "nope"]),
    (lambda c: c["engine"].update(pair="nopair"), ["engine.pair", "nopair"]),
    (lambda c: c["wrapped"]["vllm"].update(offload_gb=60), ["offload_gb", "vllm"]),
    (lambda c: c["wrapped"]["accelerate"].update(max_gpu_gib="half"), ["max_gpu_gib", "accelerate"]),
    (lambda c: c["wrapped"]["moespac_release"].update(pair="nopair"), ["wrapped.moespac_release.pair", "nopair"]),
    (lambda c: c["simulation"].update(draft_spec="qwen9"), ["simulation.draft_spec", "qwen9"]),
    (lambda c: c["table3"]["models"][0].update(draft="qwen3-4b"), ["draft", "models"]),
    (lambda c: c["engine"].update(max_new_tokens=5000), ["engine.max_new_tokens 5000", "context of 4096"]),
    (lambda c: c["simulation"].update(max_new_tokens=4091, gamma=4), ["simulation.max_new_tokens", "gamma 4"]),
    (lambda c: c["pairs"].update(built={"build": "tiny", "label": "x"}) or c["simulation"].update(pair="built")
     or c["figures"].update(heatmap_layer=2), ["figures.heatmap_layer 2", "2 MoE layers"]),
    (lambda c: c["engine"].update(batch_size=3, limit=2), ["engine.batch_size 3", "engine.limit 2"]),
    (lambda c: c["engine"].update(cache_ratio=float("nan")), ["config key engine.cache_ratio: nan"]),
    (lambda c: c["prompts"].update(temperature=float("inf")), ["config key prompts.temperature: inf"]),
    (lambda c: c.update(speed=3), ["config key (top level)", "'speed' was unexpected"]),
    (lambda c: c["pairs"].update(hub={"target": "../../x", "draft": "org/d", "label": "x"}),
     ["config key pairs.hub.target", "not a hub id"]),
], ids=["unknown-key", "wrong-type", "benchmark", "method", "hardware", "policy-option", "pair", "wrapped-key",
        "wrapped-type", "wrapped-pair", "draft-spec", "table3-key", "length-vs-context", "window-vs-context",
        "heatmap-layer", "batch-vs-limit", "nan", "infinity", "unknown-top-level-key", "folder-as-hub-target"])
def test_bad_config_fails_before_any_job_naming_the_key(tmp_path, edit, needles):
    assert_refused_before_any_job(tmp_path, bad_config(tmp_path, edit), needles)


def test_a_sweep_of_one_integer_value_is_a_valid_config(tmp_path):
    """[1] is both a list of integers and of ratios: the schema takes either (it refused one matching both)."""
    config = bad_config(tmp_path, lambda c: c["sweeps"]["K"].update(activate=True, values=[1]))
    r = snakemake("-n", "--cores", 1, "--configfile", config, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def assert_refused_before_any_job(tmp_path, configfile, needles) -> None:
    """The study with `configfile` stops before any job, its message holding every needle."""
    r = snakemake("--cores", 1, "--configfile", configfile, cwd=tmp_path)
    assert r.returncode != 0
    text = r.stdout + r.stderr
    for needle in needles:
        assert needle in text, text[-2000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "paper_figs").exists()


RECORD_DIRS = ("traces", "measured", "simulated", "wrapped")  # result records (not model configs, builds)


def _default_sigint():
    # a shell starts background jobs with SIGINT ignored and exec keeps it ignored (CI may run us that way);
    # Ctrl-C reaches a terminal's foreground job with the default action, so give Snakemake that
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_once_a_record_exists(tmp_path, timeout=300):
    """Start the tiny study, send SIGINT (as Ctrl-C does, to the whole process group) as soon as the first
    result record lands, and wait for Snakemake to stop. Returns its exit code."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    proc = subprocess.Popen([str(BIN / "snakemake"), *WORKFLOW, "--cores", "2", "--configfile", str(TINY)],
                            cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_default_sigint)
    deadline = time.monotonic() + timeout
    try:
        def any_record():
            return any(p for d in RECORD_DIRS for p in (tmp_path / "results" / d).glob("**/*.json"))

        while not any_record() and proc.poll() is None:
            assert time.monotonic() < deadline, "no result record within the timeout"
            time.sleep(0.1)
        assert proc.poll() is None, "the study finished before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def mlflow_config_hashes(tmp_path) -> list[tuple[str, str]]:
    """(study, config hash) of every run in the study's MLflow store, sorted."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results/mlflow.db'}")
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    runs = client.search_runs(list(names), max_results=10000)
    return sorted((names[r.info.experiment_id], r.data.tags[KEY_TAG]) for r in runs)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """The tiny study, Ctrl-C'd mid-way and then run again to completion (the folder it ran in)."""
    path = tmp_path_factory.mktemp("tiny")
    interrupt_once_a_record_exists(path)
    assert not (path / "results/mlflow/ingest.json").exists()  # stopped mid-way: the last step never ran
    r = snakemake("--cores", 2, "--configfile", TINY, cwd=path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return path


def test_tiny_study_end_to_end(tiny_study):
    # Ctrl-C mid-way, then the same command again: it completes, and no record is corrupt (checked below)
    tmp_path = tiny_study
    records = [p for d in RECORD_DIRS[:3] for p in (tmp_path / "results" / d).glob("**/*.json")]
    derived = [p for p in records if json.loads(p.read_text()).get("kind") == "derive-ar-trace"]
    # the batch-1 AR traces are derived from the speculative ones (no engine run, so no result record)
    assert sorted(p.name for p in derived) == ["g0-b1-n6.json"] * len(derived) and derived
    for path in derived:
        d = json.loads(path.read_text())
        assert d["source"] == str(path.relative_to(tmp_path)).replace("/g0-b1-", "/g4-b1-").replace(".json", ".npz")
    assert len(records) > len(derived)
    for path in set(records) - set(derived):
        validate_record(path)  # schema + completeness
    # the paper-regime block: every Table 1 method of the study on routing fitted to App. A.1, at the model's depth
    regime = validate_record(tmp_path / "results/whatif/paper_regime.json")
    (row,) = regime["metrics"]["rows"]
    assert regime["timing"] == "simulated" and row["benchmark"] == "gsm8k" and row["target"]["a_over_b"] == 0.64
    assert ({"moespac", "llamacpp", "hybrimoe"} <= set(row["methods"])
            and "synthetic, fitted" in regime["metrics"]["source"])
    assert "paper-regime routing" in (tmp_path / "paper_figs/paper_regime.md").read_text()
    # ... and Tables 1, 2 and 4 show its cells as a block of their own (Table 4 on batched traces over its grid)
    assert ([(c["batch_size"], c["gamma"]) for c in regime["metrics"]["table4"]["cells"]]
            == [(1, 2), (1, 4), (2, 2), (2, 4)])
    assert set(row["table2"]) == {"moespac", "moespac-no-adabc"}
    for table in ("table1", "table2", "table4"):
        assert "paper-regime routing: synthetic, fitted to the paper's App. A.1" in (tmp_path / f"paper_figs/{table}.md"
                                                                                    ).read_text(), table
    assert "aggregate over the batch" in (tmp_path / "paper_figs/table4.md").read_text()
    # the consistency page: the host inferred from llama.cpp's rows, the plausible-range sweep,
    # a verdict the audit quotes
    consistency = (tmp_path / "paper_figs/consistency.md").read_text()
    sweep = regime["metrics"]["inferred_host"]["sweep"]
    assert len(sweep) == 8 and set(sweep[0]["tps"]) == {"gsm8k"} and "oracle-sd" not in sweep[0]["tps"]["gsm8k"]
    verdict = consistency.split("## Verdict\n\n")[1].split("\n")[0]
    assert verdict.startswith("On the host inferred") and verdict in (tmp_path / "paper_figs/audit.md").read_text()
    for path in (tmp_path / "results" / "wrapped").glob("**/*.json"):  # external systems' records: whole JSON
        assert read_record(path)["timing"] == "wrapped"
    assert not list((tmp_path / "results").glob("**/*.failure.json"))
    figs = tmp_path / "paper_figs"
    pages = sorted(figs.glob("*.md"))
    assert len(pages) >= 10 and {"audit.md", "routing_stats.md", "consistency.md"} <= {p.name for p in pages}
    for page in pages:  # every number on every page says how it was obtained
        assert not unlabelled(page.read_text()), (page.name, unlabelled(page.read_text())[:3])
    for name in ("table1", "table2", "table4", "table6", "appendix_a1"):
        for ext in ("csv", "md", "tex"):
            assert (figs / f"{name}.{ext}").stat().st_size > 0, name
    for name in ("fig4_hot_cold", "fig5_sensitivity", "fig8_expert_reuse", "fig9_heatmaps", "fig10_utility",
                 "fig_overhead"):
        assert (figs / f"{name}.png").read_bytes()[:4] == b"\x89PNG" and (figs / f"{name}.pdf").exists(), name
    assert not (figs / "table3.md").exists() and not (figs / "fig6_batch.png").exists()  # switched off
    assert (figs / "whatif_locality.png").read_bytes()[:4] == b"\x89PNG" and (figs / "whatif_locality.pdf").exists()
    whatif = (figs / "whatif_locality.md").read_text()
    assert "(timing: simulated)" in whatif and "| gsm8k (recorded) |" in whatif
    stats = pd.read_csv(figs / "routing_stats.csv")  # every trace of the study and each what-if skew, the paper's row
    assert len(stats) == 2 + 2 + 1 + 1 and stats["label"].str.contains("what-if skew").sum() == 2
    # ... and the paper-regime study's own speculative trace: the one its cells replay, with its fitted statistics
    (fitted,) = stats[stats["label"] == "paper-regime gsm8k SD"].to_dict("records")
    assert fitted["source"] == "synthetic, A.1 fit" and fitted["trace_id"] == row["sd_trace"]
    assert (fitted["alpha"], fitted["a_over_b"]) == pytest.approx((row["measured"]["alpha"],
                                                                   row["measured"]["a_over_b"]), rel=1e-9)
    whatif_csv = pd.read_csv(figs / "whatif_locality.csv")
    assert set(whatif_csv["timing"]) == {"simulated"} and whatif_csv["recorded"].any()
    assert "does not re-derive" in (figs / "audit.md").read_text()

    # every Table 1 cell carries its timing label and the model that produced it; nothing simulated says measured
    t1 = pd.read_csv(figs / "table1.csv")
    cells = t1[t1["benchmark"] != "average"]
    assert set(cells["timing"]) == {"simulated", "measured", "wrapped"} and cells["model"].notna().all()
    regime = cells["kind"].astype(str).str.startswith("regime:")  # the paper-regime block, on the inferred host
    assert cells.loc[regime, "hardware"].str.contains("inferred from the paper's llama.cpp rows").all() and regime.any()
    sim = cells[(cells["timing"] == "simulated") & ~regime]
    assert set(sim["hardware"]) == {"rtx4090-pcie4"} and sim["model"].str.startswith("qwen3-30b-a3b experts").all()
    refs = {"Offline oracle w/ SD (reference)", "Infinite cache w/ SD (bound)"}
    assert set(sim["label"]) == {"llama.cpp", "HybriMoE", "MoE-SpAc"} | refs
    tps = sim.set_index("label")["tps"]
    bound = tps["Infinite cache w/ SD (bound)"]  # of the SD trace: bounds the rows replayed on it
    assert max(tps["MoE-SpAc"], tps["Offline oracle w/ SD (reference)"]) <= bound * (1 + 1e-9)
    md = (figs / "table1.md").read_text()
    assert "simulated on rtx4090-pcie4" in md and " S n=1 (paper 27.82)" in md and " M n=1 (paper 27.82)" in md
    assert "- simulated draft cost charged to speculative rows: qwen3-4b-fp8 (given)" in md
    # wrapped: Accelerate ran on this CPU; vLLM and the release cannot (no CUDA) and say why, with no number
    wrapped = cells[cells["timing"] == "wrapped"].set_index("label")
    assert wrapped.loc["Accelerate", "tps"] > 0 and not wrapped.loc["Accelerate", "skipped"]
    for label in ("vLLM", "MoE-SpAc (authors' release)"):
        assert wrapped.loc[label, "skipped"] and pd.isna(wrapped.loc[label, "tps"])
        assert "CUDA" in wrapped.loc[label, "skip_reason"] and f"| {label} | skipped | skipped |" in md
        assert f"- {label}: skipped, not run here on gsm8k (" in md

    # MLflow: one run per result record in each study that uses it
    ingest = json.loads((tmp_path / "results/mlflow/ingest.json").read_text())
    records = {p: studies for p, studies in ingest["runs"].items() if p != "outputs"}
    assert ingest["created"] == sum(map(len, records.values())) and not ingest["skipped"]
    keys = mlflow_config_hashes(tmp_path)
    assert len(keys) == len(set(keys)) == ingest["created"] + 1  # (+ the outputs run), no duplicate
    assert any(p.startswith("results/traces/") for p in records)

    # the HTML report bundles the figures with their captions
    report = snakemake("--report", tmp_path / "report.html", "--configfile", TINY, cwd=tmp_path)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert (tmp_path / "report.html").stat().st_size > 10000

    # a second run has nothing to do
    again = snakemake("-n", "--cores", 2, "--configfile", TINY, cwd=tmp_path)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout[-2000:]

    # one more cache ratio reruns only what depends on it: one simulated cell, Figure 5, the MLflow step
    changed = bad_config(tmp_path, lambda c: c["sweeps"]["cache_ratio"].update(values=[0.25, 0.5, 0.75]))
    dry = snakemake("-n", "--quiet", "rules", "--cores", 2, "--configfile", changed, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert job_counts(dry.stdout) == {"simulate_cell": 1, "paper_figure": 1, "log_mlflow": 1, "all": 1}

    # another draft spec reruns the speculative simulated cells (the draft is in their path), nothing else runs
    redraft = bad_config(tmp_path, lambda c: c["simulation"].update(draft_spec="qwen3-1.7b"))
    dry = snakemake("-n", "--quiet", "rules", "--cores", 2, "--configfile", redraft, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    counts = job_counts(dry.stdout)
    # moespac (Tables 1, 2, 4), oracle-sd, moespac-no-adabc, moespac at batch 2 and at cache ratio 0.5; the AR
    # rows keep theirs
    assert counts["simulate_cell"] == 5 and counts["paper_table"] == 4
    assert not {"record_trace", "bench_measured", "bench_wrapped"} & set(counts)


def test_mlflow_answers_moespac_against_hybrimoe_in_one_search(tiny_study):
    """The first question a reader asks of the store: tokens/s of MoE-SpAc and HybriMoE on each benchmark,
    simulated on rtx4090-pcie4. One search of the Table 1 experiment gives one row per cell, with the table's
    number under the table's name; a cell shared with a sweep is in the sweep's experiment too."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tiny_study / 'results/mlflow.db'}")
    found = mlflow.search_runs(experiment_names=["moespac/table1"],
                               filter_string="tags.`moespac.timing` = 'simulated' AND "
                                             "tags.`moespac.hardware` = 'rtx4090-pcie4'")
    found = found[found["tags.moespac.method"].isin(["moespac", "hybrimoe"])]
    got = {(r["tags.moespac.method"], r["tags.moespac.benchmark"]): r["metrics.tokens_per_s"]
           for _, r in found.iterrows()}
    table = pd.read_csv(tiny_study / "paper_figs/table1.csv")
    cells = table[(table["timing"] == "simulated") & table["method"].isin(["moespac", "hybrimoe"])
                  & (table["benchmark"] != "average") & (table["hardware"] == "rtx4090-pcie4")]
    assert len(found) == len(got) == len(cells) == 2  # one row per cell, no duplicate
    assert got == {(r.method, r.benchmark): r.tps for r in cells.itertuples()}
    # the sweep's 0.25 point is the Table 1 cell; it is a run of the sweep's experiment as well
    sweep = mlflow.search_runs(experiment_names=["moespac/sweep_cache_ratio"])
    assert sorted(sweep["params.cache_ratio"].astype(float)) == [0.25, 0.5]
    experiment = mlflow.get_experiment_by_name("moespac/sweep_cache_ratio")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "cache_ratio" in experiment.tags["mlflow.note.content"]


def _simulated_rows(csv: Path) -> list[str]:
    """The lines of a paper table's CSV that hold simulated cells (all of them when it has no timing column)."""
    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    if "timing" in frame:
        frame = frame[frame["timing"] == "simulated"]
    return frame.to_csv(index=False).splitlines()


def test_two_clean_runs_write_identical_traces_and_simulated_outputs(tiny_study, tmp_path):
    """Everything but a timing is deterministic: a second study from scratch, in another folder, without the
    interrupt and with another machine's kernels emulated (the libraries' own instruction-set switches), writes
    byte-identical weights, traces, simulated records and figures, and the same simulated table cells; the
    manifest of the first run says so of the second. Measured and wrapped records differ (they are timed) and are
    not compared."""
    from test_pinning import EMULATE_ANOTHER_MACHINE

    r = snakemake("--cores", 2, "--configfile", TINY, cwd=tmp_path, env=EMULATE_ANOTHER_MACHINE)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    first, second = tiny_study, tmp_path
    manifest = tmp_path / "MANIFEST.json"
    assert main(["manifest", "write", "--results", str(first / "results"), "--out", str(manifest)]) == 0
    assert main(["manifest", "check", str(manifest), "--results", str(second / "results")]) == 0

    def files(root, pattern):
        return sorted(p.relative_to(root).as_posix() for p in root.glob(pattern))

    traces = files(first, "results/traces/**/*.npz")
    simulated = files(first, "results/simulated/**/*.json") + files(first, "results/whatif/*.json")
    figures = [f for f in files(first, "paper_figs/*.p[dn][gf]") if not f.startswith("paper_figs/fig_overhead")]
    # the recorded and derived traces, and the paper-regime study's two (speculative and autoregressive)
    assert len(traces) == 3 + 2 and len(simulated) >= 8 and len(figures) == 16  # consistency.p* among them
    for name in traces + simulated + figures:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    for name in simulated:
        record = json.loads((first / name).read_text())
        assert record["timing"] == "simulated" and "created" not in record and str(first) not in json.dumps(record)
    csvs = files(first, "paper_figs/*.csv")
    assert csvs == files(second, "paper_figs/*.csv") and "paper_figs/table1.csv" in csvs
    for name in csvs:
        rows = _simulated_rows(first / name)
        assert rows == _simulated_rows(second / name), name
    assert len(_simulated_rows(first / "paper_figs/table1.csv")) > 5
    # and the check can fail: one changed trace is named, and the stage it starts from
    trace = second / "results/traces/micro/gsm8k/g4-b1-n6.npz"
    trace.write_bytes(trace.read_bytes()[:-1] + b"x")
    assert main(["manifest", "check", str(manifest), "--results", str(second / "results")]) == 1


def test_a_clean_clone_rebuilds_every_output(tiny_study):
    """A clean clone has the committed paper_figs/ but no results/: every output must still be planned for
    rebuild (Snakemake does not rebuild a missing input of an existing output unless something targets it)."""
    results, aside = tiny_study / "results", tiny_study / "results.aside"
    results.rename(aside)
    try:
        r = snakemake("--summary", "--configfile", TINY, cwd=tiny_study)
    finally:
        if results.exists():
            shutil.rmtree(results)
        aside.rename(results)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plans = {line.split("\t")[0]: line.split("\t")[-1] for line in r.stdout.splitlines()
             if line.startswith("paper_figs/")}
    assert "paper_figs/table6.csv" in plans and len(plans) == len(list((tiny_study / "paper_figs").iterdir()))
    assert {f for f, plan in plans.items() if plan != "update pending"} == set()


HOSTILE = "$(touch pwned)"


@pytest.mark.parametrize("edit, key", [
    (lambda c: c["pairs"].update(hub={"target": HOSTILE, "draft": "org/draft", "label": "x"}), "target"),
    (lambda c: c["pairs"].update(hub={"target": "org/target", "draft": "x;touch pwned", "label": "x"}), "draft"),
    (lambda c: c["pairs"].update(built={"build": "tiny", "build_set": ["layers=2`touch pwned`"], "label": "x"}),
     "build_set"),
    (lambda c: c["smoke"].update(policy=f"lru {HOSTILE}"), "policy"),
    (lambda c: c["smoke"].update(policy="lru:seed=1;touch pwned"), "policy"),
], ids=["pair-target", "pair-draft", "build-set", "smoke-policy", "smoke-policy-option"])
def test_hostile_config_values_never_reach_a_shell(tmp_path, edit, key):
    """A value that would run a command if pasted into a shell rule fails the schema before any job, naming
    its key; nothing runs (the rules also quote every value, in case a pattern is ever widened)."""
    r = snakemake("--cores", 1, "--configfile", bad_config(tmp_path, edit), cwd=tmp_path)
    text = r.stdout + r.stderr
    assert r.returncode != 0 and key in text and "does not match" in text, text[-2000:]  # the schema's pattern
    assert not (tmp_path / "pwned").exists() and not (REPO / "pwned").exists()
    assert not (tmp_path / "results").exists()



HOSTILE_LABEL = "<script>alert(1)</script><img src=x onerror=alert(2)> javascript:alert(3) .. raw:: html"


def test_a_hostile_label_reaches_the_report_as_text(tiny_study, tmp_path):
    """A pair label is free text from a config: the report quotes it as an RST inline literal, so markup in it is
    shown, never run (Snakemake's report renders captions with dangerouslySetInnerHTML). A label that could leave
    the literal (a newline, a backquote) is refused by the schema."""
    hostile = bad_config(tmp_path, lambda c: c["pairs"]["micro"].update(label=HOSTILE_LABEL))
    r = snakemake("--report", tmp_path / "report.html", "--configfile", hostile, cwd=tiny_study)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    page = (tmp_path / "report.html").read_text()
    # docutils escapes the literal's text (and wraps its words in spans): the markup is there as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img" in page and "onerror=alert(2)&gt; javascript:alert(3)" in page
    assert "<script>alert(1)" not in page and "<img src=x" not in page and 'href="javascript:' not in page
    for label in ("two\n.. raw:: html\n\n   <script>alert(1)</script>", "`x <javascript:alert(1)>`_"):
        bad = bad_config(tmp_path, lambda c: c["pairs"]["micro"].update(label=label))
        assert_refused_before_any_job(tmp_path, bad, ["pairs.micro.label"])
