"""The paper's tables from result records, ours beside the paper's, every cell with its timing label.

Each builder takes the flat rows of moespac.analysis.rows (or a numerics file for Table 6) and returns
(long DataFrame, [Block]) for moespac.analysis.render.write_table. Cells are grouped into one block per
timing label (and hardware / model), because numbers obtained differently are never averaged together.
"""

from __future__ import annotations

import itertools

import json
from pathlib import Path

import numpy as np
import pandas as pd

from moespac.analysis import paper
from moespac.analysis.render import Block, cell, fmt, span
from moespac.analysis.rows import busy_note
from moespac.datasets import get_benchmark
from moespac.errors import MoespacError
from moespac.catalogue import TABLE2_LABELS

BLOCK_ORDER = {"simulated": 0, "measured": 1, "wrapped": 2}


def display(benchmark: str, rows: pd.DataFrame | None = None) -> str:
    """The paper's column name; '(proxy)' after it where the block's prompts are a proxy set (offline MMLU-Pro,
    Alpaca, CNN/DM), so a column beside the paper's never passes for the benchmark itself."""
    if benchmark == "average":
        return "Average"
    name = get_benchmark(benchmark).display
    if rows is not None and rows.loc[rows["benchmark"] == benchmark, "proxy_prompts"].fillna(False).astype(bool).any():
        return f"{name} (proxy)"
    return name


def blocks_of(rows: pd.DataFrame):
    """(timing, hardware, model) groups in a fixed order: simulated, measured, wrapped."""
    keys = rows[["timing", "hardware", "model"]].drop_duplicates().itertuples(index=False)
    return sorted(keys, key=lambda k: (BLOCK_ORDER.get(k.timing, 9), str(k.hardware), str(k.model)))


def _source_words(source: str) -> str | None:
    """A row's source as a block header says it: which rows the draft serves; nothing for 'no draft'."""
    if source == "no draft":
        return None
    if source.startswith("draft cost of "):
        return f"SD rows charged the draft cost of {source.removeprefix('draft cost of ')}"
    if source.startswith("draft "):
        return f"SD rows draft with {source.removeprefix('draft ')}"
    return source


def block_title(timing: str, hardware, model, rows: pd.DataFrame, beside_paper: bool | None = None) -> str:
    """'TIMING on HARDWARE — model: ...; sources', and, where paper numbers sit beside ours (default: where the
    rows have any), where those ran."""
    parts = dict.fromkeys(w for s in rows["source"].dropna() for part in str(s).split("; ")
                          if (w := _source_words(part)))
    src = f"; {'; '.join(parts)}" if len(parts) <= 3 else ""
    title = f"{timing} on {hardware} — model: {model}{src}"
    if beside_paper is None:
        beside_paper = any(rows[c].notna().any() for c in ("paper_tps", "paper_latency_s") if c in rows)
    if beside_paper:
        title += f" — (paper N) = {paper.SETUP}, not this hardware nor this model: compare directions, not values"
    return title


STAND_IN_MARK = "†"
LOSSY_MARK = "‡"
LOSSY_NOTE = (f"{LOSSY_MARK} lossy: the row's output is not the unmodified model's (INT4 experts, or speculated "
              "experts run in place of routed ones); its speed is not bought at the same accuracy")


def shown(part: pd.DataFrame, label: str) -> str:
    """A row's name in a table: its label, and what the row is where that is not the label's system itself
    (records.ENGINE_NOTE, a wrapped system that offloaded nothing; a † where its policy is a documented
    stand-in, explained under the table; a ‡ where it is lossy)."""
    rows = part.loc[part["label"] == label]
    notes = rows["note"].dropna()
    mark = STAND_IN_MARK if "stand_in" in rows and rows["stand_in"].notna().any() else ""
    mark += LOSSY_MARK if "lossy" in rows and rows["lossy"].fillna(False).astype(bool).any() else ""
    return f"{label}{mark} ({notes.iloc[0]})" if len(notes) else f"{label}{mark}"


