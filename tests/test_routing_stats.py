"""Routing statistics of a trace (moespac/analysis/routing_stats.py) and `moespac report routing-stats`: every
statistic by hand on a hand-made trace, the uniform / skewed synthetic limits, the reuse of the project's hot/cold
accuracy and sMAPE, the table files and the CLI's errors."""

import math

import numpy as np
import pandas as pd
import pytest

from moespac.analysis import routing_stats as rs
from moespac.cli import main
from moespac.errors import MoespacError
from moespac.policy import Topology
from moespac.scheduler import metrics as sm
from moespac.scheduler.config import MoESpAcConfig
from moespac.sim.simulate import SimConfig, simulate
from moespac.sim.synthetic import hand_trace, synthetic_trace, toy_spec

TOPO = Topology(1, 4, 1)


def _tok(*experts):
    """ids of a step: one token per expert, 1 layer, top-1."""
    return [[[e]] for e in experts]


def hand(kind="verify"):
    """Two requests, 1 layer, 4 experts, top-1. Decode steps (3 tokens each, or 1 for AR):
    request 0: A {0,0,1}, B {0,1,2}, C {0,0,0}; request 1: D {0,1,1}, E {2,2,2}; prefills route to expert 3."""
    decode = [(0, 0, 1), (0, 1, 2), (0, 0, 0), (0, 1, 1), (2, 2, 2)]
    steps, req = [], []
    for r, block in ((0, decode[:3]), (1, decode[3:])):
        steps.append(("prefill", 0, 1, _tok(3, 3)))
        req.append(r)
        for ids in block:
            if kind == "verify":
                steps.append(("verify", 2, 2, _tok(*ids)))
                req.append(r)
            else:  # the same routing, one token per AR step
                for e in ids:
                    steps.append(("ar", 0, 1, _tok(e)))
                    req.append(r)
    return hand_trace(TOPO, steps, request_of_step=req)


def test_every_statistic_by_hand():
    t = hand()
    st = rs.routing_stats(t)
    # totals over decode steps: expert 0: 2+1+3+1+0 = 7, expert 1: 1+1+0+2 = 4, expert 2: 1+3 = 4, expert 3: 0
    assert (st["steps"], st["tokens"], st["requests"], st["tokens_per_step"]) == (5, 15, 2, 3.0)
    assert (st["num_layers"], st["num_experts"], st["top_k"]) == (1, 4, 1)
    assert st["experts_for_90pct"] == 3  # 90 % of 15 = 13.5: 7, 11, 15
    p = np.array([7, 4, 4]) / 15
    assert st["entropy_norm"] == pytest.approx(-(p * np.log(p)).sum() / math.log(4), abs=1e-12)
    assert st["top_share"] == pytest.approx(7 / 15, abs=1e-12)
    assert st["distinct_per_step"] == pytest.approx((2 + 3 + 1 + 2 + 1) / 5, abs=1e-12)
    # A->B: {0,1} & {0,1,2} = 2 of 3; B->C: 1 of 1; (C->D crosses requests: not a pair); D->E: 0 of 1
    assert st["reuse"] == pytest.approx((2 / 3 + 1 + 0) / 3, abs=1e-12)
    assert st["distinct_uniform"] == pytest.approx(4 * (1 - (3 / 4) ** 3), abs=1e-12)
    assert st["moespac_policy"] == "moespac" and st["hot_cold_mode"] == "sd"
    # App. A.1's alpha and a/b: each verify step accepts 1 of 2 drafts, then rejects (5 / (5 + 5)); distinct experts
    # per (step, layer) over 3 tokens x top-1: (2 + 3 + 1 + 2 + 1) / 15
    assert (st["alpha"], st["a_over_b"]) == (pytest.approx(0.5, abs=1e-12), pytest.approx(0.6, abs=1e-12))
    ar = rs.routing_stats(hand("ar"))
    assert math.isnan(ar["alpha"]) and math.isnan(ar["a_over_b"])  # no drafts: nothing to measure


