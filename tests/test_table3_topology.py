"""Table 3 replays each model on a trace of its own routing shape: a trace of 128 experts mapped onto a
256-expert model by e mod E leaves half of the model's experts dead (a 25 % cache then holds half of the experts
in use), and one of top-8 routing replayed for a top-6 model routes too many experts per token."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from moespac.analysis.records import bench_row
from moespac.analysis.tables import mapping_tag
from moespac.models.registry import get_spec
from moespac.policy import Topology
from moespac.sim.synthetic import synthetic_trace
from moespac.sim.workload import make_workload
from moespac.workflow_checks import pair_routing

CONFIG = Path(__file__).resolve().parents[1] / "workflows" / "config" / "default.yaml"


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
