"""What-if: how the Table 1 methods' simulated throughput depends on how local the routing is.

MoE-SpAc's lookahead pays off only if the experts one verify step activates are few and recur in the next
steps. A router trained for minutes (the proxy pair) activates nearly as many distinct experts per step as a
uniform one, so the proxy traces say little about a trained 30B router. This sweeps the synthetic generator's
popularity skew (moespac/sim/synthetic.py: fixed per-layer popularity plus a drifting part) over traces of
Qwen3-30B-A3B's shape, and for each prints the locality (distinct experts per layer per 9-token verify step,
against uniform routing) and each method's simulated tokens/s on a hardware profile: where along this axis
MoE-SpAc overtakes the baselines, and by how much. Recorded traces can be put on the same axis
(--recorded SD.npz AR.npz). Every number printed is simulated.

    python benchmarks/locality_sweep.py [--skews 0,1,2,3,4] [--tokens 256] [--recorded SD.npz AR.npz]
                                        [--json OUT.json] [--plot OUT]   (OUT.png and OUT.pdf)
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

from moespac.atomic import write_json
from moespac.errors import MoespacError
from moespac.models.proxy_stats import decode_counts, locality
from moespac.models.registry import get_spec
from moespac.policy import Topology, check_signals
from moespac.registry import make_policy
from moespac.sim.replay import SIM_SIGNALS
from moespac.sim.simulate import SimConfig, simulate
from moespac.sim.synthetic import synthetic_trace
from moespac.study import get_method
from moespac.trace import load_trace

METHODS = ("moespac", "hybrimoe", "llamacpp", "llamacpp-sd", "fate", "mixtral-offload", "moe-infinity")


def distinct_per_step(trace) -> float:
    """Mean distinct experts per layer in a decode step (proxy-stats' active share x experts)."""
    return locality(decode_counts(trace))[1] * trace.topology.num_experts


def run(methods, sd_trace, ar_trace, path: str, args, skipped: dict) -> dict[str, dict]:
    """method -> simulated metrics; a method the trace lacks a signal for (Fate's cross-layer top-k on a
    synthetic trace) is left out and its reason kept in `skipped`."""
    out = {}
    for slug in methods:
        m = get_method(slug)
        trace = sd_trace if m.draft else ar_trace
        try:
            check_signals(make_policy(m.policy), trace.signals() | SIM_SIGNALS | {"warmup_counts"})
        except MoespacError as e:
            skipped.setdefault(slug, str(e))
            continue
        cfg = SimConfig(trace=path, policy=m.policy, hardware=args.hardware, model_spec=args.model_spec,
                        draft_spec=args.draft_spec, cache_ratio=args.cache_ratio, bounds=False,
                        allow_topology_mismatch=args.allow_topology_mismatch)
        out[slug] = simulate(cfg, trace=trace)["metrics"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skews", default="0,1,2,3,4", help="popularity skews of the synthetic traces")
    ap.add_argument("--persistence", type=float, default=0.9, help="step-to-step correlation of the drifting part")
    ap.add_argument("--accept", type=float, default=0.8, help="per-token draft acceptance of the synthetic SD steps")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--hardware", default="rtx4090-pcie4")
    ap.add_argument("--model-spec", default="qwen3-30b-a3b")
    ap.add_argument("--draft-spec", default="qwen3-4b-fp8")
    ap.add_argument("--cache-ratio", type=float, default=0.25, help="as Table 1 of the default workflow")
    ap.add_argument("--recorded", nargs=2, metavar=("SD", "AR"), help="recorded SD and AR traces to add as a row")
    ap.add_argument("--allow-topology-mismatch", action="store_true", help="for --recorded proxy traces")
    ap.add_argument("--json", help="write every row (locality, each method's metrics) here")
    ap.add_argument("--plot", help="figure prefix: tokens/s against distinct experts per step, one line per method")
    args = ap.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    spec = get_spec(args.model_spec)
    topo = Topology(spec.num_moe_layers, spec.num_experts, spec.top_k)
    E, k = topo.num_experts, topo.top_k

    rows, skipped = [], {}
    cases = [(f"synthetic skew {s:g}", float(s)) for s in (float(v) for v in args.skews.split(","))]
    if args.recorded:
        cases.append(("recorded", None))
    for label, skew in tqdm(cases, desc="traces"):
        if skew is None:
            sd, ar = (load_trace(p) for p in args.recorded)
        else:
            kw = dict(new_tokens=args.tokens, skew=skew, persistence=args.persistence, accept=args.accept,
                      model_spec=spec, seed=0)
            sd, ar = synthetic_trace(topo, gamma=args.gamma, **kw), synthetic_trace(topo, gamma=0, **kw)
        metrics = run(methods, sd, ar, label, args, skipped)
        rows.append((label, distinct_per_step(sd), metrics))

    uniform = E * (1 - (1 - k / E) ** (args.gamma + 1))
    print(f"\nsimulated on {args.hardware}, {args.model_spec} experts, draft {args.draft_spec}, cache ratio "
          f"{args.cache_ratio}; distinct = experts per layer per {args.gamma + 1}-token verify step "
          f"(uniform routing: {uniform:.1f}). timing: simulated")
    head = ["trace", "distinct"] + [f"{m} tok/s" for m in methods]
    if "moespac" in methods:
        head += ["moespac hit", "moespac vs best other"]
    print(" | ".join(head))
    for label, distinct, metrics in rows:
        cells = [label, f"{distinct:.1f}"] + [f"{metrics[m]['tokens_per_s']:.2f}" if m in metrics else "-"
                                              for m in methods]
        if "moespac" in metrics:
            others = [metrics[m]["tokens_per_s"] for m in metrics if m != "moespac"]
            best = max(others) if others else float("nan")
            cells += [f"{metrics['moespac']['hit_rate']:.3f}", f"{100 * (metrics['moespac']['tokens_per_s'] / best - 1):+.1f} %"]
        print(" | ".join(cells))
    for slug, why in skipped.items():
        print(f"- {slug} left out where its signal is missing: {why}")
    setup = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    if args.json:
        write_json(args.json, dict(timing="simulated", setup=setup, uniform_distinct=uniform,
                                   rows=[dict(trace=label, distinct=d, metrics=m) for label, d, m in rows]))
    if args.plot:
        plot(rows, methods, uniform, args)


def plot(rows, methods, uniform: float, args) -> None:
    from moespac.analysis.style import figure, save

    fig, (ax,) = figure(width=5.6, height=3.8)
    synthetic = [r for r in rows if r[0] != "recorded"]
    for slug in methods:
        pts = [(d, m[slug]["tokens_per_s"]) for _, d, m in synthetic if slug in m]
        if pts:
            line, = ax.plot(*zip(*pts), marker="o", label=get_method(slug).label)
            for label, d, m in rows:
                if label == "recorded" and slug in m:
                    ax.scatter([d], [m[slug]["tokens_per_s"]], marker="*", s=120, color=line.get_color(), zorder=3)
    ax.axvline(uniform, color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel(f"distinct experts per layer per {args.gamma + 1}-token step (uniform routing: {uniform:.0f})")
    ax.set_ylabel("tokens/s (simulated)")
    ax.set_title(f"{args.model_spec} on {args.hardware}, cache {args.cache_ratio:g}; * = recorded trace", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    for path in save(fig, args.plot):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