def _stand_in_notes(part: pd.DataFrame) -> list[str]:
    if "stand_in" not in part:
        return []
    marked = part.dropna(subset=["stand_in"]).groupby("label", sort=False)["stand_in"].first()
    notes = [f"{label}{STAND_IN_MARK}: a stand-in, not all of its system ({text}; `moespac policy list`)"
             for label, text in marked.items()]
    if "variants" in part:
        variants = part.dropna(subset=["variants"]).groupby("label", sort=False)["variants"].first()
        notes += [f"{label}: {text}" for label, text in variants.items()]
    if "lossy" in part and part["lossy"].fillna(False).astype(bool).any():
        notes.append(LOSSY_NOTE)
    return notes


def _pivot(rows: pd.DataFrame, value: str, index: str, columns: str) -> pd.DataFrame:
    return rows.pivot_table(index=index, columns=columns, values=value, aggfunc="mean", dropna=False)


SPAN_OF = {"tps": ("tps_lo", "tps_hi"), "latency_s": ("latency_lo", "latency_hi")}


def _spans(rows: pd.DataFrame, value: str, index: str, columns: str) -> pd.DataFrame:
    """Each cell's '[lo, hi] n=N' (render.span) of `value`, wide like _pivot; '' where a cell has none."""
    lo, hi = SPAN_OF[value]
    text = [span(a, b, n) for a, b, n in zip(rows[lo], rows[hi], rows["requests"])]
    frame = rows.assign(_span=text)
    return frame.pivot_table(index=index, columns=columns, values="_span", aggfunc="first", dropna=False).fillna("")


INTERVAL_NOTE = ("[lo, hi] n=N after a number: the 95 % Student-t interval of the cell's mean over its N requests "
                 "(n=1 has none; at n=2 it is mean +- 12.7 standard errors). It covers request-to-request variation "
                 "of one trace (of one trained proxy, or of one fitted synthetic routing), not another training of "
                 "the proxy nor another draw of the routing. Differences inside overlapping intervals are not called "
                 "differences (audit.md).")


def relative_improvement(tps: pd.Series, ours: str = "MoE-SpAc", among=None) -> float | None:
    """MoE-SpAc's TPS over the best other row's (of the baselines `among`, default all), minus 1 (Rel. Imprv.)."""
    if ours not in tps.index or np.isnan(tps[ours]):
        return None
    others = tps.drop(ours).dropna()
    if among is not None:
        others = others[[label in among for label in others.index]]
    return float(tps[ours] / others.max() - 1) if len(others) and others.max() > 0 else None


# ---- Table 1 -----------------------------------------------------------------------------------------------

