"""Hand-computed replay timelines: every time, hit and byte below is derived by hand in the comments.

Costs are set by hand (a Timing), so the timelines test the replay's semantics alone; the cost model
has its own tests (test_sim_cost.py).
"""

import numpy as np
import pytest

from baselines.all_host import AllHost
from baselines.lru import LRU
from moespac.policy import LayerPlan, Policy, Prefetch, Topology
from moespac.sim.cost import Timing
from moespac.sim.replay import replay
from moespac.sim.synthetic import hand_trace, toy_spec
from moespac.sim.workload import make_workload

TOPO = Topology(2, 4, 2)


def timing(steps: int, draft, attention=1.0, other=0.5, device=(0, 1, 1.5), host=(0, 3, 5), hidden=0.5,
           load=4.0, serial=False) -> Timing:
    return Timing(draft=np.asarray(draft, float), attention=np.full(steps, attention), other=np.full(steps, other),
                  device_by_count=np.asarray(device, float), host_by_count=np.asarray(host, float),
                  hidden=np.full(steps, hidden), load=load, expert_bytes=100, serial=serial)


# 2 layers x 4 experts, top-2, 3 steps: prefill (1 token), then two verify steps of gamma=1 (2 tokens).
#   s0 layer0 {0,1}            layer1 {2,3}
#   s1 layer0 {0:2, 1:1, 2:1}  layer1 {2:2, 3:1, 1:1}
#   s2 layer0 {0:2, 1:2}       layer1 {3:2, 0:2}
THREE_STEPS = [
    ("prefill", 0, 1, [[[0, 1], [2, 3]]]),
    ("verify", 1, 2, [[[0, 1], [2, 3]], [[0, 2], [2, 1]]]),
    ("verify", 1, 1, [[[0, 1], [3, 0]], [[0, 1], [3, 0]]]),
]
# draft 2 per verify step, attention 1 per layer, other 0.5 per step, device 1 (one entry) / 1.5 (two),
# host 3 / 5, hidden transfer 0.5, one copy 4


def three_step_workload():
    return make_workload(hand_trace(TOPO, THREE_STEPS, trace_id="three-steps"), toy_spec(TOPO))


def breakdown(result, key):
    return result.step_time[key].tolist()


def test_lru_timeline_by_hand():
    # capacity 3, global pool, nothing placed; LRU loads every miss, evicts the least recently planned.
    # s0 (t=0): L0 at 1: load 0,1 -> 9 (stall 8), device 1+1 -> 11.
    #           L1 at 12: load 2 (last free slot), 3 evicts (0,0) (tie with (0,1): lower index) -> 20, device -> 22.
    #           other -> 22.5.                                        step = 22.5 (stall 16, expert 4)
    # s1: draft -> 24.5. L0 at 25.5: hit 1; load 0 evicts (1,2), load 2 evicts (1,3) -> 33.5; device 1.5+1+1 -> 37.
    #           L1 at 38: load 1,2,3 evicting (0,0),(0,1),(0,2) -> 50; device 1+1.5+1 -> 53.5; other -> 54.
    #                                                                 step = 31.5 (stall 20, expert 7)
    # s2: draft -> 56. L0 at 57: load 0,1 evicting (1,1),(1,2) -> 65; device 1.5+1.5 -> 68.
    #           L1 at 69: hit 3; load 0 evicts (0,0) -> 73; device 1.5+1.5 -> 76; other -> 76.5.
    #                                                                 step = 22.5 (stall 12, expert 6)
    w = three_step_workload()
    r = replay(w, timing(3, [0, 2, 2]), LRU(), capacity=3)
    assert r.total.tolist() == [22.5, 31.5, 22.5]
    assert breakdown(r, "stall") == [16, 20, 12]
    assert breakdown(r, "expert") == [4, 7, 6]
    assert breakdown(r, "expert_device") == [4, 7, 6]
    assert breakdown(r, "expert_host") == [0, 0, 0]
    assert breakdown(r, "draft") == [0, 2, 2]
    assert breakdown(r, "attention") == [2, 2, 2]
    c = r.requests[0]["counters"]
    assert (c["hits"], c["loads"], c["host"], c["evictions"], c["bytes_copied"]) == (2, 12, 0, 9, 1200)
    assert (c["prefetched"], c["prefetch_dropped"], c["prefetch_refused"]) == (0, 0, 0)
    s = r.summary()
    assert s["prefill_s"] == 22.5 and s["decode_s"] == 54.0 and s["tokens"] == 3
    assert s["tokens_per_s"] == 3 / 54
    assert s["latency_s"] == 76.5
    assert s["hit_rate"] == 2 / 14
    assert s["link_bytes"] == 1200 and s["link_busy_s"] == 48.0  # 12 copies of 4
    assert s["link_utilisation"] == 48 / 76.5


