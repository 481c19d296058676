"""How fast this machine is right now, on three fixed workloads of the kinds the main job runs: a pure-Python loop
(the drivers' bookkeeping), small numpy calls on 48 x 128 masks (the simulator's per-layer work) and one-thread
torch matmuls (the proxy builds and trace recordings). CPU-seconds each, one process, one thread.

    python benchmarks/machine_speed.py

A wall-clock figure of the main job means little without it: on the same 2-core VM the four proxy builds took
1964 job-seconds one day and 3970 the next, idle both times, with the same code (docs/pipeline.md). Run this
beside any timing you report, and compare timings only where these figures agree.
"""

from __future__ import annotations

import os
import time

import numpy as np


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def python_loop() -> None:
    s = 0
    for i in range(10_000_000):
        s += i * i


def numpy_small_calls() -> None:
    rng = np.random.default_rng(0)
    mask = rng.random((48, 128)) < 0.25
    keys = rng.integers(0, 1 << 40, (48, 128))
    for _ in range(50_000):
        int(np.argmax(np.where(mask, keys, -1)))


def torch_matmul() -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    for _ in range(200):
        a = torch.tanh(a @ a)


def main() -> None:
    figures = {name: cpu_seconds(fn) for name, fn in
               (("python loop", python_loop), ("numpy small calls", numpy_small_calls), ("torch matmul", torch_matmul))}
    print(", ".join(f"{k} {v:.2f} CPU-s" for k, v in figures.items())
          + f"; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (timing: measured)")


if __name__ == "__main__":
    main()
