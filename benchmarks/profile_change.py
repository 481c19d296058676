"""What a change of hardware profile does to the simulated cells: each method's tokens/s under profile A and
profile B on the same traces, side by side, with B/A. Each method replays as the pipeline's cells do (the
speculative trace for methods with a draft, the AR one otherwise; Qwen3-30B-A3B's experts, a 25 % cache).

    git show HEAD~1:moespac/sim/profiles/rtx4090-pcie4.yaml > /tmp/before.yaml
    python benchmarks/profile_change.py /tmp/before.yaml rtx4090-pcie4 \
        --sd-trace results/traces/proxy-shape/mt-bench/g8-b1-n512.npz \
        --ar-trace results/traces/proxy-shape/mt-bench/g0-b1-n512.npz --methods moespac,hybrimoe,llamacpp-sd

It prints one row per (trace, method) and, per profile, which method is fastest: a change that reorders the
methods shows there.
"""

from __future__ import annotations

import argparse

from moespac.catalogue import METHODS, get_method
from moespac.sim.simulate import SimConfig, simulate


def tokens_per_s(trace: str, method: str, hardware: str, cache_ratio: float, spec: str, draft: str) -> float:
    sim = simulate(SimConfig(trace=trace, policy=get_method(method).policy, hardware=hardware, model_spec=spec,
                             draft_spec=draft, cache_ratio=cache_ratio, allow_topology_mismatch=True, bounds=False))
    return sim["metrics"]["tokens_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile_a", help="profile name or YAML path (before)")
    p.add_argument("profile_b", help="profile name or YAML path (after)")
    p.add_argument("--sd-trace", action="append", default=[], help="speculative traces (repeat)")
    p.add_argument("--ar-trace", action="append", default=[], help="autoregressive traces (repeat)")
    p.add_argument("--methods", default="moespac,hybrimoe,llamacpp-sd,llamacpp,moespac-no-sd",
                   help="comma-separated table methods, or 'all'")
    p.add_argument("--cache-ratio", type=float, default=0.25)
    p.add_argument("--model-spec", default="qwen3-30b-a3b")
    p.add_argument("--draft-spec", default="qwen3-4b-fp8", help="the draft charged on speculative traces")
    args = p.parse_args()
    methods = list(METHODS) if args.methods == "all" else args.methods.split(",")
    print(f"{'trace':<58} {'method':<22} {'A tok/s':>9} {'B tok/s':>9} {'B/A':>6}")
    best = {}
    for traces, draft in ((args.sd_trace, True), (args.ar_trace, False)):
        for trace in traces:
            for m in (m for m in methods if get_method(m).draft == draft and "oracle" not in m):
                a, b = (tokens_per_s(trace, m, hw, args.cache_ratio, args.model_spec, args.draft_spec)
                        for hw in (args.profile_a, args.profile_b))
                print(f"{trace[-58:]:<58} {m:<22} {a:>9.3f} {b:>9.3f} {b / a if a else float('nan'):>6.3f}")
                for side, v in (("A", a), ("B", b)):
                    if v > best.get((trace, side), ("", -1.0))[1]:
                        best[(trace, side)] = (m, v)
    for (trace, side), (m, v) in sorted(best.items()):
        print(f"fastest under {side} on {trace}: {m} ({v:.3f} tokens/s)")


if __name__ == "__main__":
    main()
