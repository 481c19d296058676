"""The paper-regime study (moespac/experiments/paper_regime.py) as a long-form CSV, a Markdown page and a figure:
each method's simulated tokens/s on routing fitted to the paper's statistics, beside the paper's own number."""

from __future__ import annotations

import pandas as pd

from moespac.analysis.paper import squash, table1
from moespac.catalogue import get_method
from moespac.experiments.paper_regime import gains, mean_or_none


def _paper_tps() -> dict[tuple[str, str], float]:
    t = table1()
    return {(squash(r.method), r.benchmark): r.tps for r in t.itertuples()}


def frame(record: dict) -> pd.DataFrame:
    """Long form: one row per benchmark x method x host (the sourced profile, and the inferred one if any)."""
    cfg, m = record["config"], record["metrics"]
    paper = _paper_tps()
    hosts = [("methods", cfg["hardware"])]
    if m.get("inferred_host"):
        hosts.append(("methods_inferred", f"{cfg['hardware']}-paper-inferred"))
    rows = [dict(table="paper_regime", timing="simulated", hardware=hardware, model_spec=cfg["model_spec"],
                 draft_spec=cfg["draft_spec"], cache_ratio=cfg["cache_ratio"], benchmark=r["benchmark"],
                 routing=m["source"] + (" (parameters filled: no A.1 statistics)" if r["filled"] else ""),
                 alpha=r["measured"]["alpha"], a_over_b=r["measured"]["a_over_b"], method=slug,
                 label=get_method(slug).label, tps=r[key][slug]["tokens_per_s"],
                 hit_rate=r[key][slug]["hit_rate"],
                 paper_tps=paper.get((squash(get_method(slug).label), r["benchmark"])))
            for key, hardware in hosts for r in m["rows"] for slug in cfg["methods"] if slug in (r.get(key) or {})]
    return pd.DataFrame(rows)


def pct(x) -> str:
    """A ratio - 1 as a signed percentage, '-' where missing (this page's and the consistency page's)."""
    return "-" if x is None else f"{round(100 * x, 1) + 0.0:+.1f} %"  # + 0.0: no '-0.0 %' for a tiny negative


def _block(record: dict, key: str, heading: str) -> list[str]:
    """One host's table (rows[key]) and its verdict line."""
    cfg, m = record["config"], record["metrics"]
    paper = _paper_tps()
    methods = [x for x in cfg["methods"] if any(x in (r.get(key) or {}) for r in m["rows"])]
    g = gains(record, key=key)
    lines = [heading, "",
             "| benchmark | alpha (A.1) | a/b (A.1) | " + " | ".join(get_method(x).label for x in methods)
             + " | MoE-SpAc vs llama.cpp-w/ SD | vs best other | vs best lossless other |",
             "|" + "---|" * (len(methods) + 6)]
    for r in m["rows"]:
        t, got = r["target"], r["measured"]
        stat = lambda k: f"{got[k]:.3f} ({t[k]:.2f})" if k in t else f"{got[k]:.3f} (filled)"
        cells = [r["benchmark"], stat("alpha"), stat("a_over_b")]
        for x in methods:
            v = (r.get(key) or {}).get(x, {}).get("tokens_per_s")
            p = paper.get((squash(get_method(x).label), r["benchmark"]))
            span = [(r.get(f"{key}_{end}") or {}).get(x, {}).get("tokens_per_s") for end in ("low", "high")]
            span = "" if None in span else f" [{min(span):.2f}, {max(span):.2f}]"  # not monotone for every policy
            cells.append("-" if v is None else f"{v:.2f}{span}" + ("" if p is None else f" ({p:.2f})"))
        gb = g[r["benchmark"]]
        best = "" if gb["best"] is None else f" ({get_method(gb['best']).label})"
        exact = "" if gb["best_lossless"] is None else f" ({get_method(gb['best_lossless']).label})"
        cells += [pct(gb["vs"]), pct(gb["vs_best"]) + best, pct(gb["vs_best_lossless"]) + exact]
        lines.append("| " + " | ".join(cells) + " |")
    vs, vs_best = mean_or_none(x["vs"] for x in g.values()), mean_or_none(x["vs_best"] for x in g.values())
    vs_exact = mean_or_none(x["vs_best_lossless"] for x in g.values())
    lines += ["", f"MoE-SpAc against llama.cpp-w/ SD, mean over benchmarks: {pct(vs)} (the paper: +41.9 % on its "
              f"Table 1); against the best other method of each benchmark: {pct(vs_best)}; against the best "
              f"lossless one (what MoE-SpAc is): {pct(vs_exact)}. "
              + ("The headline's direction holds on this routing and host." if vs is not None and vs > 0 and
                 vs_exact is not None and vs_exact > 0 else
                 "The headline does not follow on this routing and host: see which method leads in the last columns."),
              ""]
    return lines


