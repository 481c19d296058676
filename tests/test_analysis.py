"""Tables, audit and figure helpers: exact arithmetic on the paper's numbers and on hand-made rows."""

import numpy as np
import pandas as pd
import pytest

from moespac.analysis import audit, paper, tables
from moespac.analysis.records import COLUMNS, method_of
from moespac.analysis.render import cell, latex, Block
from moespac.errors import MoespacError
from moespac.study import METHODS, check_names, get_method, k_method


def test_paper_speedup_readings_and_the_claims_they_test():
    t1 = paper.table1()
    averages = t1[t1["benchmark"] == "average"].set_index("method")["tps"]
    r = audit.speedup_readings(averages)
    assert (round(r["mean_of_ratios"], 2), round(r["geometric_mean"], 2), round(r["ratio_of_means"], 2)) == (6.92, 5.07, 3.68)
    assert r["n"] == 11
    verdicts = {c.claim: c.verdict for c in audit.claims()}
    assert verdicts["+41.9 % (\"42 %\") average TPS over the strongest baseline, llama.cpp-w/ SD"] == "re-derives"
    assert verdicts["4.04x average speedup over the standard baselines"] == "does not re-derive"
    pattern = next(c for c in audit.claims() if c.claim == "latency is measured per request like TPS")
    assert "MoE-SpeQ, SpecExp" in pattern.derived  # exactly these two rows have TPS x latency = 512


def test_every_method_round_trips_through_its_policy_spec():
    for slug, m in METHODS.items():
        assert method_of(m.policy, m.draft) == slug
    assert method_of("moespac:K=6", True) == "moespac-k6" == k_method(6)
    assert get_method("moespac-no-adabc-k3").policy == "moespac:ablation=no-adabc,K=3"
    with pytest.raises(MoespacError, match="unknown method 'nope'"):
        get_method("nope")


def rows(*cells):
    out = []
    for timing, method, bench, tps, lat in cells:
        r = dict.fromkeys(COLUMNS)
        r.update(timing=timing, method=method, label=get_method(method).label, benchmark=bench, tps=tps, latency_s=lat,
                 hardware="rtx4090-pcie4" if timing == "simulated" else "CPU", model="m", source="s", skipped=False,
                 requests=1, max_new_tokens=64)
        out.append(r)
    return pd.DataFrame(out, columns=COLUMNS)


def test_table1_keeps_timing_blocks_apart_and_computes_relative_improvement():
    df = rows(("simulated", "moespac", "gsm8k", 30.0, 1.0), ("simulated", "hybrimoe", "gsm8k", 20.0, 2.0),
              ("simulated", "moespac-no-sd", "gsm8k", 29.0, 1.0),  # an ablation, not a baseline
              ("simulated", "llamacpp", "gsm8k", 10.0, 4.0), ("measured", "moespac", "gsm8k", 3.0, 9.0),
              ("measured", "moespac", "qa", 5.0, 8.0))
    long, blocks = tables.table1(df, ["gsm8k", "qa"])
    titles = [b.title for b in blocks]
    assert titles == ["TPS, simulated on rtx4090-pcie4 — model: m; s", "latency (s), simulated on rtx4090-pcie4 — model: m; s",
                      "TPS, measured on CPU — model: m; s", "latency (s), measured on CPU — model: m; s"]
    sim_tps = {r[0]: r for r in blocks[0].rows}
    assert sim_tps["MoE-SpAc"][1] == "30.00 S (paper 27.82)"
    assert sim_tps["Rel. Imprv. (MoE-SpAc vs the best Table 1 baseline here)"][1] == "+50.0% S (paper +46.2%)"
    # the simulated block has no qa cell: its Average is left empty rather than averaged over fewer benchmarks
    assert blocks[0].columns == ["Method", "GSM8K", "Average"]
    meas = {r[0]: r for r in blocks[2].rows}
    assert meas["MoE-SpAc"][1:] == ["3.00 M (paper 27.82)", "5.00 M (paper 23.56)", "4.00 M (paper 25.06)"]
    avg = long[(long["benchmark"] == "average") & (long["timing"] == "measured") & long["tps"].notna()]
    assert avg["tps"].tolist() == [4.0]


def test_cells_and_latex():
    assert cell(1.5, "wrapped", 2.0) == "1.50 W (paper 2.00)"
    assert cell(float("nan"), "simulated", 2.0) == "– (paper 2.00)"
    assert "w/o SD \\& more\\_x" in latex("t", [Block("b", ["a"], [["w/o SD & more_x"]])])


def test_check_names_names_the_key():
    import yaml
    from pathlib import Path

    config = yaml.safe_load((Path(__file__).parent / "fixtures" / "workflow_tiny.yaml").read_text())
    check_names(config)
    config["table3"]["models"][0]["spec"] = "qwen9"
    with pytest.raises(MoespacError, match=r"config key 'table3.models\[0\].spec': unknown model spec 'qwen9'"):
        check_names(config)


def test_report_names_every_figure_without_importing_matplotlib():
    from moespac.analysis.figures import FIGURES
    from moespac.commands.report import FIGURES as NAMES

    assert set(NAMES) == set(FIGURES)


