"""Paper-regime routing (moespac/sim/paper_routing.py): traces at a model's own depth whose alpha and a/b are
fitted to the paper's App. A.1, round-tripped; statistics no routing can have are refused; the fit reads no
throughput."""

import dataclasses

import numpy as np
import pytest

from moespac.errors import MoespacError
from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.sim import paper_routing as pr
from moespac.sim.profile import profile_yaml
from moespac.sim.synthetic import toy_spec
from moespac.trace import KINDS

SMALL = toy_spec(Topology(6, 32, 4))


def test_the_fit_round_trips_known_parameters():
    """Traces made with known parameters, measured, fitted back: the fitted routing has the same statistics
    (a/b within 0.02, the tolerance of the default study's check being 0.03; alpha is taken as given) and
    temperatures within 30 % of the truth."""
    truth = {"a": pr.RoutingParams(accept=0.6, temperature=0.5, persistence=0.95),
             "b": pr.RoutingParams(accept=0.85, temperature=2.0, persistence=0.95)}
    shape = dataclasses.replace(pr.FIT_SHAPE, gamma=6)
    measured = {b: pr.measured_statistics(pr.paper_regime_trace(SMALL, p, shape, seed=0)) for b, p in truth.items()}
    targets = {b: dict(alpha=m["alpha"], a_over_b=m["a_over_b"]) for b, m in measured.items()}
    smape = float(np.mean([m["smape"] for m in measured.values()]))
    fitted, note = pr.fit_routing(SMALL, targets, smape, gamma=6)
    for b, p in fitted.items():
        again = pr.measured_statistics(pr.paper_regime_trace(SMALL, p, shape, seed=0))
        assert abs(again["a_over_b"] - targets[b]["a_over_b"]) < 0.02, (b, again, targets[b])
        assert p.accept == targets[b]["alpha"]  # alpha is the acceptance probability itself
        assert abs(np.log(p.temperature / truth[b].temperature)) < np.log(1.3), (b, p.temperature)
    assert note == ""  # the sMAPE of a routing made by these parameters is within reach


@pytest.mark.parametrize("targets, needle", [
    ({"x": dict(alpha=0.7, a_over_b=0.05)}, "a/b 0.05"),  # fewer distinct experts than one token's top-k
    ({"x": dict(alpha=0.7, a_over_b=1.2)}, "a/b 1.2"),
    ({"x": dict(alpha=1.3, a_over_b=0.4)}, "acceptance 1.3"),
])
def test_statistics_no_routing_can_have_are_refused_naming_them(targets, needle):
    with pytest.raises(MoespacError, match=needle.replace(".", r"\.")):
        pr.fit_routing(SMALL, targets, 0.5, gamma=8)


def test_no_fit_reads_a_throughput(monkeypatch):
    """Every row of moespac/reference but the routing statistics is poisoned (MoE-SpAc's and HybriMoE's
    throughputs among them): the fit's inputs do not change."""
    import moespac.reference as reference

    clean = pr.paper_targets()
    real = reference.read_reference
    allowed = set(pr.ROUTING_QUANTITIES) | {"smape"}

    def poisoned(name):
        rows = [dict(r) for r in real(name)]
        for r in rows:
            if r.get("quantity") not in allowed:
                for key in r:
                    if key not in ("quantity", "context", "method", "benchmark"):
                        r[key] = "nan"
        return rows

    monkeypatch.setattr(reference, "read_reference", poisoned)
    assert pr.paper_targets() == clean
    assert any(r["quantity"] == "tps" for r in real("appendix_stats"))  # MoE-SpAc's TPS is there, and unread


def test_traces_have_the_models_own_depth_and_meaningful_cross_layer_predictions():
    spec = get_spec("qwen3-30b-a3b")
    params = pr.RoutingParams(accept=0.7, temperature=1.0, persistence=0.99)
    t = pr.paper_regime_trace(spec, params, pr.Shape(requests=1, new_tokens=32), seed=0)
    topo = t.topology
    assert (topo.num_layers, topo.num_experts, topo.top_k) == (48, 128, 8)
    assert t.meta["source"] == pr.SOURCE and "qwen3-30b-a3b" in t.trace_id()
    cross, ids = t.cross_topk, t.topk_ids
    assert (cross[:, -1] == -1).all() and (cross[:, :-1] >= 0).all()
    # the prediction of layer l + 1 from layer l's input: right far more often than a random top-8 of 128
    hits = np.mean([len(set(cross[n, l]) & set(ids[n, l + 1])) / 8 for n in range(len(ids)) for l in range(47)])
    assert hits > 3 * 8 / 128, hits
    again = pr.paper_regime_trace(spec, params, pr.Shape(requests=1, new_tokens=32), seed=0)
    assert np.array_equal(again.topk_ids, ids) and np.array_equal(again.cross_topk, cross)


