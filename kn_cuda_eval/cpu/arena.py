"""The host executor's arena: one private mapping every executor of a prepared graph runs in
(`HostArena`), with what they share beside it (`SharedMemory`: packed weights, oneDNN's
workspace), and the constant pages given back once oneDNN has packed them (`PageRelease`).
"""

from __future__ import annotations

import bisect
import mmap
from dataclasses import dataclass

import numpy as np

from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.runtime import onednn_usable
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.limits import check_allocation
from kn_cuda_eval.planning.plan import Plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.binding import available_bytes

__all__ = [
    "HostArena",
    "PageRelease",
    "SharedMemory",
    "constant_identity",
    "overlap",
    "packed_operand",
]


def private_mapping(n: int) -> tuple[np.ndarray, mmap.mmap]:
    """A page-aligned block of its own anonymous *private* mapping: pages given back with
    `MADV_DONTNEED` are freed (a shared mapping, `mmap.mmap(-1, n)`'s default, would only move
    them to shared memory, where VmRSS stops counting them)."""
    mm = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(mm, np.uint8), mm


def constant_identity(data: np.ndarray) -> tuple[object, ...]:
    """A graph constant's identity while it lives: the address, size and type of its bytes."""
    return (int(data.__array_interface__["data"][0]), int(data.nbytes), data.dtype.str)


