"""Expert weights out of the model: host copies of every routed expert, and the device slot pool.

`ExpertStore(experts, capacity, device)` moves the routed expert tensors into one exactly sized host block per
layer (page-locked on CUDA), so the host never holds two full copies; `restore()` puts them back. A copy into a
slot runs on the copy stream with no host wait. transfer_scale < 1 (Fate's INT4 row) copies experts as INT4,
dequantised into the slot on arrival.

Details: docs/internals.md#moespacenginestorepy.
"""

from __future__ import annotations

import torch

from moespac.engine.device import COPY, NO_EVENT, Device, Event
from moespac.engine.kernels import ExpertLayout
from moespac.errors import MoespacError

INT4_MAX_SCALE = 0.3  # 4 bits a weight plus per-group scales: what an INT4 copy can weigh against 16 bits
ALIGN = 256  # bytes: each tensor of a host block starts on a boundary that every matmul kernel accepts


def int4_pack(w: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 4-bit [..., rows, cols] -> (uint8 codes [..., ceil(rows * cols / 2)], two a byte, row-major per
    matrix; float32 scales [..., rows, groups, 1]): one scale per `group` consecutive columns of a row (None, or
    a group that does not divide the row: one per row, Fate's copies; 128: GPTQ's usual group size, MoE-SpeQ's
    draft experts). Leading dims are independent matrices (a layer's experts at once)."""
    *lead, rows, cols = w.shape
    g = group if group and cols % group == 0 else cols
    x = w.float().reshape(*lead, rows, cols // g, g)
    scale = x.abs().amax(dim=-1, keepdim=True) / 7
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((x / scale).round().clamp(-8, 7) + 8).to(torch.uint8).reshape(*lead, rows * cols)
    if (rows * cols) % 2:
        q = torch.cat([q, q.new_zeros(*lead, 1)], dim=-1)
    return q[..., 0::2] | (q[..., 1::2] << 4), scale


def int4_unpack(packed: torch.Tensor, scale: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of int4_pack: float32 [..., rows, cols] = code x its group's scale (`shape`: rows, cols last)."""
    rows, cols = shape[-2:]
    lead = packed.shape[:-1]
    q = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)[..., :rows * cols]
    return ((q.float() - 8).view(*lead, rows, scale.shape[-2], -1) * scale).view(*lead, rows, cols)


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class ExpertStore:
    def __init__(self, experts: list, capacity: int, device: Device, transfer_scale: float = 1.0):
        self.layouts = [ExpertLayout.of(m, f"MoE layer {i}") for i, m in enumerate(experts)]
        self.layout = self.layouts[0]
        m0 = experts[0]
        shapes = {n: tuple(getattr(m0, n).shape) for n in self.layout.names}
        for i, (m, lay) in enumerate(zip(experts, self.layouts)):
            if lay != self.layout or any(tuple(getattr(m, n).shape) != s for n, s in shapes.items()):
                raise MoespacError(f"MoE layer {i}: expert shapes or layout differ from layer 0's; not supported")
        self.device = device
        self.experts = experts
        self.dtype = getattr(m0, self.layout.up).dtype
        self.num_experts = shapes[self.layout.up][0]
        self.expert_bytes = (sum(torch.Size(s[1:]).numel() for s in shapes.values())
                             * getattr(m0, self.layout.up).element_size())
        self.int4 = transfer_scale < 1.0
        if self.int4 and not 0.25 <= transfer_scale <= INT4_MAX_SCALE:
            raise MoespacError(f"transfer_scale {transfer_scale}: the engine's compressed copies are INT4 only "
                               f"(0.25 to {INT4_MAX_SCALE} of an expert's bytes, scales included)")
        self.copy_bytes = round(self.expert_bytes * transfer_scale)  # what one copy counts, as the simulator does
        self._taken: list[tuple] = []  # (module, name, device the tensor came from)
        self._blocks: list[torch.Tensor] = []
        self.host: list[dict[str, torch.Tensor]] = [self._take(m) for m in experts]
        self.host_bytes = sum(b.numel() for b in self._blocks)
        self.shapes = {n: torch.Size(s) for n, s in shapes.items()}
        if self.int4:  # quantised once, as Fate keeps the INT4 versions on the host (weights only; biases exact)
            self.int4_host = [{n: [int4_pack(w) for w in layer[n]] for n in self.layout.names[:2]}
                              for layer in self.host]
        self.capacity = -1
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        """A slot pool of `capacity` experts (the caller has waited for everything that used the old one)."""
        if capacity != self.capacity:
            self.slots = {}  # the old pool goes before the new one is allocated
            self.slots = {n: torch.empty((capacity, *s[1:]), dtype=self.dtype, device=self.device.torch_device)
                          for n, s in self.shapes.items()}
        self.capacity = capacity
        self.ready: list[Event] = [NO_EVENT] * capacity  # copy that filled the slot
        self.read_done: list[Event] = [NO_EVENT] * capacity  # latest compute that read the slot

    # -- taking the experts out of the model, and giving them back -------------------------------------
    def _take(self, module) -> dict[str, torch.Tensor]:
        """One layer's expert tensors into one host block; the module keeps empty placeholders."""
        tensors = {n: getattr(module, n) for n in self.layout.names}
        offsets, total = {}, 0
        for n, t in tensors.items():
            offsets[n] = total
            total += _round_up(t.numel() * t.element_size())
        block = self.device.host_block(total)
        self._blocks.append(block)
        views = {}
        for n, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            view = block[offsets[n]:offsets[n] + nbytes].view(t.dtype).view(t.shape)
            view.copy_(t.detach())
            views[n] = view
            self._taken.append((module, n, t.device))
            setattr(module, n, torch.nn.Parameter(torch.empty(0, dtype=t.dtype, device=t.device), requires_grad=False))
        return views

    def restore(self) -> None:
        """Put every expert tensor back into its module, on the device it came from."""
        by_module = {id(m): layer for layer, m in enumerate(self.experts)}
        for module, name, device in self._taken:
            t = self.host[by_module[id(module)]][name]
            setattr(module, name, torch.nn.Parameter(t.to(device) if device.type != "cpu" else t, requires_grad=False))
        self._taken = []
        for block in self._blocks:
            self.device.release_host_block(block)
        self._blocks = []

    # -- copies ----------------------------------------------------------------------------------------
    def copy_in(self, layer: int, expert: int, slot: int) -> Event:
        """Issue the copy of (layer, expert) into `slot` on the copy stream; returns (and keeps) its ready event."""
        dev = self.device
        with dev.on_copy_stream():
            dev.wait(COPY, self.read_done[slot])
            if not self.int4:
                pairs = [(self.slots[n][slot], self.host[layer][n][expert]) for n in self.layout.names]
            else:
                pairs = [(self.slots[n][slot], self.host[layer][n][expert]) for n in self.layout.names[2:]]
                for n in self.layout.names[:2]:
                    codes, scale = self.int4_host[layer][n][expert]
                    dst = self.slots[n][slot]
                    codes, scale = codes.to(dev.torch_device, non_blocking=dev.cuda), scale.to(dev.torch_device)
                    pairs.append((dst, int4_unpack(codes, scale, dst.shape)))
            dev.copy_into_slot(slot, (layer, expert), pairs)
            ready = self.ready[slot] = dev.record(COPY)
        return ready