def test_the_ar_trace_replays_the_kept_tokens():
    params = pr.RoutingParams(accept=0.6, temperature=1.0)
    shape = pr.Shape(requests=2, new_tokens=40, prompt_tokens=8, gamma=4)
    sd = pr.paper_regime_trace(SMALL, params, shape, seed=3)
    ar = pr.paper_regime_trace(SMALL, params, shape, seed=3, ar=True)
    kept, start = [], 0
    for s in range(sd.num_steps):
        n, out = int(sd.steps["step_tokens"][s]), int(sd.steps["step_emitted"][s])
        kept.append(sd.topk_ids[start:start + (n if sd.kind(s) == "prefill" else out)])
        start += n
    assert np.array_equal(np.concatenate(kept), ar.topk_ids)
    assert set(np.unique(ar.steps["step_kind"])) == {KINDS.index("prefill"), KINDS.index("ar")}
    assert ar.steps["step_emitted"].sum() == sd.steps["step_emitted"].sum() == 2 * 40


def _same_trace(a, b) -> bool:
    arrays = ("topk_ids", "topk_weights", "cross_topk", "self_draft_topk")
    return a.meta == b.meta and all(np.array_equal(a.steps[c], b.steps[c]) for c in a.steps) and all(
        (getattr(a, f) is None and getattr(b, f) is None) or np.array_equal(getattr(a, f), getattr(b, f))
        for f in arrays)


def _prefill(trace, request: int) -> np.ndarray:
    """The routed rows of a request's prefill step."""
    starts = np.r_[0, np.cumsum(trace.steps["step_tokens"])]
    s = int(np.flatnonzero((trace.steps["step_request"] == request)
                           & (trace.steps["step_kind"] == KINDS.index("prefill")))[0])
    return trace.topk_ids[starts[s]:starts[s + 1]]


def test_shared_draws_give_the_traces_drawn_alone():
    """One Sequences serves the SD trace and its AR twin, and Table 4's traces of every batch size: each equals the
    trace drawn on its own (request r of batch b holds sequences r*b .. r*b+b-1 of one stream, whichever batch size
    asks first). Draws of other arguments are refused."""
    params = pr.RoutingParams(accept=0.6, temperature=1.0)
    shape = pr.Shape(requests=2, new_tokens=30, prompt_tokens=8, gamma=4)
    drawn = pr.Sequences(SMALL, params, shape, seed=9)
    for ar in (True, False):  # the AR trace first: the SD one reads the sequences it drew
        assert _same_trace(pr.paper_regime_trace(SMALL, params, shape, seed=9, ar=ar, sequences=drawn),
                           pr.paper_regime_trace(SMALL, params, shape, seed=9, ar=ar))
    drawn = pr.Sequences(SMALL, params, shape, seed=9, self_draft=False)
    for b in (3, 1, 2):  # the largest first: the others read a prefix of its sequences
        batched = dataclasses.replace(shape, batch=b)
        shared = pr.paper_regime_trace(SMALL, params, batched, seed=9, self_draft=False, sequences=drawn)
        assert _same_trace(shared, pr.paper_regime_trace(SMALL, params, batched, seed=9, self_draft=False))
        assert shared.meta["batch_size"] == b
    # request 1 of batch 3 starts with the prefills of sequences 3, 4 and 5: requests 3, 4 and 5 drawn one by one
    alone = pr.paper_regime_trace(SMALL, params, dataclasses.replace(shape, requests=6), seed=9, self_draft=False)
    assert np.array_equal(_prefill(shared if b == 3 else pr.paper_regime_trace(
        SMALL, params, dataclasses.replace(shape, batch=3), seed=9, self_draft=False), 1),
        np.concatenate([_prefill(alone, r) for r in (3, 4, 5)]))
    for other in (dict(seed=10), dict(self_draft=True), dict(shape=dataclasses.replace(shape, gamma=2))):
        args = dict(dict(shape=shape, seed=9, self_draft=False), **other)
        with pytest.raises(MoespacError, match="drawn for other arguments"):
            pr.paper_regime_trace(SMALL, params, args.pop("shape"), sequences=drawn, **args)


