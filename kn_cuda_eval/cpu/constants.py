"""A plan's constants in its executor's arena: those steps read as they are, copied in when the
executor is built; those only oneDNN packs, copied in just before their step packs them (their
pages given back after, `arena.PageRelease`); and either kind copied in again before a run when
another binding's executor of the same prepared graph changed the shared arena since.
"""

from __future__ import annotations

import functools

import numpy as np

from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.arena import (
    HostArena,
    PageRelease,
    constant_identity,
    overlap,
    packed_operand,
)
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.plan import Plan
from kn_graph.filemap import release_pages
from kn_graph.ops import content_digest

__all__ = ["ArenaConstants", "copy_constant"]


COPY_CHUNK = 32 << 20
"""Bytes of a constant copied before the source's pages go back: a large mapped weight is not
resident twice, in the file's pages and in the arena (Qwen2-0.5B's 544 MB embedding table,
which its Gather reads as it is: mapping the arena peaked at 1135 MB, now 642)."""


def copy_constant(arena: np.ndarray, off: int, data: np.ndarray) -> None:
    """Constant bytes into the arena, `COPY_CHUNK` at a time; the source's pages go back after
    each chunk when it views a mapped model file (`release_pages`: the arena holds the copy, a
    later read faults them in again)."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    for lo in range(0, raw.size, COPY_CHUNK):
        part = raw[lo : lo + COPY_CHUNK]
        arena[off + lo : off + lo + part.size] = part
        release_pages(part)


def _content(data: np.ndarray) -> tuple[object, ...]:
    """A constant the planner made for one binding (a uniform value at its shape), by content:
    the next binding makes its own array of the same bytes."""
    return ("content", content_digest(data))


class ArenaConstants:
    """The constants of one executor's plan in `arena` (its bytes of `home`). Constants only
    oneDNN packs are copied in just before their step packs them (and their pages go back right
    after): the weights are never all in the arena at once; with shared packed weights, a
    binding after the first finds them packed and never copies them at all. The others are
    copied in now."""

    def __init__(
        self,
        plan: Plan,
        home: HostArena,
        arena: np.ndarray,
        release: PageRelease,
        skip: set[int] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        """`skip`: offsets of graph constants the steps read where they are, never copied in
        (the executor's gather tables)."""
        self.plan = plan
        self._home, self._arena, self._release = home, arena, release
        self.deferred: list[tuple[int, np.ndarray]] = []
        self.raw: list[tuple[int, np.ndarray]] = []  # constants steps read as they are
        # where the constants the planner made for this binding start
        self.own_from = (
            plan.constants[plan.graph_constants][0]
            if plan.graph_constants < len(plan.constants)
            else plan.const_size
        )
        for off, data in plan.constants:
            if off in skip:
                continue
            if release.deferrable(off, off + data.nbytes):
                self.deferred.append((off, data))
            else:
                self.raw.append((off, data))
        self.resident()

    def copy_deferred(self, k: int, raw: bool = True) -> None:
        """Copy in the deferred constants step k reads (to pack them, or as they are when it
        did not pack), before oneDNN packs them or the step runs."""
        span = self._release.cands.get(k)
        if span is None or not self.deferred:
            return
        rest = []
        for off, data in self.deferred:
            if overlap(span, (off, off + data.nbytes)):
                copy_constant(self._arena, off, data)
                self._home.loaded(off)
                if raw:
                    self.raw.append((off, data))
            else:
                rest.append((off, data))
        self.deferred = rest

    def resident(self) -> None:
        """Copy in the graph constants this executor reads as they are and the arena does not
        hold (not yet, or given back since by another binding's executor)."""
        home = self._home
        for off, data in self.raw:
            if off < self.own_from and off not in home.resident:
                copy_constant(self._arena, off, data)
                home.loaded(off)
        self._seen = home.version

    def claim(self, executor: object) -> None:
        """Before `executor` runs: the constants the planner made for this binding back in place
        when another executor ran (or was built) in the arena since, and resident graph
        constants."""
        home = self._home
        if self._seen != home.version:  # another binding gave constant pages back
            self.resident()
        if home.last is not executor:
            for off, data in self.raw:
                if off >= self.own_from:
                    copy_constant(self._arena, off, data)
            home.last = executor

    def packing(
        self, k: int, step: st.Step, store: onednn.PackedWeights | None
    ) -> onednn.Packing | None:
        """Where step k's constant operand is packed: the prepared graph's `store`, keyed by the
        constant's bytes and the operand's view of them; None without a store."""
        span = self._release.cands.get(k)
        if store is None or span is None:
            return None
        view = packed_operand(step)
        if view is None:
            return None
        lo = span[0]
        for off, data in self.plan.constants:
            if off <= lo < off + data.nbytes:
                ident = constant_identity(data) if off < self.own_from else _content(data)
                key = (ident, lo - off, view.shape, view.strides, view.dtype.name)
                load = functools.partial(self.copy_deferred, k, False)
                # packed from the constant's own bytes where they lie as in the arena: a deferred
                # constant is never copied in (2.5 GB of Qwen2-0.5B's weights: 3.5 s of a cold
                # start, and each weight held twice, arena and packed, while it was packed)
                at = int(data.ctypes.data) + view.offset - off if data.flags.c_contiguous else None
                return onednn.Packing(store, key, load, data, source_at=at)
        return None

    def finish(self) -> None:
        """After every step is built: deferred constants left are those whose steps found their
        weights packed already; and every constant's source pages go back once more, as reading
        one maps in the page cache's whole folio, which may hold a neighbour released before."""
        self.deferred.clear()
        for _, data in self.plan.constants:
            release_pages(data)
