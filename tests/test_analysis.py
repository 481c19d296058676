"""Tables, audit and figure helpers: exact arithmetic on the paper's numbers and on hand-made rows."""

import numpy as np
import pandas as pd
import pytest

from moespac.analysis import audit, paper, tables
from moespac.analysis.rows import COLUMNS
from moespac.analysis.render import cell, latex, Block
from moespac.errors import MoespacError
from moespac.catalogue import get_method, k_method
from moespac.workflow_checks import check_names


def test_paper_speedup_readings_and_the_claims_they_test():
    t1 = paper.table1()
    averages = t1[t1["benchmark"] == "average"].set_index("method")["tps"]
    r = audit.speedup_readings(averages)
    assert ((round(r["mean_of_ratios"], 2), round(r["geometric_mean"], 2), round(r["ratio_of_means"], 2))
            == (6.92, 5.07, 3.68))
    assert r["n"] == 11
    verdicts = {c.claim: c.verdict for c in audit.claims()}
    assert verdicts["+41.9 % (\"42 %\") average TPS over the strongest baseline, llama.cpp-w/ SD"] == "re-derives"
    assert verdicts["4.04x average speedup over the standard baselines"] == "does not re-derive"
    pattern = next(c for c in audit.claims() if c.claim == "latency is measured per request like TPS")
    assert "MoE-SpeQ, SpecExp" in pattern.derived  # exactly these two rows have TPS x latency = 512


def test_k_variants_of_a_catalogue_method():
    assert get_method(k_method(6)).policy == "moespac:K=6" and get_method("moespac-k6").draft
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
    titles = [b.title.split(" — (paper N)")[0] for b in blocks]
    assert titles == ["TPS, simulated on rtx4090-pcie4 — model: m; s",
                      "latency (s), simulated on rtx4090-pcie4 — model: m; s",
                      "TPS, measured on CPU — model: m; s", "latency (s), measured on CPU — model: m; s"]
    # a block whose cells sit beside the paper's says, in its header, that those ran elsewhere on another model
    assert all("(paper N) = the paper's own run (RTX 4090" in b.title and "not this hardware nor this model"
               in b.title for b in blocks)
    sim_tps = {r[0]: r for r in blocks[0].rows}
    assert sim_tps["MoE-SpAc"][1] == "30.00 S n=1 (paper 27.82)"  # one request: no interval
    assert sim_tps["Rel. Imprv. (MoE-SpAc vs the best Table 1 baseline here)"][1] == "+50.0% S (paper +46.2%)"
    # the simulated block has no qa cell: its Average is left empty rather than averaged over fewer benchmarks
    assert blocks[0].columns == ["Method", "GSM8K", "Average"]
    meas = {r[0]: r for r in blocks[2].rows}
    assert meas["MoE-SpAc"][1:] == ["3.00 M n=1 (paper 27.82)", "5.00 M n=1 (paper 23.56)", "4.00 M (paper 25.06)"]
    avg = long[(long["benchmark"] == "average") & (long["timing"] == "measured") & long["tps"].notna()]
    assert avg["tps"].tolist() == [4.0]


def test_headers_name_proxy_prompt_sets_and_which_rows_the_draft_serves():
    """A column of offline proxy prompts says '(proxy)' beside the paper's column name; a measured block with SD
    and AR rows says which rows the draft serves, not 'draft X; no draft'; Table 2 says what its +x % is."""
    df = rows(("measured", "moespac", "mmlu-pro", 3.0, 9.0), ("measured", "moespac-no-sd", "mmlu-pro", 2.0, 9.0),
              ("measured", "moespac", "gsm8k", 5.0, 8.0), ("measured", "moespac-no-sd", "gsm8k", 4.0, 8.0))
    df["proxy_prompts"] = df["benchmark"] == "mmlu-pro"
    df["source"] = ["draft proxy/draft@1", "no draft"] * 2
    _, blocks = tables.table1(df, ["mmlu-pro", "gsm8k"])
    assert blocks[0].columns == ["Method", "MMLU-Pro (proxy)", "GSM8K", "Average"]
    assert blocks[0].title.startswith("TPS, measured on CPU — model: m; SD rows draft with proxy/draft@1 — (paper N)")
    assert "no draft" not in blocks[0].title
    ablation = df.assign(method=["moespac", "moespac-no-adabc"] * 2)
    ablation["label"] = [get_method(m).label for m in ablation["method"]]
    _, t2 = tables.table2(ablation)
    assert t2[0].columns[1] == "MMLU-Pro (proxy) TPS"
    assert t2[0].notes[0].startswith("+x % after a variant's TPS: its TPS over the full MoE-SpAc's in this block")
    assert {r[0]: r[1] for r in t2[0].rows}["w/o AdaBC"].endswith(f", {100 * (2.0 / 3.0 - 1):+.1f}%")