@pytest.mark.parametrize("accept", [0.3, 0.56, 0.85])
def test_acceptance_draws_hold_alpha_in_few_steps(accept):
    """The drafts accepted per verify step follow P(at least i) = alpha^i (alpha = accepted / (accepted +
    rejections), as records measure it), and the golden-ratio draws hold it within 0.01 over 200 steps."""
    u, acc, rejected = 0.37, 0, 0
    for _ in range(200):
        u = (u + pr.GOLDEN) % 1.0
        a = pr.accepted_drafts(1.0 - u, accept, 8)
        acc, rejected = acc + a, rejected + (a < 8)
    assert abs(acc / (acc + rejected) - accept) < 0.01
    assert pr.accepted_drafts(0.5, 0.0, 8) == 0 and pr.accepted_drafts(1e-9, 1.0, 8) == 8


def test_the_self_draft_signal_keeps_its_fidelity_and_leaves_the_routing_as_it_was(monkeypatch):
    """Each drafted row's self-draft top-k matches the routed top-k at SELF_DRAFT_FIDELITY (the bonus row and
    prefill have none); it is drawn from its own stream, so the routing is the same as without it."""
    params = pr.RoutingParams(accept=0.6, temperature=1.0)
    shape = pr.Shape(requests=2, new_tokens=60, prompt_tokens=8, gamma=4)
    sd = pr.paper_regime_trace(SMALL, params, shape, seed=5)
    rows, ids, start, kept = sd.self_draft_topk, sd.topk_ids, 0, []
    for s in range(sd.num_steps):
        n = int(sd.steps["step_tokens"][s])
        block = rows[start:start + n]
        if sd.kind(s) == "prefill":
            assert (block == -1).all()
        else:
            assert (block[-1] == -1).all() and (block[:-1] >= 0).all()
            kept += [len(set(block[t, l]) & set(ids[start + t, l])) / SMALL.top_k
                     for t in range(n - 1) for l in range(SMALL.num_moe_layers)]
        start += n
    assert abs(np.mean(kept) - pr.SELF_DRAFT_FIDELITY) < 0.02, np.mean(kept)
    assert sd.meta["synthetic"]["self_draft_fidelity"] == pr.SELF_DRAFT_FIDELITY
    assert pr.paper_regime_trace(SMALL, params, shape, seed=5, ar=True).self_draft_topk is None
    assert "self_draft_topk" in sd.signals()
    monkeypatch.setattr(pr, "SELF_DRAFT_FIDELITY", 0.3)  # other self-draft draws, the same routing
    other = pr.paper_regime_trace(SMALL, params, shape, seed=5)
    assert np.array_equal(other.topk_ids, ids) and np.array_equal(other.cross_topk, sd.cross_topk)
    assert not np.array_equal(other.self_draft_topk, rows)


@pytest.mark.parametrize("rows", ["distinct", "repeated"])
def test_self_draft_rows_follow_their_definition(rows):
    """Each drafted entry is kept with probability fidelity, else replaced by the i-th expert outside its row, i drawn
    uniformly with integers(experts outside), one entry after another; the bonus row is -1. The vectorised rows equal
    that loop's, draw for draw (and a row with a repeated expert, which the generator never makes, takes the loop)."""
    rng = np.random.default_rng(4)
    E, k = 16, 3
    ids = np.stack([[rng.choice(E, k, replace=False) for _ in range(5)] for _ in range(7)])  # [n, L, k]
    if rows == "repeated":
        ids[2, 1] = [4, 4, 9]
    want = ids.copy()
    want[-1] = -1
    ref = np.random.default_rng(8)
    for t, layer, j in zip(*np.nonzero(ref.random((6, 5, k)) >= 0.7)):
        rest = [e for e in range(E) if e not in set(ids[t, layer].tolist())]
        want[t, layer, j] = rest[int(ref.integers(len(rest)))]
    got = pr.self_draft_rows(np.random.default_rng(8), ids, E, 0.7)
    assert np.array_equal(got, want)
    assert not np.array_equal(got[:-1], ids[:-1])


