"""Wall time of the simulator's replay: a 512-token trace of Qwen3-30B-A3B's shape (48 MoE layers x 128
experts, top-8, gamma = 8, synthetic with temporal locality) through MoE-SpAc (lru if the scheduler is not
importable), on rtx4090-pcie4 with a 17 % expert cache (the paper's ratio). Goal: <= 1 s on this machine.

    python benchmarks/sim_replay_speed.py [--policy NAME] [--tokens 512] [--repeats 3]
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

from moespac.models.registry import get_spec
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "moespac" if importlib.util.find_spec("moespac.scheduler") else "lru"
    ap.add_argument("--policy", default=default)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-ratio", type=float, default=0.17)
    args = ap.parse_args()

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
    print(f"trace: {trace.num_steps} steps, {s['tokens']} decode tokens, {topo.num_layers}x{topo.num_experts} top-{topo.top_k}, "
          f"gamma 8 (synthesis + costs {setup:.2f} s)")
    print(f"policy {args.policy}, {slots} slots: replay wall time median {statistics.median(walls):.3f} s "
          f"(min {min(walls):.3f}, {args.repeats} runs; goal <= 1 s); CPU time median {statistics.median(cpus):.3f} s; "
          f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (timing: measured)")
    total = sum(by_file.values())
    print("  own time by file under cProfile (inflated by the profiler): " + ", ".join(
        f"{k} {v / total:.0%}" for k, v in list(by_file.items())[:6]))
    print(f"simulated: {s['tokens_per_s']:.2f} tokens/s, hit rate {s['hit_rate']:.3f}, host share {s['host_share']:.3f}")


if __name__ == "__main__":
    main()