def test_the_html_table_is_the_markdown_tables_content_escaped(tmp_path):
    """What the Snakemake report embeds: a page with the title, the legend, each block as a captioned table with
    its notes, every cell of the Markdown table in it (escaped)."""
    from html.parser import HTMLParser

    from moespac.analysis.render import write_table

    blocks = [Block("TPS, **measured** on CPU <x>", ["Method", "GSM8K"], [["MoE-SpAc", "3.00 M (paper 27.82)"],
                                                                          ["a & b", "–"]], ["note *one*"])]
    paths = write_table(tmp_path / "t", "Table 9: test", pd.DataFrame({"x": [1]}), blocks)
    assert [p.suffix for p in paths] == [".csv", ".md", ".tex", ".html"]
    page = (tmp_path / "t.html").read_text()

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.text, self.cells = [], [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag in ("td", "th", "caption", "li"):
                self.text = []

        def handle_endtag(self, tag):
            if tag in ("td", "th", "caption", "li"):
                self.cells.append((tag, "".join(self.text)))

        def handle_data(self, data):
            self.text.append(data)

    parsed = Cells()
    parsed.feed(page)
    assert ("caption", "TPS, measured on CPU <x>") in parsed.cells  # markup rendered, text escaped
    assert [c for t, c in parsed.cells if t in ("th", "td")] == ["Method", "GSM8K", "MoE-SpAc", "3.00 M (paper 27.82)",
                                                                  "a & b", "–"]
    assert ("li", "note one") in parsed.cells and "<title>Table 9: test</title>" in page
    assert "<b>measured</b>" in page and "&lt;x&gt;" in page and page.count("<table>") == 1


def test_audit_sets_moespac_against_the_best_baseline_and_the_ablations_direction(tmp_path):
    """Every timing block of the audit says MoE-SpAc against the best baseline of that block (not only against
    the paper's strongest), which rows beat it, and whether the ablations are slower as the paper claims."""
    df = rows(("simulated", "moespac", "gsm8k", 20.0, 1.0), ("simulated", "llamacpp-sd", "gsm8k", 16.0, 2.0),
              ("simulated", "hybrimoe", "gsm8k", 25.0, 1.0), ("simulated", "oracle-sd", "gsm8k", 40.0, 1.0))
    long, _ = tables.table1(df, ["gsm8k"])
    long.to_csv(tmp_path / "t1.csv", index=False)
    lines = audit.our_comparison(tmp_path / "t1.csv")
    # one request per cell: no interval, so no direction is called, whatever the averages say
    assert "MoE-SpAc over llama.cpp-w/ SD +25.0 % on the averages (paper +41.9 %)" in lines[0]
    assert lines[0].endswith("not separable on 1 (gsm8k): cannot be called (no benchmark's intervals separate)")
    assert ("MoE-SpAc against the best baseline here, HybriMoE (25.00 TPS), -20.0 %" in lines[1]
            and lines[1].endswith("a higher average than MoE-SpAc: HybriMoE (faster on 0 of 1 where the intervals "
                                 "separate)"))  # the oracle is no baseline; one request: no call
    assert "no benchmark has intervals for both (one request per cell)" in lines[2]
    # the oracle is a bound: the audit says how much of it MoE-SpAc reaches (20 / 40)
    assert any(line.endswith("MoE-SpAc reaches 50 % of the Offline oracle w/ SD (reference) (40.00 TPS), which "
                             "knows each request's routing in advance") for line in lines)
    df.loc[df["method"] == "moespac", ["tps_lo", "tps_hi"]] = (19.0, 21.0)
    df.loc[df["method"] == "hybrimoe", ["tps_lo", "tps_hi"]] = (24.0, 26.0)
    df.loc[df["method"] == "llamacpp-sd", ["tps_lo", "tps_hi"]] = (15.0, 18.5)  # apart from MoE-SpAc's
    tables.table1(df, ["gsm8k"])[0].to_csv(tmp_path / "t1.csv", index=False)
    lines = audit.our_comparison(tmp_path / "t1.csv")
    assert lines[0].endswith("faster on 1 (gsm8k): supports the claim's direction where the intervals separate")
    assert "slower on 1 (gsm8k): does not support it" in lines[1]
    assert lines[1].endswith("HybriMoE (faster on 1 of 1 where the intervals separate)")
    assert lines[2].endswith("the 95 % intervals separate on 1 of 1 benchmarks (gsm8k)")
    df.loc[df["method"] == "llamacpp-sd", ["tps_lo", "tps_hi"]] = (10.0, 20.5)  # overlaps: not called
    tables.table1(df, ["gsm8k"])[0].to_csv(tmp_path / "t1.csv", index=False)
    assert audit.our_comparison(tmp_path / "t1.csv")[0].endswith("cannot be called (no benchmark's intervals separate)")
    t2 = rows(("simulated", "moespac", "gsm8k", 20.0, 1.0), ("simulated", "moespac-no-adabc", "gsm8k", 22.0, 1.0),
              ("simulated", "moespac-no-hetwb", "gsm8k", 18.0, 1.0),
              ("simulated", "moespac-released", "gsm8k", 30.0, 1.0))
    long2, _ = tables.table2(t2)
    long2.to_csv(tmp_path / "t2.csv", index=False)
    [line] = audit.ablation_comparison(tmp_path / "t2.csv")
    assert "w/o HetWB -10.0 %, w/o AdaBC +10.0 %" in line and "released" not in line  # a variant, not an ablation
    assert "cannot be called (no variant's intervals separate from the full system's)" in line  # one request each
    t2.loc[t2["method"] == "moespac", ["tps_lo", "tps_hi"]] = (19.5, 20.5)
    t2.loc[t2["method"] == "moespac-no-adabc", ["tps_lo", "tps_hi"]] = (21.0, 23.0)
    t2.loc[t2["method"] == "moespac-no-hetwb", ["tps_lo", "tps_hi"]] = (17.0, 19.0)
    tables.table2(t2)[0].to_csv(tmp_path / "t2.csv", index=False)
    [line] = audit.ablation_comparison(tmp_path / "t2.csv")
    assert ("does not support it: 1 of 2 variants are faster than the full system on a benchmark where the "
            "intervals separate (w/o AdaBC); slower where they separate: w/o HetWB") in line
    page = audit.render(tmp_path / "t1.csv", tmp_path / "t2.csv")
    assert "From paper_figs/table2.csv (the ablations)" in page and line in page


def test_a_row_that_is_not_its_system_says_so(tmp_path):
    """The engine running llama.cpp's placement is not llama.cpp (M rows say so); Accelerate on a machine without
    a GPU offloads nothing (its W row says so); the released-code MoE-SpAc is a row of its own."""
    from baselines.programs._common import wrapped_record
    from moespac.analysis.rows import wrapped_row

    df = rows(("measured", "moespac", "gsm8k", 3.0, 9.0), ("measured", "llamacpp-sd", "gsm8k", 2.0, 9.0),
              ("measured", "moespac-released", "gsm8k", 2.5, 9.0))
    df["note"] = [None, "this engine running its policy", None]
    _, blocks = tables.table1(df, ["gsm8k"])
    names = [r[0] for r in blocks[0].rows]
    assert names[:3] == ["MoE-SpAc", "llama.cpp-w/ SD (this engine running its policy)", "MoE-SpAc (released code)"]
    requests = [dict(id="gsm8k/1", new_tokens=8, decode_s=0.5, prefill_s=0.1, decode_tokens_per_s=14.0,
                     latency_s=0.6, prompt_tokens=12)]
    rec = wrapped_record("accelerate", dict(system="accelerate", model_pair=str(tmp_path), benchmark="gsm8k"), requests,
                         method="accelerate", placement=dict(offloaded=False))
    assert wrapped_row(rec)["note"] == "nothing offloaded: no GPU"
    assert wrapped_row(dict(rec, placement=dict(offloaded=True)))["note"] is None
    import json
    from pathlib import Path

    from moespac.analysis.rows import ENGINE_NOTE, bench_row

    fixture = json.loads((Path(__file__).parent / "fixtures" / "record_simulated.json").read_text())
    for policy, note in (("llamacpp-sd", ENGINE_NOTE), ("moespac", None)):
        measured = dict(fixture, timing="measured", config=dict(fixture["config"], policy=policy))
        assert bench_row(measured)["note"] == note and bench_row(dict(measured, timing="simulated"))["note"] is None


def test_a_lossy_row_is_marked_and_moespac_is_also_compared_with_the_best_lossless_baseline():
    """Fate's row copies INT4 experts: it carries a ‡ and the note, and beside 'vs the best baseline' (Fate here)
    the table says where MoE-SpAc stands against the best baseline that computes what it computes (HybriMoE)."""
    from moespac.analysis.rows import bench_row
    from records import simulated_record

    cells = [("moespac", "moespac", 8, 10.0), ("fate", "fate", 0, 40.0), ("hybrimoe", "hybrimoe", 0, 8.0)]
    records = [simulated_record(method=m, policy=p, gamma=g, tps=t) for m, p, g, t in cells]
    df = pd.DataFrame([bench_row(r) for r in records]).reindex(columns=COLUMNS)
    assert df["lossy"].tolist() == [False, True, False]
    _, blocks = tables.table1(df, ["gsm8k"])
    rows = {r[0]: r for r in blocks[0].rows}
    assert "Fate†‡" in rows and "HybriMoE†" in rows and tables.LOSSY_NOTE in blocks[0].notes  # both stand-ins too
    best = rows["Rel. Imprv. (MoE-SpAc vs the best Table 1 baseline here)"][1]
    exact = rows["Rel. Imprv. (MoE-SpAc vs the best lossless Table 1 baseline here)"][1]
    assert best.startswith("-75.0%") and exact.startswith("+25.0%")


def test_audit_also_sets_moespac_against_the_best_lossless_baseline_when_the_best_is_lossy(tmp_path):
    df = rows(("simulated", "moespac", "gsm8k", 20.0, 1.0), ("simulated", "fate", "gsm8k", 60.0, 1.0),
              ("simulated", "hybrimoe", "gsm8k", 25.0, 1.0))
    df["lossy"] = df["method"] == "fate"
    tables.table1(df, ["gsm8k"])[0].to_csv(tmp_path / "t1.csv", index=False)
    lines = audit.our_comparison(tmp_path / "t1.csv")
    assert any("the best baseline here, Fate (60.00 TPS)" in line for line in lines)
    assert any("the best baseline here is lossy (Fate); against the best lossless one, HybriMoE (25.00 TPS), "
               "MoE-SpAc is -20.0 % on the averages" in line for line in lines)
    df["lossy"] = False  # nothing lossy: no such line
    tables.table1(df, ["gsm8k"])[0].to_csv(tmp_path / "t1.csv", index=False)
    assert not any("lossless" in line for line in audit.our_comparison(tmp_path / "t1.csv"))


def test_a_stand_in_row_is_marked_and_says_what_stands_in_under_the_table():
    """A row whose policy documents a stand-in (Policy.stand_in, as `moespac policy list` shows it) carries a †
    and its text under the table; a policy that is its system's rule (LRU here) does not."""
    from moespac.analysis.rows import bench_row, stand_in_of
    from moespac.registry import make_policy
    from records import simulated_record

    records = [simulated_record(method=m, policy=m, gamma=8) for m in ("sp-moe", "lru")]
    df = pd.DataFrame([bench_row(r) for r in records]).reindex(columns=COLUMNS)
    assert df["stand_in"].iloc[0] == make_policy("sp-moe").stand_in and df["stand_in"].isna().iloc[1]
    assert stand_in_of("moe-speq:elb=previous") == stand_in_of("sp-moe:predictor=previous") != stand_in_of("moe-speq")
    _, blocks = tables.table1(df, ["gsm8k"])
    assert [r[0] for r in blocks[0].rows[:2]] == ["SP-MoE†", "LRU (reference)"]
    assert [n for n in blocks[0].notes if "†" in n] == [f"SP-MoE†: a stand-in, not all of its system "
                                                       f"({make_policy('sp-moe').stand_in}; `moespac policy list`)"]


def test_table3_says_how_each_trace_stands_for_its_model():
    """A 128-expert top-8 trace mapped onto a 256-expert model reaches half of its experts; onto a 64-expert
    top-6 one it is folded and routes top-8: the Model column says so in words."""
    assert tables.mapping_tag("modulo: spec layer l replays trace layer l mod 12, trace expert e -> e mod 256 (trace "
                              "num_layers=12 != spec num_moe_layers=48; trace num_experts=128 != spec "
                              "num_experts=256)") \
        == "mapped: layers by modulo; trace reaches 128 of its 256 experts"
    assert tables.mapping_tag("modulo: ... (trace num_layers=12 != spec num_moe_layers=26; "
                              "trace num_experts=128 != spec num_experts=64; trace top_k=8 != spec top_k=6)") == \
        "mapped: layers by modulo; trace's 128 experts folded onto 64; routes the trace's top-8, not its top-6"
    assert tables.mapping_tag(None) == "trace of this shape"
    df = rows(("simulated", "moespac", "mt-bench", 20.0, 1.0), ("simulated", "hybrimoe", "mt-bench", 10.0, 2.0))
    df["model"] = "minimax-m2.5 experts (trace layers/experts mapped)"
    df["mapping"] = "x (trace num_experts=128 != spec num_experts=256)"
    _, blocks = tables.table3(df)
    assert {r[1] for r in blocks[0].rows} == {"minimax-m2.5 (mapped: trace reaches 128 of its 256 experts)"}


def test_a_cell_shows_the_95_percent_interval_of_its_mean_over_requests(tmp_path):
    """A cell of several requests shows its mean, its Student-t interval (scipy's, to the table's precision) and n;
    one request shows n=1 and no interval."""
    import json
    from pathlib import Path

    from moespac.analysis.intervals import mean_interval, separate
    from moespac.analysis.rows import load_rows

    from scipy import stats

    for xs in ([10.0, 12.0, 14.0, 16.0], [20.0, 30.0], list(np.linspace(1, 9, 45) ** 1.5)):
        ref = stats.t.interval(0.95, len(xs) - 1, loc=np.mean(xs), scale=stats.sem(xs))
        assert np.allclose(mean_interval(xs, "k"), ref, rtol=0, atol=1e-3 * np.std(xs)), xs
    assert mean_interval([10.0], "k") is None and mean_interval([10.0, float("nan")], "k") is None
    assert separate((1, 2), (3, 4)) and not separate((1, 3), (2, 4)) and not separate(None, (1, 2))
    rec = json.loads((Path(__file__).parent / "fixtures" / "record_simulated.json").read_text())
    for r, tps in zip(rec["requests"], (20.0, 30.0)):
        r["tokens_per_s"] = tps
    rec["metrics"]["tokens_per_s"]["mean"] = 25.0
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    row = load_rows([path]).iloc[0]
    assert (row["tps_lo"], row["tps_hi"]) == mean_interval([20.0, 30.0], f"{rec['config_hash']}:tps")
    assert row["tps_lo"] < 20.0 < 30.0 < row["tps_hi"] and row["requests"] == 2  # two requests bound little
    _, blocks = tables.table1(load_rows([path]), ["gsm8k"])
    shown = blocks[0].rows[0][1]
    assert shown == f"25.00 S [{row['tps_lo']:.2f}, {row['tps_hi']:.2f}] n=2 (paper 27.82)"
    assert any(n.startswith("[lo, hi] n=N after a number: the 95 % Student-t interval") for n in blocks[0].notes)


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


def test_every_declared_output_has_its_builder_and_the_cli_imports_no_plotting():
    import subprocess
    import sys

    from moespac.analysis.outputs import OUTPUTS

    for o in OUTPUTS.values():
        assert callable(o.load()), o.name
    # building the CLI (every `moespac` call, the workflow's too) reads the declarations, not the builders
    code = ("import sys, moespac.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('matplotlib', 'pandas') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


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
    _, (block, aggregate) = tables.table4(df)
    assert block.columns == ["Batch \\ gamma", "2", "8"]
    assert block.rows == [["1", "10.00 S n=1 (paper 20.79)", "12.00 S n=1 (paper 24.10)"],
                          ["2", "– (paper 20.67)", "11.00 S n=1 (paper 26.01)"]]
    # one request per cell: no interval, so no gamma is called the best where another has a number
    assert block.notes[0].startswith("best gamma per batch size (ours, named only where its interval separates from "
                                     "every other gamma's): {1: 'not separable (2, 8)', 2: '8'}")
    assert "per sequence" in block.title and "aggregate over the batch" in aggregate.title
    assert aggregate.rows[1] == ["2", "– (paper 20.67)", "22.00 S n=1 (paper 26.01)"]  # batch x per sequence

    t3 = rows(("simulated", "moespac", "humaneval", 40.0, 1.0), ("simulated", "hybrimoe", "humaneval", 20.0, 2.0))
    t3["model"] = "deepseek-v2-lite experts (trace layers/experts mapped)"
    _, (block,) = tables.table3(t3)
    by = {r[2]: r for r in block.rows}
    assert by["MoE-SpAc"] == ["rtx4090-pcie4", "deepseek-v2-lite (trace of this shape)", "MoE-SpAc",
                              "40.00 S n=1 (paper 47.26)"]
    assert by["Rel. Improv."][3] == "+100.0% S"
    # the Model column names whose trace stands for the model (a fallback's routing shape, or the model's own)
    t3["source"] = "trace of results/models/proxy-shape-64x6/target; draft cost of qwen3-4b-fp8"
    _, (block,) = tables.table3(t3)
    assert block.rows[0][1] == "deepseek-v2-lite (trace of this shape; trace of results/models/proxy-shape-64x6/target)"


@pytest.fixture
def record(tmp_path):
    """record(name, **settings) -> the path of a simulated record of those settings (a file under tmp_path)."""
    import json

    from records import simulated_record

    def write(name, method="moespac", gamma=8, cache=0.25, tokens=64, batch=1, tps=10.0):
        rec = simulated_record("mt-bench", tps, latency=1.0, method=method, policy=get_method(method).policy,
                               gamma=gamma, batch_size=batch,
                               max_new_tokens=tokens, cache_ratio=cache, hardware="rtx4090-pcie4",
                               model_spec="qwen3-30b-a3b", target="t")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rec))
        return str(path)

    return write


