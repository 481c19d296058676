"""Map a function over items in worker processes, results in the items' order (the same list a plain loop gives).

A study's replays are independent pure functions of their inputs, so spreading them over processes changes when
they finish, never what they return. Workers are forked, so `fn` may be a closure over large arrays (nothing is
pickled but each item's index and its result); where fork does not exist, or `jobs` is 1, it is a plain loop.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

_TASK: tuple[Callable, Sequence] | None = None  # what forked workers inherit: the function and its items


def _run(i: int):
    fn, items = _TASK
    return fn(items[i])


def pmap(fn: Callable, items: Sequence, jobs: int = 1, progress=None, what: str = "items") -> list:
    """[fn(x) for x in items], over up to `jobs` forked processes. progress: an optional
    callable(iterable, total, what) -> iterable, advanced as results arrive in order."""
    global _TASK
    items = list(items)
    forkable = "fork" in multiprocessing.get_all_start_methods()

    def collect(results) -> list:
        return list(progress(results, len(items), what) if progress else results)

    if jobs <= 1 or len(items) < 2 or not forkable or _TASK is not None:  # nested: the outer map holds the workers
        return collect(fn(x) for x in items)
    _TASK = (fn, items)
    try:
        with ProcessPoolExecutor(min(jobs, len(items)), mp_context=multiprocessing.get_context("fork")) as pool:
            return collect(pool.map(_run, range(len(items))))
    finally:
        _TASK = None