def test_all_host_timeline_by_hand():
    # every expert on the host: layer = sum of host times + hidden transfer 0.5
    # s0: L0 at 1: 3+3+0.5 -> 7.5; L1 at 8.5: 6.5 -> 15; other -> 15.5
    # s1: draft -> 17.5; L0 at 18.5: 5+3+3+0.5 -> 30; L1 at 31: 3+5+3+0.5 -> 42.5; other -> 43      (27.5)
    # s2: draft -> 45; L0 at 46: 5+5+0.5 -> 56.5; L1 at 57.5: 10.5 -> 68; other -> 68.5             (25.5)
    r = replay(three_step_workload(), timing(3, [0, 2, 2]), AllHost(), capacity=3)
    assert r.total.tolist() == [15.5, 27.5, 25.5]
    assert breakdown(r, "expert_host") == [13, 23, 21]
    assert breakdown(r, "stall") == [0, 0, 0]
    c = r.requests[0]["counters"]
    assert (c["hits"], c["loads"], c["host"], c["bytes_copied"]) == (0, 0, 14, 0)
    s = r.summary()
    assert s["tokens_per_s"] == 3 / 53 and s["host_share"] == 1.0 and s["link_utilisation"] == 0.0


class Scripted(Policy):
    """Returns fixed prefetch requests per (hook, step, layer); loads every miss if `load`; victims in
    row-major order, or none when `refuse`."""

    name = "scripted-test"

    def __init__(self, script: dict, load=False, refuse=False, host=None):
        self.script, self.load, self.refuse, self.host = script, load, refuse, host or {}

    def begin_step(self, step, cache):
        self.s = step.index
        return self.script.get(("begin", self.s), [])

    def plan_layer(self, layer, counts, cache):
        active = np.flatnonzero(counts)
        host = self.host.get((self.s, layer))
        return LayerPlan(load=active[~cache.resident[layer, active]] if self.load else np.zeros(0, np.int64),
                         host=None if host is None else np.asarray(host))

    def end_layer(self, layer, counts, cache):
        return self.script.get(("end", self.s, layer), [])

    def victim(self, candidates, cache):
        if self.refuse or not candidates.any():
            return None
        return divmod(int(np.argmax(candidates)), candidates.shape[1])


def test_copy_link_prefetch_wait_drop_and_eviction_by_hand():
    # top-1; s0 prefill: L0 {0}, L1 {1}; s1 verify (gamma 1, 2 tokens): L0 {0, 3}, L1 {1, 2}.
    # draft 4, attention 1, other 0, device 1, host 2, hidden 0, copy 3; capacity 2.
    topo = Topology(2, 4, 1)
    trace = hand_trace(topo, [("prefill", 0, 1, [[[0], [1]]]), ("verify", 1, 2, [[[0], [1]], [[3], [2]]])])
    w = make_workload(trace, toy_spec(topo))
    t = timing(2, [0, 4], other=0.0, device=(0, 1), host=(0, 2), hidden=0.0, load=3.0)
    script = {
        # s0 begin (t=0): (0,0) copies 0->3; (1,1) and (1,2) wait in the queue
        ("begin", 0): [Prefetch(0, 0, 1), Prefetch(1, 1, 1), Prefetch(1, 2, 0)],
        # s1 begin (t=7): (1,2) evicts (0,0) (row-major first), copies 7->10; (0,3) evicts (1,1), 10->13
        ("begin", 1): [Prefetch(1, 2, 0), Prefetch(0, 3, 0)],
    }
    r = replay(w, t, Scripted(script, load=False), capacity=2)
    # s0: L0 at 1: (0,0) in flight -> wait to 3 (stall 2), hit, device 1 -> 4 (link takes (1,1) at 3 -> 6)
    #     L1 at 5: (1,2) still queued -> dropped; (1,1) in flight -> wait to 6 (stall 1), hit, device -> 7
    # s1: draft 7 -> 11. L0 at 12: (0,3) in flight -> wait to 13 (stall 1); hit (0,3); expert 0 was
    #     evicted -> host (plan has no loads): concurrent max(device 1, host 2) = 2 -> 15
    #     L1 at 16: (1,1) evicted, (1,2) resident: hit 2, host 1: max(1, 2) -> 18
    assert r.total.tolist() == [7.0, 11.0]
    assert breakdown(r, "stall") == [3.0, 1.0]
    assert breakdown(r, "expert") == [2.0, 4.0]
    assert breakdown(r, "expert_device") == [2.0, 2.0]
    assert breakdown(r, "expert_host") == [0.0, 4.0]
    c = r.requests[0]["counters"]
    assert (c["hits"], c["loads"], c["host"]) == (4, 0, 2)
    assert (c["prefetched"], c["prefetch_dropped"], c["prefetch_refused"], c["evictions"]) == (4, 1, 0, 2)
    assert c["bytes_copied"] == 400 and r.link_busy_s == 12.0


