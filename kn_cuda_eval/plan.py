"""The `Plan`: steps over one arena, with its memory layout, a printout and a validator.

>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> x = g.input(Shape.of("B" and 2, 4), DType.F32, "x")
>>> g.add_output(g.relu(g.add(x, 1.0)), "y")
>>> print(plan(g))
plan: 1 step, arena 768 B (constants 0 B, workspace 512 B, lower bound 512 B)
inputs:  x f32[2,4]:(4,1)@256
   0  elementwise f32[8]:(1)@512 = max(add(ld0, 1.0), 0.0)  ld0=f32[8]:(1)@256
outputs: y f32[2,4]:(4,1)@512
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kn_cuda_eval import steps as st
from kn_cuda_eval.memory import ALIGN, Buffer, BufferKind, MemoryReport, align, lower_bound, pack
from kn_cuda_eval.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError
from kn_graph.graph import Graph

if TYPE_CHECKING:
    from kn_cuda_eval.kernels.launch import KernelLaunch
    from kn_cuda_eval.planner import PlanSettings

__all__ = ["Plan", "plan"]


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """Everything an executor needs: the steps, where inputs go and outputs come from, the
    constant data and the arena size. Offsets are bytes from the arena start."""

    steps: tuple[st.Step, ...]
    inputs: tuple[StridedView, ...]
    outputs: tuple[StridedView, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    constants: tuple[tuple[int, np.ndarray], ...]
    buffers: tuple[Buffer, ...]
    status: StridedView
    arena_size: int
    const_size: int
    workspace_offset: int
    lower_bound: int
    bindings: Mapping[str, int]

    # -- reports -------------------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        work = [b for b in self.buffers if b.kind in (BufferKind.TEMP, BufferKind.INPUT)]
        return MemoryReport(
            buffers=self.buffers,
            arena_size=self.arena_size,
            const_size=self.const_size,
            workspace_offset=self.workspace_offset,
            workspace_size=self.arena_size - self.workspace_offset,
            lower_bound=self.lower_bound,
            naive_size=sum(align(b.size) for b in work),
            n_steps=len(self.steps),
        )

    def kernels(self) -> list[KernelLaunch]:
        """The launches of the generated kernels, one per step that has one (in step order)."""
        from kn_cuda_eval.kernels.codegen import launch_for

        out: list[KernelLaunch] = []
        for s in self.steps:
            launch = launch_for(s, self.status)
            if launch is not None:
                out.append(launch)
        return out

    def __str__(self) -> str:
        n = len(self.steps)
        lines = [
            f"plan: {n} step{'s' if n != 1 else ''}, arena {self.arena_size} B (constants "
            f"{self.const_size} B, workspace {self.arena_size - self.workspace_offset} B, "
            f"lower bound {self.lower_bound} B)"
        ]
        ins = ", ".join(f"{n} {v}" for n, v in zip(self.input_names, self.inputs, strict=True))
        lines.append(f"inputs:  {ins}")
        width = len(str(max(n - 1, 0)))
        for k, s in enumerate(self.steps):
            lines.append(f"  {k:>{max(width, 2)}}  {s.describe()}")
        outs = ", ".join(f"{n} {v}" for n, v in zip(self.output_names, self.outputs, strict=True))
        lines.append(f"outputs: {outs}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Plan {len(self.steps)} steps, arena {self.arena_size} B>"

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise PlanError unless: no two simultaneously live buffers overlap; every view a step
        touches lies inside the arena and inside a buffer live at that step; no step writes over
        what it reads; constants sit apart from the workspace; GEMM arguments are legal."""
        size = self.arena_size
        bufs = list(self.buffers)
        for b in bufs:
            if b.offset % ALIGN or b.offset < 0 or b.end > size:
                raise PlanError(
                    f"buffer {b.name} [{b.offset}, {b.end}) misaligned or outside the arena of {size} B"
                )
            region = b.offset < self.workspace_offset
            if region != (b.kind in (BufferKind.CONST, BufferKind.STATUS)) and b.size:
                raise PlanError(f"buffer {b.name} ({b.kind.value}) lies in the wrong region")
        if bufs:
            off = np.array([b.offset for b in bufs], dtype=np.int64)
            end = np.array([b.end for b in bufs], dtype=np.int64)
            fst = np.array([b.first for b in bufs], dtype=np.int64)
            lst = np.array([b.last for b in bufs], dtype=np.int64)
            nz = np.array([b.size > 0 for b in bufs])
            for i, b in enumerate(bufs):
                if not b.size:
                    continue
                clash = nz & (off < b.end) & (end > b.offset) & (fst <= b.last) & (lst >= b.first)
                clash[i] = False
                if clash.any():
                    o = bufs[int(np.nonzero(clash)[0][0])]
                    raise PlanError(
                        f"buffers {b.name} [{b.offset}, {b.end}) live {b.first}..{b.last} and {o.name} "
                        f"[{o.offset}, {o.end}) live {o.first}..{o.last} overlap"
                    )
        by_step: list[list[Buffer]] = [[] for _ in range(max(len(self.steps), 1))]
        for b in bufs:
            for p in range(max(b.first, 0), min(b.last, len(self.steps) - 1) + 1):
                by_step[p].append(b)
        for p, s in enumerate(self.steps):
            reads, writes = s.reads(), s.writes()
            for v in (*reads, *writes):
                lo, hi = v.byte_extent()
                if lo == hi:
                    continue
                if lo < 0 or hi > size:
                    raise PlanError(
                        f"step {p} ({s.describe()}): view {v} [{lo}, {hi}) outside the arena of {size} B"
                    )
                if not any(b.offset <= lo and hi <= b.end for b in by_step[p]):
                    raise PlanError(
                        f"step {p} ({s.describe()}): view {v} [{lo}, {hi}) is in no buffer live at that step"
                    )
            for w in writes:
                wlo, whi = w.byte_extent()
                for r in reads:
                    rlo, rhi = r.byte_extent()
                    if wlo < rhi and rlo < whi and wlo != whi and rlo != rhi:
                        raise PlanError(
                            f"step {p} ({s.describe()}): writes {w} over its operand {r}"
                        )
                if any(b.kind is BufferKind.CONST and b.offset <= wlo < b.end for b in by_step[p]):
                    raise PlanError(f"step {p} ({s.describe()}): writes into a constant")
            if isinstance(s, st.MatMul):
                _check_gemm(p, s)

    def inputs_by_name(self) -> dict[str, StridedView]:
        return dict(zip(self.input_names, self.inputs, strict=True))


