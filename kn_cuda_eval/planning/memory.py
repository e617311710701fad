"""Memory planning: buffers with live ranges over steps, packed into one arena by a
lifetime-aware best-fit packer (any freed region can be reused by any size, 256-byte aligned).

The arena is laid out as [constants | status word | workspace]. Only the workspace is packed;
its lower bound is the largest sum of simultaneously live buffer sizes over all steps.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALIGN",
    "Buffer",
    "BufferKind",
    "MemoryReport",
    "align",
    "human_bytes",
    "lower_bound",
    "pack",
]

ALIGN = 256
"""Byte alignment of every buffer (cuBLAS, cuDNN and vector loads like 16; 256 is what
cudaMalloc gives)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def human_bytes(n: int) -> str:
    """1.5 TiB, 32 EiB: the size in the largest binary unit that keeps it >= 1."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    k = min(max((n.bit_length() - 1) // 10, 0), len(units) - 1)
    return f"{n / 1024**k:.3g} {units[k]}"


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


def lower_bound(sizes: Sequence[int], ranges: Sequence[tuple[int, int]], n_steps: int) -> int:
    """max over steps of the bytes live at that step (aligned sizes): no packing can beat it."""
    if not sizes:
        return 0
    delta = [0] * (max(n_steps, 1) + 1)  # Python ints: no overflow, whatever the sizes
    for s, (a, b) in zip(sizes, ranges, strict=True):
        delta[a] += align(s)
        delta[b + 1] -= align(s)
    return max(itertools.accumulate(delta))


_MAX_PAIRS = 1 << 23
"""Neighbour lists (buffer pairs with intersecting live ranges) up to this many entries; beyond it
(thousands of buffers live at once) each placement scans all buffers with NumPy instead."""


def _neighbours(first: np.ndarray, last: np.ndarray) -> list[list[int]] | None:
    """For every buffer, the buffers whose live ranges intersect its own (in index order), by one
    sweep over start steps: O(n log n + pairs). None when there would be over `_MAX_PAIRS`."""
    n = len(first)
    sf, sl = np.sort(first), np.sort(last)
    deg = np.searchsorted(sf, last, "right") - np.searchsorted(sl, first, "left") - 1
    if int(deg.sum()) > _MAX_PAIRS:
        return None
    fst, lst = first.tolist(), last.tolist()
    nbrs: list[list[int]] = [[] for _ in range(n)]
    active: set[int] = set()
    expiry: list[tuple[int, int]] = []
    for i in sorted(range(n), key=lambda i: (fst[i], i)):
        while expiry and expiry[0][0] < fst[i]:
            active.discard(heapq.heappop(expiry)[1])
        mine = nbrs[i]
        for j in active:
            mine.append(j)
            nbrs[j].append(i)
        active.add(i)
        heapq.heappush(expiry, (lst[i], i))
    return nbrs


def _greedy(
    order: Sequence[int],
    sizes: Sequence[int],
    first: np.ndarray,
    last: np.ndarray,
    nbrs: list[list[int]] | None,
    best_fit: bool,
) -> tuple[list[int], int]:
    """Place buffers in `order`, each in a gap between already placed buffers whose live ranges
    intersect its own: the lowest such gap (first fit) or the smallest (best fit); else on top.
    `nbrs` (from `_neighbours`) makes each placement cost its neighbours, not all buffers."""
    n = len(sizes)
    offsets = [0] * n
    placed = [False] * n
    ends = [0] * n
    placed_np = np.zeros(n, dtype=bool) if nbrs is None else None
    peak = 0
    for i in order:
        size = align(sizes[i])
        if size == 0:
            offsets[i] = 0
            continue
        if nbrs is not None:
            spans = sorted((offsets[j], ends[j]) for j in nbrs[i] if placed[j])
        else:
            assert placed_np is not None
            idx = np.nonzero(placed_np & (first <= last[i]) & (last >= first[i]))[0].tolist()
            spans = sorted((offsets[j], ends[j]) for j in idx)
        # the gaps between the placed spans, in offset order (ties: only the first of equal
        # offsets can start a gap, so the order among them does not matter)
        cur = 0
        best = None
        best_gap = 0
        for lo, hi in spans:
            if lo - cur >= size and (best is None or lo - cur < best_gap):
                best, best_gap = cur, lo - cur
                if not best_fit:
                    break
            if hi > cur:
                cur = hi
        if best is None:
            best = cur
        offsets[i] = best
        placed[i] = True
        if placed_np is not None:
            placed_np[i] = True
        ends[i] = best + size
        peak = max(peak, best + size)
    return offsets, peak


def pack(sizes: Sequence[int], ranges: Sequence[tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets (relative to the workspace) and the workspace size for buffers with the given sizes
    and inclusive live ranges. Tries a few greedy orders (by size, by start, by size·lifetime, by
    lifetime), each with best-fit and first-fit gaps, and keeps the smallest peak; each pass is
    O(Σ k log k) for k buffers live at once with each buffer."""
    n = len(sizes)
    if n == 0:
        return [], 0
    first = np.array([a for a, _ in ranges], dtype=np.int64)
    last = np.array([b for _, b in ranges], dtype=np.int64)
    length = (last - first + 1).tolist()
    fst = first.tolist()
    asz = [align(s) for s in sizes]
    orders = [
        sorted(range(n), key=lambda i: (-asz[i], fst[i], i)),  # greedy by size
        sorted(range(n), key=lambda i: (fst[i], -asz[i], i)),  # by start (linear scan)
        sorted(range(n), key=lambda i: (-asz[i] * length[i], i)),  # by area
        sorted(range(n), key=lambda i: (-length[i], -asz[i], i)),  # by lifetime
    ]
    nbrs = _neighbours(first, last)
    best: tuple[list[int], int] | None = None
    for order in orders:
        for best_fit in (True, False):
            got = _greedy(order, sizes, first, last, nbrs, best_fit)
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