def test_gains_name_the_best_other_and_the_best_lossless_other():
    from moespac.experiments.paper_regime import gains

    tps = {"moespac": 20.0, "llamacpp-sd": 16.0, "fate": 50.0, "hybrimoe": 25.0, "oracle-sd": 99.0}
    record = dict(config=dict(methods=list(tps)),
                  metrics=dict(rows=[dict(benchmark="gsm8k",
                                          methods={k: {"tokens_per_s": v} for k, v in tps.items()})]))
    g = gains(record)["gsm8k"]
    assert g["vs"] == pytest.approx(0.25) and g["best"] == "fate" and g["vs_best"] == pytest.approx(-0.6)
    assert g["best_lossless"] == "hybrimoe" and g["vs_best_lossless"] == pytest.approx(-0.2)  # Fate copies INT4


def test_the_host_fit_reads_only_the_papers_llamacpp_rows_and_gives_them_back(monkeypatch, tmp_path):
    """Every reference row but the paper's llama.cpp (no SD) rows is poisoned, MoE-SpAc's and HybriMoE's among
    them: the fit is the same (and the a/b check, with only llama.cpp's two rows left, is the same too). Under the
    inferred host, llama.cpp on the fitted trace gives the paper's number
    back (bisection tolerance), and the profile is its own, marked inferred."""
    import moespac.reference as reference
    from moespac.sim import infer_host as ih

    spec = get_spec("qwen3-30b-a3b")
    params, shape = pr.RoutingParams(accept=0.83, temperature=1.3), pr.Shape(requests=1, new_tokens=24)
    trace = pr.paper_regime_trace(spec, params, shape, seed=1, benchmark="gsm8k", ar=True)
    real = reference.read_reference

    def poisoned(keep):
        def read(name):
            rows = [dict(r) for r in real(name)]
            for r in rows:
                if r.get("method") not in keep and "tps" in r:
                    r["tps"] = "nan"
            return rows
        return read

    clean = ih.infer_host("rtx4090-pcie4", {"gsm8k": trace}, 0.25, "qwen3-4b-fp8", tmp_path)
    ab = lambda: ih.ab_from_sd_gain(spec, {"gsm8k": params}, "rtx4090-pcie4", 0.25, "qwen3-4b-fp8", shape, steps=3)
    ab_clean = ab()
    monkeypatch.setattr(reference, "read_reference", poisoned(ih.PAPER_ROWS))
    assert ih.infer_host("rtx4090-pcie4", {"gsm8k": trace}, 0.25, "qwen3-4b-fp8", tmp_path)["value"] == clean["value"]
    monkeypatch.setattr(reference, "read_reference", poisoned(ih.SD_ROWS))
    assert ab() == ab_clean and ab_clean["gsm8k"]["paper_gain"] == pytest.approx(19.03 / 15.01)
    with pytest.raises(MoespacError, match="'MoE-SpAc'"):
        ih.paper_tps("MoE-SpAc")
    assert any(r["method"] == "MoE-SpAc" for r in real("table1_overall"))  # there, and unread
    monkeypatch.setattr(reference, "read_reference", real)
    path = tmp_path / "inferred.yaml"
    path.write_text(profile_yaml(clean["profile"]))
    assert ih.llamacpp_tps(str(path), trace, 0.25, "qwen3-4b-fp8") == pytest.approx(15.01, rel=0.01)
    assert clean["profile"].name == "rtx4090-pcie4-paper-inferred"
    assert "inferred, not measured" in clean["profile"].sources["host_mem_bandwidth"]
    assert 5e9 < clean["value"] < 1e12 and clean["reads"] == ["llama.cpp"]