def _check_gemm(p: int, s: st.MatMul) -> None:
    rows_a = s.k if s.transa else s.m
    rows_b = s.n if s.transb else s.k
    for name, ld, rows in (("lda", s.lda, rows_a), ("ldb", s.ldb, rows_b), ("ldc", s.ldc, s.m)):
        if ld < max(1, rows):
            raise PlanError(f"step {p} ({s.describe()}): {name}={ld} < rows {rows}")
    if s.c.shape != (s.batch, s.n, s.m) or s.a.shape[0] != s.batch or s.b.shape[0] != s.batch:
        raise PlanError(f"step {p} ({s.describe()}): operand shapes disagree with m, n, k, batch")


def plan(
    graph: Graph,
    batch_size: int | None = None,
    bindings: Mapping[str, int] | None = None,
    settings: PlanSettings | None = None,
) -> Plan:
    """Plan `graph` for concrete sizes: B from `batch_size`, other symbols from `bindings`.
    Pure Python; no GPU, no CuPy."""
    from kn_cuda_eval.planner import PlanSettings, _Planner, bind_symbols

    sets = settings if settings is not None else PlanSettings()
    binds = bind_symbols(graph, batch_size, bindings)
    p = _Planner(graph, binds, sets)
    p.run()
    return _finish(graph, p, binds)


