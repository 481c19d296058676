"""MoE-SpAc scheduler: estimator, balancer, prefetch order, eviction, config, metrics, a tiny driver."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moespac.cache import CacheCounters, ExpertCache, PrefetchQueue
from moespac.errors import MoespacError
from moespac.policy import PolicyContext, StepInfo, Topology, UnitCosts, check_signals
from moespac.registry import make_policy
from moespac.scheduler import ABLATIONS, MoESpAc, MoESpAcConfig
from moespac.scheduler import metrics
from moespac.scheduler.balancer import WorkloadBalancer
from moespac.scheduler.estimator import SCALE, UtilityEstimator
from moespac.sim.synthetic import synthetic_trace
from moespac.trace import TraceRecorder

DRAFT = frozenset({"draft"})


def run_estimator(est: UtilityEstimator, freqs) -> list[list[int]]:
    """Feed per-step frequency rows (one layer) and return u after every step."""
    out = []
    for f in freqs:
        est.update(np.asarray([f]))
        out.append(est.u[0].tolist())
    return out


# -- estimator ----------------------------------------------------------------------------------------
def test_transition_table_released_code():
    # K=5, theta_up=5, theta_down=1, fixed: up iff f >= u + 5, down iff f <= u - 1
    est = UtilityEstimator(1, 4, K=5, theta_up=5, theta_down=1, adaptive=False)
    seq = [[9, 5, 4, 0], [9, 9, 0, 0], [9, 0, 0, 0], [9, 0, 0, 0], [9, 0, 0, 0], [9, 0, 0, 0], [0, 0, 0, 0]]
    assert run_estimator(est, seq) == [
        [1, 1, 0, 0],  # f=9,5 reach 5 above u=0; f=4 does not
        [2, 2, 0, 0],
        [3, 1, 0, 0],  # f=9 at u=2: delta 7 >= 5; f=0 at u=2: -delta 2 >= 1
        [4, 0, 0, 0],
        [5, 0, 0, 0],  # f=9 at u=4: delta 5 >= 5
        [5, 0, 0, 0],  # f=9 at u=5: delta 4 < 5 (and the cap is K anyway)
        [4, 0, 0, 0],  # f=0 at u=5: -delta 5 >= 1
    ]


def test_transition_up_checked_before_down():
    # with boundaries that both hold at delta = 0 (theta 0+ rounds to 0 under 'floor'), "up" wins
    est = UtilityEstimator(1, 1, K=3, theta_up=0.5, theta_down=0.5, adaptive=False, floor=0, rounding="floor")
    assert run_estimator(est, [[0], [1], [2]]) == [[1], [2], [3]]


def test_transition_and_calibration_paper_variant():
    # gamma = 8: both boundaries start at 4 (512 in 1/128 units), lambda = 0.1, calibrated after the move
    cfg = MoESpAcConfig().resolved()
    est = UtilityEstimator.from_config(cfg, 1, 1, gamma=8)
    assert (est.q_up[0, 0], est.q_down[0, 0]) == (512, 512)
    steps = [(9, 1, 576, 512),  # delta 9 >= 4: up; theta_up -> 4 + 0.1 * (9 - 4) = 4.5
             (9, 2, 621, 512),  # delta 8: up; 576 + 0.1 * (1024 - 576) = 620.8 -> 621
             (0, 2, 621, 486),  # delta -2 < 4: stays; theta_down -> 512 + 0.1 * (256 - 512) = 486.4 -> 486
             (0, 2, 621, 463)]  # 486 - 23 = 463
    for f, u, q_up, q_down in steps:
        est.update(np.array([[f]]))
        assert (int(est.u[0, 0]), int(est.q_up[0, 0]), int(est.q_down[0, 0])) == (u, q_up, q_down)


def test_idle_expert_decays_only_with_rounded_boundaries():
    freqs = [[9], [9]] + [[0]] * 60
    stuck = UtilityEstimator(1, 1, K=4, theta_up=4, theta_down=4, rounding="none")
    decays = UtilityEstimator(1, 1, K=4, theta_up=4, theta_down=4, rounding="round")
    assert run_estimator(stuck, freqs)[-1] == [2]  # theta_down -> 2+ from above, never <= 2
    assert run_estimator(decays, freqs)[-1] == [0]


def test_calibration_order_and_floor():
    # theta_up 5.52 (707/128) rounds to 6: f=5 does not move u; calibrated first it becomes 700/128 = 5.47 -> 5
    after = UtilityEstimator(1, 1, K=4, theta_up=5.52, theta_down=6, order="after")
    before = UtilityEstimator(1, 1, K=4, theta_up=5.52, theta_down=6, order="before")
    assert after.q_up[0, 0] == 707
    after.update(np.array([[5]]))
    before.update(np.array([[5]]))
    assert (after.u[0, 0], before.u[0, 0]) == (0, 1)
    assert after.q_up[0, 0] == before.q_up[0, 0] == 700  # 707 + 0.1 * (640 - 707) = 700.3
    # the floor holds the boundaries up: with floor 3 a boundary starting at 1 is raised to 3
    floored = UtilityEstimator(1, 1, K=4, theta_up=1, theta_down=1, floor=3)
    assert floored.theta_up[0, 0] == floored.theta_down[0, 0] == 3
    floored.update(np.array([[1]]))  # delta 1 < 3: stays; theta_up -> max(3 + 0.1 * (1 - 3), 3) = 3
    assert floored.u[0, 0] == 0 and floored.theta_up[0, 0] == 3


def test_per_layer_boundaries_follow_mean_fluctuation():
    est = UtilityEstimator(2, 4, K=4, theta_up=4, theta_down=4, scope="layer")
    assert est.q_up.shape == (2, 1)
    est.update(np.array([[6, 2, 0, 0], [0, 0, 0, 0]]))  # layer 0: positive deltas 6 and 2, mean 4
    assert est.u[0].tolist() == [1, 0, 0, 0]
    assert est.theta_up[0, 0] == 4 and est.theta_up[1, 0] == 4  # mean 4 keeps 4; layer 1 saw nothing
    est.update(np.array([[9, 9, 0, 0], [0, 0, 0, 0]]))  # deltas 8, 9: mean 8.5 -> 4 + 0.45
    assert est.q_up[0, 0] == round(4.45 * SCALE)


def test_state_is_about_30_kb_for_qwen3_30b():
    est = UtilityEstimator.from_config(MoESpAcConfig().resolved(), 48, 128, gamma=8)
    assert est.nbytes == 48 * 128 * 5  # uint8 utility + two uint16 boundaries


# -- balancer -----------------------------------------------------------------------------------------
def brute_force_tau(b: WorkloadBalancer, u, resident, evictable, free, tokens, gamma):
    """tau by enumerating every candidate with plain loops (the formulas of balancer.py's docstring)."""
    L, K, c = b.L, b.K, b.costs
    prev = b.tau.copy()

    def cold(layer, tau):
        return sum(1 for e in range(u.shape[1]) if evictable[layer, e] and u[layer, e] < tau)

    def candidate(layer, tau):
        n = sum(1 for e in range(u.shape[1]) if u[layer, e] >= tau and not resident[layer, e])
        others = sum(cold(m, tau if b.scope == "global" else prev[m]) for m in range(L) if m != layer)
        slack = (free[layer] if np.ndim(free) else free) + others + cold(layer, tau)
        t_cpu = b.r_cpu[layer, tau - 1] * (tokens * b.top_k * c.t_cpu)
        t_gpu = b.r_gpu[layer, tau - 1] * (b.distinct[layer] * c.t_gpu)
        budget = c.t_layer + max(t_cpu, t_gpu) + gamma * c.t_draft / L
        ok = c.t_io * n <= budget and n <= slack
        return ok, abs(t_cpu - t_gpu)

    if b.scope == "global":
        best = None
        for tau in range(1, K + 1):
            rows = [candidate(layer, tau) for layer in range(L)]
            if all(ok for ok, _ in rows):
                total = sum(gap for _, gap in rows)
                if best is None or total < best[0]:
                    best = (total, tau)
        tau = K if best is None else best[1]
        return [b.warmup_tau if (b.seen < b.warmup_steps).any() else tau] * L
    out = []
    for layer in range(L):
        best = None
        for tau in range(1, K + 1):
            ok, gap = candidate(layer, tau)
            if ok and (best is None or gap < best[0]):
                best = (gap, tau)
        tau = K if best is None else best[1]
        out.append(b.warmup_tau if b.seen[layer] < b.warmup_steps else tau)
    return out


def test_balancer_matches_brute_force_on_random_instances():
    rng = np.random.default_rng(7)
    for trial in range(1200):
        L, E, K = rng.integers(1, 5), rng.integers(1, 9), rng.integers(1, 6)
        integral = trial % 2 == 0  # integer costs produce exact ties: the tie rule is checked too
        draw = (lambda: float(rng.integers(0, 4))) if integral else (lambda: float(rng.random() * 2))
        costs = UnitCosts(t_io=draw() + 0.5, t_gpu=draw(), t_cpu=draw(), t_draft=draw(), t_layer=draw())
        b = WorkloadBalancer(L, K, int(rng.integers(1, 4)), costs, warmup_steps=2,
                             warmup_tau=int(rng.integers(1, K + 1)),
                             scope="global" if trial % 3 == 0 else "layer")
        b.r_cpu = np.round(rng.random((L, K)), 1 if integral else 8)
        b.r_gpu = np.round(rng.random((L, K)), 1 if integral else 8)
        b.distinct = rng.integers(0, E + 1, L).astype(float)
        b.seen = rng.integers(1, 6, L)
        b.tau = rng.integers(1, K + 1, L)
        u = rng.integers(0, K + 1, (L, E)).astype(np.uint8)
        resident = rng.random((L, E)) < 0.4
        evictable = resident & (rng.random((L, E)) < 0.7)
        free = int(rng.integers(0, 4)) if trial % 4 else rng.integers(0, 4, L)
        tokens, gamma = int(rng.integers(1, 10)), int(rng.integers(0, 9))
        expected = brute_force_tau(b, u, resident, evictable, free, tokens, gamma)
        assert b.solve(u, resident, evictable, free, tokens, gamma).tolist() == expected, trial


def test_balancer_learns_the_papers_worked_example():
    # App. C.1: gamma=2, k=2, tokens pick {0, 3} and {2, 3}, expert 3 prefetched (u >= tau), the rest cold
    b = WorkloadBalancer(1, 2, 2, UnitCosts(), warmup_steps=4)
    counts = np.array([[1, 0, 1, 2]])
    u_before = np.array([[0, 0, 0, 1]], dtype=np.uint8)
    b.observe(counts, u_before)
    assert b.r_cpu[0].tolist() == [1 - 2 / 4, 1.0]  # tau=1: expert 3 on device; tau=2: nothing is
    assert b.r_gpu[0].tolist() == [1 / 3, 0.0]
    assert b.distinct[0] == 3
    b.observe(counts, np.array([[0, 0, 0, 0]], dtype=np.uint8))  # warm-up: plain mean of the two steps
    assert b.r_cpu[0, 0] == 0.75 and b.r_gpu[0, 0] == 1 / 6


@pytest.mark.parametrize("K", [4, 5])  # 4 takes the unrolled path, 5 the loop
def test_balancer_learning_is_the_plain_moving_average_bit_for_bit(K):
    rng = np.random.default_rng(K)
    L, E = 6, 10
    b = WorkloadBalancer(L, K, 2, UnitCosts(), warmup_steps=3, rate_decay=0.1)
    r_cpu, r_gpu, seen = np.zeros((L, K)), np.zeros((L, K)), np.zeros(L, int)
    for _ in range(8):  # past the warm-up: plain means, then the moving average
        counts = rng.integers(0, 3, (L, E)) * (rng.random((L, 1)) < 0.8)  # some layers see nothing
        u = rng.integers(0, K + 1, (L, E)).astype(np.uint8)
        b.observe(counts, u)
        for layer in range(L):
            c, v = counts[layer], u[layer]
            if c.sum() == 0:
                continue
            w = 1.0 / (seen[layer] + 1) if seen[layer] < 3 else 0.1
            for tau in range(1, K + 1):
                hot = v >= tau
                new_cpu = 1 - c[(c > 0) & hot].sum() / c.sum()
                new_gpu = ((c > 0) & hot).sum() / (c > 0).sum()
                r_cpu[layer, tau - 1] += w * (new_cpu - r_cpu[layer, tau - 1])
                r_gpu[layer, tau - 1] += w * (new_gpu - r_gpu[layer, tau - 1])
            seen[layer] += 1
        assert (b.r_cpu == r_cpu).all() and (b.r_gpu == r_gpu).all() and (b.seen == seen).all()


# -- prefetch and eviction through the real cache and queue ---------------------------------------------
def fixed_policy(L, E, capacity, tau=1, **opts):
    """released-code (fixed boundaries 5/1): counts equal to u leave u unchanged (delta = 0)."""
    p = MoESpAc(variant="released-code", **opts)
    p.reset(PolicyContext(Topology(L, E, 2), capacity, gamma=8, signals=DRAFT))
    p.tau[:] = tau
    return p


def test_prefetch_order_is_priority_then_layer_then_expert():
    p = fixed_policy(3, 6, capacity=18, tau=2)
    cache, queue = ExpertCache(Topology(3, 6, 2), 18), PrefetchQueue()
    p.estimator.u[:] = [[0, 3, 2, 3, 1, 5], [4, 0, 3, 0, 2, 0], [2, 5, 0, 3, 0, 0]]
    cache.place(np.array([[0, 0, 0, 1, 0, 0], [0] * 6, [0] * 6], dtype=bool))  # (0, 3) already resident
    p.begin_step(StepInfo(1, "verify", 9, 8), cache)
    for layer in range(3):
        queue.push(p.end_layer(layer, p.estimator.u[layer].astype(np.int64), cache))
    popped = []
    while (r := queue.pop()) is not None:
        popped.append((r.priority, r.layer, r.expert))
    assert popped == [(5, 0, 5), (5, 2, 1), (4, 1, 0), (3, 0, 1), (3, 1, 2), (3, 2, 3), (2, 0, 2), (2, 1, 4), (2, 2, 0)]


def test_stale_requests_are_dropped_when_their_layer_starts():
    p = fixed_policy(2, 4, capacity=8, tau=1)
    cache, queue = ExpertCache(Topology(2, 4, 2), 8), PrefetchQueue()
    p.estimator.u[:] = [[1, 2, 0, 0], [0, 3, 1, 0]]
    p.begin_step(StepInfo(1, "verify", 9, 8), cache)
    for layer in range(2):
        queue.push(p.end_layer(layer, p.estimator.u[layer].astype(np.int64), cache))
    assert queue.drop_layer(0) == 2  # layer 0 of the next step started before its copies were served
    assert [(r.layer, r.expert) for r in iter(queue.pop, None)] == [(1, 1), (1, 2)]


def test_evictor_order_threshold_and_frozen():
    p = fixed_policy(2, 4, capacity=4)
    cache = ExpertCache(Topology(2, 4, 2), 4)
    cache.place(np.array([[0, 1, 1, 0], [1, 0, 0, 1]], dtype=bool))
    p.estimator.u[:] = [[0, 2, 0, 0], [0, 0, 0, 1]]
    p.tau[:] = [3, 1]  # (0, 1) is cold for its layer (2 < 3), (1, 3) is hot for its own (1 >= 1)
    cache.frozen[1, 0] = True  # in use by the running layer: never a victim
    order = []
    while (v := p.victim(cache.evictable(0), cache)) is not None:
        order.append(v)
        cache.evict(*v)
    assert order == [(0, 2), (0, 1)]  # lowest (u, eid) below its layer's tau; (1, 0) frozen, (1, 3) hot
    cache.frozen[1, 0] = False
    assert p.victim(cache.evictable(0), cache) == (1, 0)
    # through the cache: a full cache asks the policy, which gives up the coldest resident
    full = ExpertCache(Topology(2, 4, 2), 2)
    full.place(np.array([[0, 1, 0, 0], [0, 0, 0, 1]], dtype=bool))
    assert full.reserve(0, 0, p) is not None and not full.resident[0, 1] and full.counters.evictions == 1
    full.commit(0, 0)
    assert full.reserve(1, 1, p) is not None and not full.resident[0, 0]  # the newcomer has u 0
    full.check()


def test_victims_follow_utility_changes():
    p = fixed_policy(1, 4, capacity=4, tau=5)
    cache = ExpertCache(Topology(1, 4, 2), 4)
    cache.place(np.ones((1, 4), dtype=bool))
    p.estimator.u[:] = [[3, 1, 2, 4]]
    assert p.victim(cache.evictable(0), cache) == (0, 1)
    p.estimator.update(np.array([3, 9, 2, 0]), 0)  # u -> [3, 2, 2, 3]: (0, 1) rises, (0, 3) falls
    p.pool.rekey(np.arange(4), p.estimator.u.ravel())
    assert p.estimator.u[0].tolist() == [3, 2, 2, 3]
    order = []
    for _ in range(4):
        order.append(p.victim(cache.evictable(0), cache))
        cache.evict(*order[-1])
    assert order == [(0, 1), (0, 2), (0, 0), (0, 3)]  # u 2, 2 by eid, then u 3, 3 by eid


# -- config, variants, ablations, registry --------------------------------------------------------------
def changed_fields(a: MoESpAcConfig, b: MoESpAcConfig) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)} - {"ablation"}