def _sweep_record(points: list[tuple[str | None, str, float, dict]]) -> dict:
    """A paper-regime record whose inferred host is points[0] and whose sweep is the rest ({slug: tps} per point,
    the same on two benchmarks)."""
    (_, _, center, tps0), rest = points[0], points[1:]
    methods = list(tps0)
    rows = [dict(benchmark=b, methods_inferred={k: {"tokens_per_s": v} for k, v in tps0.items()})
            for b in ("gsm8k", "mt-bench")]
    sweep = [dict(parameter=f, label=label, value=v, tps={"gsm8k": tps, "mt-bench": tps}) for f, label, v, tps in rest]
    return dict(config=dict(methods=methods), metrics=dict(rows=rows, inferred_host=dict(value=center, sweep=sweep)))


def test_the_consistency_verdict_calls_where_the_headline_holds_and_what_moves_it():
    from moespac.analysis.consistency import sweep_points, verdict

    base = {"moespac": 20.0, "llamacpp-sd": 16.0, "hybrimoe": 25.0, "fate": 90.0, "oracle-sd": 99.0}
    record = _sweep_record([
        (None, "inferred host", 55e9, base),
        ("host_mem_bandwidth", "slow host", 30e9, dict(base, moespac=30.0)),  # +87.5 % over SD, ahead of HybriMoE
        ("link_bandwidth", "fast link", 32e9, dict(base, hybrimoe=40.0)),
    ])
    pts = sweep_points(record)
    assert [p["label"] for p in pts] == ["inferred host", "slow host", "fast link"]
    assert pts[0]["vs"] == pytest.approx(0.25) and pts[0]["vs_lossless"] == pytest.approx(-0.2)
    assert pts[1]["ahead"] == 2 and pts[2]["vs_lossless"] == pytest.approx(-0.5)  # Fate is lossy: never the bar
    text = verdict(record)
    assert ("reaching the paper's size at 1 of 3 points" in text
            and "at 1 of 3 points (closest: +20.0 % at slow host)" in text)
    assert "the host memory bandwidth (+25.0 % to +87.5 %) moves it most" in text
    assert "the host memory bandwidth (-20.0 % to +20.0 %) moves that gap most" in text
    assert ("direction over llama.cpp-w/ SD holds across the range" in text
            and "holds at some point of the range" in text)
    nowhere = verdict(_sweep_record([(None, "inferred host", 55e9, base), ("host_flops", "big", 5e12, base)]))
    assert "holds nowhere in it" in nowhere and "at 0 of 2 points" in nowhere
    # a study without llama.cpp-w/ SD (the tiny one) checks only the second half, and says so
    no_sd = {k: v for k, v in base.items() if k != "llamacpp-sd"}
    half = verdict(_sweep_record([(None, "inferred host", 55e9, no_sd), ("host_flops", "big", 5e12, no_sd)]))
    assert "llama.cpp-w/ SD was not replayed" in half and "holds nowhere in it" in half


def test_the_host_sweep_moves_one_parameter_per_point_and_keeps_the_rest(tmp_path):
    from moespac.experiments.paper_regime import Replays, host_sweep
    from moespac.sim.infer_host import PLAUSIBLE
    from moespac.sim.profile import load_profile

    center = load_profile("rtx4090-pcie4")
    seen = []

    def replay(slug, bench, hardware):
        seen.append(load_profile(hardware))
        return {"tokens_per_s": 1.0}

    out = host_sweep(center, ["moespac"], ["gsm8k"], Replays(replay), tmp_path)
    assert [(p["parameter"], p["value"]) for p in out] == [(f, v) for f, named in PLAUSIBLE.items() for _, v in named]
    for p, prof in zip(out, seen):
        moved = {f for f in PLAUSIBLE if getattr(prof, f) != getattr(center, f)}
        assert moved == {p["parameter"]} and getattr(prof, p["parameter"]) == pytest.approx(p["value"])
        assert prof.sources[p["parameter"]].startswith("plausible-range point")


