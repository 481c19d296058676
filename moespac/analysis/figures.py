"""The paper's figures from result records and activation traces (seaborn), each saved as PNG + PDF.

Every figure takes {group name: [files]} and an output prefix; FIGURE.build(groups) returns the open
matplotlib Figure instead (tests inspect it). Axis titles carry the timing label and where the numbers come
from (hardware profile, which model produced the trace); a panel without data says why instead of being left
out. The paper's numbers are drawn grey and labelled style.paper_label; tokens/s and latency axes follow
style.rate_axis (linear ones start at 0).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from moespac.analysis import style
from moespac.analysis.paper import table4 as paper_table4
from moespac.analysis.rows import REGIME_KINDS, for_table, load_rows
from moespac.errors import MoespacError
from moespac.reference import appendix_value
from moespac.scheduler.config import MoESpAcConfig
from moespac.scheduler.estimator import UtilityEstimator
from moespac.scheduler.metrics import hot_cold_accuracy, previous_step_accuracy, step_counts
from moespac.scheduler.metrics import omega
from moespac.trace import load_trace


def _saved(build):
    """NAME(groups, out) saves the Figure build(groups) draws as OUT.png + OUT.pdf; NAME.build is build."""
    @functools.wraps(build)
    def save(groups: dict, out):
        return style.save(build(groups), out)

    save.build = build
    return save


def _rows(groups: dict, name: str) -> pd.DataFrame:
    rows = for_table(load_rows(groups.get(name, [])), None)  # the figures draw the recorded traces' cells
    return rows[rows["tps"].notna()] if len(rows) else rows


def _where(rows: pd.DataFrame) -> str:
    """'simulated, rtx4090-pcie4, qwen3-30b-a3b experts' for a set of rows (all their labels)."""
    parts = []
    for col in ("timing", "hardware", "model"):
        vals = sorted({str(v) for v in rows[col].dropna()})
        parts.append("/".join(vals) if len(vals) <= 2 else f"{len(vals)} {col}s")
    return ", ".join(parts)


def _lines(ax, rows: pd.DataFrame, x: str, xlabel: str, hue: str = "label") -> None:
    if rows.empty:
        style.placeholder(ax, f"no records for this panel ({xlabel})")
        return
    import seaborn as sns

    cols = [c for c in ("tps", "tps_lo", "tps_hi") if c in rows]
    data = rows.groupby([hue, x], as_index=False)[cols].mean()
    sns.lineplot(data=data, x=x, y="tps", hue=hue, marker="o", ax=ax)
    _intervals(ax, data, x, hue)
    ax.set_xlabel(xlabel)
    # rows.py's tps is metrics.tokens_per_s (bench/harness.py summarize): the mean over requests of each
    # request's decode tokens / the decode time of the batched call it ran in, i.e. per request, not per batch
    timing = sorted(set(rows["timing"]))[0] if rows["timing"].nunique() == 1 else "mixed timing"
    style.rate_axis(ax, f"TPS per request ({timing})")
    ax.legend(fontsize=7, title=None)


def _intervals(ax, data: pd.DataFrame, x: str, hue: str) -> None:
    """Each line's 95 % intervals over requests (rows.py tps_lo/hi) as a band in the line's colour, where
    its cells have them (two requests or more)."""
    if "tps_lo" not in data or data["tps_lo"].isna().all():
        return
    colour = {label: h.get_color() for h, label in zip(*ax.get_legend_handles_labels())}
    for name, grp in data.dropna(subset=["tps_lo"]).groupby(hue, sort=False):
        grp = grp.sort_values(x)
        ax.fill_between(grp[x], grp["tps_lo"], grp["tps_hi"], color=colour.get(str(name), "0.5"), alpha=0.2,
                        linewidth=0, label="_nolegend_")


def _trace_label(trace) -> str:
    facts = trace.meta.get("bench", {})
    cfg = facts.get("config", {})
    return f"{cfg.get('benchmark', trace.trace_id() or '?')}"


def _alpha(trace) -> float | None:
    rows = trace.meta.get("bench", {}).get("rows", [])
    drafted = sum(r.get("drafted", 0) for r in rows)
    return sum(r.get("accepted", 0) for r in rows) / drafted if drafted else None


def _model(trace) -> str:
    from moespac.analysis.rows import short

    return short(trace.meta.get("target") or trace.meta.get("model_spec", {}).get("name") or "?")


# ---- Figure 4: hot/cold prediction accuracy over steps ----------------------------------------------------

@_saved
def fig4_hot_cold(groups: dict):
    panels = ("MoE-SpAc with SD (per verify step)", "MoE-SpAc w/o SD (per token, window "
              f"{MoESpAcConfig().ar_window})", "AR previous-token predictor (per token)")
    fig, axes = style.figure(ncols=3, width=3.4, height=3.4)
    series = {p: [] for p in panels}  # panel -> [(benchmark, hot_cold_accuracy-style scores)]
    alphas = {}
    for path in groups.get("sd", []):
        t = load_trace(path)
        series[panels[0]].append((_trace_label(t), hot_cold_accuracy(t)))
        alphas[_trace_label(t)] = _alpha(t)
    for path in groups.get("ar", []):
        t = load_trace(path)
        counts = step_counts(t)[0]
        if len(counts):
            series[panels[1]].append((_trace_label(t), hot_cold_accuracy(counts, MoESpAcConfig(ablation="no-sd"))))
            series[panels[2]].append((_trace_label(t), previous_step_accuracy(counts)))
    names = sorted({b for ss in series.values() for b, _ in ss})
    colour = dict(zip(names, style.palette(len(names))))
    paper = appendix_value("hot_cold_accuracy")
    window = 20  # steps: a rolling mean, so that benchmarks can be told apart at all
    lows, means = [], []
    for ax, panel in zip(axes, panels):
        if not series[panel]:
            style.placeholder(ax, "no traces given")
            continue
        for bench, scores in series[panel]:
            y = pd.Series(np.asarray(scores["per_step"], dtype=float))
            smooth = y.rolling(window, min_periods=1).mean()
            ax.plot(np.arange(1, len(y) + 1), smooth, color=colour[bench], linewidth=1.2, label=bench)
            lows.append(float(smooth.min()))
        means.append(f"{panel.split(' (')[0]}: " + ", ".join(f"{b} {sc['accuracy']:.3f} ({sc['balanced_accuracy']:.3f})"
                                                             for b, sc in series[panel]))
        if paper is not None:
            ax.axhline(paper, **style.PAPER_STYLE, label=style.paper_label(f"~{paper}"))
        ax.set_title(panel, fontsize=8)
        ax.set_xlabel("verify step" if panel == panels[0] else "token")
    handles, labels = next(((ax.get_legend_handles_labels()) for ax in axes if ax.get_lines()), ([], []))
    if handles:  # one legend for the three panels, below them: every panel's curves span its whole width
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 4),
                   fontsize=7, frameon=False)  # (the paper's line names its setting, as every paper artist does)
    bottom = max(0.0, np.floor(10 * min(lows)) / 10 - 0.1) if lows else 0.0
    for ax in axes:
        ax.set_ylim(bottom, 1.0)
    axes[0].set_ylabel("hot/cold accuracy (tau = 1)")
    models = sorted({_model(load_trace(p)) for g in ("sd", "ar") for p in groups.get(g, [])})
    fig.suptitle("Figure 4: online hot/cold prediction (measured traces)", fontsize=10)
    drafts = ", ".join(f"{b} {a:.2f}" for b, a in alphas.items() if a is not None)
    style.footnote(fig, f"Traces recorded by the real engine on {', '.join(models) or '?'}; accuracy per step averaged "
                   f"over layers, drawn as a {window}-step rolling mean; means, accuracy (balanced accuracy): "
                   f"{'; '.join(means)}. The y axis "
                   f"starts at {bottom:.1f}. The time bases differ: a verify step holds gamma + 1 tokens. With 8 of "
                   f"128 experts routed per token, calling every expert 'cold' is already right for about 94 % of a "
                   f"token's experts (of a verify step's, 1 - distinct / 128), so accuracy, the paper's measure, "
                   f"flatters every predictor; balanced accuracy (mean of the hot and the cold recall) scores any "
                   f"constant guess 0.5. The proxies' own "
                   f"acceptance alpha: {drafts or '-'} (the paper's App. A.1 alphas are for its models). Paper: "
                   f"{style.PAPER_SETUP}.", y=-0.1)
    return fig


# ---- Figure 5: cache ratio, generation length, K ----------------------------------------------------------

@_saved
def fig5_sensitivity(groups: dict):
    fig, axes = style.figure(ncols=3, width=4.2)
    cache, length, K = _rows(groups, "cache"), _rows(groups, "length"), _rows(groups, "K")
    _lines(axes[0], cache, "cache_ratio", "expert cache ratio")
    _lines(axes[1], length, "max_new_tokens", "generation length (tokens)")
    if not K.empty:
        K = K.assign(K=[int(str(m).rsplit("-k", 1)[1]) if "-k" in str(m) else 4 for m in K["method"]])
        K["label"] = "MoE-SpAc"
    _lines(axes[2], K, "K", "utility bound K")
    if not K.empty:
        axes[2].axvline(4, **style.PAPER_STYLE, label=style.paper_label("K = 4", "Qwen3-30B-A3B"))
        axes[2].legend(fontsize=7, loc="lower right")
    for ax, name in zip(axes, ("expert cache ratio", "generation length", "utility bound K")):
        ax.set_title(name, fontsize=9)
    fig.suptitle("Figure 5: sensitivity of MoE-SpAc", fontsize=10)
    parts = [p for p in (cache, length, K) if not p.empty]
    style.footnote(fig, (f"Numbers: {_where(pd.concat(parts))}. " if parts else "") + "The paper sweeps generation "
                   "length 512-4096 on Qwen3-30B-A3B; the lengths here are those the configured traces recorded. "
                   f"The paper's K = 4 is its own run's ({style.PAPER_SETUP}). The cache panel draws the methods "
                   f"config sweeps.cache_ratio names: {', '.join(sorted(set(cache['label']))) or 'none'}.")
    return fig


# ---- Figure 6: batch size ------------------------------------------------------------------------------

def _batch_axes(axes, sizes) -> None:
    for ax in axes:
        ax.set_xscale("log", base=2)  # batch sizes double: evenly spaced
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()


def _per_request_and_aggregate(axes, rows: pd.DataFrame, hue: str = "label") -> None:
    """(per request, aggregate) panels of one set of batch rows; aggregate = batch size x per request."""
    _lines(axes[0], rows, "batch_size", "batch size", hue=hue)
    scale = rows["batch_size"].astype(float)
    total = rows.assign(**{c: rows[c] * scale for c in ("tps", "tps_lo", "tps_hi") if c in rows})
    _lines(axes[1], total, "batch_size", "batch size", hue=hue)
    style.rate_axis(axes[1], f"aggregate TPS ({rows['timing'].iloc[0]})")
    _batch_axes(axes, sorted({int(b) for b in rows["batch_size"]}))


def _regime_batch_rows(groups: dict) -> pd.DataFrame:
    """Table 4's paper-regime cells (MoE-SpAc on batched synthetic traces, batch 1-32), where the study ran; the
    draft length as an ordered label, so that gamma = 10 comes after gamma = 8."""
    rows = load_rows(groups.get("regime", []))
    rows = rows[(rows["kind"] == REGIME_KINDS["table4"]) & rows["tps"].notna()] if len(rows) else rows
    if rows.empty:
        return rows
    order = [f"gamma = {g}" for g in sorted({int(g) for g in rows["gamma"]})]
    return rows.assign(draft=pd.Categorical([f"gamma = {int(g)}" for g in rows["gamma"]], categories=order,
                                            ordered=True))


@_saved
def fig6_batch(groups: dict):
    rows, regime = _rows(groups, "batch"), _regime_batch_rows(groups)
    fig, axes = style.figure(ncols=2, nrows=2 if len(regime) else 1)
    if rows.empty:
        for ax in axes[:2]:
            style.placeholder(ax, "no records")
    else:
        _per_request_and_aggregate(axes[:2], rows)
    axes[0].set_title("(a) per request, engine-recorded traces", fontsize=9)
    axes[1].set_title("(b) aggregate, engine-recorded traces", fontsize=9)
    notes, y = [], -0.02
    if not rows.empty:
        sizes = sorted({int(b) for b in rows["batch_size"]})
        notes.append(f"(a, b) {_where(rows)}, batch sizes {', '.join(map(str, sizes))} (config sweeps.batch).")
    if len(regime):  # the paper's grid, batch 1-32, on routing fitted to its App. A.1
        _per_request_and_aggregate(axes[2:], regime, hue="draft")
        ref = paper_table4()
        ref = ref[ref["gamma"] == 8].sort_values("batch_size")
        for ax in axes[2:]:
            ax.plot(ref["batch_size"], ref["tps"], **style.PAPER_STYLE, label=style.paper_label("Table 4, gamma = 8"))
            ax.get_legend().remove()
            style.rate_axis(ax, ax.get_ylabel())
        handles, labels = axes[3].get_legend_handles_labels()  # one legend for (c) and (d), below them
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=7, frameon=False)
        axes[2].set_title("(c) per sequence, paper-regime routing", fontsize=9)
        axes[3].set_title("(d) aggregate, paper-regime routing", fontsize=9)
        notes.append(f"(c, d) MoE-SpAc, {_where(regime)}; the paper's grid. The paper does not say whether its "
                     "Table 4 is per sequence or aggregate; its gamma = 8 row is drawn on both.")
        y = -0.06
    fig.suptitle("Figure 6: throughput over batch size", fontsize=10)
    style.footnote(fig, " ".join(notes) + " TPS per request: each request's decode tokens over the decode time of "
                   "the batch it ran in, averaged over requests; aggregate: batch size x that. Bands: 95 % intervals "
                   "over requests; where two bands overlap the lines are not told apart.", y=y)
    return fig


# ---- Figure 7: TPS vs cache ratio with and without the draft ------------------------------------------

@_saved
def fig7_draft_vs_cache(groups: dict):
    fig, (ax,) = style.figure(width=5.2)
    rows = _rows(groups, "records")
    if not rows.empty:
        rows = rows.assign(decoding=np.where(rows["speculative"], "with draft (SD)", "without draft (AR)"))
        rows = rows.assign(cache_pct=100 * rows["cache_ratio"].astype(float))
    _lines(ax, rows, "cache_pct", "expert cache ratio (%)", hue="decoding")
    ax.set_title("Figure 7: TPS vs expert cache ratio, with and without a draft", fontsize=10)
    draft = appendix_value("draft_memory_overhead_fraction")
    if not rows.empty:
        style.footnote(fig, f"Numbers: {_where(rows)}. The paper's draft (Qwen3-4B-FP8) takes about {draft:.0%} of all "
                       "expert weights' memory: compare the SD curve at ratio r with the AR curve at r + that share."
                       + _which_curve_leads(rows))
    return fig


def _which_curve_leads(rows) -> str:
    """One sentence on which decoding is faster at each cache ratio, so the caption says what the plot shows."""
    by = rows.groupby(["cache_pct", "decoding"])["tps"].mean().unstack()
    if by.shape[1] != 2 or by.isna().any().any():
        return ""
    sd, ar = by["with draft (SD)"], by["without draft (AR)"]
    if (ar > sd).all():
        return " Here AR is faster than SD at every cache ratio: on these traces the draft does not pay for itself."
    if (sd > ar).all():
        return " Here SD is faster than AR at every cache ratio."
    return (" SD is faster at " + ", ".join(f"{r:g} %" for r in by.index[sd > ar]) + " and AR at "
            + ", ".join(f"{r:g} %" for r in by.index[ar >= sd]) + ".")


# ---- Figure 8: expert cost ratio a/b vs gamma ---------------------------------------------------------

@_saved
def fig8_expert_reuse(groups: dict):
    fig, axes = style.figure(ncols=2)
    rows = for_table(load_rows(groups.get("records", [])), None)
    rows = rows[(rows["method"] == "moespac") & (rows["batch_size"] == 1)] if len(rows) else rows
    if rows.empty:
        for ax in axes:
            style.placeholder(ax, "no batch-1 MoE-SpAc records over draft lengths")
        return fig
    by = rows.groupby("gamma").agg(a_over_b=("a_over_b", "mean"), per_token=("a_over_b_per_token", "mean"),
                                   omega=("omega", "mean"), alpha=("alpha", "mean")).reset_index()
    ax = axes[0]
    ax.plot(by["gamma"], by["a_over_b"], "o-", label="a/b = distinct experts per verify step / top-k")
    ax.plot(by["gamma"], by["omega"], "s-", label="Omega measured (tokens per verify step)")
    ax.plot(by["gamma"], [omega(int(g), a) for g, a in zip(by["gamma"], by["alpha"])], "x:",
            label="Omega(gamma, alpha) from the measured alpha")
    ax.set_xlabel("draft length gamma")
    ax.set_ylabel("experts per verify step / top-k (or tokens)")
    ax.set_title("(a) per step: SD pays off where a/b < Omega", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[1]
    ax.plot(by["gamma"], by["per_token"], "o-", label="ours: distinct / (tokens x top-k)")
    ax.set_title("(b) per token: a/b / (gamma + 1), App. A.1's ratio", fontsize=9)
    benches = ("CNN/DM", "MT-Bench", "GSM8K", "HumanEval")
    paper_vals = [appendix_value("expert_cost_ratio_a_over_b", c) for c in benches]
    ax.scatter([8] * len(paper_vals), paper_vals, marker="D", color=style.PAPER_COLOR,
               label=style.paper_label("gamma = 8, App. A.1"))
    for bench, v in zip(benches, paper_vals):
        ax.annotate(bench, (8, v), xytext=(-5, 0), textcoords="offset points", ha="right", va="center", fontsize=6,
                    color=style.PAPER_COLOR)
    ax.set_xlabel("draft length gamma")
    ax.set_ylabel("a/b per token")
    ax.set_ylim(0, 1.05)  # a share of the step's routing entries
    ax.legend(fontsize=6, loc="lower left")
    fig.suptitle("Figure 8: expert cost ratio over the draft length (a/b per step in (a), per token in (b))",
                 fontsize=10)
    style.footnote(fig, f"From the MoE-SpAc cells of Table 4 at batch 1: {_where(rows)}; "
                   f"{'; '.join(sorted(set(rows['source'])))[:160]}.")
    return fig


# ---- Figure 9: activation-frequency heatmaps SD vs AR --------------------------------------------------

def _layer_counts(path, layer: int, max_steps: int = 64) -> tuple[np.ndarray, str]:
    t = load_trace(path)
    counts = step_counts(t)[0]
    req = t.steps["step_request"][[s for s in range(t.num_steps) if t.kind(s) != "prefill"]]
    if len(req):
        counts = counts[req == req[0]]  # one request: its steps are consecutive
    if layer >= counts.shape[1]:
        raise MoespacError(f"{path}: layer {layer} >= the trace's {counts.shape[1]} MoE layers")
    return counts[:max_steps, layer, :].T, f"{_trace_label(t)}, {_model(t)}"


@_saved
def fig9_heatmaps(groups: dict):
    import seaborn as sns

    layer = int((groups.get("layer") or ["0"])[0])
    fig, axes = style.figure(ncols=2, width=5.0, height=4.0)
    panels = (("sd", "speculative decoding", "verify step (gamma + 1 tokens each)", "routing entries in the step"),
              ("ar", "autoregressive", "token (one step each)", "routed (1) or not (0)"))
    for ax, (name, title, xlabel, scale) in zip(axes, panels):
        files = groups.get(name, [])
        if not files:
            style.placeholder(ax, f"no {name.upper()} trace given")
            continue
        counts, what = _layer_counts(files[0], layer)
        sns.heatmap(counts, ax=ax, cmap="rocket", cbar_kws=dict(label=scale))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("expert")
        ax.set_title(f"{title}, colour 0-{int(counts.max())}\nlayer {layer}; {what}", fontsize=8)
    fig.suptitle("Figure 9: activation frequency across iterations (measured traces)", fontsize=10)
    style.footnote(fig, "The panels differ in time base and colour scale: a verify step routes gamma + 1 tokens, so "
                   "an expert can count up to gamma + 1 in it; an autoregressive step routes one token, 0 or 1. "
                   "Compare patterns (persistence along a row), not colours.")
    return fig


# ---- Figure 10: r_c, r_g vs tau; utility vs frequency ------------------------------------------------

def utility_curves(trace, K: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(r_c, r_g per tau) and (frequency of the next step per utility level) from one SD trace.

    Experts with u >= tau before a step are on the device. r_c(tau) = share of the step's (token, slot)
    activations that name an expert below tau (computed on the host); r_g(tau) = share of the step's
    distinct activated experts at or above tau (computed on the device in parallel).
    """
    cfg = MoESpAcConfig().resolved()
    K = K or cfg.K
    counts = step_counts(trace)[0]
    gamma = int(trace.steps["step_gamma"].max()) if trace.num_steps else 8
    est = UtilityEstimator.from_config(cfg, counts.shape[1], counts.shape[2], gamma)
    rc, rg, freq = np.zeros(K), np.zeros(K), []
    for c in counts:
        u = est.u
        active = c > 0
        for tau in range(1, K + 1):
            hot = u >= tau
            rc[tau - 1] += c[~hot].sum() / max(c.sum(), 1)
            rg[tau - 1] += (active & hot).sum() / max(active.sum(), 1)
        freq.append(pd.DataFrame({"utility": u.ravel(), "frequency": c.ravel()}))
        est.update(c)
    n = max(len(counts), 1)
    ratios = pd.DataFrame({"tau": np.arange(1, K + 1), "r_c": rc / n, "r_g": rg / n})
    return ratios, pd.concat(freq, ignore_index=True) if freq else pd.DataFrame(columns=["utility", "frequency"])