def table1(rows: pd.DataFrame, benchmarks: list[str] | None = None):
    """12 methods x 7 benchmarks, TPS and latency, average and relative improvement, per timing block."""
    ref = paper.table1()
    benchmarks = benchmarks or [b for b in ref["benchmark"].unique() if b != "average"]
    rows = rows[rows["benchmark"].isin(benchmarks)].copy()
    rows["paper_tps"] = [paper.lookup(ref, "tps", method=m, benchmark=b)
                         for m, b in zip(rows["label"], rows["benchmark"])]
    rows["paper_latency_s"] = [paper.lookup(ref, "latency_s", method=m, benchmark=b)
                               for m, b in zip(rows["label"], rows["benchmark"])]
    blocks, long = [], [rows.assign(table="table1")]
    for key in blocks_of(rows):
        part = rows[(rows["timing"] == key.timing) & (rows["hardware"] == key.hardware) & (rows["model"] == key.model)]
        labels = list(dict.fromkeys(part["label"]))
        cols = [b for b in benchmarks if b in set(part["benchmark"])]
        skipped = set(zip(part["label"][_skipped(part)], part["benchmark"][_skipped(part)]))  # no number: a reason
        for metric, paper_col, unit in (("tps", "tps", "TPS"), ("latency_s", "latency_s", "latency (s)")):
            wide = _pivot(part, metric, "label", "benchmark").reindex(index=labels, columns=cols)
            spans = _spans(part, metric, "label", "benchmark").reindex(index=labels, columns=cols).fillna("")
            complete = wide.notna().all(axis=1)
            avg = wide.mean(axis=1).where(complete)
            body = []
            for label in labels:
                r = [shown(part, label)] + ["skipped" if (label, b) in skipped else
                               cell(wide.loc[label, b], key.timing,
                                    paper.lookup(ref, paper_col, method=label, benchmark=b),
                                    span=spans.loc[label, b])
                               for b in cols]
                r.append("skipped" if all((label, b) in skipped for b in cols) else
                         cell(avg[label], key.timing, paper.lookup(ref, paper_col, method=label, benchmark="average")))
                body.append(r)
                long.append(pd.DataFrame([dict(table="table1", timing=key.timing, hardware=key.hardware,
                                               model=key.model, label=label, benchmark="average",
                                               **{metric: avg[label]},
                                               **{f"paper_{paper_col}": paper.lookup(ref, paper_col, method=label,
                                                                                      benchmark="average")})]))
            if metric == "tps":
                baselines = set(ref["method"])  # the paper's rows: ablations and references are not baselines
                imp = [relative_improvement(wide[b], among=baselines) for b in cols]
                imp.append(relative_improvement(avg, among=baselines))
                paper_imp = [relative_improvement(_paper_wide(ref, b)) for b in cols + ["average"]]
                body.append(["Rel. Imprv. (MoE-SpAc vs the best Table 1 baseline here)"] +
                            [_pct(o, key.timing, p) for o, p in zip(imp, paper_imp)])
                lossy = set(part["label"][part["lossy"].fillna(False).astype(bool)]) if "lossy" in part else set()
                if lossy & baselines:  # MoE-SpAc is lossless: say where it stands among the rows that are too
                    exact = baselines - lossy
                    imp = [relative_improvement(wide[b], among=exact) for b in cols]
                    imp.append(relative_improvement(avg, among=exact))
                    body.append(["Rel. Imprv. (MoE-SpAc vs the best lossless Table 1 baseline here)"] +
                                [_pct(o, key.timing, None) for o in imp])
            blocks.append(Block(f"{unit}, {block_title(key.timing, key.hardware, key.model, part)}",
                                ["Method"] + [display(b, part) for b in cols] + ["Average"], body,
                                notes=_notes(part) + (_not_told_apart(part) if metric == "tps" else [])))
    return pd.concat(long, ignore_index=True), blocks


def _paper_wide(ref: pd.DataFrame, benchmark: str) -> pd.Series:
    part = ref[ref["benchmark"] == benchmark]
    return pd.Series(part["tps"].values, index=part["method"].values)


def _pct(x, timing, paper_x) -> str:
    ours = "–" if x is None else f"{100 * x:+.1f}% {'MSW'['measured simulated wrapped'.split().index(timing)]}"
    return ours + ("" if paper_x is None else f" (paper {100 * paper_x:+.1f}%)")


def _skipped(part: pd.DataFrame) -> pd.Series:
    return part["skipped"].fillna(False).astype(bool)


def _not_told_apart(part: pd.DataFrame) -> list[str]:
    """Rows of different methods whose TPS intervals overlap on every benchmark of the block (at least two): a
    reader cannot tell them apart here. The reason, where the catalogue knows one (COINCIDENCES), else a flag."""
    from moespac.analysis.intervals import separate
    from moespac.catalogue import COINCIDENCES

    spans, fewest = {}, {}
    for r in part.itertuples():
        if pd.notna(r.tps_lo) and pd.notna(r.tps_hi):
            spans.setdefault((r.label, r.method), {})[r.benchmark] = (r.tps_lo, r.tps_hi)
            fewest[r.label, r.method] = min(fewest.get((r.label, r.method), r.requests), r.requests)
    notes = []
    for (la, ma), (lb, mb) in itertools.combinations(spans, 2):
        shared = set(spans[la, ma]) & set(spans[lb, mb])
        if len(shared) < 2 or ma == mb or any(separate(spans[la, ma][b], spans[lb, mb][b]) for b in shared):
            continue
        why = COINCIDENCES.get(frozenset({ma, mb}))
        if why is None and min(fewest[la, ma], fewest[lb, mb]) <= 2:
            why = "cells of 2 requests: intervals this wide separate only large differences"
        notes.append(f"{la} and {lb}: intervals overlap on all {len(shared)} benchmarks, not told apart here ("
                     + (why or "the catalogue names no mechanism they share: look at both rows") + ")")
    return notes


