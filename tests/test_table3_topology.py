"""Table 3 replays each model on a trace of its own routing shape: a trace of 128 experts mapped onto a
256-expert model by e mod E leaves half of the model's experts dead (a 25 % cache then holds half of the experts
in use), and one of top-8 routing replayed for a top-6 model routes too many experts per token."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from moespac.analysis.rows import bench_row
from moespac.analysis.tables import mapping_tag
from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.sim.synthetic import synthetic_trace
from moespac.sim.workload import make_workload
from moespac.workflow_checks import pair_routing

CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"


def test_every_table3_model_of_the_default_study_replays_a_trace_of_its_experts_and_top_k():
    config = yaml.safe_load(CONFIG.read_text())
    for entry in config["table3"]["models"]:
        pair = entry.get("pair") or config["simulation"]["pair"]
        spec = get_spec(entry["spec"])
        assert pair_routing(config["pairs"][pair]) == (spec.num_experts, spec.top_k), (entry, pair)


@pytest.mark.parametrize("spec_name, experts, top_k", [("minimax-m2.5", 256, 8), ("deepseek-v2-lite", 64, 6)])
def test_a_trace_of_the_models_shape_maps_its_layers_only(spec_name, experts, top_k):
    """Such a trace is mapped by layers only: every expert it routes is one the replay schedules, none is
    folded onto another, and the table says 'layers' where a 128-expert top-8 trace says experts too."""
    spec = get_spec(spec_name)
    trace = synthetic_trace(Topology(12, experts, top_k), new_tokens=64, gamma=4, seed=0)
    work = make_workload(trace, spec, allow_topology_mismatch=True)
    assert mapping_tag(work.mapping) == "mapped: layers by modulo"
    assert work.topology.top_k == top_k and work.counts.shape[2] == experts
    routed = trace.counts().sum(axis=0) > 0  # [12, E]
    assert np.array_equal(work.counts.sum(axis=0)[:12] > 0, routed)
    wide = make_workload(synthetic_trace(Topology(12, 128, 8), new_tokens=64, gamma=4, seed=0), spec,
                         allow_topology_mismatch=True)
    assert mapping_tag(wide.mapping) != "mapped: layers by modulo"
    assert "(trace layers mapped)" in model_column(work.mapping)
    assert "(trace layers/experts mapped)" in model_column(wide.mapping)


def model_column(mapping: str) -> str:
    """The Model column of a simulated record replayed with this topology mapping."""
    from records import simulated_record

    rec = simulated_record()
    rec["simulation"] = dict(rec.get("simulation") or {}, topology_mapping=mapping)
    return bench_row(rec)["model"]


PAPER = CONFIG.parent / "paper.yaml"


def test_each_paper_table3_model_is_its_hub_pair_with_a_fallback_of_its_routing_shape():
    """The paper config traces each Table 3 model as a real hub pair where its memory plan fits this machine; the
    fallback that stands in elsewhere routes the model's experts and top-k (a built routing shape, or a real pair
    of that shape: Qwen3-30B-A3B routes 128 experts top-8, as GLM-4.5-Air does)."""
    from moespac.models.specs import PAPER_MODELS

    config = yaml.safe_load(PAPER.read_text())
    hub_shape = {s.hub_id: (s.num_experts, s.top_k) for s in PAPER_MODELS.values() if s.hub_id}
    for entry in config["table3"]["models"]:
        spec = get_spec(entry["spec"])
        if entry["spec"] == "qwen3-30b-a3b":  # Section 4.6's RTX 4060 row: Qwen3 itself
            continue
        assert config["pairs"][entry["pair"]]["target"] == spec.hub_id, entry
        fallback = config["pairs"][entry["fallback_pair"]]
        shape = pair_routing(fallback) or hub_shape[fallback["target"]]
        assert shape == (spec.num_experts, spec.top_k), entry


def test_the_memory_plan_picks_the_pairs_own_trace_only_when_it_fits_and_names_a_draft():
    from moespac.workflow_checks import table3_choice

    entry = {"spec": "deepseek-v2-lite", "pair": "ds", "fallback_pair": "shape"}
    with_draft = {"ds": {"target": "deepseek-ai/DeepSeek-V2-Lite", "draft": "me/ds-int4"}}
    fits = {"fits": True, "reason": None, "slots": 100, "total_slots": 1664}
    too_big = {"fits": False, "reason": "memory plan: the host needs 40 GiB"}
    assert (table3_choice(entry, fits, with_draft, needs_draft=True)
            == ("ds", "ds fits this machine (100 of 1664 expert slots)"))
    pair, why = table3_choice(entry, too_big, with_draft, needs_draft=True)
    assert pair == "shape" and "does not fit" in why and "host needs 40 GiB" in why
    no_draft = {"ds": {"target": "deepseek-ai/DeepSeek-V2-Lite"}}
    pair, why = table3_choice(entry, fits, no_draft, needs_draft=True)
    assert pair == "shape" and "names no draft (pairs.ds.draft)" in why
    assert table3_choice(entry, fits, no_draft, needs_draft=False)[0] == "ds"  # autoregressive methods only


def paper_with(edit) -> dict:
    config = yaml.safe_load(PAPER.read_text())
    for key in ("smoke", "proxy_stats", "tracking", "figures", "whatif"):  # sections paper.yaml takes from default
        config.setdefault(key, yaml.safe_load(CONFIG.read_text())[key])
    edit(config)
    return config


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c["table3"]["models"][0].update(fallback_pair="proxy-shape-256x8"),
     "table3.models[0].fallback_pair': 'proxy-shape-256x8' routes 256 experts top-8, deepseek-v2-lite 64 top-6"),
    (lambda c: c["table3"]["models"][0].update(pair="proxy-shape-64x6"),
     "table3.models[0].pair': 'proxy-shape-64x6' is not a hub pair"),
    (lambda c: c["engine"].update(pair="glm-4.5-air"), "engine.pair': hub pair 'glm-4.5-air' names no draft"),
], ids=["fallback-shape", "not-hub", "draftless-elsewhere"])
def test_a_table3_plan_config_that_cannot_work_is_refused_naming_the_key(edit, needle):
    from moespac.errors import MoespacError
    from moespac.workflow_checks import check_table3_plans

    with pytest.raises(MoespacError) as e:
        check_table3_plans(paper_with(edit))
    assert needle in str(e.value)
    check_table3_plans(paper_with(lambda c: None))  # the shipped one passes
