"""`Plan.validate()`: the proof that a plan is safe to run — no two simultaneously live buffers
overlap, every view a step touches lies in a buffer live at that step, no step writes over what
it reads or into a constant, GEMM arguments are legal.

Two sweeps keep it O((buffers + views) · log buffers): one over buffers by first step, one over
the steps, each holding the buffers live at the moment sorted by offset. Live buffers never
overlap (the first sweep proves it), so the one live buffer that can hold an address is the
live buffer with the largest offset at or below it.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import weakref
from typing import Protocol

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.memory import ALIGN, Buffer, BufferKind
from kn_graph.errors import PlanError

__all__ = ["ArenaPlan", "validate_once", "validate_plan"]


class ArenaPlan(Protocol):
    """What the validator reads of a `plan.Plan`: its steps and buffers over one arena."""

    @property
    def steps(self) -> tuple[st.Step, ...]: ...

    @property
    def buffers(self) -> tuple[Buffer, ...]: ...

    @property
    def arena_size(self) -> int: ...

    @property
    def workspace_offset(self) -> int: ...


_passed: weakref.WeakSet[ArenaPlan] = weakref.WeakSet()  # plans that validated (immutable)
_lock = threading.Lock()


class _Live:
    """The buffers live at the sweep's position, sorted by offset, expiring by last step."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.bufs: list[Buffer] = []
        self._expiry: list[tuple[int, int, Buffer]] = []

    def expire(self, step: int) -> None:
        """Drop the buffers whose last step is before `step`."""
        while self._expiry and self._expiry[0][0] < step:
            _, _, b = heapq.heappop(self._expiry)
            k = bisect.bisect_left(self.offsets, b.offset)
            while self.bufs[k] is not b:  # unique offsets once proven disjoint; be safe anyway
                k += 1
            del self.offsets[k], self.bufs[k]

    def holder(self, lo: int) -> Buffer | None:
        """The live buffer with the largest offset <= lo (the only one that can hold lo)."""
        k = bisect.bisect_right(self.offsets, lo) - 1
        return self.bufs[k] if k >= 0 else None

    def clash(self, b: Buffer) -> Buffer | None:
        """A live buffer whose bytes overlap b's (neighbours in offset order suffice)."""
        k = bisect.bisect_right(self.offsets, b.offset)
        if k > 0 and self.bufs[k - 1].end > b.offset:
            return self.bufs[k - 1]
        if k < len(self.bufs) and self.offsets[k] < b.end:
            return self.bufs[k]
        return None

    def add(self, b: Buffer) -> None:
        k = bisect.bisect_right(self.offsets, b.offset)
        self.offsets.insert(k, b.offset)
        self.bufs.insert(k, b)
        heapq.heappush(self._expiry, (b.last, id(b), b))


def _check_buffers(p: ArenaPlan) -> list[Buffer]:
    """Alignment, bounds and regions of every buffer; no two live at once overlap. Returns the
    non-empty buffers."""
    size = p.arena_size
    for b in p.buffers:
        if b.offset % ALIGN or b.offset < 0 or b.end > size:
            raise PlanError(
                f"buffer {b.name} [{b.offset}, {b.end}) misaligned or outside the arena of {size} B"
            )
        region = b.offset < p.workspace_offset
        if region != (b.kind in (BufferKind.CONST, BufferKind.STATUS)) and b.size:
            raise PlanError(f"buffer {b.name} ({b.kind.value}) lies in the wrong region")
    bufs = [b for b in p.buffers if b.size]
    live = _Live()
    for b in sorted(bufs, key=lambda b: b.first):
        live.expire(b.first)
        o = live.clash(b)
        if o is not None:
            raise PlanError(
                f"buffers {b.name} [{b.offset}, {b.end}) live {b.first}..{b.last} and {o.name} "
                f"[{o.offset}, {o.end}) live {o.first}..{o.last} overlap"
            )
        live.add(b)
    return bufs


def validate_once(p: ArenaPlan) -> None:
    """Validate `p` unless it already passed."""
    with _lock:
        if p in _passed:
            return
    validate_plan(p)
    with _lock:
        _passed.add(p)


def validate_plan(p: ArenaPlan) -> None:
    """Raise PlanError naming the first problem found (see the module docstring)."""
    bufs = _check_buffers(p)
    size = p.arena_size
    pending = sorted(bufs, key=lambda b: max(b.first, 0))
    nxt = 0
    live = _Live()
    for k, s in enumerate(p.steps):
        live.expire(k)
        while nxt < len(pending) and max(pending[nxt].first, 0) <= k:
            if pending[nxt].last >= k:
                live.add(pending[nxt])
            nxt += 1
        reads, writes = s.reads(), s.writes()
        holders: dict[int, Buffer] = {}  # id(view) -> its buffer (writes only)
        for v in (*reads, *writes):
            lo, hi = v.byte_extent()
            if lo == hi:
                continue
            if lo < 0 or hi > size:
                raise PlanError(
                    f"step {k} ({s.describe()}): view {v} [{lo}, {hi}) outside the arena of {size} B"
                )
            b = live.holder(lo)
            if b is None or hi > b.end:
                raise PlanError(
                    f"step {k} ({s.describe()}): view {v} [{lo}, {hi}) is in no buffer live at "
                    "that step"
                )
            holders[id(v)] = b
        for w in writes:
            wlo, whi = w.byte_extent()
            for r in reads:
                rlo, rhi = r.byte_extent()
                if wlo < rhi and rlo < whi and wlo != whi and rlo != rhi:
                    raise PlanError(f"step {k} ({s.describe()}): writes {w} over its operand {r}")
            b = holders.get(id(w))
            if b is not None and b.kind is BufferKind.CONST:
                raise PlanError(f"step {k} ({s.describe()}): writes into a constant ({b.name})")
        if isinstance(s, st.MatMul):
            _check_gemm(k, s)


def _check_gemm(p: int, s: st.MatMul) -> None:
    rows_a = s.k if s.transa else s.m
    rows_b = s.n if s.transb else s.k
    for name, ld, rows in (("lda", s.lda, rows_a), ("ldb", s.ldb, rows_b), ("ldc", s.ldc, s.m)):
        if ld < max(1, rows):
            raise PlanError(f"step {p} ({s.describe()}): {name}={ld} < rows {rows}")
    if s.c.shape != (s.batch, s.n, s.m) or s.a.shape[0] != s.batch or s.b.shape[0] != s.batch:
        raise PlanError(f"step {p} ({s.describe()}): operand shapes disagree with m, n, k, batch")
