"""Routing statistics of an activation trace, so every workload (proxy pair, Table 3 topology proxy, what-if
skew, imported trace) can be placed beside the paper's Qwen3-30B-A3B.

Everything is computed over the trace's decode steps (kinds 'verify' and 'ar'; prefill is left out), with
counts = (token, top-k slot) routing entries naming each expert:

- experts_for_90pct: per layer, the fewest experts whose summed counts over the trace reach 90 % of the layer's
  entries; median over layers (uniform routing needs about 0.9 E, one dominant expert 1).
- entropy_norm: per layer, the entropy of the layer's expert distribution over the trace divided by log E;
  mean over layers (1 = uniform).
- top_share: per layer, the most-routed expert's share of the layer's entries; mean over layers (uniform: 1/E).
- distinct_per_step: distinct experts per layer in a decode step, mean over (step, layer); the `distinct_mean`
  of moespac.scheduler.metrics.expert_cost_ratio. distinct_uniform is what uniform routing would give:
  E (1 - (1 - k/E)^n) for a step of n tokens (the what-if's uniform_distinct), mean over the decode steps.
- reuse: |A_s & A_{s-1}| / |A_s| per layer over consecutive decode steps of the same request (A = experts a step
  activates), mean over (pair, layer): moespac.routing.locality, proxy-stats' `reuse`.
- hot_cold_accuracy (and hot_cold_balanced, its balanced accuracy), smape: moespac.scheduler.metrics.hot_cold_accuracy
  and .smape on the whole trace, as
  `moespac bench` computes them for its records (the estimator runs over all decode steps in order; a trace
  without verify steps is scored with MoE-SpAc's AR mode, ablation no-sd, as Fig. 4's AR curve).
- moespac_hit_rate: the GPU expert-cache hit rate of MoE-SpAc (its AR mode on a trace without drafts) when the
  trace is simulated (moespac.sim.simulate): the only simulated number here.
"""

from __future__ import annotations

import math

import numpy as np

from moespac.errors import MoespacError
from moespac.trace import KINDS

STATS = ("alpha", "a_over_b", "experts_for_90pct", "entropy_norm", "top_share", "distinct_per_step",
         "distinct_uniform", "reuse", "hot_cold_accuracy", "hot_cold_balanced", "smape", "moespac_hit_rate")
"""The statistics, in table order (routing_stats also returns the trace's size and topology)."""

PAPER_LABEL = "paper (Qwen3-30B-A3B)"
PAPER_MODEL = "qwen3-30b-a3b"
HIT_RATE_QUANTITY = "gpu_cache_hit_rate"

COVERAGE = 0.9


def experts_for_coverage(totals: np.ndarray, coverage: float = COVERAGE) -> np.ndarray:
    """Per layer of totals [L, E]: the fewest experts whose counts sum to >= coverage x the layer's entries."""
    desc = -np.sort(-totals, axis=1)
    cum = np.cumsum(desc, axis=1)
    need = coverage * totals.sum(1, keepdims=True)
    # 1 + the number of prefixes still short of the target; a tolerance keeps exact products (0.9 x 10) exact
    return 1 + (cum < need - 1e-9 * np.maximum(need, 1)).sum(1)


def entropy_norm(totals: np.ndarray) -> np.ndarray:
    """Per layer of totals [L, E]: entropy of the expert distribution / log E (NaN where E = 1 or no entries)."""
    E = totals.shape[1]
    n = totals.sum(1, keepdims=True).astype(np.float64)
    p = np.divide(totals, n, out=np.zeros(totals.shape), where=n > 0)
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(1)
    return h / math.log(E) if E > 1 else np.full(len(totals), np.nan)


def uniform_distinct(num_experts: int, top_k: int, tokens) -> np.ndarray:
    """Expected distinct experts per layer of a step of `tokens` tokens under uniform top-k routing."""
    return num_experts * (1 - (1 - top_k / num_experts) ** np.asarray(tokens, dtype=np.float64))


def moespac_policy(trace) -> str:
    """MoE-SpAc with its draft where the trace has verify steps, else its AR mode (ablation no-sd)."""
    return "moespac" if "draft" in trace.signals() else "moespac:ablation=no-sd"


