"""ExpertCache bookkeeping and PrefetchQueue ordering (shared by engine and simulator)."""

import numpy as np
import pytest

from baselines.lru import LRU
from moespac.cache import ExpertCache, PrefetchQueue
from moespac.errors import MoespacError
from moespac.policy import PolicyContext, Prefetch, Topology

TOPO = Topology(2, 4, 2)


def test_reserve_commit_evict_lru():
    cache = ExpertCache(TOPO, capacity=2)
    lru = LRU()
    lru.reset(PolicyContext(TOPO, 2))
    for layer, e in [(0, 1), (0, 2)]:
        lru.plan_layer(layer, np.bincount([e], minlength=4), cache)
        slot = cache.reserve(layer, e, lru)
        cache.commit(layer, e)
        assert slot is not None
    lru.plan_layer(0, np.bincount([2], minlength=4), cache)  # touch (0, 2): (0, 1) is now least recent
    assert cache.reserve(1, 3, lru) is not None
    cache.commit(1, 3)
    assert not cache.resident[0, 1] and cache.resident[0, 2] and cache.resident[1, 3]
    assert cache.counters.evictions == 1
    cache.check()


def test_frozen_experts_never_evicted():
    cache = ExpertCache(TOPO, capacity=1)
    lru = LRU()
    lru.reset(PolicyContext(TOPO, 1))
    cache.place(np.array([[1, 0, 0, 0], [0, 0, 0, 0]], bool))
    cache.frozen[0, 0] = True
    assert cache.reserve(1, 1, lru) is None  # the only resident is in use: refused, not evicted
    assert cache.resident[0, 0]


def test_per_layer_capacity_evicts_within_layer():
    cache = ExpertCache(TOPO, capacity=4, per_layer_capacity=1)
    lru = LRU()
    lru.reset(PolicyContext(TOPO, 4, per_layer_capacity=1))
    cache.place(np.array([[1, 0, 0, 0], [1, 0, 0, 0]], bool))
    assert cache.free_slots(0) == 0 and cache.free_slots() == 2
    cache.reserve(0, 3, lru)
    assert not cache.resident[0, 0] and cache.resident[1, 0]  # the victim came from layer 0


def test_placement_over_capacity_rejected():
    cache = ExpertCache(TOPO, capacity=1)
    with pytest.raises(MoespacError, match="capacity"):
        cache.place(np.ones((2, 4), bool))
    with pytest.raises(MoespacError, match="capacity"):
        ExpertCache(TOPO, capacity=9)


def test_prefetch_queue_priority_fifo_and_drop():
    q = PrefetchQueue()
    q.push([Prefetch(0, 1, 1), Prefetch(1, 2, 3), Prefetch(2, 0, 1), Prefetch(0, 3, 3)])
    assert q.drop_layer(0) == 2
    assert len(q) == 2
    assert q.pop() == Prefetch(1, 2, 3)
    assert q.pop() == Prefetch(2, 0, 1)
    assert q.pop() is None
    q.push([Prefetch(0, 0, 2)])  # a new request for a dropped layer is live again
    assert q.pop() == Prefetch(0, 0, 2)


def test_unknown_policy_option_is_named():
    from moespac.registry import make_policy

    with pytest.raises(MoespacError, match="has no option 'nope'"):
        make_policy("lru:nope=1")
    with pytest.raises(MoespacError, match="unknown policy 'no-such'"):
        make_policy("no-such")
