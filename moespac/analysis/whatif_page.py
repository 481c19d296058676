"""The routing-locality what-if (moespac/experiments/whatif.py) as a long-form CSV, a Markdown table and a figure."""

from __future__ import annotations

import numpy as np

import pandas as pd

from moespac.experiments.whatif import ratio_to_best_other
from moespac.catalogue import get_method


def locality_frame(record: dict) -> pd.DataFrame:
    """One row per trace and method, with its timing label and setting, like every table's CSV."""
    cfg, m = record["config"], record["metrics"]
    rows = [dict(table="whatif_locality", timing="simulated", hardware=cfg["hardware"], model_spec=cfg["model_spec"],
                 draft_spec=cfg["draft_spec"], cache_ratio=cfg["cache_ratio"], trace=r["trace"], recorded=r["recorded"],
                 distinct_experts_per_step=r["distinct"], method=slug, label=get_method(slug).label,
                 tps=r["methods"][slug]["tokens_per_s"], hit_rate=r["methods"][slug].get("hit_rate"))
            for r in m["rows"] for slug in cfg["methods"] if slug in r["methods"]]
    return pd.DataFrame(rows)


def render_locality(record: dict) -> str:
    cfg, m = record["config"], record["metrics"]
    methods = list(cfg["methods"])
    head = ["trace", "distinct experts/step"] + [get_method(x).label for x in methods]
    lines = ["# What-if: tokens/s against routing locality (timing: simulated)", "",
             f"{cfg['model_spec']} experts on {cfg['hardware']}, draft {cfg['draft_spec']} charged to the speculative "
             f"methods, cache ratio {cfg['cache_ratio']:g}. Synthetic traces: {cfg['tokens']} new tokens, gamma "
             f"{cfg['gamma']}, draft acceptance {cfg['accept']:g}, persistence {cfg['persistence']:g}. "
             f"Distinct experts per layer in a decode step; uniform routing gives {m['uniform_distinct']:.1f}.", "",
             "| " + " | ".join(head + ["MoE-SpAc hit rate", "MoE-SpAc vs best other"]) + " |",
             "|" + "---|" * (len(head) + 2)]
    for row in m["rows"]:
        cells = [row["trace"] + (" (recorded)" if row["recorded"] else ""), f"{row['distinct']:.1f}"]
        cells += [f"{row['methods'][x]['tokens_per_s']:.2f}" if x in row["methods"] else "-" for x in methods]
        ratio = ratio_to_best_other(row)
        hit = row["methods"].get("moespac", {}).get("hit_rate")
        cells += ["-" if hit is None else f"{hit:.3f}", "-" if ratio is None else f"{100 * (ratio - 1):+.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    for slug, why in m["skipped"].items():
        lines += ["", f"{get_method(slug).label}: left out where its signal is missing ({why})."]
    return "\n".join(lines) + "\n"


def plot_locality(record: dict, prefix) -> list:
    from moespac.analysis import style
    from moespac.analysis.style import figure, save

    cfg, m = record["config"], record["metrics"]
    fig, (ax,) = figure(width=5.6, height=3.8)
    recorded = [r for r in m["rows"] if r["recorded"]]
    from matplotlib.transforms import offset_copy

    for i, slug in enumerate(cfg["methods"]):
        pts = [(r["distinct"], r["methods"][slug]["tokens_per_s"]) for r in m["rows"]
               if not r["recorded"] and slug in r["methods"]]
        if not pts:
            continue
        line, = ax.plot(*zip(*pts), marker="o", label=get_method(slug).label)
        # one method's star a few points beside the next's: at one x, close values would hide each other
        shift = offset_copy(ax.transData, fig=fig, x=6 * (i - (len(cfg["methods"]) - 1) / 2), units="points")
        for r in recorded:  # the recorded traces sit together: one star per method
            if slug in r["methods"]:
                ax.scatter([r["distinct"]], [r["methods"][slug]["tokens_per_s"]], marker="*", s=110,
                           color=line.get_color(), edgecolor="white", linewidth=0.6, zorder=3, transform=shift)
    ax.axvline(m["uniform_distinct"], color="0.5", linestyle=":", linewidth=1)
    ax.annotate(f"uniform routing ({m['uniform_distinct']:.1f})", (m["uniform_distinct"], 0.42),
                xycoords=("data", "axes fraction"), xytext=(-3, 0), textcoords="offset points", ha="right",
                fontsize=7, color="0.4", rotation=90)
    if recorded:
        x = float(np.mean([r["distinct"] for r in recorded]))
        ax.annotate("recorded proxy traces (stars)", (x, 0.97), xycoords=("data", "axes fraction"), ha="center",
                    va="top", fontsize=7, color="0.3")
    ax.set_xlabel(f"distinct experts per layer in a {cfg['gamma'] + 1}-token step")
    style.rate_axis(ax, "tokens/s (simulated)")
    ax.set_title("What-if: tokens/s as routing locality falls (synthetic lines; recorded stars)", fontsize=9)
    style.footnote(fig, f"Simulated: {cfg['model_spec']} experts on {cfg['hardware']}, cache ratio "
                   f"{cfg['cache_ratio']:g}; more distinct experts per step = less locality. The stars of the recorded "
                   "traces sit at their trace's x, each method's drawn a few points beside the next so that none hides "
                   "another.")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, prefix)