def sweep_groups(record, tps=lambda i: 10.0 + 5 * i):
    """The groups of Figures 5-7: two or three cells per sweep, the i-th with tokens/s tps(i)."""
    cache = [record(f"c{c}", cache=c, tps=tps(i)) for i, c in enumerate((0.1, 0.5))]
    return {"cache": cache, "length": [record(f"n{n}", tokens=n, tps=tps(i)) for i, n in enumerate((64, 128))],
            "K": [record(f"k{k}", method=k_method(k), tps=tps(i)) for i, k in enumerate((2, 4, 8))],
            "batch": [record(f"b{b}", batch=b, method="hybrimoe", gamma=0, tps=tps(i))
                      for i, b in enumerate((1, 2, 4))],
            "records": cache + [record(f"ar{c}", method="moespac-no-sd", gamma=0, cache=c, tps=tps(i))
                                for i, c in enumerate((0.1, 0.5))]}


def test_sweep_figures_from_records(tmp_path, record):
    """Figures 5-7 from hand-made records (the workflow test switches these sweeps off to stay short), the
    same bytes when drawn twice."""
    from moespac.analysis.outputs import get_output

    groups = sweep_groups(record)
    for name in ("fig5_sensitivity", "fig6_batch", "fig7_draft_vs_cache"):
        png, pdf = get_output(name).load()(groups, tmp_path / name)
        assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF"
        again, _ = get_output(name).load()(groups, tmp_path / f"{name}-again")
        assert again.read_bytes() == png.read_bytes()


