"""The data structures that make the scheduler and the simulator fast pick exactly what plain references pick:
the utility-level eviction pool, the batched LRU/LFU victim order, the estimator's deferred calibration and
the balancer's narrow-dtype histogram."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import brute_force_tau

from baselines._common import PrefetchLRU
from baselines.lfu import LFU
from baselines.lru import LRU
from moespac.cache import ExpertCache
from moespac.errors import MoespacError
from moespac.policy import PolicyContext, Topology, UnitCosts, VictimKeys, keyed_victims
from moespac.registry import make_policy
from moespac.sim.replay import replay
from moespac.sim.synthetic import toy_scenario
from moespac.scheduler.balancer import WorkloadBalancer
from moespac.scheduler.estimator import UtilityEstimator
from moespac.scheduler.evictor import EvictionPool


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.data())
def test_level_pool_matches_brute_force(layers, experts, K, data):
    """Utilities change with or without rekey (sync reconciles), thresholds 0..K+1, repeated searches."""
    pool = EvictionPool(layers, experts, K)
    n = layers * experts
    u = np.zeros(n, dtype=np.uint8)
    resident = np.zeros(n, dtype=bool)
    told = True  # the pool has been given every utility change
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["load", "drop", "utility", "quiet utility", "victim"]))
        eid = data.draw(st.integers(0, n - 1))
        if op == "load":
            resident[eid] = True
        elif op == "drop":
            resident[eid] = False
        elif op == "utility":
            u[eid] = data.draw(st.integers(0, K))
            pool.rekey(np.array([eid]), u)
        elif op == "quiet utility":
            u[eid] = data.draw(st.integers(0, K))
            told = False
        else:
            tau = np.array(data.draw(st.lists(st.integers(0, K + 1), min_size=layers, max_size=layers)))
            candidates = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))  # pool ands resident
            pool.sync(resident, None if told else u)
            told = True
            eligible = [(int(u[e]), e) for e in range(n) if candidates[e] and resident[e] and u[e] < tau[e // experts]]
            expected = min(eligible)[1] if eligible else None
            assert pool.pop_victim(candidates, tau) == expected
            assert pool.pop_victim(candidates, tau) == expected  # a search removes nothing: the driver evicts
            if expected is not None and data.draw(st.booleans()):
                resident[expected] = False


def brute_force_victim(candidates: np.ndarray, keys: np.ndarray):
    """Lowest key among candidates, ties to the lowest flat index, by a plain loop."""
    best = None
    for eid in range(candidates.size):
        if candidates.flat[eid] and (best is None or keys.flat[eid] < keys.flat[best]):
            best = eid
    return None if best is None else divmod(best, candidates.shape[1])


def drive_cache_policy(policy, keys, seed: int, steps: int = 120, L: int = 3, E: int = 8, capacity: int = 7):
    """Random uses, on-demand load batches, prefetch commits between reservations, frozen layers and
    per-request resets through the real ExpertCache; every victim() is checked against the brute force.
    Returns (victim() calls checked, the cache's slot map and counters after each step)."""
    rng = np.random.default_rng(seed)
    topo = Topology(L, E, 2)
    checked, states = 0, []

    def fresh():
        policy.reset(PolicyContext(topo, capacity))
        return ExpertCache(topo, capacity)

    cache = fresh()
    original = policy.victim

    def watched(candidates, c):
        nonlocal checked
        expected = brute_force_victim(candidates, keys(policy))
        got = original(candidates, c)
        assert (None if got is None else (int(got[0]), int(got[1]))) == expected
        checked += 1
        return got

    policy.victim = watched
    for s in range(steps):
        if rng.random() < 0.05:
            cache = fresh()
        layer = int(rng.integers(L))
        counts = rng.integers(0, 3, E) * (rng.random(E) < 0.4)
        plan = policy.plan_layer(layer, counts, cache)
        cache.frozen[layer] = cache.resident[layer] & (counts > 0)
        reserved = [int(e) for e in plan.load if cache.reserve(layer, int(e), policy) is not None]
        for e in reserved:
            cache.commit(layer, e)
        cache.frozen[layer] = False
        if isinstance(policy, PrefetchLRU) and rng.random() < 0.5:  # prefetches: touch, reserve, commit in turn
            keys_in = [(int(rng.integers(L)), int(rng.integers(E))) for _ in range(3)]
            policy.touch(keys_in)
            for pl, pe in keys_in:
                if not (cache.resident[pl, pe] or cache.loading[pl, pe]) and cache.reserve(pl, pe, policy) is not None:
                    cache.commit(pl, pe)
        cache.check()
        states.append((cache.slot_of.tobytes(), cache.counters.to_dict()))
    return checked, states


def asked_and_compiled(make_policy_, keys, seed: int) -> int:
    """drive_cache_policy asking victim() each time (checked against the brute force), then with the compiled
    reservations (Policy.victim_keys): the same slots after every step. Returns the victim() calls checked."""
    with patch("moespac.cache.keyed_victims", lambda p: False):
        checked, asked = drive_cache_policy(make_policy_(), keys, seed)
    _, compiled = drive_cache_policy(make_policy_(), keys, seed)
    assert compiled == asked
    return checked


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000))
def test_lru_and_lfu_victims_match_brute_force_asked_or_compiled(seed):
    assert asked_and_compiled(LRU, lambda p: p.last_use, seed) > 0
    assert asked_and_compiled(PrefetchLRU, lambda p: p.last_use, seed) > 0
    def lfu_key(p):
        return p.uses * (p.clock + 1) + p.last_use

    assert asked_and_compiled(LFU, lfu_key, seed) > 0
    assert asked_and_compiled(lambda: LFU(in_cache=True), lfu_key, seed) > 0


