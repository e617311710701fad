"""Memory planning: buffers with live ranges over steps, packed into one arena by a
lifetime-aware best-fit packer (any freed region can be reused by any size, 256-byte aligned).

The arena is laid out as [constants | status word | workspace]. Only the workspace is packed;
its lower bound is the largest sum of simultaneously live buffer sizes over all steps.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ALIGN", "Buffer", "BufferKind", "MemoryReport", "align", "lower_bound", "pack"]

ALIGN = 256
"""Byte alignment of every buffer (cuBLAS, cuDNN and vector loads like 16; 256 is what
cudaMalloc gives)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class BufferKind(enum.Enum):
    INPUT = "input"
    CONST = "const"
    TEMP = "temp"
    STATUS = "status"


@dataclass(frozen=True, slots=True)
class Buffer:
    """A region of the arena; `first`/`last` are the step positions where it is first written and
    last read (inclusive; inputs start at 0, outputs end at the last step)."""

    name: str
    kind: BufferKind
    offset: int
    size: int
    first: int
    last: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def live_at(self, step: int) -> bool:
        return self.first <= step <= self.last


def lower_bound(sizes: Sequence[int], ranges: Sequence[tuple[int, int]], n_steps: int) -> int:
    """max over steps of the bytes live at that step (aligned sizes): no packing can beat it."""
    if not sizes:
        return 0
    delta = np.zeros(max(n_steps, 1) + 1, dtype=np.int64)
    for s, (a, b) in zip(sizes, ranges, strict=True):
        delta[a] += align(s)
        delta[b + 1] -= align(s)
    return int(np.cumsum(delta).max())


def _greedy(
    order: Sequence[int], sizes: Sequence[int], first: np.ndarray, last: np.ndarray, best_fit: bool
) -> tuple[list[int], int]:
    """Place buffers in `order`, each in a gap between already placed buffers whose live ranges
    intersect its own: the lowest such gap (first fit) or the smallest (best fit); else on top."""
    n = len(sizes)
    offsets = [0] * n
    placed = np.zeros(n, dtype=bool)
    p_off = np.zeros(n, dtype=np.int64)
    p_end = np.zeros(n, dtype=np.int64)
    peak = 0
    for i in order:
        size = align(sizes[i])
        if size == 0:
            offsets[i] = 0
            continue
        conflict = placed & (first <= last[i]) & (last >= first[i])
        idx = np.nonzero(conflict)[0]
        best = None
        if idx.size:
            o = p_off[idx]
            e = p_end[idx]
            srt = np.argsort(o, kind="stable")
            o, e = o[srt], e[srt]
            # best fit: the smallest gap that holds the buffer; else the top of the stack
            cur = 0
            best_gap = None
            for lo, hi in zip(o.tolist(), e.tolist(), strict=True):
                if lo - cur >= size and (best_gap is None or lo - cur < best_gap):
                    best, best_gap = cur, lo - cur
                    if not best_fit:
                        break
                cur = max(cur, hi)
            if best is None:
                best = cur
        else:
            best = 0
        offsets[i] = best
        placed[i] = True
        p_off[i] = best
        p_end[i] = best + size
        peak = max(peak, best + size)
    return offsets, peak


def pack(sizes: Sequence[int], ranges: Sequence[tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets (relative to the workspace) and the workspace size for buffers with the given sizes
    and inclusive live ranges. Tries a few greedy orders (by size, by start, by size·lifetime, by
    lifetime), each with best-fit and first-fit gaps, and keeps the smallest peak; each pass is
    O(n·k) for k buffers live at once."""
    n = len(sizes)
    if n == 0:
        return [], 0
    first = np.array([a for a, _ in ranges], dtype=np.int64)
    last = np.array([b for _, b in ranges], dtype=np.int64)
    length = last - first + 1
    orders = [
        sorted(range(n), key=lambda i: (-align(sizes[i]), first[i], i)),  # greedy by size
        sorted(range(n), key=lambda i: (first[i], -align(sizes[i]), i)),  # by start (linear scan)
        sorted(range(n), key=lambda i: (-align(sizes[i]) * int(length[i]), i)),  # by area
        sorted(range(n), key=lambda i: (-int(length[i]), -align(sizes[i]), i)),  # by lifetime
    ]
    best: tuple[list[int], int] | None = None
    for order in orders:
        for best_fit in (True, False):
            got = _greedy(order, sizes, first, last, best_fit)
            if best is None or got[1] < best[1]:
                best = got
    assert best is not None
    return best


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """What `plan.memory_report()` returns; `str()` prints the per-buffer table and totals."""

    buffers: tuple[Buffer, ...]
    arena_size: int
    const_size: int
    workspace_offset: int
    workspace_size: int
    lower_bound: int
    naive_size: int
    n_steps: int

    @property
    def ratio(self) -> float:
        """Packed workspace / lower bound (1.0 is optimal)."""
        return self.workspace_size / self.lower_bound if self.lower_bound else 1.0

    def summary(self) -> str:
        return (
            f"arena {self.arena_size} B = constants {self.const_size} B + workspace "
            f"{self.workspace_size} B; workspace lower bound {self.lower_bound} B "
            f"(ratio {self.ratio:.3f}); naive (one buffer per tensor) {self.naive_size} B"
        )

    def __str__(self) -> str:
        lines = [f"{'buffer':<28} {'kind':<6} {'offset':>12} {'size':>12}  live"]
        for b in sorted(self.buffers, key=lambda b: (b.offset, b.first)):
            lines.append(
                f"{b.name[:28]:<28} {b.kind.value:<6} {b.offset:>12} {b.size:>12}  [{b.first}, {b.last}]"
            )
        lines.append(self.summary())
        return "\n".join(lines)
