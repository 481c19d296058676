"""The linter as CI runs it: `ruff check` with pyproject.toml's settings over the package, baselines, tests and
benchmark scripts (so the README's `pytest` runs it too)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                        "moespac", "baselines", "tests", "benchmarks"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