@_saved
def fig10_utility(groups: dict):
    import seaborn as sns

    fig, axes = style.figure(ncols=2)
    files = groups.get("sd", [])
    if not files:
        for ax in axes:
            style.placeholder(ax, "no SD trace given")
        return fig
    t = load_trace(files[0])
    ratios, freq = utility_curves(t)
    ax = axes[0]
    ax.plot(ratios["tau"], 1 - ratios["r_c"], "o:", label="1 - r_c: activations on the device")
    ax.plot(ratios["tau"], ratios["r_g"], "s-", label="r_g: distinct activated experts on the device")
    ax.set_xticks(ratios["tau"])  # tau is an integer level
    ax.set_xlabel("threshold tau")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.set_title("(a) device shares vs tau", fontsize=9)
    # a count cannot go below 0: the bars span the 10th to 90th percentile, not mean +- sd
    sns.barplot(data=freq, x="utility", y="frequency", ax=axes[1], color=sns.color_palette()[0],
                errorbar=("pi", 80))
    axes[1].set_ylim(bottom=0)
    axes[1].set_ylabel("count per expert")
    axes[1].set_title("(b) routing entries in the next step, per utility level\n"
                      "(bar: mean; line: 10th-90th percentile)",
                      fontsize=8)
    fig.suptitle(f"Figure 10: utility and threshold on a measured trace ({_trace_label(t)}, {_model(t)})", fontsize=9)
    return fig