def render(record: dict) -> str:
    cfg, m = record["config"], record["metrics"]
    host = m.get("inferred_host")
    lines = [
        "# The Table 1 methods on paper-regime routing (timing: simulated)", "",
        f"Routing: {m['source']}: synthetic traces at {cfg['model_spec']}'s own depth, {cfg['requests']} requests x "
        f"{cfg['new_tokens']} new tokens, gamma {cfg['gamma']}, per-benchmark acceptance and token spread fitted to "
        f"App. A.1's alpha and a/b (no throughput is read by the fit). Cache ratio {cfg['cache_ratio']:g}, draft "
        f"{cfg['draft_spec']} charged. Each cell: simulated tokens/s (the paper's number in brackets).", ""]
    lines += _block(record, "methods", f"## On `{cfg['hardware']}`, a sourced profile (its host is an assumption: the "
                                       f"paper does not name its CPU)")
    if host:
        per = ", ".join(f"{b} {v / 1e9:.1f}" for b, v in host["per_benchmark"].items())
        lines += _block(record, "methods_inferred",
                        f"## On the host inferred from the paper's own llama.cpp rows "
                        f"({host['value'] / 1e9:.1f} GB/s, not measured)")
        lines += [f"The host memory bandwidth at which this simulator's llama.cpp row gives the paper's llama.cpp "
                  f"tokens/s, fitted per benchmark on these traces (GB/s): {per}; their geometric mean "
                  f"{host['value'] / 1e9:.1f} is used (`{cfg['hardware']}` assumes {host['base_value'] / 1e9:.1f}). "
                  f"The fit reads only the paper's {', '.join(host['reads'])} rows; every other number here is a "
                  f"prediction. [lo, hi] after a number: the same method at the lowest and highest per-benchmark "
                  f"fit ({host['low'] / 1e9:.1f}-{host['high'] / 1e9:.1f} GB/s). Only the host bandwidth is "
                  f"inferred; the profile (in the study's record, metrics.inferred_host.profile_yaml) keeps every "
                  f"other parameter of `{cfg['hardware']}`.", ""]
        lines += ["Whether the paper's tables agree with each other (the a/b its llama.cpp SD gain implies), every "
                  "method's prediction against the paper's number, and the headline across the plausible range of "
                  "the host: paper_figs/consistency.md.", ""]
    lines += ["One fitted routing and one seed per benchmark: a difference of a few percent is not called.", ""]
    for note in (m["fill_rule"], m["smape_note"], m.get("self_draft_note")):
        if note:
            lines.append(f"- {note}")
    for slug, why in m["skipped"].items():
        lines.append(f"- {get_method(slug).label}: not simulated ({why}).")
    return "\n".join(lines) + "\n"


def plot(record: dict, prefix) -> list:
    from moespac.analysis import style
    from moespac.analysis.style import figure, save

    df = frame(record).dropna(subset=["paper_tps"])
    df = df[df["hardware"] == record["config"]["hardware"]]  # the sourced profile; the inferred: consistency.png
    fig, (ax,) = figure(width=5.2, height=4.4)
    for (label, part), (color, marker) in zip(df.groupby("label", sort=False), style.looks(df["label"].nunique())):
        ax.scatter(part["paper_tps"], part["tps"], label=label, s=22, color=color, marker=marker)
    top = float(max(df["paper_tps"].max(), df["tps"].max())) * 1.08 if len(df) else 1.0
    ax.plot([0, top], [0, top], color="0.5", linestyle=":", linewidth=1)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("the paper's tokens/s (Table 1)")
    style.rate_axis(ax, "tokens/s, simulated on paper-regime routing")
    cfg = record["config"]
    host = df["hardware"].iloc[0] if len(df) else cfg["hardware"]
    ax.set_title(f"{cfg['model_spec']} routing fitted to App. A.1, on {host}", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return save(fig, prefix)