@pytest.mark.parametrize("variant", ["paper", "released-code"])
def test_each_ablation_changes_exactly_what_it_names(variant):
    expected = {"no-specue": {"K"}, "no-adabc": {"adaptive", "theta_up", "theta_down"}, "no-hetwb": {"tau"},
                "no-sg-prefetcher": {"prefetcher"}, "no-sg-evictor": {"evictor"}, "no-sd": {"decoding"}}
    base = MoESpAcConfig(variant=variant).resolved()
    for name in ABLATIONS:
        if variant == "released-code" and name == "no-adabc":
            continue  # already fixed; checked below
        ablated = MoESpAcConfig(variant=variant, ablation=name).resolved()
        assert changed_fields(base, ablated) == expected[name], name
    ablated = MoESpAcConfig(variant="paper", ablation="no-adabc").resolved()
    assert (ablated.adaptive, ablated.theta_up, ablated.theta_down) == (False, 3.0, 1.0)
    assert MoESpAcConfig(ablation="no-specue").resolved().K == 1
    assert MoESpAcConfig(ablation="no-hetwb").resolved().tau == 2


def test_variants():
    paper, code = MoESpAcConfig().resolved(), MoESpAcConfig(variant="released-code").resolved()
    assert (paper.K, paper.theta_up, paper.theta_down, paper.adaptive, paper.tau) == (4, None, None, True, None)
    assert (code.K, code.theta_up, code.theta_down, code.adaptive, code.tau) == (5, 5.0, 1.0, False, 1)