@settings(max_examples=80, deadline=None)
@given(st.fixed_dictionaries(dict(
    K=st.integers(1, 6), theta_up=st.floats(0.1, 9), theta_down=st.floats(0.1, 9), adaptive=st.booleans(),
    lam=st.floats(0.01, 1), floor=st.sampled_from([0.0, 1.0, 3.5]), order=st.sampled_from(["after", "before"]),
    rounding=st.sampled_from(["round", "floor", "none"]), scope=st.sampled_from(["expert", "layer"]))),
    st.integers(1, 3), st.data())
def test_deferred_calibration_equals_calibrating_at_once(a, layers, data):
    """Reading the boundaries after every call settles at once; the lazy twin reads at random points."""
    eager, lazy = UtilityEstimator(layers, 5, **a), UtilityEstimator(layers, 5, **a)
    for _ in range(data.draw(st.integers(1, 30))):
        rows = data.draw(st.sampled_from([slice(None)] + list(range(layers))))
        f = np.array(data.draw(st.lists(st.integers(0, 700), min_size=5, max_size=5)))  # > 511: the q cap acts
        f = np.tile(f, (layers, 1)) if isinstance(rows, slice) else f
        for est in (eager, lazy):
            est.update(f, rows)
        _ = eager.q_up  # reading a boundary settles what is owed: eager calibrates at once
        assert (eager.u == lazy.u).all()
        if data.draw(st.booleans()):
            assert (eager.q_up == lazy.q_up).all() and (eager.q_down == lazy.q_down).all()
    assert (eager.q_up == lazy.q_up).all() and (eager.q_down == lazy.q_down).all()


def test_balancer_large_shapes_match_the_brute_force():
    """L x 3 x (K + 1) past int16 (the old numpy histogram had to widen its index there): the compiled
    decision still matches the brute force."""
    rng = np.random.default_rng(3)
    L, E, K = 90, 3, 127
    b = WorkloadBalancer(L, K, 2, UnitCosts(t_io=0.01), warmup_steps=1)
    b.r_cpu, b.r_gpu = rng.random((L, K)), rng.random((L, K))
    b.distinct, b.seen, b.tau = rng.integers(0, E + 1, L).astype(float), np.ones(L, np.int64), rng.integers(1, K + 1, L)
    u = rng.integers(0, K + 1, (L, E)).astype(np.uint8)
    resident = rng.random((L, E)) < 0.5
    evictable = resident & (rng.random((L, E)) < 0.5)
    expected = brute_force_tau(b, u, resident, evictable, 2, 9, 8)
    assert b.solve(u, resident, evictable, 2, 9, 8).tolist() == expected


KEYED = ["lru", "lfu", "lfu:in_cache=true", "accelerate", "vllm-offload", "moe-infinity", "moe-infinity:prefetch=eam",
         "oracle"]
ONE_BY_ONE = ["mixtral-offloading", "hybrimoe"]  # their own victim() decides


@pytest.mark.parametrize("spec", KEYED + ONE_BY_ONE)
def test_compiled_reservations_replay_exactly_as_asking_victim_each_time(spec):
    """A policy that gives its eviction order as keys (Policy.victim_keys) has its reservations done in compiled
    code without a victim() call: every replayed number (times, counters, per request) equals the replay that
    asks victim() for each eviction, on random scenarios where slots run out."""
    keyed = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        L, E = int(rng.integers(2, 4)), int(rng.integers(8, 20))
        k, gamma = int(rng.integers(3, 7)), int(rng.integers(0, 3))
        workload, timing = toy_scenario(rng, L, E, k, n_steps=6, requests=2, gamma=gamma, d0=0.2, d1=1.0, h0=0.5,
                                        h1=2.0, load=float(rng.uniform(0.05, 2.0)), serial=bool(rng.integers(0, 2)))
        capacity = int(rng.integers(1, L * E))
        with patch("moespac.cache.keyed_victims", lambda p: False):
            asking = replay(workload, timing, make_policy(spec), capacity)
        cls = next(k for k in type(make_policy(spec)).__mro__ if "victim_keys" in vars(k))
        inner = cls.victim_keys

        def counted(self, *a, **kw):
            nonlocal keyed
            out = inner(self, *a, **kw)
            keyed += out is not None
            return out

        with patch.object(cls, "victim_keys", counted):  # on the class: the oracle replays copies of itself
            compiled = replay(workload, timing, make_policy(spec), capacity)
        assert compiled.summary() == asking.summary()
        assert compiled.requests == asking.requests
    assert (keyed > 0) == (spec in KEYED), f"{spec}: {keyed} compiled reservations"


