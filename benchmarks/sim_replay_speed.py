"""Wall time of the simulator's replay: a 512-token trace of Qwen3-30B-A3B's shape (48 MoE layers x 128
experts, top-8, gamma = 8, synthetic with temporal locality) through MoE-SpAc (lru if the scheduler is not
importable), on rtx4090-pcie4 with a 17 % expert cache (the paper's ratio). Goal: <= 1 s on this machine.

    python benchmarks/sim_replay_speed.py [--policy NAME] [--tokens 512] [--repeats 3]

With --methods, every table method (moespac.catalogue.METHODS, or the names given) is replayed once as the
pipeline's cells replay it: on the recorded --sd-trace (methods with a draft) or --ar-trace, Qwen3-30B-A3B's
expert sizes, a 25 % cache, the oracle with its bounds, profile-reading methods given --profile-trace. It
prints each method's replay time: the pipeline's simulated cells cost about that much each.

    python benchmarks/sim_replay_speed.py --methods all \
        --sd-trace results/traces/proxy-shape/mmlu-pro/g8-b1-n512.npz \
        --ar-trace results/traces/proxy-shape/mmlu-pro/g0-b1-n512.npz \
        --profile-trace results/traces/proxy-shape/gsm8k/g0-b1-n512.npz
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats
import statistics
import time
from pathlib import Path

from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.registry import make_policy
from moespac.sim.cost import CostModel
from moespac.sim.profile import load_profile
from moespac.sim.replay import replay
from moespac.sim.synthetic import synthetic_trace
from moespac.sim.workload import make_workload


def time_by_file(fn) -> dict[str, float]:
    """Run fn under cProfile; own time summed per source file of this repository (numpy and Python
    builtins, e.g. heapq, are one group: attributing them to callers would need the call tree)."""
    root = str(Path(__file__).resolve().parents[1]) + "/"
    prof = cProfile.Profile()
    prof.runcall(fn)
    out: dict[str, float] = {}
    for (path, _, _), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
        ours = path.startswith(root) and "/.venv/" not in path
        key = path[len(root):] if ours else "numpy/builtins"
        out[key] = out.get(key, 0.0) + tottime
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def time_methods(names: list[str], sd_trace: str, ar_trace: str, profile: list[str]) -> None:
    from moespac.sim.simulate import SimConfig, simulate
    from moespac.catalogue import METHODS

    total = 0.0
    for name in names or list(METHODS):
        m = METHODS[name]
        uses = make_policy(m.policy).uses_profile()
        cfg = SimConfig(trace=sd_trace if m.draft else ar_trace, policy=m.policy, hardware="rtx4090-pcie4",
                        model_spec="qwen3-30b-a3b", draft_spec="qwen3-4b-fp8" if m.draft else None, cache_ratio=0.25,
                        allow_topology_mismatch=True, bounds=m.policy == "oracle",
                        profile_traces=tuple(profile) if uses else ())
        t0 = time.perf_counter()
        rec = simulate(cfg)
        wall = time.perf_counter() - t0
        total += wall
        print(f"{name:26s} {wall:7.2f} s  {rec['trace']['requests']} requests, "
              f"{rec['metrics']['tokens_per_s']:.4f} tokens/s (simulated)")
    print(f"all: {total:.1f} s; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (timing: measured)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "moespac" if importlib.util.find_spec("moespac.scheduler") else "lru"
    ap.add_argument("--policy", default=default)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-ratio", type=float, default=0.17)
    ap.add_argument("--methods", default=None,
                    help="'all' or comma-separated table methods: time each on --sd/--ar-trace")
    ap.add_argument("--sd-trace", default=None)
    ap.add_argument("--ar-trace", default=None)
    ap.add_argument("--profile-trace", action="append", default=[])
    args = ap.parse_args()
    if args.methods:
        if not (args.sd_trace and args.ar_trace):
            ap.error("--methods needs --sd-trace and --ar-trace")
        time_methods([] if args.methods == "all" else args.methods.split(","), args.sd_trace, args.ar_trace,
                     args.profile_trace)
        return

    spec = get_spec("qwen3-30b-a3b")
    topo = Topology(spec.num_moe_layers, spec.num_experts, spec.top_k)
    t0 = time.perf_counter()
    trace = synthetic_trace(topo, new_tokens=args.tokens, gamma=8, model_spec=spec, seed=0)
    workload = make_workload(trace, spec)
    cost = CostModel(load_profile("rtx4090-pcie4"), spec, get_spec("qwen3-4b-fp8"))
    timing = cost.timing(workload)
    setup = time.perf_counter() - t0
    slots = round(args.cache_ratio * topo.num_layers * topo.num_experts)
    walls, cpus = [], []
    for _ in range(args.repeats):
        policy = make_policy(args.policy)
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay(workload, timing, policy, slots, costs=cost.unit_costs())
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    policy = make_policy(args.policy)  # once more under the profiler: where the time goes
    by_file = time_by_file(lambda: replay(workload, timing, policy, slots, costs=cost.unit_costs()))
    s = result.summary()
    print(f"trace: {trace.num_steps} steps, {s['tokens']} decode tokens, "
          f"{topo.num_layers}x{topo.num_experts} top-{topo.top_k}, "
          f"gamma 8 (synthesis + costs {setup:.2f} s)")
    print(f"policy {args.policy}, {slots} slots: replay wall time median {statistics.median(walls):.3f} s "
          f"(min {min(walls):.3f}, {args.repeats} runs; goal <= 1 s); CPU time median {statistics.median(cpus):.3f} s; "
          f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (timing: measured)")
    total = sum(by_file.values())
    print("  own time by file under cProfile (inflated by the profiler): " + ", ".join(
        f"{k} {v / total:.0%}" for k, v in list(by_file.items())[:6]))
    print(f"simulated: {s['tokens_per_s']:.2f} tokens/s, hit rate {s['hit_rate']:.3f}, "
          f"host share {s['host_share']:.3f}")


if __name__ == "__main__":
    main()
