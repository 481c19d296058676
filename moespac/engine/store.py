"""Expert weights: host copies of every routed expert, and a device slot pool the cache fills.

On CUDA the host copies are pinned and copies run on their own stream; a copy waits for the compute
that may still read the slot (an event recorded after each layer), and the caller learns completion
from an event. On a CPU-only machine the "device" pool is a second host buffer and a copy is a memcpy.

transfer_scale < 1 (Fate's lossy variant: policy.transfer_scale = 0.25) copies experts as INT4: every
weight row (output channel) is quantised symmetrically to 4 bits once on the host, two values a byte, and
dequantised into the slot on arrival, so device-resident experts are genuinely lossy (host ones are not).
"""

from __future__ import annotations

import torch

from moespac.errors import MoespacError


def int4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric 4-bit [rows, cols] -> (uint8 codes, two a byte, row-major; float32 scales [rows, 1])."""
    scale = w.abs().amax(dim=-1, keepdim=True).float() / 7
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((w.float() / scale).round().clamp(-8, 7) + 8).to(torch.uint8).flatten()
    q = torch.cat([q, q.new_zeros(q.numel() % 2)])
    return q[0::2] | (q[1::2] << 4), scale


def int4_unpack(packed: torch.Tensor, scale: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of int4_pack: float32 [rows, cols] = code x row scale."""
    q = torch.stack([packed & 15, packed >> 4], dim=-1).flatten()[:shape[0] * shape[1]]
    return (q.float() - 8).view(shape) * scale


class ExpertStore:
    def __init__(self, experts: list, capacity: int, device: torch.device, transfer_scale: float = 1.0):
        m0 = experts[0]
        for i, m in enumerate(experts):
            if getattr(m, "has_bias", False) or getattr(m, "is_transposed", False) or not getattr(m, "has_gate", True) \
                    or not getattr(m, "is_concatenated", True):
                raise MoespacError(f"MoE layer {i} ({type(m).__name__}): unsupported experts layout "
                                   "(needs fused gate_up_proj [E, 2I, H] and down_proj [E, H, I], no bias)")
            if m.gate_up_proj.shape != m0.gate_up_proj.shape or m.down_proj.shape != m0.down_proj.shape:
                raise MoespacError(f"MoE layer {i}: expert shapes differ across layers; not supported")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = m0.gate_up_proj.dtype
        # Host copies stay where transformers loaded them on CPU; pinned on CUDA for async copies
        self.host_gate_up = [self._host(m.gate_up_proj.data) for m in experts]
        self.host_down = [self._host(m.down_proj.data) for m in experts]
        _, two_i, h = m0.gate_up_proj.shape
        self.slot_gate_up = torch.empty((capacity, two_i, h), dtype=self.dtype, device=self.device)
        self.slot_down = torch.empty((capacity, h, two_i // 2), dtype=self.dtype, device=self.device)
        self.expert_bytes = (two_i * h + h * two_i // 2) * self.slot_gate_up.element_size()
        self.int4 = transfer_scale < 1.0
        if self.int4 and transfer_scale != 0.25:
            raise MoespacError(f"transfer_scale {transfer_scale}: the engine's compressed copies are INT4 only (0.25)")
        self.copy_bytes = round(self.expert_bytes * transfer_scale)  # what one copy counts, as the simulator does
        if self.int4:  # quantised once, as Fate keeps the INT4 versions on the host
            self.int4_gate_up = [[tuple(map(self._host, int4_pack(w))) for w in t] for t in self.host_gate_up]
            self.int4_down = [[tuple(map(self._host, int4_pack(w))) for w in t] for t in self.host_down]
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._compute_done = None  # event after the latest layer's device compute

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to("cpu")
        return t.pin_memory() if self.cuda else t

    def mark_compute(self) -> None:
        """Record that device compute issued so far may read slots (copies into slots wait for it)."""
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._compute_done = ev

    def copy_in(self, layer: int, expert: int, slot: int, wait: bool = True):
        """Copy (layer, expert) into `slot`. Returns a CUDA event (None on CPU); `wait` blocks until done."""
        if not self.cuda:
            self._fill(layer, expert, slot)
            return None
        with torch.cuda.stream(self.copy_stream):
            if self._compute_done is not None:
                self.copy_stream.wait_event(self._compute_done)
            self._fill(layer, expert, slot)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        if wait:
            done.synchronize()
        return done

    def _fill(self, layer: int, expert: int, slot: int) -> None:
        """Issue the copies of (layer, expert) into `slot` on the current stream."""
        nb = self.cuda
        if not self.int4:
            self.slot_gate_up[slot].copy_(self.host_gate_up[layer][expert], non_blocking=nb)
            self.slot_down[slot].copy_(self.host_down[layer][expert], non_blocking=nb)
            return
        for dst, (codes, scale) in ((self.slot_gate_up[slot], self.int4_gate_up[layer][expert]),
                                    (self.slot_down[slot], self.int4_down[layer][expert])):
            codes, scale = codes.to(self.device, non_blocking=nb), scale.to(self.device, non_blocking=nb)
            dst.copy_(int4_unpack(codes, scale, dst.shape))