def test_a_subclass_that_changes_victim_is_not_keyed_by_its_parents_order():
    from baselines.mixtral_offloading import MixtralOffloading
    from baselines.moe_infinity import MoEInfinity
    from baselines.accelerate import Accelerate

    assert keyed_victims(LRU()) and keyed_victims(LFU()) and keyed_victims(Accelerate())
    assert keyed_victims(MoEInfinity())  # its own victim_keys, beside its own victim()
    assert not keyed_victims(MixtralOffloading())


@pytest.mark.parametrize("method", ["accelerate", "vllm", "specexp", "sp-moe", "moe-speq", "moe-infinity",
                                    "oracle-sd"])
def test_compiled_reservations_replay_a_paper_regime_cell_exactly(method):
    """The keyed Table 1 rows on the traces the tables replay (Qwen3-30B-A3B's 48 x 128, a 25 % cache): the record
    of the compiled reservations equals, number for number, the one that asks victim() for every eviction."""
    from moespac.catalogue import get_method
    from moespac.models.specs import get_spec
    from moespac.sim import paper_routing as pr
    from moespac.sim.simulate import SimConfig, simulate

    m = get_method(method)
    params = pr.RoutingParams(accept=0.74, temperature=1.3, persistence=0.99)
    shape = pr.Shape(requests=2, new_tokens=24, prompt_tokens=16)
    trace = pr.paper_regime_trace(get_spec("qwen3-30b-a3b"), params, shape, seed=3, ar=not m.draft)
    cfg = SimConfig("t", m.policy, "rtx4090-pcie4", model_spec="trace", draft_spec="qwen3-4b-fp8",
                    cache_ratio=0.25, bounds=False)
    compiled = simulate(cfg, trace)
    with patch("moespac.cache.keyed_victims", lambda p: False):
        asking = simulate(cfg, trace)
    assert compiled["metrics"]["counters"]["evictions"] > 0
    assert compiled["metrics"] == asking["metrics"] and compiled["requests"] == asking["requests"]


def test_compiled_reservations_refuse_bad_keys_and_taken_experts_changing_nothing():
    class Wrong(LRU):
        def victim(self, candidates, cache):  # with victim_keys, so that the keys stand for it
            return super().victim(candidates, cache)

        def victim_keys(self, cache):
            return VictimKeys(np.zeros((2, 2), dtype=np.int64))

    topo = Topology(1, 6, 2)
    ctx = PolicyContext(topo, 2, None, gamma=0, batch_size=1, costs=UnitCosts(), signals=set())
    for policy, experts, match in ((Wrong(), [2, 3, 4], "victim keys of shape"),
                                   (LRU(), [2, 1, 3], r"expert \(0, 1\) is already resident"),
                                   (LRU(), [2, 3, 2], r"expert \(0, 2\) is already resident")):
        cache = ExpertCache(topo, 2)
        policy.reset(ctx)
        for e in (0, 1):
            cache.reserve(0, e, None)
            cache.commit(0, e)
        before = [a.copy() for a in (cache.resident, cache.loading, cache.slot_of, cache.occupied, cache._free)]
        with pytest.raises(MoespacError, match=match):
            cache.reserve_many(0, experts, policy)
        after = (cache.resident, cache.loading, cache.slot_of, cache.occupied, cache._free)
        assert all(np.array_equal(x, y) for x, y in zip(before, after)) and cache._nfree == 0
        cache.check()


def test_add_each_is_the_left_fold_of_n_additions():
    """The copy link's clock advances by one copy time per expert of a batch: the compiled fold rounds as that many
    Python additions do, which n * x does not (a batch's end time would then depend on how it was computed)."""
    from moespac.sim.link import add_each

    rng = np.random.default_rng(0)
    differs = 0
    for _ in range(200):
        total, x, n = float(rng.uniform(0, 100)), float(rng.uniform(1e-4, 1e-2)), int(rng.integers(0, 200))
        folded = total
        for _ in range(n):
            folded += x
        assert add_each(total, x, n) == folded
        differs += folded != total + n * x
    assert differs > 0