def routing_stats(trace, hardware: str = "rtx4090-pcie4", model_spec: str = "trace", cache_ratio: float = 0.25,
                  bounds: bool = False, allow_topology_mismatch: bool | None = None, policy: str | None = None,
                  draft_spec: str | None = None) -> dict:
    """The statistics of the module docstring for one trace, plus its size (decode `steps`, their `tokens`,
    `requests`, `new_tokens` emitted) and topology (L, E, k).

    The hit rate simulates `policy` (default: moespac_policy(trace)) on `hardware` with `cache_ratio` of the
    experts on the device; model_spec 'trace' takes the trace's own spec, another registry name maps the trace
    onto that model (allow_topology_mismatch defaults to True then)."""
    from moespac.routing import decode_counts, locality
    from moespac.scheduler import metrics as sm
    from moespac.scheduler.config import MoESpAcConfig
    from moespac.sim.simulate import SimConfig, simulate

    topo = trace.topology
    L, E, k = topo.num_layers, topo.num_experts, topo.top_k
    counts, tokens = sm.step_counts(trace)  # decode steps (verify / ar)
    if not len(counts):
        raise MoespacError(f"trace {trace.trace_id() or '?'}: no decode (verify / ar) steps to take statistics of")
    totals = counts.sum(0, dtype=np.int64)  # [L, E] over the decode steps
    decode = np.isin(trace.steps["step_kind"], [KINDS.index("verify"), KINDS.index("ar")])
    sd = "draft" in trace.signals()
    hot_cold = sm.hot_cold_accuracy(trace, None if sd else MoESpAcConfig(ablation="no-sd"))
    policy = policy or moespac_policy(trace)
    if allow_topology_mismatch is None:
        allow_topology_mismatch = model_spec != "trace"
    sim = SimConfig(trace=trace.trace_id() or "trace", policy=policy, hardware=hardware, model_spec=model_spec,
                    draft_spec=draft_spec, cache_ratio=cache_ratio, bounds=bounds,
                    allow_topology_mismatch=allow_topology_mismatch)
    hit = simulate(sim, trace=trace)["metrics"]["hit_rate"]
    a1 = _appendix_a1(trace)
    top = totals.max(1) / np.maximum(totals.sum(1), 1)
    return dict(
        steps=len(counts), tokens=int(tokens.sum()), tokens_per_step=float(tokens.mean()),
        requests=len(np.unique(trace.steps["step_request"][decode])),
        new_tokens=int(trace.steps["step_emitted"].sum()), num_layers=L, num_experts=E, top_k=k,
        alpha=a1["alpha"], a_over_b=a1["a_over_b"],
        experts_for_90pct=float(np.median(experts_for_coverage(totals))),
        entropy_norm=float(np.mean(entropy_norm(totals))),
        top_share=float(np.mean(top)),
        distinct_per_step=float(sm.expert_cost_ratio(trace)["distinct_mean"]),
        distinct_uniform=float(uniform_distinct(E, k, tokens).mean()),
        reuse=float(locality(decode_counts(trace))[0]),
        hot_cold_accuracy=float(hot_cold["accuracy"]), hot_cold_balanced=float(hot_cold["balanced_accuracy"]),
        smape=float(sm.smape(trace)),
        moespac_hit_rate=float(hit), moespac_policy=policy, hot_cold_mode="sd" if sd else "ar (no-sd)",
        hardware=hardware, model_spec=model_spec, cache_ratio=cache_ratio)


def _appendix_a1(trace) -> dict:
    """alpha and a/b per token as App. A.1 defines them and the paper-regime fit reads them; NaN without drafts."""
    from moespac.sim.paper_routing import measured_statistics

    if not (trace.steps["step_kind"] == KINDS.index("verify")).any():
        return dict(alpha=float("nan"), a_over_b=float("nan"))
    m = measured_statistics(trace)
    return dict(alpha=m["alpha"], a_over_b=m["a_over_b"])


