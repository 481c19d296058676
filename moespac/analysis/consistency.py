"""paper_figs/consistency.*: is the paper consistent with its own baselines? From the paper-regime record: the
host inferred from its llama.cpp rows with the residual of every benchmark, the a/b that llama.cpp's SD gain implies
beside App. A.1's, every Table 1 method predicted under that setup beside the paper's number, and the plausible-range
sweep with a one-paragraph verdict (quoted by the audit). Every number is simulated; the host is inferred."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from moespac.analysis.paper import squash, table1
from moespac.analysis.paper_regime_page import pct as _pct
from moespac.catalogue import get_method
from moespac.experiments.paper_regime import compare, lossless_of, mean_or_none

HEADLINE = 0.419
"""The paper's headline: MoE-SpAc over llama.cpp-w/ SD, mean of its Table 1 (+41.9 %)."""

PARAMETER = {"host_mem_bandwidth": ("host memory bandwidth", 1e9, "GB/s"),
             "host_flops": ("host compute", 1e12, "TFLOP/s"),
             "link_bandwidth": ("host-to-device link", 1e9, "GB/s")}


def _paper() -> dict[tuple[str, str], float]:
    return {(squash(r.method), r.benchmark): r.tps for r in table1().itertuples()}


def _value(field: str, value: float) -> str:
    _, scale, unit = PARAMETER[field]
    return f"{value / scale:.1f} {unit}"


def predictions(record: dict) -> pd.DataFrame:
    """One row per method x benchmark on the inferred host: predicted tokens/s, the [low, high] of the host's
    per-benchmark fit range where replayed, the paper's number and predicted / paper."""
    paper = _paper()
    rows = []
    for r in record["metrics"]["rows"]:
        for slug, got in (r.get("methods_inferred") or {}).items():
            ends = [(r.get(f"methods_inferred_{e}") or {}).get(slug, {}).get("tokens_per_s") for e in ("low", "high")]
            p = paper.get((squash(get_method(slug).label), r["benchmark"]))
            rows.append(dict(table="consistency", timing="simulated", method=slug, label=get_method(slug).label,
                             benchmark=r["benchmark"], predicted=got["tokens_per_s"],
                             low=None if None in ends else min(ends), high=None if None in ends else max(ends),
                             paper=p, ratio=None if p is None else got["tokens_per_s"] / p))
    return pd.DataFrame(rows)


def sweep_points(record: dict) -> list[dict]:
    """The inferred host, then each plausible-range point: MoE-SpAc vs llama.cpp-w/ SD and vs the best lossless
    other method, each the mean over the swept benchmarks, and which lossless method leads most often."""
    host = record["metrics"].get("inferred_host") or {}
    points = host.get("sweep") or []
    if not points:
        return []
    benches = list(points[0]["tps"])
    pool = list(points[0]["tps"][benches[0]])
    by_bench = {r["benchmark"]: r for r in record["metrics"]["rows"]}
    center = dict(parameter=None, label="inferred host", value=host["value"],
                  tps={b: {s: by_bench[b]["methods_inferred"][s]["tokens_per_s"] for s in pool} for b in benches})
    lossless = lossless_of(pool)
    out = []
    for p in [center, *points]:
        g = [compare(p["tps"][b], lossless) for b in benches]
        leader = Counter(x["best_lossless"] for x in g if x["best_lossless"]).most_common(1)
        out.append(dict(parameter=p["parameter"], label=p["label"], value=p["value"],
                        vs=mean_or_none(x["vs"] for x in g), vs_lossless=mean_or_none(x["vs_best_lossless"] for x in g),
                        ahead=sum(1 for x in g if (x["vs_best_lossless"] or 0) > 0), n=len(g),
                        leader=get_method(leader[0][0]).label if leader else None, benchmarks=benches, pool=pool))
    return out


def determined(record: dict) -> list[dict]:
    """Which host parameters the paper's llama.cpp rows pin down: per swept parameter, how far the fitted row
    (llama.cpp, replayed at every point) moves across the parameter's plausible range, mean over the swept
    benchmarks, beside the fit's own residuals at the inferred host. A parameter that moves the row less than
    the residuals do cannot be read from the rows: it keeps the sourced profile's value and is only swept."""
    host = record["metrics"].get("inferred_host") or {}
    points = host.get("sweep") or []
    from moespac.experiments.paper_regime import FITTED_ROW

    benches = list(points[0]["tps"]) if points else []
    if not benches or FITTED_ROW not in points[0]["tps"][benches[0]]:
        return []
    by_bench = {r["benchmark"]: r for r in record["metrics"]["rows"]}
    center = {b: by_bench[b]["methods_inferred"][FITTED_ROW]["tokens_per_s"] for b in benches}
    residual = max(abs(center[b] / host["targets"][b] - 1) for b in benches)
    out = {}
    for p in points:
        move = float(np.mean([p["tps"][b][FITTED_ROW] / center[b] - 1 for b in benches]))
        lo, hi = out.get(p["parameter"], (0.0, 0.0))
        out[p["parameter"]] = (min(lo, move), max(hi, move))
    return [dict(parameter=f, low=lo, high=hi, residual=residual, determined=max(-lo, hi) > residual)
            for f, (lo, hi) in out.items()]


