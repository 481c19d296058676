"""Speculative Utility Estimator: one small state machine per (layer, expert), updated with numpy.

u in {0..K} follows the inertial transition of paper Eq. 5 with delta = f - u (the code's definition,
gb.cpp:817-827): up one level if delta >= theta_up, else down one if -delta >= theta_down (up is checked
first). With calibration on, the boundaries follow a moving average of the positive / negative
fluctuations, theta += lam * (|delta| - theta), and never go below `floor` [inferred reconstruction of the
missing Algorithm 1].

Rounding: delta is an integer, so comparing it with a float boundary means comparing with ceil(theta).
Then an expert that goes idle at utility u sees delta = -u every step, theta_down (an average of
magnitudes <= u that started at floor(gamma/2) > u) approaches u from above and never reaches it: the
expert stays hot forever. Comparing with the boundary rounded to the nearest integer ('round', our
default) lets it decay once theta_down < u + 0.5; 'none' keeps the float comparison, 'floor' rounds
down. Fixed integer boundaries (released code, w/o AdaBC) behave the same under all three.

State: u as uint8 and each boundary as uint16 fixed point in units of 1/SCALE (theta < 512, resolution
1/128), 30 KB for 48 x 128 experts (the paper reports "approximately 30 KB"). Fixed point makes the
comparisons exact (delta * SCALE + offset > q) and avoids float16, whose conversions cost more than the
update itself; each calibration step computes in float32 and rounds to the nearest 1/SCALE (half to even).
"""

from __future__ import annotations

import numpy as np

from moespac.scheduler.config import MoESpAcConfig

SCALE = 128
_QMAX = np.iinfo(np.uint16).max


def to_fixed(theta) -> np.ndarray:
    """Boundary value(s) -> uint16 units of 1/SCALE (at least one unit, so a boundary is never 0)."""
    return np.clip(np.rint(np.asarray(theta, dtype=np.float64) * SCALE), 1, _QMAX).astype(np.uint16)


class UtilityEstimator:
    """Utilities and boundaries of all layers x experts; `update` takes one layer or all of them."""

    def __init__(self, num_layers: int, num_experts: int, K: int, theta_up: float, theta_down: float,
                 adaptive: bool = True, lam: float = 0.1, floor: float = 1.0, order: str = "after",
                 scope: str = "expert", rounding: str = "round"):
        self.K, self.adaptive, self.lam, self.order, self.scope = K, adaptive, lam, order, scope
        # integer delta >= theta  <=>  delta * SCALE + offset > q, with theta rounded up / half up / down
        self.offset = np.float32({"none": 1, "round": SCALE // 2, "floor": SCALE}[rounding])
        self.q_floor = int(to_fixed(floor)) if floor > 0 else 1
        self.u = np.zeros((num_layers, num_experts), dtype=np.uint8)
        shape = (num_layers, num_experts) if scope == "expert" else (num_layers, 1)
        self.q_up = np.full(shape, max(int(to_fixed(theta_up)), self.q_floor), dtype=np.uint16)
        self.q_down = np.full(shape, max(int(to_fixed(theta_down)), self.q_floor), dtype=np.uint16)

    @classmethod
    def from_config(cls, cfg: MoESpAcConfig, num_layers: int, num_experts: int, gamma: int) -> "UtilityEstimator":
        """`gamma` = draft length (for 'ar' decoding pass ar_window - 1: the window plays the verify batch)."""
        half = float(gamma // 2)  # [paper] boundaries start at floor(gamma / 2)
        up = cfg.theta_up if cfg.theta_up is not None else half
        down = cfg.theta_down if cfg.theta_down is not None else half
        return cls(num_layers, num_experts, cfg.K, up, down, cfg.adaptive, cfg.lam, cfg.theta_floor,
                   cfg.calibrate_order, cfg.theta_scope, cfg.theta_rounding)

    @property
    def theta_up(self) -> np.ndarray:
        return self.q_up / SCALE

    @property
    def theta_down(self) -> np.ndarray:
        return self.q_down / SCALE

    @property
    def nbytes(self) -> int:
        return self.u.nbytes + self.q_up.nbytes + self.q_down.nbytes

    def update(self, f: np.ndarray, rows=slice(None)) -> None:
        """One step for `rows` (a layer index or a slice) given activation frequencies f (same shape)."""
        u, q_up, q_down = self.u[rows], self.q_up[rows], self.q_down[rows]  # views: updated in place
        rise = np.subtract(f, u, dtype=np.float32)  # delta, exact in float32
        rise *= SCALE  # in boundary units: the comparisons below are exact
        fall = -rise
        if self.adaptive and self.order == "before":
            self._calibrate(rise, fall, q_up, q_down)
        up = rise + self.offset > q_up  # delta >= boundary, the boundary rounded as `rounding` says
        down = fall + self.offset > q_down
        down &= ~up  # the code checks "up" first
        up &= u < self.K
        down &= u > 0
        u += up
        u -= down
        if self.adaptive and self.order == "after":
            self._calibrate(rise, fall, q_up, q_down)

    def _calibrate(self, rise, fall, q_up, q_down) -> None:
        """Move each boundary toward the size of its own-sign fluctuations: q += lam * (|delta| - q)."""
        lam = np.float32(self.lam)
        for q, target in ((q_up, rise), (q_down, fall)):
            if self.scope == "layer":  # one boundary per layer follows the mean fluctuation of its experts
                moved = target > 0
                n = moved.sum(-1, keepdims=True)
                target = np.where(moved, target, 0).sum(-1, keepdims=True, dtype=np.float32) / np.maximum(n, 1)
            weight = np.multiply(target > 0, lam)  # 0 where this side did not fluctuate: q stays
            new = target - q  # float32
            new *= weight
            new += q
            np.rint(new, out=new)
            # new lies between q and target >= SCALE: only a floor above 1 or f > 511 can cross a bound
            if self.q_floor > SCALE:
                np.maximum(new, self.q_floor, out=new)
            if q is q_up:
                np.minimum(new, _QMAX, out=new)
            q[...] = new


class SlidingCounts:
    """Activation counts summed over the last `window` steps (the 'w/o SD' ablation: AR tokens)."""

    def __init__(self, num_layers: int, num_experts: int, window: int):
        self.ring = np.zeros((window, num_layers, num_experts), dtype=np.int32)
        self.total = np.zeros((num_layers, num_experts), dtype=np.int32)
        self.slot = 0

    def push(self, counts: np.ndarray, rows=slice(None)) -> np.ndarray:
        """Replace this step's slot for `rows` with `counts`; returns the window sums of those rows."""
        old = self.ring[self.slot, rows]
        self.total[rows] += np.asarray(counts, dtype=np.int32) - old
        old[...] = counts
        return self.total[rows]

    def advance(self) -> None:
        """Next step: its slot starts from the oldest step, which leaves the window."""
        self.slot = (self.slot + 1) % len(self.ring)