@pytest.mark.parametrize("options, key", [
    (dict(K=0), "'K'"), (dict(lam=0.0), "'lam'"), (dict(lam=1.5), "'lam'"), (dict(variant="v9"), "'variant'"),
    (dict(ablation="no-magic"), "'ablation'"), (dict(tau=5), "'tau'"), (dict(tau=0), "'tau'"),
    (dict(variant="released-code", tau=6), "'tau'"), (dict(theta_rounding="up"), "'theta_rounding'"),
    (dict(ablation="no-specue", K=6), "'K'"), (dict(ablation="no-specue+no-hetwb"), "'tau'"),
    (dict(ar_window=0), "'ar_window'"), (dict(count_mode="some"), "'count_mode'"),
])
def test_invalid_config_names_the_key(options, key):
    with pytest.raises(MoespacError, match=key):
        MoESpAcConfig(**options).resolved()


def test_registry_builds_variants_and_ablations():
    p = make_policy("moespac:variant=released-code,ablation=no-adabc")
    assert isinstance(p, MoESpAc) and p.config.K == 5 and p.config.theta_up == 3.0 and p.config.tau == 1
    assert make_policy("moespac:lambda=0.2").config.lam == 0.2
    with pytest.raises(MoespacError, match="no option 'bogus'"):
        make_policy("moespac:bogus=1")