@pytest.mark.parametrize("capacity, refuse", [(3, False), (2, True)])
def test_on_demand_load_waits_for_inflight_copy_then_goes_first(capacity, refuse):
    # one prefill step, top-1: L0 {0}, L1 {1}; copy 3, attention 1, device 1.
    # begin (t=0): (1,1) copies 0->3; (1,2), (1,3) queued.
    # L0 at 1: load 0 waits for (1,1) until 3, then copies 3->6 BEFORE the queued prefetches (stall 5),
    #   device -> 7. The link then serves (1,2) from 6.
    #   capacity 3: (1,2) copies 6->9; at L1 (t=8) (1,3) is dropped and (1,2) waited for until 9 (stall 1).
    #   capacity 2, victims refused: (1,2) and (1,3) are refused at 6; L1 at 8 has nothing to wait for.
    topo = Topology(2, 4, 1)
    w = make_workload(hand_trace(topo, [("prefill", 0, 1, [[[0], [1]]])]), toy_spec(topo))
    t = timing(1, [0], other=0.0, device=(0, 1), host=(0, 2), hidden=0.0, load=3.0)
    script = {("begin", 0): [Prefetch(1, 1, 2), Prefetch(1, 2, 1), Prefetch(1, 3, 0)]}
    r = replay(w, t, Scripted(script, load=True, refuse=refuse), capacity=capacity)
    c = r.requests[0]["counters"]
    assert c["loads"] == 1 and c["hits"] == 1
    if refuse:
        assert breakdown(r, "stall") == [5.0] and r.total.tolist() == [9.0]
        assert (c["prefetched"], c["prefetch_dropped"], c["prefetch_refused"]) == (1, 0, 2)
        assert r.link_busy_s == 6.0
    else:
        assert breakdown(r, "stall") == [6.0] and r.total.tolist() == [10.0]
        assert (c["prefetched"], c["prefetch_dropped"], c["prefetch_refused"]) == (2, 1, 0)
        assert r.link_busy_s == 9.0


@pytest.mark.parametrize("serial, device_call, expected", [(False, 0.0, [4.5, 6.5]), (True, 0.0, [5.5, 6.5]),
                                                          (False, 4.0, [5.0, 6.5]), (True, 4.0, [9.5, 6.5])])
def test_plan_host_split_concurrent_and_serial(serial, device_call, expected):
    # one prefill step of 3 tokens, top-1: L0 {0,1,2} one entry each, L1 {3: 3 entries}.
    # placement (0,0),(0,1); the plan sends the resident (0,1) to the host: device {0}, host {1, 2}.
    # L0: device 1, host 2+2+0.5 hidden; concurrent max = 4.5, serial sum = 5.5. L1: host 6 + 0.5 = 6.5.
    # A device call of 4 makes L0's device side 5 (max 5, sum 9.5); L1 has no device expert, so no call.
    topo = Topology(2, 4, 1)
    w = make_workload(hand_trace(topo, [("prefill", 0, 1, [[[0], [3]], [[1], [3]], [[2], [3]]])]), toy_spec(topo))
    t = timing(1, [0], attention=0.0, other=0.0, device=(0, 1, 1, 1), host=(0, 2, 4, 6), hidden=0.5, serial=serial)
    t.device_call = device_call

    class Placed(Scripted):
        def reset(self, ctx):
            super().reset(ctx)
            placement = np.zeros((2, 4), bool)
            placement[0, :2] = True
            return placement

    r = replay(w, t, Placed({}, host={(0, 0): [1]}), capacity=2)
    assert breakdown(r, "expert") == [sum(expected)]
    c = r.requests[0]["counters"]
    assert (c["hits"], c["host"], c["loads"]) == (1, 3, 0)  # a resident expert sent to the host is no hit