def _finish(graph: Graph, p: object, binds: dict[str, int]) -> Plan:
    from kn_cuda_eval.planner import _ID_SHIFT, _OFF_MASK, _Planner

    assert isinstance(p, _Planner)
    steps = p.steps
    n = len(steps)
    nb = len(p.bufs)
    first = [-1] * nb
    last = [-1] * nb
    for k, s in enumerate(steps):
        for v in s.writes():
            b = v.offset >> _ID_SHIFT
            if first[b] < 0:
                first[b] = k
            last[b] = max(last[b], k)
        for v in s.reads():
            b = v.offset >> _ID_SHIFT
            last[b] = max(last[b], k)
            if first[b] < 0 and p.bufs[b].kind is BufferKind.TEMP and p.bufs[b].size:
                raise PlanError(
                    f"internal: step {k} reads buffer {p.bufs[b].name} before anything writes it"
                )
    end = max(n - 1, 0)
    in_views = [p.state[v.index] for v in graph.inputs]
    out_views: list[StridedView] = []
    for out in graph.outputs:
        state = p.state[out.index]
        assert isinstance(state, StridedView), "outputs are materialised"
        out_views.append(state)
    for b, buf in enumerate(p.bufs):
        if buf.kind is BufferKind.INPUT:
            first[b] = 0
            last[b] = max(last[b], 0)
        elif first[b] < 0 and last[b] >= 0:  # read, never written: only empty buffers
            first[b] = last[b]
    for ov in out_views:
        b = ov.offset >> _ID_SHIFT
        first[b] = max(first[b], 0) if first[b] >= 0 else end
        last[b] = end
    # constants: their own region, in first-use order
    base: dict[int, int] = {}
    buffers: list[Buffer] = []
    constants: list[tuple[int, np.ndarray]] = []
    pos = 0
    for b, buf in enumerate(p.bufs):
        if buf.kind is BufferKind.CONST and (last[b] >= 0 or first[b] >= 0):
            base[b] = pos
            assert buf.data is not None
            constants.append((pos, buf.data))
            buffers.append(Buffer(buf.name, buf.kind, pos, buf.size, 0, end))
            pos += align(buf.size)
    const_size = pos
    status_off = pos
    buffers.append(Buffer("status", BufferKind.STATUS, status_off, 4, 0, end))
    work_off = pos + ALIGN
    ws = [
        b
        for b, buf in enumerate(p.bufs)
        if buf.kind in (BufferKind.TEMP, BufferKind.INPUT) and first[b] >= 0
    ]
    sizes = [p.bufs[b].size for b in ws]
    ranges = [(first[b], last[b]) for b in ws]
    offsets, peak = pack(sizes, ranges)
    for b, o in zip(ws, offsets, strict=True):
        base[b] = work_off + o
        buf = p.bufs[b]
        buffers.append(Buffer(buf.name, buf.kind, base[b], buf.size, first[b], last[b]))
    lb = lower_bound(sizes, ranges, n)

    def rebase(v: StridedView) -> StridedView:
        return v.with_offset(base[v.offset >> _ID_SHIFT] + (v.offset & _OFF_MASK))

    final = tuple(st.map_views(s, rebase) for s in steps)  # type: ignore[misc]
    ins = tuple(rebase(v) for v in in_views)  # type: ignore[arg-type]
    outs = tuple(rebase(v) for v in out_views)  # type: ignore[arg-type]
    arena = work_off + peak
    return Plan(
        steps=final,  # type: ignore[arg-type]
        inputs=ins,
        outputs=outs,
        input_names=tuple(graph.input_names),
        output_names=tuple(graph.output_names),
        constants=tuple(constants),
        buffers=tuple(buffers),
        status=StridedView(status_off, (), (), DType.U32),
        arena_size=max(arena, work_off),
        const_size=const_size,
        workspace_offset=work_off,
        lower_bound=lb,
        bindings=dict(binds),
    )