def test_needs_draft_depends_on_the_instance():
    assert make_policy("moespac").needs_draft and not make_policy("moespac:ablation=no-sd").needs_draft
    check_signals(make_policy("moespac:ablation=no-sd"), frozenset())
    with pytest.raises(MoespacError, match="draft"):
        check_signals(make_policy("moespac"), frozenset())


def test_config_hash_is_stable_and_resolution_invariant():
    h = MoESpAcConfig().compute_hash()
    assert len(h) == 12 and int(h, 16) >= 0
    assert h == MoESpAcConfig(variant="paper", K=4, adaptive=True).compute_hash()
    swapped = MoESpAcConfig(ablation="no-hetwb+no-sd")
    assert MoESpAcConfig(ablation="no-sd+no-hetwb").compute_hash() == swapped.compute_hash()
    assert h != MoESpAcConfig(lam=0.2).compute_hash()


# -- policy modes -----------------------------------------------------------------------------------------
def test_accepted_counts_mode():
    p = MoESpAc(variant="released-code", count_mode="accepted")
    topo = Topology(2, 4, 2)
    p.reset(PolicyContext(topo, 4, gamma=8, signals=DRAFT))
    cache = ExpertCache(topo, 4)
    step = StepInfo(1, "verify", 9, 8)
    p.begin_step(step, cache)
    batch = np.array([[9, 0, 9, 0], [0, 9, 0, 0]])
    assert p.end_layer(0, batch[0], cache) == [] and p.end_layer(1, batch[1], cache) == []
    with pytest.raises(MoespacError, match="observe_accepted"):
        p.end_step(step, cache)
    p.begin_step(step, cache)
    p.observe_accepted(np.array([[5, 0, 4, 0], [0, 6, 0, 0]]))
    requests = p.end_step(step, cache)
    assert p.estimator.u.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]
    assert [(r.layer, r.expert, r.priority) for r in requests] == [(0, 0, 1.0), (1, 1, 1.0)]


