"""The host -> device copy link in simulated time, with the engine's semantics.

One copy at a time: whenever idle it serves the PrefetchQueue (highest priority first, FIFO among equals);
on-demand loads wait for the copy in flight, then go before any queued prefetch. Events are processed lazily:
`advance(now)` plays every copy start and completion up to `now`, and the driver calls it before anything
reads or changes the cache, queue or policy.

Details: docs/internals.md#moespacsimlinkpy.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from moespac.cache import ExpertCache, PrefetchQueue
from moespac.policy import Policy


@njit(cache=True, nogil=True)
def add_each(total: float, x: float, n: int) -> float:
    """`total` plus `x`, n times over, with the rounding of n additions (a left fold, unlike n * x); compiled, as
    every on-demand batch calls it twice."""
    for _ in range(n):
        total += x
    return total


class CopyLink:
    def __init__(self, cache: ExpertCache, queue: PrefetchQueue, policy: Policy, t_copy: float, expert_bytes: int):
        self.cache, self.queue, self.policy = cache, queue, policy
        self.t_copy, self.expert_bytes = t_copy, expert_bytes
        self.t = 0.0  # idle since t (or busy until `done`)
        self.inflight: tuple[int, int] | None = None
        self.restoring = False  # the copy in flight is a Prefetch.restore
        self.started = 0.0
        self.done = math.inf
        self.busy = 0.0  # seconds spent copying (prefetches and on-demand loads)

    def advance(self, now: float) -> None:
        """Play copy starts/completions up to `now`."""
        while True:
            if self.inflight is None and not self._start(self.t):
                break
            if self.done > now:
                return
            self._finish()
        self.t = max(self.t, now)

    def push(self, requests, now: float) -> None:
        """Queue prefetch requests at `now`; an idle link starts on them at once."""
        if requests:
            self.advance(now)
            self.queue.push(requests)
            self.advance(now)

    def wait_layer(self, layer: int, now: float) -> float:
        """Layer `layer` starts at `now`: wait for an in-flight copy of one of its experts."""
        self.advance(now)
        if self.inflight is not None and self.inflight[0] == layer and not self.restoring:
            now = self.done
            self._finish()  # no new copy starts here: the layer's on-demand loads would go first
        return now

    def load(self, layer: int, experts: np.ndarray, now: float, counter: str = "loads") -> tuple[float, np.ndarray]:
        """Blocking on-demand loads at `now`: reserve every slot first (as the engine does), then copy them
        back to back after the copy in flight. Returns (time they are all resident, experts loaded as int64);
        an expert whose reservation is refused is not loaded (it runs on the host). The caller has
        already advanced the link to `now` (wait_layer), so no queued prefetch slips in first. `counter`:
        the cache counter the copies count in ("carried" for experts that come along but do not run)."""
        if self.inflight is not None:
            now = self.done
            self._finish()
        self.t = max(self.t, now)
        loaded, _ = self.cache.reserve_many(layer, experts, self.policy)
        self.t, self.busy = add_each(self.t, self.t_copy, len(loaded)), add_each(self.busy, self.t_copy, len(loaded))
        self.cache.commit_many(layer, loaded)
        c = self.cache.counters
        setattr(c, counter, getattr(c, counter) + len(loaded))
        c.bytes_copied += len(loaded) * self.expert_bytes
        return self.t, loaded

    def close(self, now: float) -> None:
        """End of a request: the copy in flight is abandoned (its cache is discarded)."""
        self.advance(now)
        if self.inflight is not None:
            self.busy += now - self.started
            self.inflight, self.done = None, math.inf
        self.queue.clear()

    def _start(self, t: float) -> bool:
        cache = self.cache
        while (r := self.queue.pop()) is not None:
            layer, expert = int(r.layer), int(r.expert)
            if r.restore:  # traffic only: the expert stays resident as it is (skipped if it left meanwhile)
                if not cache.resident[layer, expert]:
                    continue
            elif cache.start_prefetch(layer, expert, self.policy) is None:
                continue
            self.inflight, self.started, self.done = (layer, expert), t, t + self.t_copy
            self.restoring = bool(r.restore)
            return True
        return False

    def _finish(self) -> None:
        layer, expert = self.inflight
        if self.restoring:
            self.cache.counters.restored += 1
            self.cache.counters.bytes_copied += self.expert_bytes
        else:
            self.cache.finish_prefetch(layer, expert)
        self.busy += self.done - self.started
        self.t = self.done
        self.inflight, self.done = None, math.inf
