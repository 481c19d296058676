"""How often some policy beats the offline oracle, and by how much, on small random scenarios.

Each seed is one scenario of moespac.sim.synthetic.random_toy_scenario (the generator of the property tests
in tests/test_sim_bounds.py): 1-3 layers x 2-5 experts, 1-2 requests of 1-5 steps, random costs and cache
size. Every registered policy that the scenario can run is replayed beside the oracle (simulated time).

    python benchmarks/oracle_gap.py [--seeds 0:10000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import collections
from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from moespac.registry import make_policy, policies_runnable_with
from moespac.sim.replay import SIM_SIGNALS, replay
from moespac.sim.synthetic import random_toy_scenario

TOL = 1e-9


def gaps(seed: int) -> dict[str, float]:
    """policy -> oracle time / policy time, for the policies the oracle loses to on this seed."""
    workload, timing, capacity = random_toy_scenario(seed)
    signals = SIM_SIGNALS | workload.trace.signals()
    oracle = float(replay(workload, timing, make_policy("oracle"), capacity).total.sum())
    out = {}
    for name in policies_runnable_with(signals):
        if name == "oracle":
            continue
        t = float(replay(workload, timing, make_policy(name), capacity).total.sum())
        if oracle > t * (1 + TOL):
            out[name] = oracle / t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:10000", help="first:last (exclusive)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    first, last = (int(v) for v in args.seeds.split(":"))
    losses, worst, examples = collections.Counter(), {}, []
    with ProcessPoolExecutor(args.jobs) as pool:
        seeds = range(first, last)
        for seed, lost in tqdm(zip(seeds, pool.map(gaps, seeds, chunksize=50)), total=len(seeds), desc="scenarios"):
            for name, ratio in lost.items():
                losses[name] += 1
                worst[name] = max(worst.get(name, 0.0), ratio)
                examples.append((seed, name, ratio))
    n = last - first
    print(f"{n} scenarios (seeds {first}-{last - 1}); scenarios where some policy beat the oracle: "
          f"{len({s for s, _, _ in examples})} (timing: simulated)")
    for name, count in losses.most_common():
        print(f"  {name}: {count} (oracle up to {100 * (worst[name] - 1):.2f} % slower)")
    for seed, name, ratio in examples[:20]:
        print(f"  seed {seed}: {name} {ratio:.4f}")


if __name__ == "__main__":
    main()
