"""Cost model numbers derived by hand from a round-number profile and the paper's model specs."""

import numpy as np
import pytest

from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.sim.cost import CostModel
from moespac.sim.profile import HardwareProfile
from moespac.sim.synthetic import hand_trace, toy_spec
from moespac.sim.workload import make_workload

PROFILE = HardwareProfile(name="round", link_bandwidth=1e9, link_latency=1e-5, device_mem_bandwidth=1e12,
                          device_flops=1e14, device_memory=24e9, launch_overhead=5e-6, host_mem_bandwidth=1e11,
                          host_flops=1e12, host_op_overhead=1e-5)
QWEN = get_spec("qwen3-30b-a3b")  # expert: 3 x 2048 x 768 = 4,718,592 params, bf16 9,437,184 bytes
DRAFT = get_spec("qwen3-4b-fp8")
approx = lambda x: pytest.approx(x, rel=1e-12)  # noqa: E731


def test_expert_bytes_and_copies():
    cm = CostModel(PROFILE, QWEN)
    assert cm.expert_bytes == 9_437_184
    assert CostModel(PROFILE, QWEN, expert_dtype="fp8").expert_bytes == 4_718_592
    assert cm.load_s() == approx(1e-5 + 9_437_184 / 1e9)


def test_device_and_host_expert_time_roofline():
    cm = CostModel(PROFILE, QWEN)
    # 1 token: bandwidth-bound (9.437184e-6 s vs 9.4e-8 s of compute); a GPU's grouped call launches nothing per expert
    assert cm.device_expert_s(1) == approx(9.437184e-6)
    # 2000 tokens: compute-bound, 2 x 4,718,592 x 2000 / 1e14
    assert cm.device_expert_s(2000) == approx(1.8874368e-4)
    # host: 1 token bandwidth-bound at 1e11 B/s; 100 tokens compute-bound at 1e12 FLOP/s; the loop's 2 row slices
    # and 2 matmuls of 10 us
    assert cm.host_expert_s(1) == approx(9.437184e-5 + 4e-5)
    assert cm.host_expert_s(100) == approx(9.437184e-4 + 4e-5)
    assert cm.device_expert_s(np.array([0, 1])).tolist()[0] == 0.0


def test_each_side_pays_its_call_once_per_layer():
    cm = CostModel(PROFILE, QWEN)
    # device: offsets copy, 2 grouped matmuls, act, mul = 5 launches of 5 us; host: act, mul, 2 cats = 4 ops of 10 us
    assert cm.device_call_s() == approx(25e-6)
    assert cm.host_call_s() == approx(40e-6)
    # the engine's own software, when a calibrated profile measured it, adds to each
    eng = HardwareProfile(**{**PROFILE.__dict__, "device_call_overhead": 1e-6, "host_call_overhead": 2e-6,
                             "copy_overhead": 3e-6})
    cm = CostModel(eng, QWEN)
    assert cm.device_call_s() == approx(26e-6) and cm.host_call_s() == approx(42e-6)
    assert cm.load_s() == approx(1e-5 + 9_437_184 / 1e9 + 3e-6)
    # a CPU "device" loops like the host: 4 ops per expert and 4 per call (at the device's operator cost, which a
    # calibrated CPU profile sets to the host's)
    cpu = CostModel(HardwareProfile(**{**PROFILE.__dict__, "device_is_host": True}), QWEN)
    assert cpu.device_expert_s(1) == approx(9.437184e-6 + 2e-5) and cpu.device_call_s() == approx(20e-6)


def test_a_pair_that_fits_half_the_last_level_cache_reads_its_weights_from_it():
    big = CostModel(HardwareProfile(**{**PROFILE.__dict__, "host_cache_bytes": 32 * 2**20,
                                       "host_cache_bandwidth": 4e11}), QWEN)
    assert big.host_expert_s(1) == approx(9.437184e-5 + 4e-5)  # Qwen3-30B-A3B: far too large, memory as before
    tiny = toy_spec(Topology(2, 4, 2))
    weights = CostModel(PROFILE, tiny).weight_bytes()
    for cache, cached in ((2 * weights, True), (2 * weights - 1, False)):
        profile = HardwareProfile(**{**PROFILE.__dict__, "host_cache_bytes": cache, "host_cache_bandwidth": 4e11,
                                     "device_is_host": True})
        cm = CostModel(profile, tiny)
        assert cm.host_bandwidth == (4e11 if cached else 1e11)
        assert cm.device_bandwidth == (4e11 if cached else PROFILE.device_mem_bandwidth)