def routing_note(part: pd.DataFrame) -> list[str]:
    """What routing a block's traces have, beside the paper's (a reader sees why a proxy block and the paper-regime
    block differ): the expert-cost ratio a/b of its speculative rows, over its benchmarks."""
    sd = part[part["speculative"].fillna(False).astype(bool)] if "a_over_b_per_token" in part else part.iloc[:0]
    ab = sd["a_over_b_per_token"].dropna() if len(sd) else pd.Series(dtype=float)  # an AR step's tokens share none
    if ab.empty:
        return []
    ref = paper.appendix()
    theirs = ref.loc[ref["quantity"] == "expert_cost_ratio_a_over_b", "value"]
    return [f"routing of this block's traces: a/b (distinct experts of a verify step / (tokens x top-k)) "
            f"{ab.min():.2f}-{ab.max():.2f} over its benchmarks; the paper measured {theirs.min():.2f}-"
            f"{theirs.max():.2f} (App. A.1). Lower a/b = more experts shared by the tokens a step verifies, which "
            "is what speculative decoding's gain rests on"]


def _notes(part: pd.DataFrame) -> list[str]:
    notes = routing_note(part) + _stand_in_notes(part)
    skipped = part[_skipped(part)]
    for (label, reason), grp in skipped.groupby(["label", "skip_reason"], sort=False):
        notes.append(f"{label}: skipped, not run here on {', '.join(dict.fromkeys(grp['benchmark']))} ({reason})")
    charged = part.dropna(subset=["draft_charged"]).groupby("draft_charged", sort=False)["model"]
    for draft, models in charged:
        notes.append(f"simulated draft cost charged to speculative rows: {draft}"
                     + (f" for {', '.join(dict.fromkeys(models))}" if charged.ngroups > 1 else ""))
    notes += busy_note(part)
    if len(part):
        n = part["requests"].dropna()
        if len(n):
            notes.append(f"requests per cell: {int(n.min())}–{int(n.max())}; generation length "
                         f"{sorted(set(part['max_new_tokens'].dropna().astype(int)))} tokens")
            notes.append(INTERVAL_NOTE)
    return notes


# ---- Table 2 -----------------------------------------------------------------------------------------------

def table2(rows: pd.DataFrame):
    ref = paper.table2()
    rows = rows.copy()
    rows["label"] = [TABLE2_LABELS.get(m, lbl) for m, lbl in zip(rows["method"], rows["label"])]
    rows["paper_tps"] = [paper.lookup(ref, "tps", method=m, benchmark=b)
                         for m, b in zip(rows["label"], rows["benchmark"])]
    rows["paper_latency_s"] = [paper.lookup(ref, "latency_s", method=m, benchmark=b)
                               for m, b in zip(rows["label"], rows["benchmark"])]
    blocks = []
    for key in blocks_of(rows):
        part = rows[(rows["timing"] == key.timing) & (rows["hardware"] == key.hardware) & (rows["model"] == key.model)]
        labels, cols = list(dict.fromkeys(part["label"])), list(dict.fromkeys(part["benchmark"]))
        tps, lat = (_pivot(part, v, "label", "benchmark").reindex(index=labels, columns=cols)
                    for v in ("tps", "latency_s"))
        tps_span, lat_span = (_spans(part, v, "label", "benchmark").reindex(index=labels, columns=cols).fillna("")
                              for v in ("tps", "latency_s"))
        full = tps.loc["MoE-SpAc (Full)"] if "MoE-SpAc (Full)" in tps.index else None
        body = []
        for label in labels:
            r = [shown(part, label)]
            for b in cols:
                delta = ("" if full is None or label == "MoE-SpAc (Full)"
                         else f", {100 * (tps.loc[label, b] / full[b] - 1):+.1f}%")
                r.append(cell(tps.loc[label, b], key.timing, paper.lookup(ref, "tps", method=label, benchmark=b),
                              span=tps_span.loc[label, b]) + delta)
                r.append(cell(lat.loc[label, b], key.timing, paper.lookup(ref, "latency_s", method=label, benchmark=b),
                              span=lat_span.loc[label, b]))
            body.append(r)
        columns = ["Variant"] + [f"{display(b, part)} {u}" for b in cols for u in ("TPS", "latency (s)")]
        notes = ["+x % after a variant's TPS: its TPS over the full MoE-SpAc's in this block, minus 1 (ours; "
                 "positive = the variant without that component is faster here)"] + _notes(part)
        blocks.append(Block(block_title(key.timing, key.hardware, key.model, part), columns, body, notes))
    return rows.assign(table="table2"), blocks


