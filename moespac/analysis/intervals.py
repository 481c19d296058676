"""95 % intervals of a cell's mean over its requests: a seeded percentile bootstrap, so a rerun draws the same."""

from __future__ import annotations

import hashlib
import math

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def mean_interval(samples, key: str, level: float = LEVEL, resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """(lo, hi) of the mean of `samples` (finite ones), or None with fewer than two. `key` seeds the draw (the
    record's config hash), so the interval of a record never changes."""
    x = np.array([float(s) for s in samples if isinstance(s, (int, float)) and math.isfinite(s)])
    if len(x) < 2:
        return None
    seed = int(hashlib.sha256(str(key).encode()).hexdigest()[:16], 16)
    means = np.random.default_rng(seed).choice(x, size=(resamples, len(x)), replace=True).mean(axis=1)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def separate(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Whether two intervals do not overlap: only then is a difference between their means called one."""
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])
