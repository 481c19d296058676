"""What machine and software produced a number (goes into every result record)."""

from __future__ import annotations

import functools
import platform
import subprocess
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