class HostArena:
    """The arena of a prepared graph's executors (one per binding of the sizes; they run one at a
    time): one private mapping that grows to the largest binding seen (with a quarter of
    headroom) instead of one arena per binding. Plans put the graph's constants first, at the
    same offsets at every binding (`Plan.graph_constants`); executors whose plans agree on them
    share the arena (in practice all: an executor whose plan differs gets an arena of its own).
    The constants the planner made for one binding come after them, where another binding's
    executor may have its workspace: an executor copies its own in again whenever another one
    ran since (`last`).

    It tracks which graph constants hold their bytes: an executor gives back the pages of
    weights oneDNN packed (`PageRelease`), and another executor that reads those bytes as they are
    (a fallback step, a GEMM run by BLAS) copies them in again before it runs (`version` tells
    it something was given back since it last looked). `generation` changes when the mapping is
    replaced: executors built over the old one are stale and are rebuilt."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None
        self._mm: mmap.mmap | None = None
        self.generation = 0
        self.version = 0  # bumped when constant bytes are given back
        self.layout: tuple[tuple[int, int, tuple[object, ...]], ...] | None = None
        self._spans: list[tuple[int, int]] = []  # the layout's constants, by offset
        self.resident: set[int] = set()  # offsets of graph constants whose bytes are here
        self.last: object = None  # the executor that ran last (its own constants are in place)
        self.runs = 0  # evaluations on this arena (by any of its executors) so far

    @property
    def capacity(self) -> int:
        return 0 if self.array is None else int(self.array.size)

    def take(self, plan: Plan, need: int) -> np.ndarray | None:
        """`need` bytes for an executor of `plan`, or None when the plan's constant layout is
        not this arena's (the executor then maps its own)."""
        graph = plan.constants[: plan.graph_constants]
        layout = tuple((off, int(d.nbytes), constant_identity(d)) for off, d in graph)
        if self.layout is not None and layout != self.layout:
            return None
        if self.array is None or need > self.capacity:
            page = mmap.PAGESIZE
            size = -(-max(need, self.capacity + self.capacity // 4) // page) * page
            if size > need and size > available_bytes():  # no headroom where memory is short
                size = -(-need // page) * page
            check_allocation(f"the host executor's arena ({len(plan.steps)} steps)", size)
            self.array, self._mm = private_mapping(size)
            # unwritten memory reads as NaN, as in the emulator (constants are copied in)
            self.array[plan.const_size : need].fill(0xFF)
            self.generation += 1
            self.resident.clear()
        self.layout = layout
        self._spans = [(off, off + n) for off, n, _ in layout]
        self.last = None  # the new executor's packing may write where others keep theirs
        return self.array[:need]

    def loaded(self, off: int) -> None:
        self.resident.add(off)

    def drop(self, lo: int, hi: int) -> None:
        """Give pages [lo, hi) back (whole pages; their constants no longer hold their bytes)."""
        assert self._mm is not None
        self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        i = max(bisect.bisect_right(self._spans, (lo, 1 << 62)) - 1, 0)
        while i < len(self._spans) and self._spans[i][0] < hi:
            if self._spans[i][1] > lo:
                self.resident.discard(self._spans[i][0])
            i += 1
        self.version += 1


@dataclass
class SharedMemory:
    """What every executor of one prepared graph shares: the arena, the packed weights and
    oneDNN's workspace. Weights are held once per prepared graph, whatever the bindings."""

    arena: HostArena
    packed: onednn.PackedWeights | None = None  # when oneDNN is usable
    workspace: onednn.Workspace | None = None

    @staticmethod
    def make() -> SharedMemory:
        if not onednn_usable():
            return SharedMemory(HostArena())
        return SharedMemory(HostArena(), onednn.PackedWeights(), onednn.Workspace())

    def nbytes(self) -> dict[str, int]:
        """Bytes held: the arena's mapping, the packed weights, the workspace's block."""
        return {
            "arena": self.arena.capacity,
            "packed": 0 if self.packed is None else int(self.packed.nbytes),
            "workspace": 0 if self.workspace is None else int(self.workspace.mapped),
        }


def packed_operand(s: st.Step) -> StridedView | None:
    """The operand a oneDNN runner packs once when it is a constant: a conv's weights, a GEMM's
    `a` (the graph's right operand)."""
    if isinstance(s, st.Conv):
        return s.w
    if isinstance(s, st.MatMul):
        return s.a
    return None


class PageRelease:
    """Constant pages no step reads once oneDNN has packed them (`madvise(MADV_DONTNEED)`): the
    weights would otherwise be held twice, in the arena and packed. A range goes back when every
    step reading it has been built and each packed it; pages any other step reads (a bias, a
    gather of tied embeddings, a fallback step) or that a plan output views stay."""

    def __init__(self, plan: Plan, arena: HostArena) -> None:
        self._arena = arena
        const = plan.const_size
        self.cands: dict[int, tuple[int, int]] = {}
        keep: list[tuple[int, int]] = []
        for k, s in enumerate(plan.steps):
            packed = packed_operand(s)
            for r in s.reads():
                lo, hi = r.byte_extent()
                if lo >= const or lo == hi:
                    continue
                if r is packed and hi <= const:
                    self.cands[k] = (lo, hi)
                else:
                    keep.append((lo, hi))
        for v in plan.outputs:  # an output that is a constant is read from the arena
            lo, hi = v.byte_extent()
            if lo < const and lo < hi:
                keep.append((lo, hi))
        self._keep = _merged(keep)  # sorted, disjoint
        self._keep_lo = [lo for lo, _ in self._keep]
        self._packed: dict[int, bool] = {}
        ks = sorted(self.cands)
        # the last candidate step whose range overlaps each one's: when it is built, decide
        self._last = {k: max(j for j in ks if overlap(self.cands[j], self.cands[k])) for k in ks}
        self.released = 0  # bytes handed back

    def deferrable(self, lo: int, hi: int) -> bool:
        """Whether the constant bytes [lo, hi) are read only as operands oneDNN packs."""
        span = (lo, hi)
        return (
            lo < hi
            and any(overlap(span, c) for c in self.cands.values())
            and not self._kept_in(lo, hi)
        )

    def _kept_in(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The kept ranges that overlap [lo, hi)."""
        i = max(bisect.bisect_right(self._keep_lo, lo) - 1, 0)
        out = []
        while i < len(self._keep) and self._keep[i][0] < hi:
            if self._keep[i][1] > lo:
                out.append(self._keep[i])
            i += 1
        return out

    def built(self, k: int, packed: bool) -> None:
        if k not in self.cands:
            return
        self._packed[k] = packed
        for i, last in self._last.items():
            if last != k:
                continue
            group = [j for j in self.cands if overlap(self.cands[j], self.cands[i])]
            if all(self._packed.get(j, False) for j in group):
                self._drop(*self.cands[i])

    def _drop(self, lo: int, hi: int) -> None:
        page = mmap.PAGESIZE
        parts = [(-(-lo // page) * page, hi // page * page)]
        for klo, khi in self._kept_in(lo - page, hi + page):  # whole pages of kept bytes stay
            klo, khi = klo // page * page, -(-khi // page) * page
            parts = [
                q for a, b in parts for q in ((a, min(b, klo)), (max(a, khi), b)) if q[0] < q[1]
            ]
        for a, b in parts:
            if a >= b:
                continue
            self._arena.drop(a, b)
            self.released += b - a


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` sorted, overlapping and touching ones merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether byte ranges [lo, hi) `a` and `b` share a byte."""
    return a[0] < b[1] and b[0] < a[1]