# ---- Section 3.4: runtime overhead ---------------------------------------------------------------------

@_saved
def fig_overhead(groups: dict):
    import json

    import seaborn as sns

    from moespac.analysis.rows import machine_name

    fig, axes = style.figure(ncols=3, width=2.6)
    files = groups.get("record", [])
    if not files:
        for ax in axes:
            style.placeholder(ax, "no overhead record")
        return fig
    rec = json.loads(open(files[0]).read())
    m, paper = rec["metrics"], rec.get("paper", {})
    items = [("estimator update", "ms per step", m["estimator_ms_per_step"], paper.get("estimator_ms_per_step")),
             ("tau selection", "ms per 512 tokens", m["tau_ms_per_generation"], paper.get("tau_ms_per_generation")),
             ("estimator state", "KB", m["state_kb"], paper.get("state_kb"))]
    machine = machine_name(rec.get("environment") or {})
    for ax, (what, unit, ours, theirs) in zip(axes, items):  # one axis per unit: three quantities, three scales
        names = [f"ours\n({rec['timing']})"] + (["paper"] if theirs is not None else [])
        values = [ours] + ([theirs] if theirs is not None else [])
        bars = ax.bar(names, values, color=[sns.color_palette()[0], style.PAPER_COLOR][:len(values)])
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)
        ax.set_title(what, fontsize=9)
        ax.set_ylabel(unit)
        ax.set_ylim(0, max(values) * 1.2)
    L, E, k = m["shape"]
    fig.suptitle(f"Section 3.4: MoE-SpAc scheduler overhead at {L}x{E} top-{k}, gamma {m['gamma']}", fontsize=10)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=sns.color_palette()[0], label=f"ours ({rec['timing']}, {machine})"),
                        Patch(color=style.PAPER_COLOR,
                              label=style.paper_label("Sec. 3.4", "Qwen3-30B-A3B, its machine, not named"))],
               loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=7, frameon=False)
    return fig
    rec = json.loads(open(files[0]).read())
    m, paper = rec["metrics"], rec.get("paper", {})
    items = [("estimator update\n(ms / step)", m["estimator_ms_per_step"], paper.get("estimator_ms_per_step")),
             ("tau selection\n(ms / 512 tokens)", m["tau_ms_per_generation"], paper.get("tau_ms_per_generation")),
             ("estimator state\n(KB)", m["state_kb"], paper.get("state_kb"))]
    ours, theirs = f"ours ({rec['timing']}, this CPU)", style.paper_label("Sec. 3.4", "Qwen3-30B-A3B, its machine")
    data = pd.DataFrame([dict(what=w, source=ours, value=v) for w, v, _ in items]
                        + [dict(what=w, source=theirs, value=p) for w, _, p in items if p is not None])
    import seaborn as sns

    sns.barplot(data=data, x="what", y="value", hue="source", ax=ax,
                palette={ours: sns.color_palette()[0], theirs: style.PAPER_COLOR})
    ax.set_yscale("log")  # the three quantities lie decades apart
    ax.set_xlabel("")
    style.rate_axis(ax, "value")
    L, E, k = m["shape"]
    ax.set_title(f"Section 3.4: MoE-SpAc scheduler overhead at {L}x{E} top-{k}, gamma {m['gamma']}", fontsize=9)
    ax.legend(fontsize=7)
    return fig