def build(name, groups):
    """The figure NAME of `groups`, drawn (so that text has its extent) and left open."""
    from moespac.analysis.outputs import get_output

    fig = get_output(name).load().build(groups)
    fig.canvas.draw()
    return fig


@pytest.fixture
def traces(tmp_path):
    """Figure 4's groups as the workflow gives them: three short synthetic SD traces and their AR twins."""
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace

    groups = {}
    for name, gamma in (("sd", 4), ("ar", 0)):
        for seed in range(3):
            path = tmp_path / f"{name}{seed}.npz"
            synthetic_trace(Topology(2, 8, 2), new_tokens=48, gamma=gamma, prompt_tokens=4, seed=seed).save(path)
            groups.setdefault(name, []).append(str(path))
    return groups


def test_fig4_legend_covers_no_curve(traces):
    import matplotlib.pyplot as plt

    fig = build("fig4_hot_cold", traces)
    assert len(fig.axes) == 3  # one panel per predictor: SD steps and AR tokens never share an x axis
    fig.canvas.draw()
    (legend,) = fig.legends  # one, below the panels
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert len(ax.get_lines()) == 4  # one per benchmark and the paper's line
        for line in ax.get_lines():
            assert not box.overlaps(line.get_window_extent()), line.get_label()
    plt.close(fig)


