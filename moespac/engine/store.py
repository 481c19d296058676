"""Expert weights: host copies of every routed expert, and a device slot pool the cache fills.

On CUDA the host copies are pinned and copies run on their own stream; a copy waits for the compute
that may still read the slot (an event recorded after each layer), and the caller learns completion
from an event. On a CPU-only machine the "device" pool is a second host buffer and a copy is a memcpy.
"""

from __future__ import annotations

import torch

from moespac.errors import MoespacError


class ExpertStore:
    def __init__(self, experts: list, capacity: int, device: torch.device):
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
            self.slot_gate_up[slot].copy_(self.host_gate_up[layer][expert])
            self.slot_down[slot].copy_(self.host_down[layer][expert])
            return None
        with torch.cuda.stream(self.copy_stream):
            if self._compute_done is not None:
                self.copy_stream.wait_event(self._compute_done)
            self.slot_gate_up[slot].copy_(self.host_gate_up[layer][expert], non_blocking=True)
            self.slot_down[slot].copy_(self.host_down[layer][expert], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        if wait:
            done.synchronize()
        return done
