"""95 % intervals of a cell's mean over its requests: Student's t on the request values, right at the small n
the tables have (n = 2 gives mean +- 12.7 standard errors, not the range of the two). They cover request-to-
request variation for one trained proxy and one trace, not the variation between proxies (docs/reproducibility.md)."""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95
# two-sided 95 % quantiles t_{0.975, df} for df = 1..30 (any statistics table); past 30 a Cornish-Fisher expansion
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom {df} < 1")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(samples, key: str = "", level: float = LEVEL) -> tuple[float, float] | None:
    """(lo, hi) of the 95 % Student-t interval of the mean of `samples` (finite ones), or None with fewer than
    two. `key` is kept for callers that name the cell (the interval no longer draws anything)."""
    if level != LEVEL:
        raise ValueError(f"only the {LEVEL:.0%} interval is tabulated, not {level}")
    x = np.array([float(s) for s in samples if isinstance(s, (int, float)) and math.isfinite(s)])
    if len(x) < 2:
        return None
    half = t975(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    mean = float(x.mean())
    return mean - half, mean + half


def separate(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Whether two intervals do not overlap: only then is a difference between their means called one."""
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])