# ---- Table 3 -----------------------------------------------------------------------------------------------

def mapping_tag(mapping) -> str:
    """How a trace of another shape stands for a model, in a few words: which of its experts the trace can
    reach and whose top-k it routes (from the record's topology_mapping)."""
    import re

    if not isinstance(mapping, str) or not mapping:
        return "trace of this shape"
    parts = ["layers by modulo"] if "num_layers" in mapping else []
    e = re.search(r"trace num_experts=(\d+) != spec num_experts=(\d+)", mapping)
    if e and int(e[1]) < int(e[2]):
        parts.append(f"trace reaches {e[1]} of its {e[2]} experts")
    elif e:
        parts.append(f"trace's {e[1]} experts folded onto {e[2]}")
    k = re.search(r"trace top_k=(\d+) != spec top_k=(\d+)", mapping)
    if k:
        parts.append(f"routes the trace's top-{k[1]}, not its top-{k[2]}")
    return "mapped: " + "; ".join(parts) if parts else "trace of this shape"


def table3(rows: pd.DataFrame):
    ref = paper.table3()
    rows = rows.copy()
    rows["spec"] = [str(m).split(" ")[0] for m in rows["model"]]
    rows["paper_tps"] = [paper.lookup(ref, "tps", spec=s, method=lbl, benchmark=b, profile=h)
                         for s, lbl, b, h in zip(rows["spec"], rows["label"], rows["benchmark"], rows["hardware"])]
    blocks = []
    for timing in sorted(rows["timing"].unique(), key=lambda t: BLOCK_ORDER.get(t, 9)):
        part = rows[rows["timing"] == timing]
        cols = list(dict.fromkeys(part["benchmark"]))
        body = []
        for (hw, spec), grp in part.groupby(["hardware", "spec"], sort=False):
            tps = _pivot(grp, "tps", "label", "benchmark").reindex(columns=cols)
            spans = _spans(grp, "tps", "label", "benchmark").reindex(columns=cols).fillna("")
            mapped = grp["mapping"].dropna()
            # how the trace stands for the model, and whose it is (a real pair's, or a fallback's routing shape)
            whose = [str(x).split(";")[0] for x in grp["source"].dropna() if str(x).startswith("trace of ")]
            model = f"{spec} ({'; '.join([mapping_tag(mapped.iloc[0] if len(mapped) else None)] + whose[:1])})"
            for label in dict.fromkeys(grp["label"]):
                body.append([str(hw), model, shown(grp, label)] + [
                    cell(tps.loc[label, b], timing,
                         paper.lookup(ref, "tps", spec=spec, method=label, benchmark=b, profile=hw),
                         span=spans.loc[label, b])
                    for b in cols])
            imp = [relative_improvement(tps[b]) for b in cols]
            body.append([str(hw), model, "Rel. Improv."] + [_pct(x, timing, None) for x in imp])
        sources = sorted({str(s) for s in part["source"].dropna()})
        notes = [f"numbers from: {s}" for s in sources[:3]] + _notes(part)
        if timing == "simulated":
            notes.append("the paper drafted these models with unnamed \"quantized variants\"; the draft charged "
                         "above stands in for them (config: table3.models[].draft_spec)")
        beside = f" — (paper N) = {paper.TABLE3_SETUP}, not this trace: compare directions, not values" \
            if part["paper_tps"].notna().any() else ""
        blocks.append(Block(f"TPS, {timing}{beside}",
                            ["Hardware", "Model", "Method"] + [display(b, part) for b in cols],
                            body, notes=notes))
    return rows.assign(table="table3"), blocks


# ---- Table 4 -----------------------------------------------------------------------------------------------