def shown_ticklabels(axis):
    """The tick labels drawn: matplotlib also keeps those of ticks just outside the view."""
    lo, hi = sorted(axis.get_view_interval())
    return [t for x, t in zip(axis.get_majorticklocs(), axis.get_majorticklabels()) if lo <= x <= hi]


def test_fig5_panels_text_does_not_overlap(record):
    import matplotlib.pyplot as plt

    fig = build("fig5_sensitivity", sweep_groups(record, tps=lambda i: 20.123 + 0.05 * i))
    texts = list(fig.texts)  # the suptitle and the footnote
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *shown_ticklabels(ax.xaxis), *shown_ticklabels(ax.yaxis)]
    # a few pixels apart, not merely not touching
    boxes = [(t, t.get_window_extent().padded(3)) for t in texts if t.get_visible() and t.get_text()]
    for i, (a, box) in enumerate(boxes):
        for b, other in boxes[i + 1:]:
            assert not box.overlaps(other), (a.get_text(), b.get_text())
        for ax in fig.axes:  # nor over a neighbouring panel
            if a.axes not in (None, ax):
                assert not box.overlaps(ax.get_window_extent()), (a.get_text(), ax.get_title())
    plt.close(fig)


def test_fig6_ticks_at_the_batch_sizes_and_tps_per_request(record):
    import matplotlib.pyplot as plt

    fig = build("fig6_batch", sweep_groups(record))
    per_request, aggregate = fig.axes
    for ax in fig.axes:
        assert ax.get_xticks().tolist() == [1, 2, 4]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert "per request" in per_request.get_ylabel() and "aggregate" in aggregate.get_ylabel()
    # the records' per-request mean as it is in (a); batch size x it in (b)
    assert per_request.get_lines()[0].get_ydata().tolist() == [10.0, 15.0, 20.0]
    assert aggregate.get_lines()[0].get_ydata().tolist() == [10.0, 30.0, 80.0]
    plt.close(fig)