def test_no_sd_uses_a_sliding_window():
    topo = Topology(1, 2, 1)
    p = MoESpAc(variant="released-code", ablation="no-sd", ar_window=6, theta_up=3)
    p.reset(PolicyContext(topo, 2, gamma=0))  # no draft signal needed
    cache = ExpertCache(topo, 2)
    window, us = [], []
    for s, f in enumerate([[1, 0]] * 5 + [[0, 0]] * 5):
        step = StepInfo(s + 1, "ar", 1, 0)
        p.begin_step(step, cache)
        p.end_layer(0, np.array(f), cache)
        p.end_step(step, cache)
        window.append(int(p.window.total[0, 0]))
        us.append(int(p.estimator.u[0, 0]))
    assert window == [1, 2, 3, 4, 5, 5, 4, 3, 2, 1]  # f = activations of the last 6 tokens
    assert us == [0, 0, 1, 2, 3, 3, 3, 3, 2, 1]  # up when f - u >= 3, down when f - u <= -1


def test_static_placement_ablation():
    topo = Topology(2, 4, 2)
    warm = np.array([[5, 0, 3, 1], [0, 7, 0, 2]])
    p = MoESpAc(ablation="no-sg-prefetcher")
    placement = p.reset(PolicyContext(topo, 3, gamma=8, signals=DRAFT, warmup_counts=warm))
    assert np.flatnonzero(placement).tolist() == [0, 2, 5]  # counts 7, 5, 3
    cache = ExpertCache(topo, 3)
    cache.place(placement)
    assert p.victim(cache.evictable(0), cache) is None  # never moved
    # without warm-up counts: the first static_warmup_steps steps choose, then requests, never evictions
    q = MoESpAc(ablation="no-sg-prefetcher", static_warmup_steps=2)
    q.reset(PolicyContext(topo, 2, gamma=8, signals=DRAFT))
    cache = ExpertCache(topo, 2)
    requests = []
    for s in range(3):
        step = StepInfo(s + 1, "verify", 9, 8)
        q.begin_step(step, cache)
        for layer in range(2):
            requests += q.end_layer(layer, warm[layer], cache)
        requests += q.end_step(step, cache)
    assert sorted({(r.layer, r.expert) for r in requests}) == [(0, 0), (1, 1)]