def test_utility_curves_on_a_single_step_put_everything_on_the_host():
    from moespac.analysis.figures import utility_curves
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace

    one = synthetic_trace(Topology(2, 8, 2), new_tokens=2, gamma=3, prompt_tokens=4, seed=1)
    ratios, freq = utility_curves(one, K=4)
    assert ratios["r_c"].tolist() == [1.0] * 4 and ratios["r_g"].tolist() == [0.0] * 4  # u = 0 before the first step
    many, _ = utility_curves(synthetic_trace(Topology(4, 16, 2), new_tokens=128, gamma=4, seed=0), K=4)
    assert np.all(np.diff(many["r_c"]) >= 0) and np.all(np.diff(many["r_g"]) <= 0)  # a higher tau moves work off
    assert freq["utility"].max() <= 4


def test_table4_and_table3_put_the_papers_numbers_beside_ours():
    df = rows(("simulated", "moespac", "mt-bench", 10.0, 1.0), ("simulated", "moespac", "mt-bench", 12.0, 1.0),
              ("simulated", "moespac", "mt-bench", 11.0, 1.0))
    df["batch_size"], df["gamma"] = [1, 1, 2], [2, 8, 8]
    _, (block,) = tables.table4(df)
    assert block.columns == ["Batch \\ gamma", "2", "8"]
    assert block.rows == [["1", "10.00 S (paper 20.79)", "12.00 S (paper 24.10)"], ["2", "– (paper 20.67)", "11.00 S (paper 26.01)"]]
    assert block.notes[0].startswith("best gamma per batch size (ours): {1: 8, 2: 8}")

    t3 = rows(("simulated", "moespac", "humaneval", 40.0, 1.0), ("simulated", "hybrimoe", "humaneval", 20.0, 2.0))
    t3["model"] = "deepseek-v2-lite experts (trace layers/experts mapped)"
    _, (block,) = tables.table3(t3)
    by = {r[2]: r for r in block.rows}
    assert by["MoE-SpAc"] == ["rtx4090-pcie4", "deepseek-v2-lite", "MoE-SpAc", "40.00 S (paper 47.26)"]
    assert by["Rel. Improv."][3] == "+100.0% S"


def test_sweep_figures_from_records(tmp_path):
    """Figures 5-7 from hand-made records (the workflow test switches these sweeps off to stay short)."""
    import json

    from moespac.analysis.figures import FIGURES
    from records import simulated_record

    def record(name, policy="moespac", gamma=8, cache=0.25, tokens=64, batch=1, tps=10.0):
        rec = simulated_record("mt-bench", tps, latency=1.0, policy=policy, gamma=gamma, batch_size=batch,
                               max_new_tokens=tokens, cache_ratio=cache, hardware="rtx4090-pcie4",
                               model_spec="qwen3-30b-a3b", target="t")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rec))
        return str(path)

    cache = [record(f"c{c}", cache=c, tps=10 + 10 * c) for c in (0.1, 0.5)]
    groups = {"cache": cache, "length": [record(f"n{n}", tokens=n) for n in (64, 128)],
              "K": [record(f"k{k}", policy=f"moespac:K={k}") for k in (2, 4)],
              "batch": [record(f"b{b}", batch=b, policy="hybrimoe", gamma=0) for b in (1, 2)],
              "records": cache + [record(f"ar{c}", policy="moespac:ablation=no-sd", gamma=0, cache=c) for c in (0.1, 0.5)]}
    for name in ("fig5_sensitivity", "fig6_batch", "fig7_draft_vs_cache"):
        png, pdf = FIGURES[name](groups, tmp_path / name)
        assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF"


def test_table1_shows_skipped_wrapped_systems_as_skipped_with_the_reason_and_names_the_charged_draft():
    df = rows(("wrapped", "accelerate", "gsm8k", 5.0, 2.0), ("wrapped", "accelerate", "qa", 7.0, 2.0),
              ("wrapped", "vllm", "gsm8k", None, None), ("wrapped", "vllm", "qa", None, None),
              ("simulated", "moespac", "gsm8k", 30.0, 1.0), ("simulated", "hybrimoe", "gsm8k", 20.0, 2.0))
    vllm = df["label"] == "vLLM"
    df.loc[vllm, "skipped"], df.loc[vllm, "skip_reason"] = True, "needs CUDA"
    df.loc[df["method"] == "moespac", "draft_charged"] = "qwen3-4b-fp8 (given)"
    _, blocks = tables.table1(df, ["gsm8k", "qa"])
    sim, wrapped = blocks[0], blocks[2]
    assert "simulated draft cost charged to speculative rows: qwen3-4b-fp8 (given)" in sim.notes
    by = {r[0]: r for r in wrapped.rows}
    assert by["vLLM"][1:] == ["skipped", "skipped", "skipped"]
    assert by["Accelerate"][1:] == ["5.00 W (paper 1.21)", "7.00 W (paper 1.16)", "6.00 W (paper 1.17)"]
    assert "vLLM: skipped, not run here on gsm8k, qa (needs CUDA)" in wrapped.notes
    assert not any("draft cost" in n for n in wrapped.notes)