AGGREGATE_NOTE = ("Two readings of one run: per sequence (each sequence's tokens over its engine call's decode time, "
                  "what a user of one stream sees) and aggregate (batch size x per sequence: all sequences' tokens per "
                  "second, what a server counts). The paper calls its Table 4 'throughput (TPS)' and reads its batch-1 "
                  "to batch-32 gain (+29.3 % at gamma = 8) as throughput, without saying which; its number sits beside "
                  "both.")


def best_gamma(tps: pd.Series, spans: dict) -> str:
    """The fastest draft length of one batch size, named only where its interval separates from every other
    length's; otherwise the lengths it cannot be told apart from."""
    from moespac.analysis.intervals import separate

    tps = tps.dropna()
    if tps.empty:
        return "-"
    top = tps.idxmax()
    tied = [g for g in tps.index if g != top and not separate(spans.get(top), spans.get(g))]
    return f"{int(top)}" if not tied else f"not separable ({', '.join(str(int(g)) for g in sorted([top] + tied))})"


def table4(rows: pd.DataFrame):
    ref = paper.table4()
    rows = rows.copy()
    rows["paper_tps"] = [paper.lookup(ref, "tps", batch_size=int(b), gamma=int(g))
                         for b, g in zip(rows["batch_size"], rows["gamma"])]
    for col in ("tps", "tps_lo", "tps_hi"):  # batch x per sequence: every sequence runs for its whole call
        rows[f"aggregate_{col}"] = rows[col] * rows["batch_size"]
    blocks = []
    for key in blocks_of(rows):
        part = rows[(rows["timing"] == key.timing) & (rows["hardware"] == key.hardware) & (rows["model"] == key.model)]
        for reading, prefix in (("per sequence", ""), ("aggregate over the batch", "aggregate_")):
            view = part.assign(tps=part[f"{prefix}tps"], tps_lo=part[f"{prefix}tps_lo"], tps_hi=part[f"{prefix}tps_hi"])
            wide = _pivot(view, "tps", "batch_size", "gamma")
            spans = (_spans(view, "tps", "batch_size", "gamma").reindex(index=wide.index, columns=wide.columns)
                     .fillna(""))
            body = [[str(int(b))] + [cell(wide.loc[b, g], key.timing,
                                          paper.lookup(ref, "tps", batch_size=int(b), gamma=int(g)),
                                          span=spans.loc[b, g])
                                     for g in wide.columns] for b in wide.index]
            ci = {(int(r.batch_size), int(r.gamma)): (r.tps_lo, r.tps_hi) for r in view.itertuples()
                  if pd.notna(r.tps_lo) and pd.notna(r.tps_hi)}
            best = {int(b): best_gamma(wide.loc[b], {g: ci.get((int(b), int(g))) for g in wide.columns})
                    for b in wide.index}
            notes = [f"best gamma per batch size (ours, named only where its interval separates from every other "
                     f"gamma's): {best}; the paper: gamma = 8 at every batch size", AGGREGATE_NOTE] + _notes(part)
            blocks.append(Block(f"MoE-SpAc TPS {reading}, batch size x draft length, "
                                f"{block_title(key.timing, key.hardware, key.model, part)}",
                                ["Batch \\ gamma"] + [str(int(g)) for g in wide.columns], body, notes))
    return rows.assign(table="table4"), blocks


# ---- Table 6 -----------------------------------------------------------------------------------------------

