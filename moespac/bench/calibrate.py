"""Measure this machine into a hardware profile, with the engine's own expert kernel.

Host: moespac.engine.kernels.expert_ffn on the CPU, timed against the number of tokens, gives the
per-operator overhead (a tiny expert), the memory bandwidth (one token through large experts, cycling
through more weights than the caches hold) and the throughput (many tokens). The same on the GPU when
CUDA is available, plus the pinned host -> device copy (latency from a tiny copy, bandwidth from an
expert-sized one), the launch overhead, and an attention and a draft-layer timing kept as checks.
On a CPU-only machine the "device" is the host CPU (device_is_host: true) and the link is the memcpy
the engine's ExpertStore does there, measured the same way. The host's last-level cache (its size from sysfs,
the expert kernel's bandwidth on weights that stay in it) prices a model pair small enough to live there.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moespac.sim.cost import OPS_PER_EXPERT
from moespac.sim.profile import HardwareProfile

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class CalibrationConfig:
    """What to measure."""

    hidden: int = 2048
    """Expert input width (Qwen3-30B-A3B's by default)."""
    expert_ffn: int = 768
    """Expert intermediate width."""
    dtype: str = "fp32"
    """Expert weight dtype on the host (fp32, bf16, fp16); the device always uses bf16."""
    working_set_mib: int = 256
    """Distinct expert weights cycled through when timing bandwidth (more than the caches hold)."""
    tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    """Token counts of the expert-time sweep."""
    repeats: int = 5
    """Timed repetitions per point (the median is kept)."""
    engine_overheads: bool = True
    """Also measure the engine's software overheads per layer and forward (micro models)."""


class _Clock:
    """perf_counter on the CPU; CUDA events (after a synchronise) on the GPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def time(self, fn, repeats: int, inner: int = 1) -> float:
        import torch

        fn()  # warm-up
        samples = []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(inner):
                    fn()
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b) / 1e3 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - t0) / inner)
        return statistics.median(samples)


def _experts(cfg: CalibrationConfig, device: str, dtype, count: int):
    import torch

    g = torch.Generator().manual_seed(0)
    H, I = cfg.hidden, cfg.expert_ffn
    gate_up = [(torch.randn(2 * I, H, generator=g) * 0.02).to(device=device, dtype=dtype) for _ in range(count)]
    down = [(torch.randn(H, I, generator=g) * 0.02).to(device=device, dtype=dtype) for _ in range(count)]
    return gate_up, down


def measure_experts(cfg: CalibrationConfig, device: str, dtype_name: str) -> dict:
    """Expert time versus tokens on `device`, and the fitted (overhead per op, bandwidth, flops)."""
    import torch
    import torch.nn.functional as F

    from moespac.engine.kernels import expert_ffn

    dtype = getattr(torch, _DTYPES[dtype_name])
    clock = _Clock(device.startswith("cuda"))
    H, I = cfg.hidden, cfg.expert_ffn
    params = 3 * H * I
    nbytes = params * torch.finfo(dtype).bits // 8
    count = int(np.clip(cfg.working_set_mib * 2**20 // nbytes, 2, 64))
    gate_up, down = _experts(cfg, device, dtype, count)
    act = F.silu
    it = iter(range(1 << 62))

    def run(n):
        x = torch.randn(n, H, device=device, dtype=dtype)

        def call():
            e = next(it) % count  # a different expert each call: weights come from memory, not cache
            return expert_ffn(x, gate_up[e], down[e], act)
        return call

    tiny_gu, tiny_dn = torch.zeros(2 * 8, 8, device=device, dtype=dtype), torch.zeros(8, 8, device=device, dtype=dtype)
    x_tiny = torch.zeros(1, 8, device=device, dtype=dtype)
    t_tiny = clock.time(lambda: expert_ffn(x_tiny, tiny_gu, tiny_dn, act), cfg.repeats, inner=50)
    overhead = t_tiny / OPS_PER_EXPERT
    sweep = {n: clock.time(run(n), cfg.repeats, inner=count if n <= 16 else 1) for n in cfg.tokens}
    fixed = OPS_PER_EXPERT * overhead
    flops = max(2 * params * n / max(t - fixed, 1e-9) for n, t in sweep.items())
    # bandwidth from the flat part of the curve (compute under half the time), median against noise
    flat = [t - fixed for n, t in sweep.items() if 2 * params * n / flops <= t / 2] or [sweep[min(sweep)] - fixed]
    bandwidth = nbytes / max(statistics.median(flat), 1e-9)
    predicted = {n: max(nbytes / bandwidth, 2 * params * n / flops) + fixed for n in sweep}
    worst = max(abs(predicted[n] - t) / t for n, t in sweep.items())
    return dict(op_overhead_s=overhead, mem_bandwidth=bandwidth, flops=flops, expert_bytes=nbytes,
                expert_s_by_tokens={int(n): float(t) for n, t in sweep.items()}, fit_max_rel_error=float(worst))


_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}  # sysfs cache sizes: "32768K"


def last_level_cache_bytes() -> int:
    """The CPU's last-level cache in bytes (Linux sysfs), 0 where it cannot be read."""
    best, size = -1, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        value = int(text[:-1]) * _SIZE_UNITS[text[-1]] if text[-1] in _SIZE_UNITS else int(text)
        if level > best:
            best, size = level, value
    return size


def measure_cache_bandwidth(cfg: CalibrationConfig, cache_bytes: int) -> dict:
    """Expert kernels whose weights stay in the last-level cache: small experts (hidden 512, width 256) cycled
    through half of it, fitted as measure_experts fits memory."""
    small = dataclasses.replace(cfg, hidden=512, expert_ffn=256, working_set_mib=max(cache_bytes // 2 // 2**20, 1),
                                tokens=(1, 2, 4, 8, 16))
    return measure_experts(small, "cpu", cfg.dtype)


def measure_link(cfg: CalibrationConfig, cuda: bool, dtype_name: str) -> dict:
    """Latency and bandwidth of copying one expert into a device slot, as the ExpertStore does it."""
    import torch

    dtype = getattr(torch, _DTYPES["bf16" if cuda else dtype_name])
    clock = _Clock(cuda)
    dst_dev = "cuda" if cuda else "cpu"
    H, I = cfg.hidden, cfg.expert_ffn

    def copier(h, i, count):
        src = [(torch.empty(2 * i, h, dtype=dtype), torch.empty(h, i, dtype=dtype)) for _ in range(count)]
        if cuda:
            src = [(a.pin_memory(), b.pin_memory()) for a, b in src]
        dst = (torch.empty(2 * i, h, dtype=dtype, device=dst_dev), torch.empty(h, i, dtype=dtype, device=dst_dev))
        it = iter(range(1 << 62))

        def copy():
            a, b = src[next(it) % count]
            dst[0].copy_(a, non_blocking=cuda)
            dst[1].copy_(b, non_blocking=cuda)
        return copy

    nbytes = 3 * H * I * torch.finfo(dtype).bits // 8
    count = int(np.clip(cfg.working_set_mib * 2**20 // nbytes, 2, 64))
    latency = clock.time(copier(8, 8, 2), cfg.repeats, inner=50)
    t_big = clock.time(copier(H, I, count), cfg.repeats, inner=count)
    return dict(latency_s=latency, bandwidth=nbytes / max(t_big - latency, 1e-9), expert_bytes=nbytes,
                expert_copy_s=t_big)


def measure_cuda_checks(cfg: CalibrationConfig) -> dict:
    """Attention (decode, 4096 keys) and one dense draft layer (Qwen3-4B widths), for the record."""
    import torch
    import torch.nn.functional as F

    clock = _Clock(True)
    q = torch.randn(1, 32, 9, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
    attn = clock.time(lambda: F.scaled_dot_product_attention(q, kv, kv), cfg.repeats, inner=20)
    w_up = torch.randn(2 * 9728, 2560, device="cuda", dtype=torch.bfloat16) * 0.02
    w_dn = torch.randn(2560, 9728, device="cuda", dtype=torch.bfloat16) * 0.02
    w_qkvo = torch.randn(2560 * 2 + 1024 * 2, 2560, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, 2560, device="cuda", dtype=torch.bfloat16)

    def layer():
        F.linear(x, w_qkvo)
        gate, up = F.linear(x, w_up).chunk(2, -1)
        F.linear(F.silu(gate) * up, w_dn)
    return dict(attention_decode_4096_s=attn, draft_layer_qwen3_4b_bf16_s=clock.time(layer, cfg.repeats, inner=20))


def _forward_time(model, tokens: int, repeats: int, cuda: bool, prefix: int = 32, ready=None,
                  last_only: bool = False) -> float:
    """Median time of one forward of `tokens` new tokens after a `prefix`-token KV cache, run the way the
    engine's speculative loop runs it (moespac.engine.kvcache at batch 1: the lean forward where the model has
    one; `last_only` as the draft asks). `ready()` is called once the prefix is in; then come 1 + 10 x repeats
    forwards."""
    import torch

    from moespac.engine.kvcache import CachedModel

    # seeded random ids: a target's tokens then route to different experts, as real tokens do (a repeated id
    # would send every token of the step to the same top-k and hide the per-expert cost)
    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (prefix + tokens,), generator=g).tolist()
    cached = CachedModel(model, 1, lean=True)
    cached.forward([ids[:prefix]])
    if ready is not None:
        ready()

    def step():
        cached.forward([ids[prefix:]], last_only=last_only)
        cached.keep([prefix])
    return _Clock(cuda).time(step, repeats, inner=10)


SPLITS = {"host": 0.0, "device": 1.0, "split": 0.5, "load": 0.125}
"""Cache ratios of the four target runs: every expert on the host, every one on the device, a seeded half each
(these three copy nothing), and LRU on an eighth of the experts, which loads most of what runs on demand."""


def measure_engine_overheads(profile: HardwareProfile, repeats: int, cuda: bool, gamma: int = 8) -> dict:
    """Framework overheads of our eager engine: forwards of the micro models (the engine's architectures,
    random weights) with 1 and 3 layers; the slope is per layer, the intercept per forward. The cost
    model's kernel time for the same shapes (with the hardware just measured) is taken off, so what is
    left is software: dense layers from the draft (1 token); the hybrid MoE layer from the target (gamma + 1
    tokens, 32 experts top-4, sparse like the engine's real layers) run three times by HybridRuntime with a
    seeded split and no copies (SPLITS). With R the per-layer residual of each run, the layer's common part
    is R_host + R_device - R_split, the device call's R_split - R_host and the host call's R_split - R_device
    (each side's call is paid only when it has experts). An on-demand load's software cost (reservation, the
    victim's eviction, the store's copy and its events, the commit) is the fourth run's residual beyond the
    all-device one, per load, less the link's time for its bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.models.micro import draft_config, target_config
    from moespac.models.specs import spec_from_config
    from moespac.numerics import RandomSplit
    from moespac.policy import expert_wall
    from moespac.sim.cost import CostModel

    bare = dataclasses.replace(profile, layer_overhead=0.0, moe_layer_overhead=0.0, forward_overhead=0.0,
                               device_call_overhead=0.0, host_call_overhead=0.0, copy_overhead=0.0)
    device = "cuda" if cuda else "cpu"
    n, prefix = gamma + 1, 32
    draft_s, draft_model_s = {}, {}
    target_s = {m: {} for m in SPLITS}
    target_model_s = {m: {} for m in SPLITS}
    loads = {m: {} for m in SPLITS}
    for layers in (1, 3):
        torch.manual_seed(0)
        dcfg = draft_config(320, num_hidden_layers=layers)
        tcfg = target_config("qwen3_moe", 320, num_hidden_layers=layers, num_experts=32, num_experts_per_tok=4)
        draft = AutoModelForCausalLM.from_config(dcfg).eval().to(device)
        dspec, tspec = spec_from_config(dcfg, "micro-draft"), spec_from_config(tcfg, "micro-target")
        cm = CostModel(bare, tspec, dspec, expert_dtype="fp32")
        draft_s[layers] = _forward_time(draft, 1, repeats, cuda, prefix, last_only=True)
        draft_model_s[layers] = float(cm.draft_forward_s(1, prefix))
        for mode, ratio in SPLITS.items():
            target = AutoModelForCausalLM.from_config(tcfg).eval()
            session = EngineSession(target, None, None, EngineConfig(target="micro", policy="lru", cache_ratio=ratio,
                                                                     copy_mode="sync"), device=device)
            runtime = session.runtime
            if mode != "load":
                runtime.reconfigure(runtime.config, RandomSplit())
            runtime.start_request(gamma=gamma)
            before = {}
            c = runtime.cache.counters
            target_s[mode][layers] = _forward_time(target, n, repeats, cuda, prefix,
                                                   ready=lambda: before.update(host=c.host, hits=c.hits, loads=c.loads))
            if (c.loads != before["loads"]) != (mode == "load"):
                raise RuntimeError(f"calibration split {mode!r}: {c.loads - before['loads']} copies")
            visits = (1 + 10 * repeats) * layers
            host, hits = (c.host - before["host"]) / visits, (c.hits - before["hits"]) / visits  # experts per layer
            loads[mode][layers] = (c.loads - before["loads"]) / visits
            on_device = hits + loads[mode][layers]
            per_expert = n * tspec.top_k / max(host + on_device, 1)
            dev = (on_device * float(cm.device_expert_s(per_expert)) + (cm.device_call_s() if on_device else 0.0)
                   + loads[mode][layers] * cm.load_s())
            off = (host * float(cm.host_expert_s(per_expert))
                   + (cm.host_call_s() + float(cm.hidden_transfer_s(n)) if host else 0.0))
            experts = float(expert_wall(dev, off, bare.device_is_host))
            target_model_s[mode][layers] = (layers * (float(cm.attention_s(n, prefix)) + experts)
                                            + float(cm.other_s(n, prefix)))
            session.close()
            if mode == "host" and layers == 1:
                loop = _loop_time(target, draft, gamma, device)

    layer = (draft_s[3] - draft_s[1] - draft_model_s[3] + draft_model_s[1]) / 2
    forward = draft_s[1] - draft_model_s[1] - layer
    residual = {m: (target_s[m][3] - target_s[m][1] - target_model_s[m][3] + target_model_s[m][1]) / 2 - layer
                for m in SPLITS}
    common = residual["host"] + residual["device"] - residual["split"]
    return dict(layer_overhead=max(layer, 0.0), forward_overhead=max(forward, 0.0), moe_layer_overhead=max(common, 0.0),
                device_call_overhead=max(residual["split"] - residual["host"], 0.0),
                host_call_overhead=max(residual["split"] - residual["device"], 0.0),
                copy_overhead=max((residual["load"] - residual["device"]) / max(loads["load"][3], 1e-9), 0.0),
                loads_per_layer=loads["load"], moe_layer_residual_s=residual,
                draft_token_overhead=max(loop["draft_token_s"] - draft_s[1], 0.0),
                step_overhead=max(loop["target_step_s"] - target_s["host"][1], 0.0), loop=loop,
                draft_forward_s=draft_s, draft_kernels_model_s=draft_model_s, target_forward_s=target_s,
                target_kernels_model_s=target_model_s)


def _loop_time(target, draft, gamma: int, device: str, tokens: int = 96) -> dict:
    """The speculative loop on the 1-layer micro pair (all experts on the host, sampling at temperature 0.8):
    draft phase per drafted token and target phase per step, each with its forwards inside."""
    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.engine.speculative import Sampling

    session = EngineSession(target, draft, None, EngineConfig(target="micro", policy="all-host", cache_ratio=0.0,
                                                              copy_mode="sync"), device=device)
    try:
        prompt = list(range(1, 33))
        sampling = Sampling(temperature=0.8, seed=0)
        session.generate([prompt], gamma=gamma, max_new_tokens=16, sampling=sampling, ignore_eos=True)  # warm-up
        (res,), _ = session.generate([prompt], gamma=gamma, max_new_tokens=tokens, sampling=sampling, ignore_eos=True)
    finally:
        session.close()
    steps = max(res.steps, 1)  # decode steps (the prefill is timed apart)
    return dict(draft_token_s=res.draft_s / (steps * gamma), target_step_s=res.target_s / steps, steps=steps)


def _host_memory_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def calibrate(cfg: CalibrationConfig = CalibrationConfig(), name: str | None = None) -> tuple[HardwareProfile, dict]:
    """Measure this machine; returns (profile, raw measurements)."""
    import platform

    import torch

    cuda = torch.cuda.is_available()
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    host = measure_experts(cfg, "cpu", cfg.dtype)
    link = measure_link(cfg, cuda, cfg.dtype)
    shape = f"expert {cfg.hidden}x{cfg.expert_ffn}"
    how = f"moespac calibrate, expert_ffn on {threads} CPU threads ({cpu}), {shape}, {cfg.dtype}"
    src = {
        "host_mem_bandwidth": f"measured: {how}, 1 token, {cfg.working_set_mib} MiB of experts cycled",
        "host_flops": f"measured: {how}, best of the token sweep",
        "host_op_overhead": f"measured: {how}, 8x8 expert / {OPS_PER_EXPERT} operators",
    }
    measurements = {"host_expert": host, "link": link, "torch": str(torch.__version__), "cpu_threads": threads}
    cache_bytes = last_level_cache_bytes()
    cache = {}
    if cache_bytes:
        cached = measure_cache_bandwidth(cfg, cache_bytes)
        cache = dict(host_cache_bytes=float(cache_bytes), host_cache_bandwidth=cached["mem_bandwidth"])
        src.update(host_cache_bytes="/sys/devices/system/cpu/cpu0/cache: the highest level's size",
                   host_cache_bandwidth=f"measured: {how.replace(shape, 'expert 512x256')}, 1 token, experts cycled "
                                        "through half of the last-level cache")
        measurements["host_cache_expert"] = cached
    if cuda:
        props = torch.cuda.get_device_properties(0)
        dev = measure_experts(cfg, "cuda", "bf16")
        dhow = f"moespac calibrate, expert_ffn on {props.name}, {shape}, bf16"
        values = dict(device_mem_bandwidth=dev["mem_bandwidth"], device_flops=dev["flops"],
                      device_memory=float(props.total_memory), launch_overhead=dev["op_overhead_s"])
        src.update(device_mem_bandwidth=f"measured: {dhow}, 1 token",
                   device_flops=f"measured: {dhow}, best of the sweep",
                   device_memory="torch.cuda.get_device_properties(0).total_memory",
                   launch_overhead=f"measured: {dhow}, 8x8 expert / {OPS_PER_EXPERT} kernels",
                   link_bandwidth="measured: pinned host -> device copy of one bf16 expert (gate_up + down), cycled",
                   link_latency="measured: pinned host -> device copy of an 8x8 expert")
        measurements.update(device_expert=dev, checks=measure_cuda_checks(cfg), gpu=props.name)
        notes = f"Calibrated on {props.name} with {threads} CPU threads ({cpu})."
    else:
        values = dict(device_mem_bandwidth=host["mem_bandwidth"], device_flops=host["flops"],
                      device_memory=_host_memory_bytes(), launch_overhead=host["op_overhead_s"])
        same = "CPU-only machine: the device is the host CPU, value equals the host's"
        src.update(device_mem_bandwidth=f"{same} (host_mem_bandwidth)", device_flops=f"{same} (host_flops)",
                   device_memory="CPU-only machine: host RAM (sysconf SC_PHYS_PAGES x SC_PAGE_SIZE)",
                   launch_overhead=f"{same} (host_op_overhead)",
                   link_bandwidth=f"measured: memcpy of one {cfg.dtype} expert into a slot buffer "
                                  "(the CPU ExpertStore copy)",
                   link_latency="measured: memcpy of an 8x8 expert (two copy_ calls)")
        notes = (f"Calibrated on a CPU-only machine ({cpu}, {threads} threads): the 'device' parameters equal the "
                 "host's and the link is a memcpy; device and host expert work run one after the other.")
    profile = HardwareProfile(
        name=name or f"calibrated-{platform.node() or 'local'}", link_bandwidth=link["bandwidth"],
        link_latency=link["latency_s"], host_mem_bandwidth=host["mem_bandwidth"], host_flops=host["flops"],
        host_op_overhead=host["op_overhead_s"], device_is_host=not cuda, notes=notes, sources=src, **values, **cache)
    if cfg.engine_overheads:
        eng = measure_engine_overheads(profile, cfg.repeats, cuda)
        micro = "micro models (moespac.models.micro) with 1 and 3 layers, minus the cost model's kernel time"
        splits = "HybridRuntime MoE layer run all-host, all-device and half-half"
        src.update(layer_overhead=f"measured: dense decoder layer of the {micro}",
                   moe_layer_overhead=f"measured: {splits} (no copies) of the {micro}, minus layer_overhead: the part "
                                      "all three share",
                   device_call_overhead=f"measured: {splits}: the half-half layer minus the all-host one",
                   host_call_overhead=f"measured: {splits}: the half-half layer minus the all-device one",
                   copy_overhead=f"measured: {splits} and run by LRU on an eighth of the experts (loads on demand): "
                                 "the last one's residual beyond the all-device one, per load, minus the link's time",
                   draft_token_overhead="measured: the engine's speculative loop on the 1-layer micro pair (gamma 8, "
                                        "temperature 0.8), draft phase per drafted token minus one draft forward",
                   step_overhead="measured: the same loop, target phase per step minus one target forward",
                   forward_overhead="measured: one-token forward of the micro draft, minus its layers and kernels")
        profile = dataclasses.replace(profile, sources=src, **{k: eng[k] for k in (
            "layer_overhead", "moe_layer_overhead", "forward_overhead", "device_call_overhead", "host_call_overhead",
            "copy_overhead", "draft_token_overhead", "step_overhead")})
        measurements["engine"] = eng
    return profile, _plain(measurements)


def _plain(x):
    """numpy / torch scalars -> plain Python, for YAML."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.generic,)):
        return x.item()
    return x