def test_the_sweep_replays_the_headline_and_the_lossless_contenders():
    from moespac.experiments.paper_regime import contenders

    names = ("accelerate", "llamacpp", "llamacpp-sd", "mixtral-offload", "hybrimoe", "fate", "moespac", "oracle-sd")
    tps = {"gsm8k": (0.6, 15.0, 1.0, 7.0, 16.0, 80.0, 14.0, 30.0),
           "mt-bench": (0.6, 15.0, 1.0, 41.0, 47.0, 80.0, 24.0, 37.0)}
    on = {b: {n: {"tokens_per_s": v} for n, v in zip(names, values)} for b, values in tps.items()}
    # llama.cpp is within 2x of the best lossless on gsm8k only, Mixtral Offload on mt-bench only: both stay; Fate is
    # lossy, the oracle a bound, Accelerate far behind everywhere; the headline's two sides always stay
    assert contenders(on) == ["llamacpp", "llamacpp-sd", "mixtral-offload", "hybrimoe", "moespac"]
    # llama.cpp is the row the host is fitted to: it stays however slow (the page reads how each parameter moves it)
    slow = {b: dict(per, llamacpp={"tokens_per_s": 0.1}) for b, per in on.items()}
    assert "llamacpp" in contenders(slow)


def test_a_batched_trace_runs_its_sequences_together_and_routes_them_as_alone():
    """A request of b sequences holds exactly the routing of b one-sequence requests drawn in the same order: step i
    runs step i of every sequence still going (rows one after another), accepted drafts and new tokens summed."""
    params = pr.RoutingParams(accept=0.6, temperature=1.0)
    alone = pr.paper_regime_trace(SMALL, params, pr.Shape(requests=3, new_tokens=30, prompt_tokens=8, gamma=4), seed=5,
                                  self_draft=False)
    together = pr.paper_regime_trace(SMALL, params, pr.Shape(requests=1, new_tokens=30, prompt_tokens=8, gamma=4,
                                                             batch=3), seed=5, self_draft=False)
    assert together.meta["batch_size"] == 3 and together.trace_id().endswith("-g4-b3-s5")
    assert together.self_draft_topk is None and alone.self_draft_topk is None
    seqs = [np.flatnonzero(alone.steps["step_request"] == r) for r in range(3)]
    offsets = np.r_[0, np.cumsum(alone.steps["step_tokens"])]
    rows = lambda r, i: alone.topk_ids[offsets[seqs[r][i]]:offsets[seqs[r][i] + 1]]  # noqa: E731
    start = 0
    for i in range(together.num_steps):
        live = [r for r in range(3) if i < len(seqs[r])]
        n = int(together.steps["step_tokens"][i])
        assert np.array_equal(together.topk_ids[start:start + n], np.concatenate([rows(r, i) for r in live]))
        for col in ("step_tokens", "step_accepted", "step_emitted"):
            assert together.steps[col][i] == sum(alone.steps[col][seqs[r][i]] for r in live)
        start += n
    assert together.num_steps == max(map(len, seqs)) and together.steps["step_emitted"].sum() == 3 * 30
    with pytest.raises(MoespacError, match="autoregressive trace is batch 1"):
        pr.paper_regime_trace(SMALL, params, pr.Shape(batch=2), ar=True)


def test_the_consistency_page_says_which_host_parameters_the_llamacpp_rows_pin_down():
    from moespac.analysis.consistency import determined, render

    base = {"moespac": 20.0, "llamacpp": 15.0, "llamacpp-sd": 16.0}
    record = _sweep_record([
        (None, "inferred host", 55e9, base),
        ("host_mem_bandwidth", "server", 130e9, dict(base, llamacpp=30.0)),
        ("host_flops", "big", 5e12, dict(base, llamacpp=15.03)),  # +0.2 %: under the fit's residual of 1 %
        ("link_bandwidth", "fast link", 32e9, base),
    ])
    record["metrics"]["inferred_host"].update(targets={"gsm8k": 15.15, "mt-bench": 15.0}, per_benchmark={},
                                              low=1, high=1, base="rtx4090-pcie4", base_value=60.8e9)
    record["config"].update(model_spec="qwen3-30b-a3b", cache_ratio=0.25)
    got = {d["parameter"]: d for d in determined(record)}
    assert got["host_mem_bandwidth"]["determined"] and got["host_mem_bandwidth"]["high"] == pytest.approx(1.0)
    assert not got["host_flops"]["determined"] and got["host_flops"]["high"] == pytest.approx(0.002)
    assert not got["link_bandwidth"]["determined"] and got["host_flops"]["residual"] == pytest.approx(0.15 / 15.15)
    assert "| host compute | +0.0 % to +0.2 % | no: the rows barely depend on it; swept below |" in render(record)
    del record["metrics"]["rows"][0]["methods_inferred"]["llamacpp"]  # the fitted row not swept: nothing to say
    for p in record["metrics"]["inferred_host"]["sweep"]:
        p["tps"] = {b: {k: v for k, v in per.items() if k != "llamacpp"} for b, per in p["tps"].items()}
    assert determined(record) == []