def test_hidden_transfer_attention_and_draft():
    cm = CostModel(PROFILE, QWEN, DRAFT)
    # 9 tokens x 2048 x 2 bytes each way, plus a latency each way
    assert cm.hidden_transfer_s(9) == approx(2 * (1e-5 + 9 * 2048 * 2 / 1e9))
    # attention of 1 token, empty context: q/k/v/o 2048 x (2x4096 + 2x512) + router 2048 x 128 params in
    # bf16, the new token's K/V (2 x 4 heads x 128 x 2 B) read back; bandwidth-bound; 16 launches + 6 that
    # dispatch and merge the routed rows
    nbytes = (2048 * 9216 + 2048 * 128) * 2 + 2 * 4 * 128 * 2
    assert cm.attention_s(1, 0) == approx(nbytes / 1e12 + 22 * 5e-6)
    # draft token: 36 layers of (2560 x 10240 attention + 3 x 2560 x 9728 FFN) fp8 weights + K/V of one
    # token (2 x 8 x 128 x 2 B), 20 launches each; then the LM head 151936 x 2560 fp8, 2 launches
    layer = (2560 * 10240 + 3 * 2560 * 9728 + 2 * 8 * 128 * 2) / 1e12 + 20 * 5e-6
    head = 151936 * 2560 / 1e12 + 2 * 5e-6
    assert cm.draft_token_s() == approx(36 * layer + head)
    assert CostModel(PROFILE, QWEN).draft_token_s() == 0.0


def test_unit_costs_come_from_the_profile():
    cm = CostModel(PROFILE, QWEN, DRAFT)
    u = cm.unit_costs(tokens=9, context=512)
    assert u.t_io == cm.load_s() and u.t_gpu == cm.device_expert_s(9) and u.t_cpu == cm.host_expert_s(1)
    assert u.t_draft == cm.draft_token_s() and u.t_layer == cm.attention_s(9, 512)


def test_device_is_host_needs_no_hidden_transfer():
    cpu = HardwareProfile(**{**PROFILE.__dict__, "device_is_host": True})
    assert CostModel(cpu, QWEN).hidden_transfer_s(9) == 0.0


def test_timing_tracks_context_and_draft_catch_up():
    # prefill 3 tokens, verify (gamma 1) emitting 2, verify emitting 1: contexts 0, 3, 5.
    # The draft's first forward in a request reads the prompt + first token (4 tokens, no KV yet).
    topo = Topology(2, 4, 1)
    steps = [("prefill", 0, 1, [[[0], [1]]] * 3), ("verify", 1, 2, [[[0], [1]]] * 2),
             ("verify", 1, 1, [[[2], [3]]] * 2)]
    w = make_workload(hand_trace(topo, steps), toy_spec(topo))
    cm = CostModel(PROFILE, toy_spec(topo), DRAFT)
    t = cm.timing(w)
    assert t.attention.tolist() == [cm.attention_s(3, 0), cm.attention_s(2, 3), cm.attention_s(2, 5)]
    assert t.draft.tolist() == [0.0, cm.draft_forward_s(4, 0), cm.draft_forward_s(1, 5)]
    assert t.hidden.tolist() == [cm.hidden_transfer_s(n) + cm.host_call_s() for n in (3, 2, 2)]
    assert t.device_call == cm.device_call_s()
    assert t.device_by_count.tolist() == cm.device_expert_s(np.arange(4)).tolist()  # counts up to 3
    assert t.load == cm.load_s() and t.expert_bytes == cm.expert_bytes


def test_fit_slots_on_the_paper_testbed():
    # 24 GiB - non-expert Qwen3-30B-A3B weights - Qwen3-4B-FP8 - 4096-token KV of both - 1 GiB headroom
    cm = CostModel(HardwareProfile(**{**PROFILE.__dict__, "device_memory": 24 * 2**30}), QWEN, DRAFT)
    target = (48 * (2048 * 9216 + 2048 * 128) + 2 * 151936 * 2048) * 2 + 4096 * 48 * 2 * 4 * 128 * 2
    draft = (36 * (2560 * 10240 + 3 * 2560 * 9728) + 2 * 151936 * 2560) + 4096 * 36 * 2 * 8 * 128 * 2
    assert cm.resident_bytes() == target + draft
    assert cm.fit_slots() == (24 * 2**30 - target - draft - 2**30) // 9_437_184