def paper_reference() -> dict:
    """The paper's values of these statistics where it gives them (moespac/reference/appendix_stats.csv):
    hot/cold accuracy ~0.87 (Sec. 4.3), sMAPE 0.490 (Qwen3-30B, App. B.1), GPU cache hit rate per benchmark
    (App. C.2, 0.70-0.75: `hit_rate` is their mean, `hit_rate_range` (low, high)); NaN elsewhere."""
    from moespac.experiments.proxy_stats import paper_reference as proxy_reference
    from moespac.models.specs import get_spec
    from moespac.reference import read_reference

    ref = proxy_reference()
    hits = {r["context"]: float(r["value"]) for r in read_reference("appendix_stats")
            if r["quantity"] == HIT_RATE_QUANTITY}
    spec = get_spec(PAPER_MODEL)
    out = {s: float("nan") for s in STATS}
    out.update(hot_cold_accuracy=_num(ref["hot_cold_accuracy"]), smape=_num(ref["smape"]),
               moespac_hit_rate=float(np.mean(list(hits.values()))) if hits else float("nan"))
    return dict(out, num_layers=spec.num_moe_layers, num_experts=spec.num_experts, top_k=spec.top_k,
                hit_rate_by_benchmark=hits,
                hit_rate_range=(min(hits.values()), max(hits.values())) if hits else None)


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def whatif_trace(skew: float, sweep=None):
    """The speculative synthetic trace of the what-if at `skew` (moespac.experiments.whatif.run_locality_sweep's, with
    the LocalitySweep's settings: its model spec's shape, tokens, gamma, persistence, acceptance, seed 0)."""
    from moespac.models.specs import get_spec
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace
    from moespac.experiments.whatif import LocalitySweep

    cfg = sweep or LocalitySweep()
    spec = get_spec(cfg.model_spec)
    topo = Topology(spec.num_moe_layers, spec.num_experts, spec.top_k)
    return synthetic_trace(topo, gamma=cfg.gamma, new_tokens=cfg.tokens, skew=skew, persistence=cfg.persistence,
                           accept=cfg.accept, model_spec=spec, seed=0)


def source_of(trace) -> str:
    """'synthetic, A.1 fit' (moespac.sim.paper_routing: the paper-regime study's), 'synthetic' (moespac.sim.synthetic),
    'imported' (moespac import-trace) or 'recorded' (the engine)."""
    from moespac.sim.paper_routing import SOURCE

    if "synthetic" in trace.meta:
        return "synthetic, A.1 fit" if trace.meta.get("source") == SOURCE else "synthetic"
    if trace.meta.get("imported"):
        return "imported"
    return "recorded"


# ---- the table ------------------------------------------------------------------------------------------------

TITLE = ("Routing statistics of every workload beside the paper's (timing: none, counts read from traces; the hit "
         "rate: simulated)")

_COLUMNS = [("alpha", "alpha", 3), ("a_over_b", "a/b per token", 3),
            ("experts_for_90pct", "experts for 90 %", 1), ("entropy_norm", "entropy / log E", 3),
            ("top_share", "top expert share", 3), ("distinct_per_step", "distinct / step", 1),
            ("distinct_uniform", "uniform distinct / step", 1), ("reuse", "reuse", 3),
            ("hot_cold_accuracy", "hot/cold acc.", 3), ("hot_cold_balanced", "hot/cold balanced acc.", 3),
            ("smape", "sMAPE", 3),
            ("moespac_hit_rate", "MoE-SpAc hit rate", 3)]


def frame(rows: list[tuple[str, object, dict]]):
    """Long-form DataFrame: one row per (label, trace, stats), then the paper's row."""
    import pandas as pd

    out = []
    for label, trace, st in rows:
        out.append(dict(table="routing_stats", label=label, source=source_of(trace), trace_id=trace.trace_id(),
                        hit_rate_timing="simulated", **st))
    ref = paper_reference()
    lo, hi = ref["hit_rate_range"] or (float("nan"), float("nan"))
    out.append(dict(table="routing_stats", label=PAPER_LABEL, source="paper", trace_id="", hit_rate_timing="paper",
                    **{k: v for k, v in ref.items() if k not in ("hit_rate_by_benchmark", "hit_rate_range")},
                    note=f"hot/cold ~{ref['hot_cold_accuracy']:.2f} (Sec. 4.3, approximate); sMAPE "
                         f"{ref['smape']:.3f} (App. B.1); hit rate {lo:.2f}-{hi:.2f} (App. C.2, mean given)"))
    return pd.DataFrame(out)