def test_prefill_leaves_the_estimator_alone():
    p = fixed_policy(1, 2, capacity=2)
    cache = ExpertCache(Topology(1, 2, 2), 2)
    p.begin_step(StepInfo(0, "prefill", 40, 0), cache)
    assert p.end_layer(0, np.array([40, 40]), cache) == []
    assert p.estimator.u.tolist() == [[0, 0]]


def test_describe_reports_tau_per_layer():
    p = MoESpAc(variant="released-code")
    topo = Topology(3, 4, 2)
    p.reset(PolicyContext(topo, 4, gamma=8, signals=DRAFT))
    cache = ExpertCache(topo, 4)
    for s in range(2):
        p.begin_step(StepInfo(s + 1, "verify", 9, 8), cache)
        p.end_step(StepInfo(s + 1, "verify", 9, 8), cache)
    d = p.describe()
    assert d["tau_per_layer_mean"] == [1.0, 1.0, 1.0] and d["steps"] == 2 and d["variant"] == "released-code"
    assert d["config_hash"] == p.config.compute_hash()


# -- metrics ------------------------------------------------------------------------------------------
def test_hot_cold_accuracy_by_hand():
    counts = np.zeros((3, 1, 4), dtype=np.int64)
    counts[0, 0] = [9, 0, 0, 0]
    counts[1, 0] = [9, 1, 0, 0]
    counts[2, 0] = [0, 0, 0, 0]
    cfg = MoESpAcConfig(variant="released-code")
    acc = metrics.hot_cold_accuracy(counts, cfg)
    # before step 0 nothing is hot: expert 0 wrong (3/4); before step 1 expert 0 hot, 1 cold but active (3/4);
    # before step 2 expert 0 hot (u 2) but idle (3/4)
    assert acc["per_step"].tolist() == [0.75, 0.75, 0.75] and acc["accuracy"] == 0.75