def test_requests_start_cold_unless_warm():
    # two identical one-step requests (L0 {0}, L1 {1}); LRU with 2 slots; copy 4, attention 1, device 1.
    # cold: each request loads both experts: 2 x (1 + 4 + 1) = 12 per request.
    # warm: the second request finds both resident: 2 x (1 + 1) = 4.
    topo = Topology(2, 4, 1)
    step = ("prefill", 0, 1, [[[0], [1]]])
    trace = hand_trace(topo, [step, step], request_of_step=[0, 1])
    w = make_workload(trace, toy_spec(topo))
    t = timing(2, [0, 0], other=0.0, device=(0, 1), host=(0, 2))
    cold = replay(w, t, LRU(), capacity=2)
    warm = replay(w, t, LRU(), capacity=2, warm_cache=True)
    assert cold.total.tolist() == [12.0, 12.0]
    assert warm.total.tolist() == [12.0, 4.0]
    assert [r["counters"]["loads"] for r in cold.requests] == [2, 2]
    assert [r["counters"]["hits"] for r in warm.requests] == [0, 2]


def test_moespac_released_code_timeline_by_hand():
    # MoE-SpAc, released-code variant: K=5, theta_up 5, theta_down 1 (fixed), tau 1 for every layer; the
    # prefill does not update utilities; misses run on the host (no on-demand loads); after a layer its
    # experts with u >= 1 are prefetched (priority u); victims are residents with u < 1.
    # top-1, gamma 4 (5 tokens per verify step), capacity 2; draft 1, attention 1, device 1, host 1 per
    # entry, hidden 0.5, copy 2.
    #   s0 prefill: L0 {0}, L1 {1}       s1: L0 {0:5}, L1 {1:5}
    #   s2: L0 {0:3, 2:2}, L1 {1:5}       s3: L0 {3:5}, L1 {1:5}
    from moespac.registry import make_policy

    topo = Topology(2, 4, 1)
    five = lambda l0, l1: [[[e0], [e1]] for e0, e1 in zip(l0, l1)]  # noqa: E731
    steps = [("prefill", 0, 1, five([0], [1])),
             ("verify", 4, 5, five([0] * 5, [1] * 5)),
             ("verify", 4, 5, five([0, 0, 0, 2, 2], [1] * 5)),
             ("verify", 4, 5, five([3] * 5, [1] * 5))]
    w = make_workload(hand_trace(topo, steps), toy_spec(topo))
    t = timing(4, [0, 1, 1, 1], other=0.0, device=(0, 1, 1, 1, 1, 1), host=(0, 1, 2, 3, 4, 5), hidden=0.5, load=2.0)
    r = replay(w, t, make_policy("moespac:variant=released-code"), capacity=2)
    # s0 (t=0): all on the host: L0 1 -> 2.5, L1 3.5 -> 5.                                    step 5
    # s1: draft -> 6. L0 at 7: host 5 + 0.5 -> 12.5; u(0,0) = 1 (f - u = 5 >= 5): prefetch, copied
    #     12.5 -> 14.5. L1 at 13.5: host -> 19; u(1,1) = 1: copied 19 -> 21.                 step 14
    # s2: draft -> 20. L0 at 21: hit (0,0) on the device (1) || (0,2) on the host 2 + 0.5 -> 23.5.
    #     L1 at 24.5: hit (1,1) -> 25.5 (f - u = 4: u stays 1).                              step 6.5
    # s3: draft -> 26.5. L0 at 27.5: (0,3) on the host 5.5 -> 33; u(0,3) = 1, u(0,0) falls to 0 (f=0):
    #     (0,3) evicts (0,0) and copies 33 -> 35. L1 at 34: hit (1,1) -> 35.                  step 9.5
    assert r.total.tolist() == [5.0, 14.0, 6.5, 9.5]
    assert breakdown(r, "expert_device") == [0.0, 0.0, 2.0, 1.0]
    assert breakdown(r, "expert_host") == [3.0, 11.0, 2.5, 5.5]
    assert breakdown(r, "stall") == [0.0, 0.0, 0.0, 0.0]
    c = r.requests[0]["counters"]
    assert (c["hits"], c["loads"], c["host"]) == (3, 0, 6)
    assert (c["prefetched"], c["prefetch_dropped"], c["prefetch_refused"], c["evictions"]) == (3, 0, 0, 1)
    s = r.summary()
    assert s["tokens_per_s"] == 15 / 30 and s["link_busy_s"] == 6.0 and s["link_bytes"] == 300