def _regime_record() -> dict:
    """A paper-regime record by hand: two Table 1 methods on two benchmarks at the inferred host, Table 2's variants on
    one, and a 2 x 2 Table 4 grid (per-call aggregate samples)."""
    cell = lambda tps: dict(tokens_per_s=tps, latency_s=10.0, hit_rate=0.5, host_share=0.5,  # noqa: E731
                            per_request=dict(tokens_per_s=[tps - 1, tps + 1], latency_s=[9.0, 11.0]))
    rows = [dict(benchmark=b, sd_trace=f"sd-{b}", ar_trace=f"ar-{b}", measured=dict(alpha=0.8, a_over_b=0.5),
                 methods={"moespac": cell(5.0)}, methods_inferred={"moespac": cell(20.0), "llamacpp": cell(15.0)},
                 table2={"moespac": cell(20.0), "moespac-no-sd": cell(14.0)} if b == "gsm8k" else {})
            for b in ("gsm8k", "humaneval")]
    t4 = [dict(batch_size=b, gamma=g, trace=f"t{b}{g}", tokens_per_s=a / b, aggregate_tokens_per_s=a, latency_s=1.0,
               hit_rate=0.5, per_request=dict(aggregate_tokens_per_s=[a - 0.1, a + 0.1], latency_s=[1.0, 1.0]))
          for b, g, a in ((1, 4, 20.0), (1, 8, 24.0), (2, 4, 30.0), (2, 8, 30.1))]
    config = dict(hardware="rtx4090-pcie4", model_spec="qwen3-30b-a3b", draft_spec="qwen3-4b-fp8", gamma=8,
                  new_tokens=256, cache_ratio=0.25)
    return dict(kind="paper-regime", timing="simulated", config=config, config_hash="h",
                metrics=dict(rows=rows, inferred_host=dict(value=55e9), table4=dict(benchmark="mt-bench", cells=t4)))


def test_tables_1_2_and_4_show_the_paper_regime_cells_as_a_block_of_their_own():
    import pandas as pd

    from moespac.analysis.rows import COLUMNS, REGIME_ROUTING, for_table, regime_rows
    from moespac.analysis.tables import table1, table2, table4

    rows = pd.DataFrame(regime_rows(_regime_record()), columns=COLUMNS)
    t1 = for_table(rows, "table1")
    assert set(t1["method"]) == {"moespac", "llamacpp"} and len(t1) == 4  # the inferred host's cells, not the sourced
    assert t1["hardware"].str.contains("55.0 GB/s inferred from the paper's llama.cpp rows").all()
    assert (t1["model"] == f"qwen3-30b-a3b experts ({REGIME_ROUTING})").all()
    moespac = t1[(t1["method"] == "moespac") & (t1["benchmark"] == "gsm8k")].iloc[0]
    assert moespac["tps_lo"] < 20.0 < moespac["tps_hi"] and moespac["requests"] == 2 and moespac["gamma"] == 8
    assert t1[t1["method"] == "llamacpp"]["gamma"].eq(0).all()
    _, blocks = table1(t1)
    assert REGIME_ROUTING in blocks[0].title
    t2 = for_table(rows, "table2")
    assert sorted(t2["method"]) == ["moespac", "moespac-no-sd"] and set(t2["benchmark"]) == {"gsm8k"}
    _, blocks = table2(t2)
    assert any("w/o SD" in r[0] and "-30.0%" in r[1] for r in blocks[0].rows)
    t4 = for_table(rows, "table4")
    assert sorted(zip(t4["batch_size"], t4["gamma"])) == [(1, 4), (1, 8), (2, 4), (2, 8)]
    long, blocks = table4(t4)
    assert [b.title.split(",")[0] for b in blocks] == ["MoE-SpAc TPS per sequence",
                                                       "MoE-SpAc TPS aggregate over the batch"]
    assert long.loc[(long["batch_size"] == 2) & (long["gamma"] == 8), "aggregate_tps"].iloc[0] == pytest.approx(30.1)
    # the best gamma is named only where its interval separates from the others': batch 1 yes, batch 2 no
    assert "{1: '8', 2: 'not separable (4, 8)'}" in blocks[0].notes[0]


