"""Speculative Utility Estimator: one small state machine per (layer, expert), updated with numpy.

u in {0..K} follows the inertial transition of paper Eq. 5 with delta = f - u (the code's definition): up one
level if delta >= theta_up, else down one if -delta >= theta_down. With calibration on, the boundaries follow a
moving average of the fluctuations [inferred]. The boundary rounding is a choice ('round', the default). State
is uint8 / uint16 fixed point; the update runs as numba loops equal to the numpy formulation's bit for bit.

Rounding, fixed point and speed: docs/internals.md#moespacschedulerestimatorpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moespac.scheduler.config import MoESpAcConfig

SCALE = 128
_QMAX = np.iinfo(np.uint16).max
_SCALE32 = np.float32(SCALE)


def to_fixed(theta) -> np.ndarray:
    """Boundary value(s) -> uint16 units of 1/SCALE (at least one unit, so a boundary is never 0)."""
    return np.clip(np.rint(np.asarray(theta, dtype=np.float64) * SCALE), 1, _QMAX).astype(np.uint16)


@njit(cache=True, nogil=True)
def _transition(u, delta, f, bounds, top, first, last):
    """Layers first..last-1: delta = f - u (float32, exact), then up one level if delta > bounds[0], else down
    one if delta < bounds[1] (the code checks "up" first); u stays within 0..top."""
    for layer in range(first, last):
        row = f[layer - first]
        for e in range(u.shape[1]):
            d = np.float32(row[e]) - np.float32(u[layer, e])
            delta[layer, e] = d
            v = u[layer, e]
            if d > bounds[0, layer, e]:
                if v < top:
                    v += 1
            elif d < bounds[1, layer, e] and v > 0:
                v -= 1
            u[layer, e] = v


@njit(cache=True, nogil=True, inline="always")
def _moved(q, target, lam, q_floor, qmax):
    """One boundary moved toward its target: q + lam * (target - q), rounded half to even, within
    [q_floor, qmax] (the floor only matters above 1/SCALE; the target itself is >= SCALE)."""
    qf = np.float32(q)
    w = lam if target > 0 else np.float32(0.0)
    new = np.rint((target - qf) * w + qf)
    if q_floor > 128 and new < q_floor:
        new = q_floor
    if new > qmax:
        new = qmax
    return new


@njit(cache=True, nogil=True, inline="always")
def _set_bounds(bounds, q, layer, x, new_up, new_down, offset):
    q[0, layer, x] = np.uint16(new_up)
    q[1, layer, x] = np.uint16(new_down)
    inv = np.float32(1.0 / 128)
    bounds[0, layer, x] = np.float32(new_up - offset) * inv
    bounds[1, layer, x] = -(np.float32(new_down - offset) * inv)


@njit(cache=True, nogil=True)
def _calibrate_experts(q, bounds, delta, first, last, lam, q_floor, qmax, offset):
    """Per-expert boundaries of layers first..last-1 moved by their own fluctuation delta."""
    scale = np.float32(128)
    for layer in range(first, last):
        for e in range(q.shape[2]):
            rise = delta[layer, e] * scale
            fall = -rise
            _set_bounds(bounds, q, layer, e, _moved(q[0, layer, e], rise, lam, q_floor, qmax),
                        _moved(q[1, layer, e], fall, lam, q_floor, qmax), offset)


@njit(cache=True, nogil=True)
def _calibrate_layers(q, bounds, target, first, last, lam, q_floor, qmax, offset):
    """One boundary per layer moved toward target[side, layer] (the mean own-sign fluctuation of its experts)."""
    for layer in range(first, last):
        _set_bounds(bounds, q, layer, 0, _moved(q[0, layer, 0], target[0, layer - first], lam, q_floor, qmax),
                    _moved(q[1, layer, 0], target[1, layer - first], lam, q_floor, qmax), offset)


_WARM = []


def _warm() -> None:
    """Load (or compile) every kernel once per process, with the argument types of the real calls, so that the
    first update of a request does not pay it inside a timed step."""
    if _WARM:
        return
    u, delta = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.float32)
    q, bounds = np.ones((2, 1, 1), np.uint16), np.ones((2, 1, 1), np.float32)
    _transition(u, delta, np.zeros((1, 1), np.int64), bounds, np.uint8(1), 0, 1)
    args = (0, 1, np.float32(0.1), 1.0, float(_QMAX), np.float32(1))
    _calibrate_experts(q, bounds, delta, *args)
    _calibrate_layers(q, bounds, np.zeros((2, 1)), *args)
    _WARM.append(True)


class UtilityEstimator:
    """Utilities and boundaries of all layers x experts; `update` takes one layer or all of them.

    A transition compares delta with float32 copies of the boundaries, kept as the exact thresholds
    (q_up - offset) / SCALE and (offset - q_down) / SCALE. With calibrate_order='after' a layer's calibration
    is owed until the layer is next updated or a boundary is read; then every owed layer is settled in one
    call. Calibration is elementwise (per layer for theta_scope='layer'), so this equals calibrating at once.
    Scratch beside the 5-byte state: the owed delta and the two thresholds, float32.
    """

    def __init__(self, num_layers: int, num_experts: int, K: int, theta_up: float, theta_down: float,
                 adaptive: bool = True, lam: float = 0.1, floor: float = 1.0, order: str = "after",
                 scope: str = "expert", rounding: str = "round"):
        self.K, self.adaptive, self.lam, self.order, self.scope = K, adaptive, lam, order, scope
        # calibration owed until the layer's next update (update's fast path)
        self._lazy = adaptive and order == "after"
        self.L = num_layers
        self._lam32 = np.float32(lam)
        # integer delta >= theta  <=>  delta * SCALE + offset > q, with theta rounded up / half up / down
        self.offset = np.float32({"none": 1, "round": SCALE // 2, "floor": SCALE}[rounding])
        self.q_floor = int(to_fixed(floor)) if floor > 0 else 1
        self.u = np.zeros((num_layers, num_experts), dtype=np.uint8)
        shape = (num_layers, num_experts) if scope == "expert" else (num_layers, 1)
        self._q = np.empty((2,) + shape, dtype=np.uint16)  # (up, down) boundaries in 1/SCALE units
        self._q[0] = max(int(to_fixed(theta_up)), self.q_floor)
        self._q[1] = max(int(to_fixed(theta_down)), self.q_floor)
        self._bounds = np.empty((2, num_layers, num_experts), dtype=np.float32)  # up if delta > [0], down if < [1]
        self._bounds[...] = (self._q.astype(np.float32) - self.offset) * np.float32(1 / SCALE)
        self._bounds[1] *= -1
        self._top = np.uint8(K)
        self._delta = np.zeros((num_layers, num_experts), dtype=np.float32)  # f - u of the owed layers, else 0
        self._owed = [False] * num_layers  # layers whose calibration from their last update is pending
        _warm()

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
        # one kernel signature (the engine's counts pass as they are)
        if f.dtype != np.int64 or not f.flags.c_contiguous:
            f = np.ascontiguousarray(f, dtype=np.int64)
        if not isinstance(rows, slice) and self._lazy:  # the default, 48 calls a step: the call is the cost
            if self._owed[rows]:
                self._settle()  # this layer's boundaries must move before its next transition
            _transition(self.u, self._delta, f.reshape(1, -1), self._bounds, self._top, rows, rows + 1)
            self._owed[rows] = True
            return
        if isinstance(rows, slice):
            first, last, _ = rows.indices(self.L)
            owed = any(self._owed[first:last])
        else:
            first, last, owed = rows, rows + 1, self._owed[rows]
            f = f.reshape(1, -1)
        if owed:
            self._settle()  # these layers' boundaries must move before their next transition
        if self.adaptive and self.order == "before":  # this step's fluctuation moves the boundaries it meets
            np.subtract(f, self.u[first:last], out=self._delta[first:last], dtype=np.float32)
            self._calibrate(first, last)
        _transition(self.u, self._delta, f, self._bounds, self._top, first, last)
        if not self.adaptive:
            return
        if self.order == "before":
            self._delta[first:last] = 0
        else:
            self._owed[first:last] = [True] * (last - first)

    def _settle(self) -> None:
        """Apply every owed calibration in one call (layers with nothing owed hold delta 0: no change)."""
        if any(self._owed):
            self._calibrate(0, self.L)
            self._delta[...] = 0
            self._owed = [False] * self.L

    def _calibrate(self, first: int, last: int) -> None:
        """Move each boundary toward the size of its own-sign fluctuations: q += lam * (|delta| - q)."""
        args = (first, last, self._lam32, float(self.q_floor), float(_QMAX), self.offset)
        if self.scope == "expert":
            _calibrate_experts(self._q, self._bounds, self._delta, *args)
            return
        # one boundary per layer follows the mean own-sign fluctuation of its experts (float64, as numpy's
        # mean of a float32 sum by an integer count is); the layer's experts share its thresholds
        delta = self._delta[first:last] * _SCALE32
        target = np.stack([delta, -delta])
        moved = target > 0
        n = moved.sum(-1)
        target = np.where(moved, target, 0).sum(-1, dtype=np.float32) / np.maximum(n, 1)
        _calibrate_layers(self._q, self._bounds, target, *args)
        self._bounds[:, first:last] = self._bounds[:, first:last, :1]


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