def test_rate_axes_start_at_zero_even_when_the_values_differ_by_half_a_percent(record):
    import matplotlib.pyplot as plt

    groups = sweep_groups(record, tps=lambda i: 20.0 * (1 + 0.005 * i))
    for name in ("fig5_sensitivity", "fig6_batch", "fig7_draft_vs_cache"):
        fig = build(name, groups)
        for ax in fig.axes:
            assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 20.2, (name, ax.get_title())
        plt.close(fig)


def test_sweep_lines_draw_each_cells_interval(record):
    """Figure 5's lines carry a band of each cell's 95 % interval over requests, in the line's colour."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from moespac.analysis.rows import load_rows

    groups = sweep_groups(record)
    fig = build("fig5_sensitivity", groups)
    ax = fig.axes[0]  # the cache-ratio panel
    bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_paths()]  # seaborn adds an empty one
    rows = load_rows(groups["cache"]).sort_values("cache_ratio")
    assert len(bands) == 1 and rows["tps_lo"].notna().all()
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert np.isclose(ys.min(), rows["tps_lo"].min()) and np.isclose(ys.max(), rows["tps_hi"].max())
    plt.close(fig)


def colour(handle):
    """The RGBA colour of a legend handle (a line, a marker collection or a bar)."""
    from matplotlib.colors import to_rgba_array
    from matplotlib.lines import Line2D

    return tuple(to_rgba_array(handle.get_color() if isinstance(handle, Line2D) else handle.get_facecolor())[0])


def test_every_paper_number_drawn_is_labelled_the_papers_with_its_setting(traces, record, tmp_path):
    import json

    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from moespac.analysis import style

    over = tmp_path / "overhead.json"
    over.write_text(json.dumps(dict(timing="measured", paper=dict(estimator_ms_per_step=0.063, state_kb=30),
                                    metrics=dict(estimator_ms_per_step=0.01, tau_ms_per_generation=0.7, state_kb=30,
                                                 shape=[48, 128, 8], gamma=8))))
    b8 = [record(f"g{g}", gamma=g) for g in (2, 8)]
    grey = to_rgba(style.PAPER_STYLE["color"])
    for name, groups in (("fig4_hot_cold", traces), ("fig5_sensitivity", sweep_groups(record)),
                         ("fig8_expert_reuse", {"records": b8}), ("fig_overhead", {"record": [str(over)]})):
        fig = build(name, groups)
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
        labels = [text.get_text() for leg in legends for handle, text in zip(leg.legend_handles, leg.get_texts())
                  if colour(handle) == grey]  # the paper's numbers are drawn grey
        assert labels, f"{name}: no paper artist"
        for label in labels:
            assert "paper" in label and "Qwen3-30B-A3B" in label, (name, label)
        plt.close(fig)


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
    assert by["Accelerate"][1:] == ["5.00 W n=1 (paper 1.21)", "7.00 W n=1 (paper 1.16)", "6.00 W (paper 1.17)"]
    assert "vLLM: skipped, not run here on gsm8k, qa (needs CUDA)" in wrapped.notes
    assert not any("draft cost" in n for n in wrapped.notes)


def test_speedup_aggregates_name_and_drop_their_largest_contributor():
    """One very slow baseline can carry a mean of ratios (the reproduced 3.75x was mostly Accelerate's 25.8x):
    each reading is also given without it, naming it."""
    avg = pd.Series({"MoE-SpAc": 20.0, "Accelerate": 1.0, "llama.cpp": 16.0, "HybriMoE": 10.0})
    text = audit.aggregates(avg)
    assert text.startswith("mean of ratios 7.75x")  # (20 + 1.25 + 2) / 3
    assert "without the largest contributor, Accelerate (20.0x alone): 1.62x" in text  # (1.25 + 2) / 2
    [claim] = [c for c in audit.table1_claims() if c.claim.startswith("4.04x")]
    assert "without the largest contributor, Accelerate" in claim.derived


def test_a_handicapped_sd_baseline_is_said_beside_the_claim(tmp_path):
    df = rows(("simulated", "moespac", "gsm8k", 20.0, 1.0), ("simulated", "llamacpp-sd", "gsm8k", 12.0, 2.0),
              ("simulated", "llamacpp", "gsm8k", 16.0, 1.0))
    tables.table1(df, ["gsm8k"])[0].to_csv(tmp_path / "t1.csv", index=False)
    line = audit.our_comparison(tmp_path / "t1.csv")[0]
    assert ("here llama.cpp-w/ SD is 25.0 % slower than llama.cpp without SD on the same traces "
            "(the paper: +16.0 %)") in line


def test_table1_says_which_rows_its_intervals_cannot_tell_apart_and_why():
    """Two systems whose intervals overlap on every benchmark get a note: the catalogue's mechanism where it has
    one (Mixtral-Offloading and MoE-Infinity's released on-demand path), else a flag; separated rows get none."""
    from moespac.analysis.rows import record_row
    from records import simulated_record

    cells = [("mixtral-offload", "mixtral-offloading", 10.0), ("moe-infinity", "moe-infinity", 10.1),
             ("lru", "lru", 10.05), ("hybrimoe", "hybrimoe", 60.0)]  # n = 2: wide intervals
    records = [simulated_record(method=m, policy=p, tps=t, benchmark=b) for m, p, t in cells for b in ("gsm8k", "qa")]
    df = pd.DataFrame([record_row(f"r{i}.json", r) for i, r in enumerate(records)]).reindex(columns=COLUMNS)
    _, blocks = tables.table1(df, ["gsm8k", "qa"])
    notes = [n for n in blocks[0].notes if "not told apart" in n]
    assert any(n.startswith("Mixtral Offload and MoE-Infinity") and "per-layer LRU" in n for n in notes)
    assert any("LRU (reference)" in n and "cells of 2 requests" in n for n in notes)  # no shared mechanism known
    assert not any("HybriMoE" in n for n in notes)
    assert not any("not told apart" in n for n in blocks[1].notes)  # the latency block does not repeat them


def test_audit_covers_tables_3_and_4_appendix_a1_and_the_wrapped_block(tmp_path):
    """The audit reads our Table 3, Table 4 and App. A.1 too: a direction is called only where the intervals
    separate, Table 4's best gamma likewise, batch scaling is given per request and in aggregate."""
    t3 = rows(("simulated", "moespac", "gsm8k", 20.0, 1.0), ("simulated", "hybrimoe", "gsm8k", 25.0, 1.0),
              ("simulated", "fate", "gsm8k", 60.0, 1.0))
    t3["lossy"] = [False, False, True]
    t3[["tps_lo", "tps_hi"]] = [(19.0, 21.0), (24.0, 26.0), (59.0, 61.0)]
    t3.to_csv(tmp_path / "t3.csv", index=False)
    best, lossless = audit.table3_comparison(tmp_path / "t3.csv")
    assert ("against the best other method, Fate, -66.7 %" in best
            and best.endswith("slower on 1 (gsm8k): does not support it"))
    assert "against the best lossless one, HybriMoE, -20.0 %" in lossless
    t4 = rows(*[("simulated", "moespac", "gsm8k", tps, 1.0) for tps in (20.0, 18.0, 9.0, 8.9)])
    t4["batch_size"], t4["gamma"] = [1, 1, 4, 4], [2, 8, 2, 8]
    t4[["tps_lo", "tps_hi"]] = [(19.5, 20.5), (17.5, 18.5), (8.5, 9.5), (8.4, 9.4)]
    t4.to_csv(tmp_path / "t4.csv", index=False)
    called, scaling = audit.table4_comparison(tmp_path / "t4.csv")
    assert "batch 1: 2; batch 4: not called (gamma 2 leads gamma 8 by 1.1 %, intervals overlap on 1 of 1" in called
    assert "per-request TPS -55.0 %, aggregate TPS (x batch size) +80.0 %" in scaling
    a1 = pd.DataFrame([dict(table="appendix_a1", timing="simulated", hardware="h", model="m", quantity=q, benchmark=b,
                            value=v, paper_value=p) for q, b, v, p in (("alpha", "gsm8k", 0.8, 0.83),
                                                                        ("hit_rate", "gsm8k", 0.4, 0.73),
                                                                        ("omega", "gsm8k", 4.0, None))])
    a1.to_csv(tmp_path / "a1.csv", index=False)
    [line] = audit.appendix_comparison(tmp_path / "a1.csv")
    assert line.startswith("simulated, h, m: alpha 0.80-0.80 (the paper: 0.83-0.83); "
                           "GPU hit rate 0.40-0.40 (the paper:")
    w = rows(("wrapped", "llamacpp", "gsm8k", 90.0, 1.0), ("wrapped", "accelerate", "gsm8k", 9.0, 1.0))
    w.to_csv(tmp_path / "w.csv", index=False)
    [line] = audit.wrapped_comparison(tmp_path / "w.csv")
    assert "llama.cpp 90.00 TPS, Accelerate 9.00 TPS" in line and "MoE-SpAc is not in this block" in line
    page = audit.render(table3=tmp_path / "t3.csv", table4=tmp_path / "t4.csv", appendix_a1=tmp_path / "a1.csv")
    assert "From paper_figs/table3.csv" in page and scaling in page and line not in page
