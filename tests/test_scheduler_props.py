"""Property tests (hypothesis) for the MoE-SpAc scheduler's vectorised parts against plain references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moespac.cache import ExpertCache, PrefetchQueue
from moespac.policy import PolicyContext, StepInfo, Topology
from moespac.scheduler import MoESpAc
from moespac.scheduler.estimator import SCALE, UtilityEstimator
from moespac.scheduler.evictor import EvictionPool

estimator_args = st.fixed_dictionaries(dict(
    K=st.integers(1, 6),
    theta_up=st.floats(0.1, 9), theta_down=st.floats(0.1, 9),
    adaptive=st.booleans(), lam=st.floats(0.01, 1), floor=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]),
    order=st.sampled_from(["after", "before"]), rounding=st.sampled_from(["round", "floor", "none"]),
))


def counts_seq(steps=st.integers(1, 25), experts=st.integers(1, 6), high=12):
    return st.tuples(steps, experts).flatmap(lambda se: st.lists(
        st.lists(st.integers(0, high), min_size=se[1], max_size=se[1]), min_size=se[0], max_size=se[0]))


def reference_step(u, q_up, q_down, f, a, q_floor):
    """One expert, one step, the estimator's rules written out with float32 scalars."""
    offset = {"none": 1, "round": SCALE // 2, "floor": SCALE}[a["rounding"]]
    rise = np.float32(f - u) * np.float32(SCALE)
    fall = -rise
    lam = np.float32(a["lam"])

    def calibrate(q, target, cap):
        if target <= 0:
            return q
        new = np.rint(np.float32(np.float32(target - np.float32(q)) * lam) + np.float32(q))
        return int(min(max(new, q_floor), cap))

    if a["adaptive"] and a["order"] == "before":
        q_up, q_down = calibrate(q_up, rise, 65535), calibrate(q_down, fall, 65535)
    if rise + offset > q_up:
        u = min(u + 1, a["K"])
    elif fall + offset > q_down:
        u = max(u - 1, 0)
    if a["adaptive"] and a["order"] == "after":
        q_up, q_down = calibrate(q_up, rise, 65535), calibrate(q_down, fall, 65535)
    return u, q_up, q_down


@settings(max_examples=150, deadline=None)
@given(estimator_args, counts_seq(high=700))
def test_utility_stays_in_range_and_matches_the_scalar_rules(a, seq):
    est = UtilityEstimator(1, len(seq[0]), **a)
    state = [(0, int(est.q_up[0, e]), int(est.q_down[0, e])) for e in range(len(seq[0]))]
    for f in seq:
        est.update(np.array([f]))
        state = [reference_step(*state[e], f[e], a, est.q_floor) for e in range(len(f))]
        assert ((est.u >= 0) & (est.u <= a["K"])).all()
        assert est.u[0].tolist() == [s[0] for s in state]
        assert est.q_up[0].tolist() == [s[1] for s in state]
        assert est.q_down[0].tolist() == [s[2] for s in state]


@settings(max_examples=60, deadline=None)
@given(estimator_args, st.sampled_from(["expert", "layer"]), st.integers(1, 4), st.data())
def test_per_layer_calls_equal_one_call_for_all_layers(a, scope, layers, data):
    seq = data.draw(st.lists(st.lists(st.lists(st.integers(0, 9), min_size=5, max_size=5), min_size=layers,
                                      max_size=layers), min_size=1, max_size=12))
    whole, split = (UtilityEstimator(layers, 5, scope=scope, **a) for _ in range(2))
    for f in np.array(seq):
        whole.update(f)
        for layer in range(layers):
            split.update(f[layer], layer)
    assert (whole.u == split.u).all() and (whole.q_up == split.q_up).all() and (whole.q_down == split.q_down).all()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.data())
def test_eviction_pool_matches_brute_force(layers, experts, K, data):
    """Random residency and utility changes: the pool's victim is the lowest eligible (u, eid)."""
    pool = EvictionPool(layers, experts)
    n = layers * experts
    u = np.zeros(n, dtype=np.uint8)
    resident = np.zeros(n, dtype=bool)
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["load", "drop", "utility", "victim"]))
        eid = data.draw(st.integers(0, n - 1))
        if op == "load":
            resident[eid] = True
        elif op == "drop":
            resident[eid] = False
        elif op == "utility":
            u[eid] = data.draw(st.integers(0, K))
            pool.rekey(np.array([eid]), u)
        else:
            tau = np.array(data.draw(st.lists(st.integers(1, K), min_size=layers, max_size=layers)))
            candidates = resident & np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
            pool.sync(resident, u)
            eligible = [(int(u[e]), e) for e in range(n) if candidates[e] and u[e] < tau[e // experts]]
            expected = min(eligible)[1] if eligible else None
            assert pool.pop_victim(candidates, tau) == expected
            if expected is not None:
                resident[expected] = False  # the driver evicts it


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["paper", "released-code"]), st.integers(2, 12), st.data())
def test_policy_requests_and_victims_respect_tau(variant, capacity, data):
    """Driven with random counts: requests name absent experts with u >= tau at priority u, victims u < tau."""
    topo = Topology(3, 6, 2)
    policy = MoESpAc(variant=variant, warmup_steps=1)
    policy.reset(PolicyContext(topo, capacity, gamma=4, signals=frozenset({"draft"})))
    cache, queue = ExpertCache(topo, capacity), PrefetchQueue()
    chosen = []
    original = policy.victim

    def watched(candidates, c):
        key = original(candidates, c)
        if key is not None:
            chosen.append(key)
            assert candidates[key] and policy.estimator.u[key] < policy.tau[key[0]]
        return key

    policy.victim = watched
    for s in range(data.draw(st.integers(1, 10))):
        step = StepInfo(s + 1, "verify", 5, 4)
        policy.begin_step(step, cache)
        for layer in range(3):
            queue.drop_layer(layer)
            counts = np.array(data.draw(st.lists(st.integers(0, 5), min_size=6, max_size=6)))
            requests = policy.end_layer(layer, counts, cache)
            for r in requests:
                assert r.layer == layer and not cache.resident[r.layer, r.expert]
                assert r.priority == policy.estimator.u[layer, r.expert] >= policy.tau[layer]
            queue.push(requests)
            for _ in range(data.draw(st.integers(0, 4))):
                r = queue.pop()
                if r is None or cache.resident[r.layer, r.expert]:
                    continue
                if cache.reserve(r.layer, r.expert, policy) is not None:
                    cache.commit(r.layer, r.expert)
        policy.end_step(step, cache)
        cache.check()
        assert 1 <= policy.tau.min() and policy.tau.max() <= policy.config.K
