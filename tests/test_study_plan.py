"""moespac/study_plan.py: which files a workflow config asks for, decided without a file, a model or the engine."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moespac.study_plan import StudyPlan, TraceKey, cell_path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())


def test_every_simulated_cell_names_its_trace_and_every_trace_what_it_is():
    plan = StudyPlan(DEFAULT)
    cells = [c for name, files in plan.studies.items() if name != "traces" for c in files
             if c.startswith("results/simulated/")]
    assert cells and set(cells) <= set(plan.trace_of)
    for cell in cells:
        trace = plan.trace_of[cell]
        k = plan.trace_key[trace]
        assert trace == cell_path("trace", ".npz", **vars(k)) and f"/{k.pair}/{k.benchmark}/" in cell
    # MoE-SpeQ reads the self-draft signal: the SD trace its cells replay is recorded with it, no other
    speq = [plan.trace_of[c] for c in cells if "/moe-speq/" in c]
    assert speq and all("self_draft_topk" in plan.signals_of[t] for t in speq)
    assert not any("self_draft_topk" in plan.signals_of[plan.trace_of[c]] for c in cells if "/none/" in c)


def test_derived_ar_traces_are_no_engine_run():
    plan = StudyPlan(DEFAULT)
    ar = cell_path("trace", ".npz", pair=DEFAULT["simulation"]["pair"], benchmark="gsm8k", gamma=0, batch=1,
                   tokens=DEFAULT["simulation"]["max_new_tokens"])
    assert plan.derives_ar_trace(plan.trace_key[ar]) and ar.replace(".npz", ".json") not in plan.studies["traces"]
    assert not plan.derives_ar_trace(TraceKey(DEFAULT["simulation"]["pair"], "gsm8k", 8, 1, 512))
    recorded = dict(DEFAULT, simulation=dict(DEFAULT["simulation"], ar_traces="recorded"))
    assert (StudyPlan(recorded).derived_ar_pairs() == []
            and ar.replace(".npz", ".json") in StudyPlan(recorded).studies["traces"])


def test_the_paper_regime_record_joins_tables_1_2_and_4_only_when_it_runs():
    plan = StudyPlan(DEFAULT)
    for study in ("table1", "table2", "table4"):
        assert "results/whatif/paper_regime.json" in plan.studies[study]
    assert "results/whatif/paper_regime.json" not in plan.studies["table3"]
    off = dict(DEFAULT, whatif=dict(DEFAULT["whatif"], paper_regime=dict(DEFAULT["whatif"]["paper_regime"],
                                                                          activate=False)))
    assert all("results/whatif/paper_regime.json" not in files for files in StudyPlan(off).studies.values())
    assert "paper_figs/consistency.md" not in StudyPlan(off).final_outputs()


def test_a_table3_entry_decided_by_a_memory_plan_needs_one_and_gets_what_it_decides():
    config = dict(DEFAULT, table3=dict(DEFAULT["table3"], models=[
        {"spec": "deepseek-v2-lite", "hardware": "rtx4090-pcie4", "pair": "proxy",
         "fallback_pair": "proxy-shape-64x6"}]))
    with pytest.raises(ValueError, match=r"table3.models\[0\] has a fallback_pair"):
        StudyPlan(config)
    asked = []
    plan = StudyPlan(config, table3_pair=lambda i, e: asked.append(i) or e["fallback_pair"])
    assert asked and set(asked) == {0}
    assert all("/proxy-shape-64x6/" in c for c in plan.studies["table3"])


def test_planning_a_study_loads_no_engine_and_no_torch():
    code = ("import sys, yaml; from moespac.study_plan import StudyPlan; "
            f"StudyPlan(yaml.safe_load(open({str(REPO / 'config/config.yaml')!r}))); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('moespac.engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