def table6(numerics_path):
    """Our numerics rows (moespac numerics --json) beside the paper's Table 6 (measured on this machine)."""
    d = json.loads(Path(numerics_path).read_text())
    if "rows" not in d:
        raise MoespacError(f"{numerics_path}: not a `moespac numerics --json` file")
    timing = d.get("timing", "measured")
    keys = ("worst_nmse", "worst_nmse_bf16", "bf16_rounding", "stock_bf16_rounding")
    long = pd.DataFrame([dict(table="table6", timing=timing, configuration=r["configuration"],
                              tokens=str(r.get("tokens")), cache_ratios=str(r.get("cache_ratios")),
                              **{k: r.get(k) for k in keys}) for r in d["rows"]])
    ref = paper.table6()
    num = lambda v: "–" if v is None else cell(v, timing)  # noqa: E731  (records before bf16 was checked)
    body = [[r["configuration"], str(r.get("tokens")), str(r.get("cache_ratios"))] + [num(r.get(k)) for k in keys]
            for r in d["rows"]]
    body.append(["worst of all (ours)", "", ""] + [num(max((r[k] for r in d["rows"] if r.get(k) is not None),
                                                           default=None)) for k in keys])
    ours = Block("Ours: hybrid MoE layer vs the stock transformers layer (fp32 and bf16, this machine)",
                 ["Configuration", "Tokens", "Cache ratios", "Worst NMSE, fp32", "Worst NMSE, bf16",
                  "bf16 hybrid vs fp32 stock", "bf16 stock vs fp32 stock"], body,
                 [f"bound checked: worst NMSE of the hybrid against the stock block in the same dtype <= "
                  f"{fmt(d.get('bound'))} (the paper's largest): {'OK' if d.get('ok') else 'FAIL'}",
                  "On one CPU both sides of the split run the same kernels, so the same-dtype NMSE is 0 unless "
                  "a kernel, a routing weight or an expert is wrong (tests/test_numerics.py: a 1 % host-kernel error "
                  "breaks the bound). The last two columns are the rounding a bf16 run carries against fp32 "
                  "arithmetic: the hybrid must add nothing to the stock block's. The paper's CUDA-vs-CPU row needs "
                  "a GPU (benchmarks/gpu_engine_check.sh)."])
    theirs = Block("The paper's Table 6 (the paper's numbers)", ["Test", "Configuration", "Worst NMSE (paper)"],
                   [[r["test"], r["configuration"], fmt(r["worst_nmse"])] for _, r in ref.iterrows()])
    return long, [ours, theirs]


# ---- Appendix A.1 ------------------------------------------------------------------------------------------

APPENDIX_BENCHMARKS = ["cnn-dm", "mt-bench", "gsm8k", "humaneval"]


def appendix_a1(rows: pd.DataFrame):
    """alpha, Omega, a/b and TPS of MoE-SpAc per benchmark (the paper's Appendix A.1 table)."""
    ref = paper.appendix()
    rows = rows[(rows["method"] == "moespac") & rows["benchmark"].isin(APPENDIX_BENCHMARKS)].copy()
    quantities = [("alpha", "acceptance_rate", "alpha: accepted / (accepted + rejected) drafts"),
                  ("acceptance_rate", None, "accepted / drafted"), ("omega", None, "Omega (tokens per verify step)"),
                  ("a_over_b", None, "a/b: distinct experts per verify step / top-k"),
                  ("a_over_b_per_token", "expert_cost_ratio_a_over_b", "a/b per token: distinct / (tokens x top-k)"),
                  ("hit_rate", "gpu_cache_hit_rate", "expert-cache hit rate"), ("tps", "tps", "MoE-SpAc TPS")]
    blocks, long = [], []
    for key in blocks_of(rows):
        part = rows[(rows["timing"] == key.timing) & (rows["hardware"] == key.hardware) & (rows["model"] == key.model)]
        cols = [b for b in APPENDIX_BENCHMARKS if b in set(part["benchmark"])]
        body = []
        for col, ref_q, name in quantities:
            vals = part.groupby("benchmark")[col].mean()
            r = [name]
            for b in cols:
                p = paper.lookup(ref, "value", quantity=ref_q, benchmark=b) if ref_q else None
                r.append(cell(vals.get(b), key.timing, p, digits=2 if col == "tps" else 3))
                long.append(dict(table="appendix_a1", timing=key.timing, hardware=key.hardware, model=key.model,
                                 quantity=col, benchmark=b, value=vals.get(b), paper_value=p))
            body.append(r)
        notes = ["alpha, Omega and a/b come from the trace (the same for every timing of one trace); the paper "
                 "reports a/b in 0.23-0.76, which matches the per-token reading, not distinct/top-k (>= 1)"]
        blocks.append(Block(block_title(key.timing, key.hardware, key.model, part, beside_paper=True),
                            ["Metric"] + [display(b, part) for b in cols],
                            body, notes))
    return pd.DataFrame(long), blocks