def test_smape_by_hand():
    counts = np.array([[[2, 0, 0]], [[2, 4, 0]], [[0, 4, 0]]])
    # per expert, consecutive pairs: (2,2)=0 (2,0)=2 | (0,4)=2 (4,4)=0 | (0,0)=0 (0,0)=0 -> 4 / 6
    assert metrics.smape(counts) == pytest.approx(4 / 6)
    assert metrics.smape(counts, include_idle=False) == pytest.approx(4 / 4)


def test_expert_cost_ratio_by_hand():
    counts = np.array([[[2, 1, 1, 0]], [[1, 1, 1, 1]]])  # 2 tokens x top-2 each step: 3 and 4 distinct
    r = metrics.expert_cost_ratio(counts, top_k=2, tokens=[2, 2])
    assert r["a_over_b"] == 3.5 / 2 and r["per_token"] == 7 / 8 and r["distinct_mean"] == 3.5


def test_cache_summary():
    s = metrics.cache_summary(CacheCounters(hits=6, loads=1, host=3))
    assert s == dict(activations=10, hit_rate=0.6, cpu_share=0.3)


def test_step_counts_from_a_trace_with_accepted_only():
    topo = Topology(2, 4, 2)
    rec = TraceRecorder(topo, model_spec={"name": "toy"}, cross_layer=False)
    rec.begin("prefill", 0, 2)
    rec.layer(0, np.array([[0, 1], [2, 3]]), np.ones((2, 2)), None)
    rec.layer(1, np.array([[0, 1], [0, 1]]), np.ones((2, 2)), None)
    rec.end(0, 1)
    rec.begin("verify", 0, 3, gamma=2)
    rec.layer(0, np.array([[0, 1], [0, 2], [3, 2]]), np.ones((3, 2)), None)
    rec.layer(1, np.array([[1, 2], [1, 3], [0, 3]]), np.ones((3, 2)), None)
    rec.end(1, 2)
    trace = rec.finish()
    counts, tokens = metrics.step_counts(trace)
    assert counts.tolist() == [[[2, 1, 2, 1], [1, 2, 1, 2]]] and tokens.tolist() == [3]
    accepted, tokens = metrics.step_counts(trace, accepted_only=True)
    assert accepted.tolist() == [[[2, 1, 1, 0], [0, 2, 1, 1]]] and tokens.tolist() == [2]
    assert metrics.expert_cost_ratio(trace)["a_over_b"] == 4 / 2