def blocks(long) -> list:
    from moespac.analysis.render import Block, fmt

    head = ["workload", "source", "L x E, k", "decode steps", "tokens/step"] + [c for _, c, _ in _COLUMNS]
    hit_range = paper_reference()["hit_rate_range"]
    from moespac.sim.paper_routing import paper_targets

    targets = paper_targets()[0]
    # the paper gives these per benchmark (App. A.1, C.2): its row shows their range
    ranges = {key: f"{min(t[key] for t in targets.values()):.2f}-{max(t[key] for t in targets.values()):.2f}"
              for key in ("alpha", "a_over_b")}
    ranges["moespac_hit_rate"] = f"{hit_range[0]:.2f}-{hit_range[1]:.2f}" if hit_range else "–"
    rows = []
    for r in long.to_dict("records"):
        paper = r["source"] == "paper"
        cells = [r["label"], r["source"], f"{int(r['num_layers'])} x {int(r['num_experts'])}, {int(r['top_k'])}",
                 "–" if paper else str(int(r["steps"])), "–" if paper else fmt(float(r["tokens_per_step"]), 1)]
        for key, _, digits in _COLUMNS:
            v = float(r[key])
            text = fmt(v, digits)
            if paper and key in ranges:
                text = ranges[key]
            elif paper and key == "hot_cold_accuracy" and not math.isnan(v):  # read off Fig. 4
                text = f"~{fmt(v, 2)}"
            elif key == "moespac_hit_rate" and not math.isnan(v):
                text += " S"
            cells.append(f"*{text}*" if paper and text != "–" else text)
        rows.append(cells)
    settings = sorted({(r["hardware"], r["model_spec"], r["cache_ratio"], r["moespac_policy"])
                       for r in long.to_dict("records") if r["source"] != "paper"})
    notes = [
        "Over decode steps (verify / AR; prefill left out). experts for 90 %: fewest experts holding 90 % of a "
        "layer's routing entries over the trace, median over layers (uniform routing: ~0.9 E). entropy / log E and "
        "top expert share: of each layer's expert distribution over the trace, mean over layers (uniform: 1 and 1/E).",
        "alpha (accepted / drafted tokens up to the first rejection) and a/b per token (distinct experts of a verify "
        "step's layer / ((gamma + 1) k)) as App. A.1 defines them, over verify steps (– for a trace without drafts); "
        "the paper's per benchmark: " + ", ".join(f"{b} {t['alpha']:.2f} / {t['a_over_b']:.2f}"
                                                  for b, t in sorted(targets.items())) + ".",
        "distinct / step: distinct experts per layer in a decode step (uniform: E (1 - (1 - k/E)^n) for n tokens). "
        "reuse: share of a step's experts active in the request's previous decode step.",
        "hot/cold acc. (tau = 1) and sMAPE of consecutive frequencies as `moespac bench` records them (paper: ~0.87, "
        "0.490 on Qwen3-30B); traces without drafts are scored with MoE-SpAc's AR mode. The paper's figure is the "
        "share of experts classified correctly (its Fig. 4 says accuracy, its text precision); with k of E experts "
        "active, calling all cold scores 1 - k/E, so balanced acc. (mean of the hot and the cold recall, 0.5 for "
        "any constant guess) stands beside it; the paper gives none.",
        "MoE-SpAc hit rate: simulated (**S**) GPU expert-cache hit rate, " + "; ".join(
            f"{pol} on {hw}, model spec {spec}, cache ratio {ratio:g}" for hw, spec, ratio, pol in settings)
        + " (paper: 0.70-0.75 measured on Qwen3-30B-A3B, App. C.2).",
        "Routing statistics are read from the traces: recorded by the engine, synthetic (moespac.sim.synthetic: the "
        "what-if's), synthetic fitted to the paper's App. A.1 alpha and a/b per benchmark (moespac.sim.paper_routing: "
        "the paper-regime study's, at the model spec's own depth) or imported; *italic* = the paper's number, – = not "
        "given."]
    return [Block(TITLE, head, rows, notes)]


def write(prefix, rows: list[tuple[str, object, dict]]):
    """PREFIX.csv / .md / .tex / .html of [(label, trace, routing_stats(trace))]; returns the paths."""
    from moespac.analysis.render import write_table

    long = frame(rows)
    intro = ["Where each workload's routing sits: how concentrated (experts for 90 %, entropy, top share), how "
             "many experts a verify step touches, how much they recur, how well MoE-SpAc's utility trend predicts "
             "them, and the hit rate that buys."]
    return write_table(prefix, TITLE, long, blocks(long), intro)
