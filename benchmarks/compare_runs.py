"""Compare two runs of the pipeline (two checkouts that each ran `snakemake`): which paper_figs/*.csv are
identical, and for each record kind under results/ which metrics differ, in how many records, by how much.

    python benchmarks/compare_runs.py RUN_A RUN_B [--show 10]

A simulated record is a pure function of its trace, profile and policy, so any difference there is a change
in behaviour (or in an input: a profile, a trace). A measured or wrapped record also carries wall-clock
figures, which differ between any two runs; what should not differ there is what the models decided (the
acceptance counts, the tokens). The engine's cache counters sit in between: a prefetch that lands a moment
later is a miss, so they can move by a few events with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

SIM_KEYS = ("metrics", "requests", "bounds", "distance", "cache", "unit_costs")
WALL_CLOCK = re.compile(r"(_s|per_s)(_|$)")  # decode_s, tokens_per_s_e2e, decode_tokens_per_s_mean, ...


def flat(d, prefix=""):
    """Nested dicts/lists as {dotted.key: leaf}; lists of numbers stay one leaf (a per-request series)."""
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def rel(a, b) -> float | None:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare_records(a: Path, b: Path, show: int) -> None:
    only = defaultdict(list)
    diffs = defaultdict(lambda: defaultdict(list))  # kind -> key -> [(path, rel)]
    counts = defaultdict(lambda: [0, 0])  # kind -> [records, identical]
    for fa in sorted((a / "results").rglob("*.json")):
        rel_path = fa.relative_to(a / "results")
        kind = rel_path.parts[0]
        if kind not in ("simulated", "measured", "wrapped"):
            continue
        fb = b / "results" / rel_path
        if not fb.exists():
            only[str(a)].append(str(rel_path))
            continue
        ra, rb = json.loads(fa.read_text()), json.loads(fb.read_text())
        keys = SIM_KEYS if kind == "simulated" else ("metrics",)
        fa_, fb_ = flat({k: ra.get(k) for k in keys}), flat({k: rb.get(k) for k in keys})
        fa_["policy.stats"] = json.dumps(ra.get("policy", {}).get("stats"), sort_keys=True)
        fb_["policy.stats"] = json.dumps(rb.get("policy", {}).get("stats"), sort_keys=True)
        counts[kind][0] += 1
        differing = [k for k in sorted(set(fa_) | set(fb_)) if fa_.get(k) != fb_.get(k)]
        counts[kind][1] += not differing
        for k in differing:
            group = ".".join(k.split(".")[:2])  # metrics.decode_s.p50 -> metrics.decode_s
            diffs[kind][group].append((str(rel_path), rel(fa_.get(k), fb_.get(k))))
    for fb in sorted((b / "results").rglob("*.json")):
        rel_path = fb.relative_to(b / "results")
        if rel_path.parts[0] in ("simulated", "measured", "wrapped") and not (a / "results" / rel_path).exists():
            only[str(b)].append(str(rel_path))
    for kind, (n, same) in sorted(counts.items()):
        print(f"\n{kind}: {n} records in both, {same} with identical numbers")
        timed = kind != "simulated"  # a simulated record's seconds are the model's, a pure function too
        for key, hits in sorted(diffs[kind].items(), key=lambda kv: (timed and bool(WALL_CLOCK.search(kv[0])), kv[0])):
            paths = sorted({p for p, _ in hits})
            rels = [r for _, r in hits if r is not None]
            size = f", max relative difference {max(rels):.2%}" if rels else ""
            clock = timed and WALL_CLOCK.search(key.split(".")[-1])
            print(f"  {key}{' (wall clock)' if clock else ''}: differs in {len(paths)} records{size}")
            for path in ([] if clock else paths[:show]):
                print(f"      {path}")
            if not clock and len(paths) > show:
                print(f"      ... {len(paths) - show} more")
    for run, paths in only.items():
        print(f"\nonly in {run}: {len(paths)} records, e.g. {paths[:3]}")


def compare_figs(a: Path, b: Path) -> None:
    names = sorted({p.name for p in (a / "paper_figs").glob("*.csv")}
                   | {p.name for p in (b / "paper_figs").glob("*.csv")})
    print("paper_figs:")
    for name in names:
        pa, pb = a / "paper_figs" / name, b / "paper_figs" / name
        if not (pa.exists() and pb.exists()):
            print(f"  {name}: only in {a if pa.exists() else b}")
            continue
        la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
        changed = sum(x != y for x, y in zip(la, lb)) + abs(len(la) - len(lb))
        print(f"  {name}: " + ("identical" if la == lb else f"{changed} of {max(len(la), len(lb))} lines differ"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", type=Path, help="a checkout that ran the pipeline (has results/ and paper_figs/)")
    p.add_argument("run_b", type=Path, help="the other")
    p.add_argument("--show", type=int, default=5, help="record paths listed per differing key")
    args = p.parse_args()
    for run in (args.run_a, args.run_b):
        if not (run / "results").is_dir():
            raise SystemExit(f"compare_runs: {run}/results is not a directory (run the pipeline there first)")
    compare_figs(args.run_a, args.run_b)
    compare_records(args.run_a, args.run_b, args.show)


if __name__ == "__main__":
    main()