# -- a tiny driver: MoE-SpAc beats a cold cache ---------------------------------------------------------
def serve(queue, cache, policy, budget):
    """The copy link: `budget` requests served (skipping resident / loading ones)."""
    for _ in range(budget):
        r = queue.pop()
        if r is None:
            return
        if cache.start_prefetch(r.layer, r.expert, policy) is None:
            continue
        cache.finish_prefetch(r.layer, r.expert)


def drive(policy, counts, topo, capacity, gamma=8, per_layer=3, per_draft=24) -> CacheCounters:
    cache, queue = ExpertCache(topo, capacity), PrefetchQueue()
    ctx = PolicyContext(topo, capacity, gamma=gamma, costs=UnitCosts(), signals=DRAFT)
    cache.place(policy.reset(ctx))
    for s, step_counts in enumerate(counts):
        step = StepInfo(s + 1, "verify", gamma + 1, gamma)
        queue.push(policy.begin_step(step, cache))
        serve(queue, cache, policy, per_draft)  # the link is free while the draft runs
        for layer in range(topo.num_layers):
            cache.counters.prefetch_dropped += queue.drop_layer(layer)
            c = step_counts[layer]
            active = np.flatnonzero(c)
            cache.frozen[layer, active] = True
            plan = policy.plan_layer(layer, c, cache)
            assert len(plan.load) == 0 and plan.host is None  # MoE-SpAc never loads on demand
            hit = cache.resident[layer, active]
            cache.counters.hits += int(hit.sum())
            cache.counters.host += int((~hit).sum())
            queue.push(policy.end_layer(layer, c, cache))
            cache.frozen[layer] = False
            serve(queue, cache, policy, per_layer)
        queue.push(policy.end_step(step, cache))
        cache.check()
    return cache.counters


@pytest.mark.parametrize("spec", ["moespac", "moespac:variant=released-code", "moespac:tau_scope=global",
                                  "moespac:update_at=step"])
def test_driver_hit_rate_beats_a_cold_cache(spec):
    topo = Topology(8, 32, 4)
    counts = metrics.step_counts(synthetic_trace(topo, new_tokens=250, gamma=8, accept=0.7, seed=3))[0]
    assert len(counts) > 40
    capacity = 64  # a quarter of all experts
    cold = drive(make_policy("all-host"), counts, topo, capacity)
    spac = drive(make_policy(spec), counts, topo, capacity)
    assert cold.hit_rate() == 0 and spac.hits + spac.host == cold.host
    assert spac.hit_rate() > capacity / (8 * 32)  # better than a random quarter of the experts
    assert spac.prefetched > 0 and spac.evictions > 0


def test_microbench_command_prints_measured_rows(capsys):
    from moespac.cli import main

    assert main(["microbench", "scheduler", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("timing: measured") == 7 and "0.063 ms/step" in out and "4.31 ns/layer" in out and "30720 B" in out
