"""What machine and software produced a number (goes into every result record)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("moespac", "torch", "transformers", "numpy", "tokenizers", "snakemake", "mlflow")


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=1)
def software_environment() -> dict:
    """The software that computed a number: the commit, Python and package versions (no machine facts)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    from moespac.pinning import kernel_facts

    return {"git_commit": git_commit(), "python": platform.python_version(), "packages": versions,
            "kernels": kernel_facts()}


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    """The software and the machine (what a measured or wrapped number depends on)."""
    import torch

    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "cuda": torch.version.cuda}
    sw = software_environment()
    return {
        "git_commit": sw["git_commit"],
        "python": sw["python"],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "gpu": gpu,
        "packages": sw["packages"],
        "kernels": sw["kernels"],
    }


CpuSnapshot = tuple[float, float, float]


def cpu_snapshot() -> CpuSnapshot | None:
    """(wall seconds, CPU-seconds every process on the machine has used, CPU-seconds this process and its waited-for
    children have used); None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait is work (steal: other VMs')
    busy = sum(ticks[:3]) + sum(ticks[5:8])
    own = os.times()
    return (time.monotonic(), busy / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def machine_load(since: CpuSnapshot | None, now: CpuSnapshot | None = None) -> dict | None:
    """How busy the machine was with other work from `since` (a cpu_snapshot) to now: the share of all its CPUs'
    time that other processes used. A timed number taken beside other work understates the machine (issue 37:
    llama.cpp decoded 16x slower beside two busy loops); the tables say so for a share above BUSY_SHARE."""
    now = now or cpu_snapshot()
    if since is None or now is None or now[0] <= since[0]:
        return None
    cpus = os.cpu_count() or 1
    wall = now[0] - since[0]
    others = max(0.0, (now[1] - since[1]) - (now[2] - since[2]))
    return {"other_cpu_share": round(min(1.0, others / (wall * cpus)), 3), "cpus": cpus, "wall_s": round(wall, 1)}


BUSY_SHARE = 0.1
"""Other processes' share of the CPUs above which a timed record is flagged as taken on a busy machine."""
