"""The few device primitives the engine uses, behind one interface, so that a CPU runs the path a GPU runs.

Two streams (COMPUTE and COPY), events, stream and host waits, and exactly sized pinned host blocks: torch.cuda
on CUDA, a stand-in with the same semantics on a CPU. Both drive one OrderChecker, which follows slot copies and
slot reads with vector clocks, so a missing wait is caught on a CPU too.

Details: docs/internals.md#moespacenginedevicepy.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from moespac.errors import MoespacError

COMPUTE, COPY = "compute", "copy"
STREAMS = (COMPUTE, COPY)


@dataclass(frozen=True)
class Event:
    """A point in one stream: every operation issued there before it has completed once the event has."""

    stream: str
    value: int
    """Operations issued on `stream` before the event was recorded."""
    handle: object = None
    """The torch.cuda.Event on a GPU; None on the CPU stand-in."""


NO_EVENT = Event(COMPUTE, 0)


class OrderViolation(AssertionError):
    """A slot could be read before its copy completed, or overwritten while a read of it may be in flight."""


class OrderChecker:
    """Vector clocks over the two streams; every copy into a slot and every slot read is checked against them."""

    def __init__(self, keep_log: bool = False, strict: bool = True):
        self._lock = threading.Lock()
        self.issued = dict.fromkeys(STREAMS, 0)
        self.known = {s: dict.fromkeys(STREAMS, 0) for s in STREAMS}  # per stream: ops of each stream it follows
        self.filled: dict[int, tuple[int, object]] = {}  # slot -> (copy op, key copied)
        self.last_read: dict[int, int] = {}  # slot -> compute op of its latest read
        self.violations: list[str] = []
        self.log: list[tuple] | None = [] if keep_log else None
        self.strict = strict
        self.copies = self.reads = 0

    def _fail(self, message: str) -> None:
        self.violations.append(message)
        if self.strict:
            raise OrderViolation(message)

    def record(self, stream: str) -> int:
        with self._lock:
            return self.issued[stream]

    def wait(self, stream: str, event: Event) -> None:
        """`stream` waits for `event`: its later operations follow everything before the event."""
        with self._lock:
            k = self.known[stream]
            k[event.stream] = max(k[event.stream], event.value)

    def host_wait(self, event: Event) -> None:
        """The host waited for `event`: whatever it issues afterwards, on any stream, follows it."""
        with self._lock:
            for k in self.known.values():
                k[event.stream] = max(k[event.stream], event.value)
            if self.log is not None:
                self.log.append(("host_wait", event.stream, event.value))

    def copy(self, slot: int, key) -> None:
        """A copy of `key` into `slot`, issued on the copy stream."""
        with self._lock:
            op = self.issued[COPY] = self.issued[COPY] + 1
            self.copies += 1
            read = self.last_read.get(slot, 0)
            if self.known[COPY][COMPUTE] < read:
                self._fail(f"copy of {key} into slot {slot} is not ordered after compute op {read}, which reads "
                           f"that slot (it may overwrite the slot while the read is in flight)")
            self.filled[slot] = (op, key)
            if self.log is not None:
                self.log.append(("copy", op, slot, key))

    def read(self, slots_keys) -> None:
        """One compute operation reading these (slot, key) pairs."""
        with self._lock:
            op = self.issued[COMPUTE] = self.issued[COMPUTE] + 1
            for slot, key in slots_keys:
                self.reads += 1
                done, held = self.filled.get(slot, (None, None))
                if held != key:
                    self._fail(f"compute op {op} reads slot {slot} for {key}, but the last copy into it was {held}")
                elif self.known[COMPUTE][COPY] < done:
                    self._fail(f"compute op {op} reads {key} from slot {slot} before its copy (copy op {done}) is "
                               f"known to have completed")
                self.last_read[slot] = op
            if self.log is not None:
                self.log.append(("read", op, tuple(slots_keys)))


class Device:
    """Streams, events, waits and pinned host blocks of one torch device, checked by an OrderChecker."""

    def __init__(self, device: str | torch.device, checker: OrderChecker | None = None):
        self.torch_device = torch.device(device)
        self.cuda = self.torch_device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise MoespacError(f"device {device}: CUDA is not available on this machine")
        self.checker = checker or OrderChecker()
        self._copy_stream = torch.cuda.Stream(self.torch_device) if self.cuda else None
        self._registered: dict[int, int] = {}  # data_ptr -> bytes of host blocks registered with CUDA
        self.syncs = 0  # host-device synchronisations: routing reads and host waits

    def __repr__(self):
        return f"Device({self.torch_device}, {'cuda' if self.cuda else 'cpu stand-in'})"

    # -- streams and events ------------------------------------------------------------------------
    def _torch_stream(self, stream: str):
        return self._copy_stream if stream == COPY else torch.cuda.current_stream(self.torch_device)

    @contextmanager
    def on_copy_stream(self):
        """Operations issued inside run on the copy stream (on a CPU: at once, in the calling thread)."""
        with torch.cuda.stream(self._copy_stream) if self.cuda else nullcontext():
            yield

    def record(self, stream: str) -> Event:
        handle = None
        if self.cuda:
            handle = torch.cuda.Event()
            handle.record(self._torch_stream(stream))
        return Event(stream, self.checker.record(stream), handle)

    def wait(self, stream: str, event: Event) -> None:
        """`stream` waits (on the device, the host goes on) until `event` has completed."""
        if event.value == 0:  # nothing was issued before it
            return
        if self.cuda and event.handle is not None:
            self._torch_stream(stream).wait_event(event.handle)
        self.checker.wait(stream, event)

    def host_wait(self, event: Event) -> None:
        """The host blocks until `event` has completed (a synchronisation, counted on both kinds of device)."""
        self.syncs += 1
        if self.cuda and event.handle is not None:
            event.handle.synchronize()
        self.checker.host_wait(event)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor read on the host: a host-device synchronisation on a GPU, counted on both."""
        self.syncs += 1
        return t.to("cpu") if self.cuda else t

    def synchronize(self) -> None:
        """The host waits for everything issued on both streams."""
        for stream in STREAMS:
            self.host_wait(self.record(stream))

    # -- slots ---------------------------------------------------------------------------------------
    def copy_into_slot(self, slot: int, key, pairs) -> None:
        """Issue copies src -> dst (a slot's tensors) on the current (copy) stream, checked as one copy of `key`."""
        self.checker.copy(slot, key)
        for dst, src in pairs:
            dst.copy_(src, non_blocking=self.cuda)

    def read_slots(self, slots_keys) -> None:
        """Compute is about to read these (slot, key) pairs (checked against the copies that filled them)."""
        self.checker.read(slots_keys)

    # -- host memory ---------------------------------------------------------------------------------
    def host_block(self, nbytes: int) -> torch.Tensor:
        """A uint8 host tensor of exactly `nbytes`, page-locked on CUDA (registered in place: torch's pinned
        allocator rounds every block up to a power of two, 0.75 GiB -> 1 GiB per layer of Qwen3-30B-A3B)."""
        block = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        if self.cuda and nbytes:
            err = torch.cuda.cudart().cudaHostRegister(block.data_ptr(), block.numel(), 0)
            if int(getattr(err, "value", err)) != 0:
                raise MoespacError(f"cudaHostRegister of {nbytes / 2**30:.2f} GiB failed (error {err}): the host "
                                   "cannot page-lock that much memory; lower the expert store or raise the limit")
            self._registered[block.data_ptr()] = block.numel()
        return block

    def release_host_block(self, block: torch.Tensor) -> None:
        """Unregister a block (it stays valid as ordinary memory for whatever still views it)."""
        if self._registered.pop(block.data_ptr(), None) is not None:
            torch.cuda.cudart().cudaHostUnregister(block.data_ptr())