def test_coverage_is_exact_at_the_boundary_and_the_median_is_over_layers():
    totals = np.array([[9, 1, 0, 0], [5, 5, 0, 0], [63, 7, 0, 0], [1, 1, 1, 1], [3, 3, 3, 1]])
    # 9 of 10 is exactly 90 %; 63 of 70 too (0.9 x 70 is 63.000...01 in floating point)
    assert rs.experts_for_coverage(totals).tolist() == [1, 2, 1, 4, 3]
    t = hand_trace(Topology(2, 4, 1), [("prefill", 0, 1, [[[0], [0]]]),
                                      ("verify", 1, 1, [[[0], [0]], [[0], [1]]]),
                                      ("verify", 1, 1, [[[1], [2]], [[0], [3]]])])
    st = rs.routing_stats(t)
    # layer 0: 0,0,1,0 -> 3 of 4 in expert 0 < 3.6 -> 2 experts; layer 1: 0,1,2,3 -> 4 experts; median 3
    assert st["experts_for_90pct"] == 3.0
    assert st["top_share"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert st["entropy_norm"] == pytest.approx((-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(4) + 1) / 2)


def test_uniform_routing_sits_at_the_top_and_skew_lowers_it():
    topo = Topology(2, 16, 2)
    kw = dict(new_tokens=2000, gamma=4, persistence=0.9, seed=1, model_spec=toy_spec(topo))
    flat = rs.routing_stats(synthetic_trace(topo, skew=0.0, **kw))
    peaked = rs.routing_stats(synthetic_trace(topo, skew=3.0, **kw))
    assert flat["entropy_norm"] > 0.99 and abs(flat["experts_for_90pct"] - 0.9 * 16) <= 1.5
    assert flat["top_share"] < 1.5 / 16
    assert flat["distinct_per_step"] == pytest.approx(flat["distinct_uniform"], rel=0.05)
    assert peaked["entropy_norm"] < flat["entropy_norm"] - 0.1
    assert peaked["experts_for_90pct"] < 0.7 * 16 and peaked["top_share"] > 2 * flat["top_share"]
    assert peaked["distinct_per_step"] < flat["distinct_per_step"] and peaked["reuse"] > flat["reuse"]
    assert peaked["moespac_hit_rate"] > flat["moespac_hit_rate"]


def test_hot_cold_smape_and_hit_rate_are_the_projects_own():
    t = hand()
    st = rs.routing_stats(t)
    assert st["hot_cold_accuracy"] == sm.hot_cold_accuracy(t)["accuracy"]
    assert st["smape"] == sm.smape(t)
    sim = simulate(SimConfig(trace="x", policy="moespac", hardware="rtx4090-pcie4", cache_ratio=0.25, bounds=False),
                   trace=t)
    assert st["moespac_hit_rate"] == sim["metrics"]["hit_rate"]
    # a trace without drafts: MoE-SpAc's AR mode, for the accuracy and for the simulated policy
    ar = hand("ar")
    st = rs.routing_stats(ar)
    assert (st["moespac_policy"], st["hot_cold_mode"]) == ("moespac:ablation=no-sd", "ar (no-sd)")
    assert st["hot_cold_accuracy"] == sm.hot_cold_accuracy(ar, MoESpAcConfig(ablation="no-sd"))["accuracy"]
    assert st["smape"] == sm.smape(ar) and st["steps"] == 15 and st["tokens_per_step"] == 1.0
    assert st["distinct_per_step"] == 1.0 and st["distinct_uniform"] == pytest.approx(1.0)


def test_simulation_settings_pass_through():
    t = hand()
    base = rs.routing_stats(t)
    none = rs.routing_stats(t, cache_ratio=0.0)
    assert none["moespac_hit_rate"] == 0.0 and none["cache_ratio"] == 0.0
    other = rs.routing_stats(t, model_spec="qwen3-30b-a3b")  # mapped onto it (allow_topology_mismatch)
    assert other["model_spec"] == "qwen3-30b-a3b" and 0 <= other["moespac_hit_rate"] <= 1
    assert base["experts_for_90pct"] == other["experts_for_90pct"]  # the routing statistics are the trace's


def test_no_decode_steps_is_an_error():
    t = hand_trace(TOPO, [("prefill", 0, 1, _tok(0, 1))])
    with pytest.raises(MoespacError, match="no decode"):
        rs.routing_stats(t)


def test_paper_reference_values():
    ref = rs.paper_reference()
    assert ref["hot_cold_accuracy"] == 0.87 and ref["smape"] == 0.490
    assert ref["hit_rate_range"] == (0.70, 0.75)
    assert (ref["num_layers"], ref["num_experts"], ref["top_k"]) == (48, 128, 8)
    assert math.isnan(ref["entropy_norm"]) and math.isnan(ref["reuse"])


def test_cli_writes_one_row_per_trace_and_the_paper_row(tmp_path, capsys):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    hand().save(a)
    hand("ar").save(b)
    out = tmp_path / "rs"
    assert main(["report", "routing-stats", "--trace", f"sd={a}", "--trace", f"ar trace={b}", "--out", str(out)]) == 0
    for ext in (".csv", ".md", ".html", ".tex"):
        assert out.with_suffix(ext).is_file()
    df = pd.read_csv(out.with_suffix(".csv"))
    assert df["label"].tolist() == ["sd", "ar trace", rs.PAPER_LABEL]
    direct = rs.routing_stats(hand())
    row = df.iloc[0]
    for key in rs.STATS:
        assert row[key] == pytest.approx(direct[key], abs=1e-12), key
    paper = df.iloc[2]
    assert (paper["hot_cold_accuracy"], paper["smape"]) == (0.87, 0.490) and math.isnan(paper["hot_cold_balanced"])
    assert paper["moespac_hit_rate"] == pytest.approx(np.mean([0.70, 0.71, 0.73, 0.75]))
    assert math.isnan(paper["experts_for_90pct"]) and paper["source"] == "paper"
    assert df["hit_rate_timing"].tolist() == ["simulated", "simulated", "paper"]
    md = out.with_suffix(".md").read_text()
    assert rs.TITLE in md and "| ar trace |" in md and "0.70-0.75" in md and "~0.87" in md
    assert "<td>sd</td>" in out.with_suffix(".html").read_text()


def test_cli_adds_the_whatif_skews(tmp_path):
    out = tmp_path / "w"
    from moespac.experiments.whatif import LocalitySweep

    small = LocalitySweep(tokens=16)
    assert rs.whatif_trace(2.0, small).topology == Topology(48, 128, 8)
    a = tmp_path / "a.npz"
    hand().save(a)
    assert main(["report", "routing-stats", "--trace", f"hand={a}", "--skews", "0,4", "--out", str(out)]) == 0
    df = pd.read_csv(out.with_suffix(".csv"))
    assert df["label"].tolist() == ["hand", "what-if skew 0", "what-if skew 4", rs.PAPER_LABEL]
    assert df["source"].tolist() == ["recorded", "synthetic", "synthetic", "paper"]
    assert df.loc[2, "entropy_norm"] < df.loc[1, "entropy_norm"]


@pytest.mark.parametrize("arg, named", [("nolabel.npz", "nolabel.npz"), ("x=", "'x='"), ("=a.npz", "=a.npz"),
                                        ("lbl=/no/such/trace.npz", "/no/such/trace.npz")])
def test_bad_trace_argument_is_a_one_line_error_naming_it(arg, named, tmp_path, capsys):
    assert main(["report", "routing-stats", "--trace", arg, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--trace" in err and named in err
    assert not (tmp_path / "x.csv").exists()


def test_not_a_trace_and_no_trace_are_errors(tmp_path, capsys):
    junk = tmp_path / "junk.npz"
    junk.write_text("not a trace")
    assert main(["report", "routing-stats", "--trace", f"j={junk}", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "j=" in err and "not a trace" in err
    assert main(["report", "routing-stats", "--out", str(tmp_path / "x")]) == 2
    assert "at least one --trace" in capsys.readouterr().err


def test_balanced_accuracy_tells_a_learned_pattern_from_class_imbalance():
    """2 of 16 experts active: on routing with no pattern the plain accuracy is still high (most experts are cold
    and called cold), while balanced accuracy sits at chance; on a fixed pattern both are near 1."""

    S, L, E = 200, 4, 16
    fixed = np.zeros((S, L, E), np.int32)
    fixed[:, :, [3, 7]] = 4
    rng = np.random.default_rng(0)
    noise = np.zeros((S, L, E), np.int32)
    for s in range(S):
        for layer in range(L):
            noise[s, layer, rng.choice(E, 2, replace=False)] = 4
    learned, chance = sm.hot_cold_accuracy(fixed, gamma=8), sm.hot_cold_accuracy(noise, gamma=8)
    assert learned["balanced_accuracy"] > 0.99 and learned["precision"] == 1.0 and learned["recall"] == 0.995
    assert chance["accuracy"] > 0.7 and abs(chance["balanced_accuracy"] - 0.5) < 0.03 and chance["precision"] < 0.2
