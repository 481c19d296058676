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
_SCALE32 = np.float32(SCALE)


def to_fixed(theta) -> np.ndarray:
    """Boundary value(s) -> uint16 units of 1/SCALE (at least one unit, so a boundary is never 0)."""
    return np.clip(np.rint(np.asarray(theta, dtype=np.float64) * SCALE), 1, _QMAX).astype(np.uint16)


class UtilityEstimator:
    """Utilities and boundaries of all layers x experts; `update` takes one layer or all of them.

    Speed: the policy calls `update` once per layer, 48 times a step, so numpy's per-call overhead is the
    cost, not the arithmetic. A transition compares delta with float32 copies of the boundaries, kept as
    the exact thresholds (q_up - offset) / SCALE and (offset - q_down) / SCALE. With calibrate_order=
    'after' a layer's calibration is owed until the layer is next updated or a boundary is read; then
    every owed layer is settled in one call. Calibration is elementwise (per layer for theta_scope=
    'layer'), so this equals calibrating at once. Scratch beside the 5-byte state: the owed delta and
    the two thresholds, float32.
    """

    def __init__(self, num_layers: int, num_experts: int, K: int, theta_up: float, theta_down: float,
                 adaptive: bool = True, lam: float = 0.1, floor: float = 1.0, order: str = "after",
                 scope: str = "expert", rounding: str = "round"):
        self.K, self.adaptive, self.lam, self.order, self.scope = K, adaptive, lam, order, scope
        # integer delta >= theta  <=>  delta * SCALE + offset > q, with theta rounded up / half up / down
        self.offset = np.float32({"none": 1, "round": SCALE // 2, "floor": SCALE}[rounding])
        self.q_floor = int(to_fixed(floor)) if floor > 0 else 1
        self.u = np.zeros((num_layers, num_experts), dtype=np.uint8)
        shape = (num_layers, num_experts) if scope == "expert" else (num_layers, 1)
        self._q = np.empty((2,) + shape, dtype=np.uint16)  # (up, down) boundaries in 1/SCALE units
        self._q[0] = max(int(to_fixed(theta_up)), self.q_floor)
        self._q[1] = max(int(to_fixed(theta_down)), self.q_floor)
        self._bounds = np.empty((2,) + shape, dtype=np.float32)  # up if delta > [0], down if delta < [1]
        self._set_bounds(self._q.astype(np.float32), slice(None))
        self._top = np.full((num_layers, num_experts), K, dtype=np.uint8)  # array, not scalar: faster
        self._delta = np.zeros((num_layers, num_experts), dtype=np.float32)  # f - u of the owed layers, else 0
        self._owed = [False] * num_layers  # layers whose calibration from their last update is pending

    @classmethod
    def from_config(cls, cfg: MoESpAcConfig, num_layers: int, num_experts: int, gamma: int) -> "UtilityEstimator":
        """`gamma` = draft length (for 'ar' decoding pass ar_window - 1: the window plays the verify batch)."""
        half = float(gamma // 2)  # [paper] boundaries start at floor(gamma / 2)
        up = cfg.theta_up if cfg.theta_up is not None else half
        down = cfg.theta_down if cfg.theta_down is not None else half
        return cls(num_layers, num_experts, cfg.K, up, down, cfg.adaptive, cfg.lam, cfg.theta_floor,
                   cfg.calibrate_order, cfg.theta_scope, cfg.theta_rounding)

    @property
    def q_up(self) -> np.ndarray:
        """Up boundaries, uint16 in 1/SCALE units (read-only view)."""
        self._settle()
        return self._q[0]

    @property
    def q_down(self) -> np.ndarray:
        """Down boundaries, uint16 in 1/SCALE units (read-only view)."""
        self._settle()
        return self._q[1]

    @property
    def theta_up(self) -> np.ndarray:
        return self.q_up / SCALE

    @property
    def theta_down(self) -> np.ndarray:
        return self.q_down / SCALE

    @property
    def nbytes(self) -> int:
        """The state: utilities and boundaries (the float32 scratch is derived from them and the counts)."""
        return self.u.nbytes + self._q.nbytes

    def update(self, f: np.ndarray, rows=slice(None)) -> None:
        """One step for `rows` (a layer index or a slice) given activation frequencies f (same shape)."""
        owed = self._owed[rows]
        if owed is True or (owed is not False and any(owed)):
            self._settle()  # these layers' boundaries must move before their next transition
        u, delta = self.u[rows], self._delta[rows]  # views: updated in place
        np.subtract(f, u, out=delta, dtype=np.float32)  # exact in float32
        if self.adaptive and self.order == "before":
            self._calibrate(delta, rows)
        elif self.adaptive:
            self._owed[rows] = [True] * len(owed) if isinstance(rows, slice) else True
        up = delta > self._bounds[0, rows]  # delta >= theta_up, theta rounded as `rounding` says
        down = delta < self._bounds[1, rows]  # -delta >= theta_down
        np.greater(down, up, out=down)  # down &= ~up: the code checks "up" first
        u += up
        np.minimum(u, self._top[rows], out=u)  # a rise at K stays at K
        u -= np.minimum(u, down)  # a fall at 0 stays at 0

    def _settle(self) -> None:
        """Apply every owed calibration in one call (layers with nothing owed hold delta 0: no change)."""
        if any(self._owed):
            self._calibrate(self._delta, slice(None))
            self._delta[...] = 0
            self._owed = [False] * len(self._owed)

    def _calibrate(self, delta, rows) -> None:
        """Move each boundary toward the size of its own-sign fluctuations: q += lam * (|delta| - q)."""
        q = self._q[:, rows]
        target = np.empty((2,) + delta.shape, dtype=np.float32)  # (rise, fall) in boundary units
        np.multiply(delta, _SCALE32, out=target[0])
        np.negative(target[0], out=target[1])
        if self.scope == "layer":  # one boundary per layer follows the mean fluctuation of its experts
            moved = target > 0
            n = moved.sum(-1, keepdims=True)
            target = np.where(moved, target, 0).sum(-1, keepdims=True, dtype=np.float32) / np.maximum(n, 1)
        q_float = q.astype(np.float32)
        weight = (target > 0).astype(np.float32)  # 0 where this side did not fluctuate: q stays
        weight *= np.float32(self.lam)
        new = target - q_float  # float32 (float64 for the per-layer mean)
        new *= weight
        new += q_float
        np.rint(new, out=new)
        # new lies between q and target >= SCALE: only a floor above 1 or f > 511 can cross a bound
        # (numpy's min/max against a scalar is slow, hence the check)
        if self.q_floor > SCALE:
            np.maximum(new, self.q_floor, out=new)
        if new.max() > _QMAX:  # q_down's target is at most SCALE * K: only q_up can get here
            np.minimum(new, _QMAX, out=new)
        q[...] = new
        self._set_bounds(new, rows)

    def _set_bounds(self, q_float: np.ndarray, rows) -> None:
        """Thresholds on delta from the boundaries: delta * SCALE + offset > q  <=>  delta > (q - offset) / SCALE
        (exact in float32: integers below 2**17 and a power-of-two scale)."""
        bounds = self._bounds[:, rows]
        np.subtract(q_float, self.offset, out=bounds)
        bounds *= np.float32(1 / SCALE)
        np.negative(bounds[1], out=bounds[1])


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
