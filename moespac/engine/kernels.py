"""Routed-expert math as transformers' experts classes define it, over any stack of expert weights.

`ExpertLayout` reads once how a transformers experts module computes; `grouped_experts` then runs rows sorted
by group through any stack of weights with those names: the host store (group = expert id) or the device slot
pool (group = slot). A group's rows are computed by the same call wherever they run, so the device/host split
never changes the numbers on a CPU.

Details: docs/internals.md#moespacenginekernelspy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from moespac.errors import MoespacError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CPU_SPARSE_LOOP = True
"""On a CPU, run a sparse call (more than 2 groups per active one) one group at a time (see grouped_experts)."""


@dataclass(frozen=True)
class ExpertLayout:
    """Which tensors hold one layer's routed experts, and how they compute."""

    names: tuple[str, ...]
    """Expert tensors (leading dim = experts): the up projection, down_proj, then their biases if any."""
    has_gate: bool
    has_bias: bool
    is_transposed: bool
    has_post_expert_norm: bool

    @property
    def up(self) -> str:
        return self.names[0]

    @classmethod
    def of(cls, module, where: str) -> "ExpertLayout":
        """The layout of a transformers experts module; a layout the engine cannot run fails naming why."""
        has_gate = bool(getattr(module, "has_gate", True))
        has_bias = bool(getattr(module, "has_bias", False))
        up = "gate_up_proj" if has_gate else "up_proj"
        names = (up, "down_proj") + ((f"{up}_bias", "down_proj_bias") if has_bias else ())
        experts = None
        for name in names:
            t = getattr(module, name, None)
            if not isinstance(t, torch.Tensor):
                raise MoespacError(f"{where} ({type(module).__name__}): no expert tensor {name!r}; "
                                   "unsupported experts layout")
            if t.dtype not in FLOAT_DTYPES:
                raise MoespacError(f"{where} ({type(module).__name__}): expert tensor {name!r} is {t.dtype} "
                                   "(quantized experts are not supported; load the model dequantized, "
                                   "e.g. --dtype bf16)")
            if experts is not None and t.shape[0] != experts:
                raise MoespacError(f"{where}: expert tensors disagree on the number of experts")
            experts = t.shape[0]
        if has_gate and not hasattr(module, "_apply_gate"):
            raise MoespacError(f"{where} ({type(module).__name__}): gated experts without _apply_gate "
                               "(transformers older than the supported range?)")
        return cls(names, has_gate, has_bias, bool(getattr(module, "is_transposed", False)),
                   bool(getattr(module, "has_post_expert_norm", False)))


def grouped_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch's F.grouped_mm (public since 2.10; never fp64) takes the engine's inputs here.

    CUDA, checked against torch 2.11 and 2.13 (their F.grouped_mm and _grouped_mm_cuda are the same): every
    compute capability from 8.0 runs it (bf16 on sm90/sm100 in one kernel, the rest as a per-group loop inside
    torch), with strides of 16-byte multiples, which the experts' widths (multiples of 8) give. CPU: 2.10-2.12
    refuse strides that are not 16-byte multiples, so before 2.13 the host takes the engine's own per-group
    loop, which every version runs."""
    if not hasattr(F, "grouped_mm") or dtype == torch.float64:
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu" and _torch_version() >= (2, 13)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _linear(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor | None, counts: np.ndarray,
            transposed: bool) -> torch.Tensor:
    """Rows x [S, in] sorted by group through w [G, out, in] (or [G, in, out] when transposed)."""
    if offsets is not None:
        return F.grouped_mm(x, w if transposed else w.transpose(-2, -1), offs=offsets)
    parts, start = [], 0
    for g in np.flatnonzero(counts):
        n = int(counts[g])
        rows = x[start:start + n]
        parts.append(rows @ w[g] if transposed else F.linear(rows, w[g]))
        start += n
    return torch.cat(parts) if parts else x.new_zeros((0, w.shape[-1] if transposed else w.shape[-2]))


def _plain_to_device(name: str, array: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(array).to(device, non_blocking=True)


def grouped_experts(module, layout: ExpertLayout, x: torch.Tensor, weights: dict, counts: np.ndarray,
                    grouped: bool, to_device=None) -> torch.Tensor:
    """Expert outputs for rows x [S, H], sorted by group, counts[g] rows of group g (g indexes the leading dim
    of every tensor in `weights`). transformers' semantics: up (+ bias), gate or activation, down (+ bias),
    post-expert norm. No routing weight is applied here. `to_device(name, array)` moves the small index
    arrays (the engine's goes through pinned buffers, so the copy never blocks the host)."""
    if not len(x):
        return x.new_zeros((0, x.shape[-1]))
    if grouped:
        # only the span of groups that have rows goes to the kernel (a view, no copy): a layer's slots sit
        # together in the pool more often than not, and the groups outside the span need no walking
        used = np.flatnonzero(counts)
        lo, hi = int(used[0]), int(used[-1]) + 1
        weights, counts = {n: w[lo:hi] for n, w in weights.items()}, counts[lo:hi]
        if CPU_SPARSE_LOOP and x.device.type == "cpu" and len(counts) > 2 * len(used):
            # torch's CPU grouped matmul costs about 2 us a group, empty ones too, where a loop pays about 5 us
            # an active group (proxy shapes, measured): a sparse span (a layer's 128 experts of which 8 run) is
            # faster one group at a time, and the numbers are the same (on a CPU each group is the same matmul
            # either way, bit for bit)
            grouped = False
    move = to_device or (lambda name, a: _plain_to_device(name, a, x.device))
    offsets, group_of_row = None, None
    if grouped:
        offsets = move("offsets", np.cumsum(counts, dtype=np.int32))
    if layout.has_bias:
        group_of_row = move("groups", np.repeat(np.arange(len(counts)), counts))
    h = _linear(x, weights[layout.up], offsets, counts, layout.is_transposed)
    if layout.has_bias:
        h = h + weights[layout.names[2]][group_of_row]
    h = module._apply_gate(h) if layout.has_gate else module.act_fn(h)
    y = _linear(h, weights["down_proj"], offsets, counts, layout.is_transposed)
    if layout.has_bias:
        y = y + weights[layout.names[3]][group_of_row]
    if layout.has_post_expert_norm:
        y = module.post_expert_norm(y)
    return y


def expert_ffn(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act_fn) -> torch.Tensor:
    """One gated expert (concatenated layout, no bias) on its tokens: down(act(gate(x)) * up(x)); the unit the
    calibration times. x [n, H]; gate_up [2I, H]; down [H, I]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act_fn(gate) * up, down)