def _most(pts: list[dict], key: str) -> str:
    """The parameter whose plausible range moves `key` most, with the span it gives (the inferred host included)."""
    center, span = pts[0], {}
    for p in pts[1:]:
        lo, hi = span.get(p["parameter"], (center[key], center[key]))
        span[p["parameter"]] = (min(lo, p[key]), max(hi, p[key]))
    field = max(span, key=lambda f: span[f][1] - span[f][0])
    return f"the {PARAMETER[field][0]} ({_pct(span[field][0])} to {_pct(span[field][1])})"


def verdict(record: dict) -> str:
    """One paragraph: does each half of the headline hold on the inferred setup, anywhere in the plausible range,
    and which parameter moves it most (a half whose methods were not replayed is said to be unchecked)."""
    pts = sweep_points(record)
    if not pts:
        return "No plausible-range sweep in this record (the study ran without the host inference or with --no-sweep)."
    center, n = pts[0], pts[0]["n"]
    parts = ["On the host inferred from the paper's own llama.cpp rows "
             f"({_value('host_mem_bandwidth', center['value'])}"
             f", not measured), on paper-regime routing of the {n} benchmarks with App. A.1 statistics "
             f"({', '.join(center['benchmarks'])}), and with one host parameter at a time moved across its plausible "
             f"range ({len(pts) - 1} points):"]
    if all(p["vs"] is not None for p in pts):
        lo, hi = min(p["vs"] for p in pts), max(p["vs"] for p in pts)
        within = sum(p["vs"] >= HEADLINE for p in pts)
        parts.append(f"MoE-SpAc is {_pct(center['vs'])} against llama.cpp-w/ SD at the inferred host (the paper: "
                     f"{_pct(HEADLINE)}) and {_pct(lo)} to {_pct(hi)} across the range, reaching the paper's size at "
                     f"{within} of {len(pts)} points; {_most(pts, 'vs')} moves it most; so the headline's direction "
                     "over llama.cpp-w/ SD " + ("holds across the range." if lo > 0 else "depends on the host."))
    else:
        parts.append("llama.cpp-w/ SD was not replayed, so the headline's first half is not checked here.")
    if all(p["vs_lossless"] is not None for p in pts):
        ahead = sum(p["ahead"] == p["n"] for p in pts)
        closest = max(pts, key=lambda p: p["vs_lossless"])
        parts.append(f"Against the best lossless baseline ({center['leader']} leads most often at the inferred host) "
                     f"it is {_pct(center['vs_lossless'])}; it is ahead of every lossless baseline on all {n} "
                     "benchmarks at "
                     f"{ahead} of {len(pts)} points (closest: {_pct(closest['vs_lossless'])} at {closest['label']}); "
                     f"{_most(pts, 'vs_lossless')} moves that gap most; so 'ahead of every baseline' "
                     + ("holds at some point of the range." if ahead else
                        "holds nowhere in it: a lossless baseline leads on this routing."))
    else:
        parts.append("No lossless baseline was replayed, so the headline's second half is not checked here.")
    return " ".join(parts + ["(Simulated; one fitted routing and one seed per benchmark.)"])