def test_fig6_draws_the_paper_regime_grid_beside_the_recorded_batch_sweep(tmp_path):
    """Figure 6 gains (c, d): MoE-SpAc per sequence and aggregated over the paper's batch grid, one line per gamma,
    with the paper's gamma = 8 row in grey; the aggregate is batch size x per sequence."""
    import json

    import matplotlib.pyplot as plt

    from moespac.analysis import style
    from moespac.analysis.outputs import get_output

    from moespac.record import make_record

    hand = _regime_record()
    path = tmp_path / "paper_regime.json"
    path.write_text(json.dumps(make_record("paper-regime", "simulated", hand["config"], hand["metrics"])))
    fig = get_output("fig6_batch").load().build({"batch": [], "regime": [str(path)]})
    assert len(fig.axes) == 4
    per_seq, aggregate = fig.axes[2:]
    for ax, want in ((per_seq, {4: [20.0, 15.0], 8: [24.0, 15.05]}), (aggregate, {4: [20.0, 30.0], 8: [24.0, 30.1]})):
        drawn = [list(line.get_ydata()) for line in ax.get_lines()
                 if not line.get_label().startswith("paper") and len(line.get_ydata())]
        assert drawn == [pytest.approx(v) for v in want.values()]  # seaborn draws the hue levels in order

        paper = [line for line in ax.get_lines() if line.get_label().startswith("paper")]
        assert len(paper) == 1 and paper[0].get_ydata()[0] == pytest.approx(24.10)  # the paper's batch 1, gamma 8
        assert paper[0].get_color() == style.PAPER_STYLE["color"]
        assert ax.get_xticks().tolist()[:2] == [1, 2]
    assert "per request" in per_seq.get_ylabel() and "aggregate" in aggregate.get_ylabel()
    (legend,) = fig.legends  # one, below (c) and (d)
    assert [t.get_text() for t in legend.get_texts()][:2] == ["gamma = 4", "gamma = 8"]
    plt.close(fig)


def test_the_study_is_the_same_over_any_number_of_processes(monkeypatch):
    """Its replays and fits spread over processes (`--jobs`, the workflow gives it every core): only when they finish
    may change, never a number (each is a pure function of its trace, method and host)."""
    from moespac.experiments.paper_regime import PaperRegimeStudy, run_study

    cfg = PaperRegimeStudy(methods=("moespac", "llamacpp", "llamacpp-sd"), benchmarks=("gsm8k", "mt-bench"),
                           model_spec="deepseek-v2-lite", requests=1, new_tokens=12, table4_benchmark="gsm8k",
                           table4_batch_sizes=(1, 2), table4_gammas=(2, 4), table2_methods=("moespac-no-sd",),
                           table2_benchmarks=("gsm8k",))
    fits, fit = [], pr.fit_routing
    monkeypatch.setattr(pr, "fit_routing", lambda *a, **k: fits[0] if fits else fits.append(fit(*a, **k)) or fits[0])
    one, two = run_study(cfg), run_study(cfg, jobs=2)  # the routing fit is serial, and the same: made once
    assert one["metrics"] == two["metrics"] and one["config"] == two["config"]
    sweep = one["metrics"]["inferred_host"]["sweep"]
    assert len(sweep) > 1 and len({p["tps"]["gsm8k"]["moespac"] for p in sweep}) > 1  # the points differ


def test_pmap_keeps_the_order_and_runs_nested_maps_in_the_worker():
    import os

    from moespac.parallel import pmap

    parent, scale = os.getpid(), np.arange(5)  # a closure over an array: nothing but indices is pickled

    def work(i):
        inner = pmap(lambda j: (j, os.getpid()), range(3), jobs=2)  # in a worker: a plain loop there
        return i * scale.sum(), os.getpid(), {pid for _, pid in inner}

    out = pmap(work, range(6), jobs=2)
    assert [v for v, _, _ in out] == [i * 10 for i in range(6)]
    assert all(pid != parent and inner == {pid} for _, pid, inner in out)
    assert pmap(work, range(3), jobs=1)[0][1] == parent
