"""The CUDA runtime's side of the fake device (`fake_device.FakeApi`): memory at fake 64-bit
addresses, where a pointer outside every allocation raises, and streams, events and graphs, where
synchronous calls during a capture fail as they do on CUDA.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kn_cuda_eval.planning.view import StridedView

BASE = 0x9000_0000_0000_0000  # non-canonical on x86-64: never a host address
GUARD = 1 << 20


class FakeCudaError(RuntimeError):
    pass


LEGACY_STREAM = 0  # CuPy's current stream unless one is made current: the legacy stream


class FakeDevice(Protocol):
    """What the streams and the library fakes read of the device (`FakeApi`): a protocol, so that
    the device can build them without their modules importing the device's."""

    mem: Memory
    fail_capture: bool
    captures: int
    graph_launches: int

    def stream_by_ptr(self, ptr: int) -> FakeStream: ...

    def block_of(self, ptr: int) -> tuple[np.ndarray, int]: ...


# -- memory ----------------------------------------------------------------------------------------
class Memory:
    """Device allocations at fake addresses, 1 MiB apart."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.blocks: list[np.ndarray] = []
        self.next = BASE

    def alloc(self, n: int) -> int:
        start = self.next
        self.starts.append(start)
        self.blocks.append(np.zeros(max(n, 1), np.uint8))
        self.next = (start + max(n, 1) + GUARD + 255) // 256 * 256
        return start

    def find(self, ptr: int, n: int) -> tuple[np.ndarray, int]:
        """The block holding [ptr, ptr + n) and ptr's offset in it."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i < 0:
            raise FakeCudaError(f"illegal address {ptr:#x}")
        off = ptr - self.starts[i]
        block = self.blocks[i]
        if off + n > block.size:
            raise FakeCudaError(f"access [{ptr:#x}, +{n}) outside its allocation of {block.size} B")
        return block, off

    def bytes(self, ptr: int, n: int) -> np.ndarray:
        block, off = self.find(ptr, n)
        return block[off : off + n]

    def is_device(self, ptr: int) -> bool:
        return ptr >= BASE


def _nd(block: np.ndarray, v: StridedView) -> np.ndarray:
    from kn_cuda_eval.planning.emulator import _nd as nd

    return nd(block, v)


# -- streams, events, graphs --------------------------------------------------------------------------
@dataclass
class FakeGraph:
    ops: list[Callable[[], None]]
    uploaded: bool = False

    def upload(self, stream: FakeStream) -> None:
        self.uploaded = True

    def launch(self, stream: FakeStream) -> None:
        stream.api.graph_launches += 1
        for op in self.ops:
            stream.submit(op, cost=0.0005)


@dataclass(eq=False)
class FakeStream:
    api: FakeDevice
    ptr: int
    capturing: list[Callable[[], None]] | None = None
    clock: float = 0.0
    waits: int = 0
    pending: int = 0
    """Operations submitted since the last synchronize (work the host has not waited for)."""

    def submit(self, op: Callable[[], None], cost: float = 0.001) -> None:
        if self.capturing is not None:
            self.capturing.append(op)
        else:
            op()
            self.clock += cost
            self.pending += 1

    def synchronize(self) -> None:
        if self.capturing is not None:
            raise FakeCudaError("cudaErrorStreamCaptureUnsupported: synchronize while capturing")
        self.pending = 0

    def wait_event(self, event: FakeEvent) -> None:
        self.waits += 1

    def begin_capture(self) -> None:
        if self.api.fail_capture:
            raise FakeCudaError("cudaErrorStreamCaptureUnsupported (injected)")
        self.capturing = []

    def end_capture(self) -> FakeGraph:
        if self.capturing is None:
            raise FakeCudaError("cudaErrorIllegalState: not capturing")
        ops, self.capturing = self.capturing, None
        self.api.captures += 1
        return FakeGraph(ops)


@dataclass
class FakeEvent:
    time: float | None = None

    def record(self, stream: FakeStream) -> None:
        if stream.capturing is not None:
            raise FakeCudaError("event record while capturing is not part of this executor")
        self.time = stream.clock

    def synchronize(self) -> None:
        pass