def render(record: dict) -> str:
    m = record["metrics"]
    host = m.get("inferred_host")
    if not host:
        return ("# Consistency of the paper with its own baselines\n\n"
                "Not run: the study ran without the host inference.\n")
    lines = ["# Consistency of the paper with its own baselines (timing: simulated; host: inferred)", "",
             "What the paper's own numbers imply about its unstated setup, and whether its headline follows from them. "
             "The fit reads only the paper's llama.cpp rows; every other number is a prediction on synthetic routing "
             f"fitted to App. A.1 ({record['config']['model_spec']}'s depth, cache ratio "
             f"{record['config']['cache_ratio']:g}).", "", "## Verdict", "", verdict(record), "",
             "## 1. The host, inferred from llama.cpp's rows", "",
             "| benchmark | fitted host bandwidth (GB/s) | llama.cpp on the one inferred host (simulated) | "
             "the paper's llama.cpp | residual |", "|---|---|---|---|---|"]
    by_bench = {r["benchmark"]: r for r in m["rows"]}
    for b, bw in host["per_benchmark"].items():
        got = (by_bench.get(b, {}).get("methods_inferred") or {}).get("llamacpp", {}).get("tokens_per_s")
        target = host["targets"][b]
        resid = "-" if got is None else f"{got - target:+.2f} ({_pct(got / target - 1)})"
        lines.append(f"| {b} | {bw / 1e9:.1f} | {'-' if got is None else f'{got:.2f}'} | {target:.2f} | {resid} |")
    lines += ["", f"One host for all benchmarks: the geometric mean {host['value'] / 1e9:.1f} GB/s (range "
              f"{host['low'] / 1e9:.1f}-{host['high'] / 1e9:.1f}; the sourced profile `{host['base']}` assumes "
              f"{host['base_value'] / 1e9:.1f}). Host compute and the link keep the sourced profile's values; the "
              "sweep below moves them.", ""]
    pinned = determined(record)
    if pinned:
        lines += ["What the llama.cpp rows can determine: each host parameter moved across its plausible range (the "
                  "sweep's points), and how far that moves the fitted row (llama.cpp, mean over the swept benchmarks), "
                  f"beside the fit's largest residual at the inferred host ({100 * pinned[0]['residual']:.1f} % in "
                  "magnitude). A parameter that moves the row less than that cannot be read from the paper's rows. "
                  "(llama.cpp-w/ SD's row depends on the routing's a/b as well, and section 2 spends it on checking "
                  "a/b, so it cannot also pin a host parameter.)",
                  "", "| parameter | llama.cpp across its plausible range | read from the paper's rows? |",
                  "|---|---|---|"]
        for d in pinned:
            verdict_ = ("yes: fitted above" if d["parameter"] == "host_mem_bandwidth" else
                        "not apart from the bandwidth: one row per benchmark fits one unknown; swept below")
            lines.append(f"| {PARAMETER[d['parameter']][0]} | {_pct(d['low'])} to {_pct(d['high'])} | "
                         + (verdict_ if d["determined"] else "no: the rows barely depend on it; swept below") + " |")
        lines.append("")
    ab = host.get("ab_from_sd_gain") or {}
    if ab:
        lines += ["## 2. Do the paper's tables agree? a/b from llama.cpp's SD gain", "",
                  "The token spread at which llama.cpp's SD gain on the inferred host equals the paper's (Table 1: "
                  "llama.cpp-w/ SD over llama.cpp), and the a/b of that routing, beside App. A.1's (alpha A.1's; "
                  "reads no other row):", "",
                  "| benchmark | paper's SD gain | a/b it implies | a/b (A.1) | gains this host can give |",
                  "|---|---|---|---|---|"]
        for b, r in ab.items():
            t = by_bench.get(b, {}).get("target", {})
            implied = (f"unreachable (a/b searched {r['ab_range'][0]:.2f}-{r['ab_range'][1]:.2f})"
                       if r["a_over_b"] is None else f"{r['a_over_b']:.2f}")
            lines.append(f"| {b} | {r['paper_gain']:.3f} | {implied} | {t.get('a_over_b', float('nan')):.2f} | "
                         f"{r['reachable'][0]:.2f}-{r['reachable'][1]:.2f} |")
        lines.append("")
    pred = predictions(record)
    if len(pred):
        lines += ["## 3. Every method predicted on the inferred setup, beside the paper", "",
                  "Predicted / paper per method: geometric mean over benchmarks and its range (1.00 = the paper's "
                  "number; [lo, hi] in the CSV: the method at the lowest and highest per-benchmark host fit). "
                  "llama.cpp is the fitted row; every other row is a prediction.", "",
                  "| method | predicted / paper (geo-mean) | range over benchmarks | benchmarks |", "|---|---|---|---|"]
        for label, part in pred.dropna(subset=["ratio"]).groupby("label", sort=False):
            r = part["ratio"].to_numpy(float)
            lines.append(f"| {label} | {np.exp(np.log(r).mean()):.2f} | {r.min():.2f}-{r.max():.2f} | {len(r)} |")
        lines.append("")
    pts = sweep_points(record)
    if pts:
        lines += ["## 4. Across the physically plausible range (one parameter at a time)", "",
                  f"Mean over {', '.join(pts[0]['benchmarks'])}. Memory points: nominal peak x the read efficiency "
                  "measured on the sourced profile's host (an assumption); compute: cores x 32 FP32 FLOP/cycle x base "
                  "clock; link: the measured PCIe 4.0 x16 spread and the paper's nominal 32 GB/s. "
                  + f"Methods {host.get('sweep_pool_rule', 'replayed at each point')}: "
                  + f"{', '.join(get_method(s).label for s in pts[0]['pool'])}.", "",
                  "| parameter | point | value | MoE-SpAc vs llama.cpp-w/ SD | vs best lossless | ahead of every "
                  "lossless baseline on | leads most often |", "|---|---|---|---|---|---|---|"]
        for p in pts:
            name = "-" if p["parameter"] is None else PARAMETER[p["parameter"]][0]
            value = _value(p["parameter"] or "host_mem_bandwidth", p["value"])
            lines.append(f"| {name} | {p['label']} | {value} | {_pct(p['vs'])} | {_pct(p['vs_lossless'])} | "
                         f"{p['ahead']} of {p['n']} | {p['leader']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def sweep_frame(record: dict) -> pd.DataFrame:
    """Long form of the sweep: one row per point x benchmark x method (tokens/s, simulated)."""
    host = record["metrics"].get("inferred_host") or {}
    return pd.DataFrame([dict(table="consistency_sweep", timing="simulated", parameter=p["parameter"], point=p["label"],
                              value=p["value"], benchmark=b, method=s, tps=v)
                         for p in host.get("sweep") or [] for b, per in p["tps"].items() for s, v in per.items()])


def plot(record: dict, prefix) -> list:
    from moespac.analysis import style
    from moespac.analysis.style import figure, save

    fig, (left, right) = figure(ncols=2, width=5.4, height=4.6)
    pred = predictions(record).dropna(subset=["paper"])
    if len(pred):
        for (label, part), (color, marker) in zip(pred.groupby("label", sort=False),
                                                  style.looks(pred["label"].nunique())):
            left.scatter(part["paper"], part["predicted"], label=label, s=22, color=color, marker=marker)
        lo = float(min(pred["paper"].min(), pred["predicted"].min())) / 1.3
        hi = float(max(pred["paper"].max(), pred["predicted"].max())) * 1.3
        left.plot([lo, hi], [lo, hi], color="0.5", linestyle=":", linewidth=1)
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xlabel("the paper's tokens/s (Table 1)")
        left.set_ylabel("predicted tokens/s (simulated, inferred host)")
        left.set_title("(a) every method on the inferred setup vs the paper", fontsize=9)
        left.legend(fontsize=6, ncol=2, loc="lower right")
    else:
        style.placeholder(left, "no method has a paper number")
    pts = sweep_points(record)
    if pts:
        y = np.arange(len(pts))[::-1]
        for key, marker, label in (("vs", "o", "vs llama.cpp-w/ SD"),
                                   ("vs_lossless", "s", "vs best lossless baseline")):
            got = [(100 * p[key], yi) for p, yi in zip(pts, y) if p[key] is not None]  # None: not replayed
            if got:
                right.scatter(*zip(*got), marker=marker, label=label)
        right.axvline(0, color="0.3", linewidth=0.8)
        right.axvline(100 * HEADLINE, **style.PAPER_STYLE, label="the paper: +41.9 % vs llama.cpp-w/ SD")
        right.set_yticks(y)
        right.set_yticklabels([p["label"] if p["parameter"] is None else
                               f"{PARAMETER[p['parameter']][0]}:\n{p['label']}" for p in pts], fontsize=6.5)
        right.set_xlabel("MoE-SpAc, % (simulated; mean over the A.1 benchmarks)")
        right.set_title("(b) one host parameter at a time across its plausible range", fontsize=9)
        right.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    else:
        style.placeholder(right, "no plausible-range sweep in this record")
    style.footnote(fig, "Simulated on synthetic routing fitted to the paper's App. A.1; the host bandwidth is inferred "
                        "from the paper's llama.cpp rows (not measured). The dotted line in (a) is predicted = paper.")
    return save(fig, prefix)


def write(record: dict, prefix) -> list:
    """prefix.md, prefix.csv (predictions, then the sweep in long form), prefix.png and prefix.pdf."""
    from moespac.atomic import write_text

    md = render(record)
    write_text(f"{prefix}.md", md)
    write_text(f"{prefix}.csv", pd.concat([predictions(record), sweep_frame(record)], ignore_index=True)
               .to_csv(index=False))
    return [f"{prefix}.md", f"{prefix}.csv", *plot(record, prefix)]
