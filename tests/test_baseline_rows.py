"""Each Table 1 baseline row's defining mechanism, visible in its record, on traces of the kind the tables replay:
a paper-regime trace at Qwen3-30B-A3B's own depth, and a near-uniform 12-layer trace mapped onto Qwen3-30B-A3B
as the proxy's is; both replayed as a Table 1 cell is (RTX 4090 profile, Qwen3-30B-A3B experts, 25 % cache).
Each row is also set against the variant it would collapse into without its mechanism."""

from __future__ import annotations

import pytest

from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.sim import paper_routing as pr
from moespac.sim.simulate import SimConfig, simulate
from moespac.sim.synthetic import toy_spec

SUBSTRATES = {
    "paper-regime": (get_spec("qwen3-30b-a3b"), pr.RoutingParams(accept=0.74, temperature=1.3, persistence=0.99)),
    "proxy-like": (toy_spec(Topology(12, 128, 8)), pr.RoutingParams(accept=0.6, temperature=4.0, persistence=0.9)),
}


@pytest.fixture(scope="module", params=list(SUBSTRATES))
def traces(request):
    spec, params = SUBSTRATES[request.param]
    shape = pr.Shape(requests=1, new_tokens=24, prompt_tokens=16, gamma=8)
    return {ar: pr.paper_regime_trace(spec, params, shape, seed=7, ar=ar) for ar in (True, False)}


def cell(policy: str, traces, draft: bool = False) -> dict:
    """The record of one Table 1 cell of `policy` (the AR trace, or the speculative one with `draft`)."""
    cfg = SimConfig("t", policy, "rtx4090-pcie4", model_spec="qwen3-30b-a3b", cache_ratio=0.25,
                    allow_topology_mismatch=True, bounds=False, warmup_steps=0)
    rec = simulate(cfg, traces[not draft])
    return dict(rec["metrics"]["counters"], **rec["policy"]["stats"], hit_rate=rec["metrics"]["hit_rate"])


def test_specexp_runs_its_speculation_from_two_buffer_sets(traces):
    row, exact = cell("specexp", traces), cell("specexp:lossy_execution=false", traces)
    assert row["buffer_slots"] == 2 * 128  # not the 1536 slots of the run's cache
    assert row["substituted"] > 0 and row["ran_as_substitute"] >= row["substituted"] and row["ran_as_predicted"] > 0
    assert exact["substituted"] == 0 and exact["loads"] > row["loads"]  # the variant loads what the row replaces


def test_fate_caches_int4_experts_and_copies_each_used_one_again(traces):
    row, exact = cell("fate", traces), cell("fate:lossy_transfer=false", traces)
    assert row["restored"] > 0 == exact["restored"]
    assert row["hit_rate"] > exact["hit_rate"]  # 16/4.5 as many experts in the same memory
    assert row["slots_per_layer"][:4] == [128] * 4 and sum(row["slots_per_layer"]) <= int(1536 * 16 / 4.5)


def test_hybrimoe_row_prefetches_nothing_and_splits_with_the_host(traces):
    row, prefetching = cell("hybrimoe", traces), cell("hybrimoe:prefetch_size=none", traces)
    assert row["prefetched"] == 0 < prefetching["prefetched"] and row["host"] > 0


def test_sp_moe_prefetches_what_the_draft_phase_names(traces):
    row, previous = cell("sp-moe", traces, draft=True), cell("sp-moe:predictor=previous", traces, draft=True)
    assert row["prefetched"] > 0 and row["cutoff_layers"] > 0
    assert (row["hits"], row["prefetched"]) != (previous["hits"], previous["prefetched"])


def test_moe_speq_verifies_from_what_its_int4_draft_experts_leave(traces):
    row, whole = cell("moe-speq", traces, draft=True), cell("moe-speq:int4_resident=false", traces, draft=True)
    assert row["full_precision_slots"] == 128 and whole["full_precision_slots"] == 1536
    assert row["hit_rate"] < whole["hit_rate"]


def test_moe_infinity_row_fetches_on_demand_into_an_in_cache_lfu(traces):
    row, lfu = cell("moe-infinity", traces), cell("lfu:in_cache=true", traces)
    assert row["prefetched"] == 0 and {k: row[k] for k in ("hits", "loads", "evictions")} == \
        {k: lfu[k] for k in ("hits", "loads", "evictions")}
