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

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.memory import (
    ALIGN,
    Buffer,
    BufferKind,
    MemoryReport,
    align,
    lower_bound,
    pack,
)
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import ArgumentTypeError, ArgumentValueError, PlanError
from kn_graph.filemap import check_all, check_unchanged
from kn_graph.graph import Graph
from kn_graph.ops import Constant, Dynamic

if TYPE_CHECKING:
    from kn_cuda_eval.planning.planner import PlanSettings

__all__ = ["Plan", "plan"]


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
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
    graph_constants: int = 0
    """How many of `constants` (the first ones) are the graph's own: the same at every binding
    (the rest the planner made for this binding's shapes)."""

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
        what it reads; constants sit apart from the workspace; GEMM arguments are legal.
        O((buffers + views) · log buffers)."""
        from kn_cuda_eval.planning.validate import validate_plan

        validate_plan(self)

    def validate_once(self) -> None:
        """`validate()`, skipped for a plan that already passed: what the emulator and the
        executor call before running a plan."""
        from kn_cuda_eval.planning.validate import validate_once

        validate_once(self)


def plan(
    graph: Graph,
    batch_size: int | None = None,
    bindings: Mapping[str, int] | None = None,
    settings: PlanSettings | None = None,
) -> Plan:
    """Plan `graph` for concrete sizes: B from `batch_size`, other symbols from `bindings`.
    Pure Python; no GPU, no CuPy. A wrong argument type is an `ArgumentTypeError`, a bad value
    an `ArgumentValueError` (also `TypeError` / `ValueError`)."""
    from kn_cuda_eval.planning.planner import PlanSettings, _Planner, bind_symbols

    _check_arguments(graph, batch_size, bindings, settings)
    # the planner reads constants (folds, checks): a rewritten mapped model file is our error
    check_all(i.op.tensor.array for i in graph.value_infos() if isinstance(i.op, Constant))
    if graph.has_dynamic:
        kinds = sorted({i.op.kind for i in graph.value_infos() if isinstance(i.op, Dynamic)})
        raise PlanError(
            f"plan: the graph has data-dependent ops ({', '.join(kinds)}), whose sizes are known "
            "only at run time; run it in segments (kn_cuda_eval.planning.segments, as devices do)"
        )
    sets = settings if settings is not None else PlanSettings()
    binds = bind_symbols(graph, batch_size, bindings)
    p = _Planner(graph, binds, sets)
    p.run()
    return _finish(graph, p, binds)


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def _check_arguments(graph: object, batch_size: object, bindings: object, settings: object) -> None:
    from kn_cuda_eval.planning.planner import PlanSettings

    if not isinstance(graph, Graph):
        hint = " (call .specialize(inputs) first)" if hasattr(graph, "specialize") else ""
        raise ArgumentTypeError(
            f"plan: graph must be a kn_graph Graph, found {type(graph).__name__}{hint}"
        )
    if batch_size is not None and not _is_int(batch_size):
        raise ArgumentTypeError(f"plan: batch_size must be an int or None, found {batch_size!r}")
    if batch_size is not None and batch_size < 0:  # type: ignore[operator]
        raise ArgumentValueError(f"plan: batch_size must be >= 0, found {batch_size}")
    if bindings is not None:
        if not isinstance(bindings, Mapping):
            raise ArgumentTypeError(
                f"plan: bindings must be a mapping of size symbol -> int, found "
                f"{type(bindings).__name__}"
            )
        for k, v in bindings.items():
            if not isinstance(k, str):
                raise ArgumentTypeError(f"plan: bindings keys must be symbol names, found {k!r}")
            if not _is_int(v):
                raise ArgumentTypeError(f"plan: bindings['{k}'] must be an int, found {v!r}")
            if v < 0:
                raise ArgumentValueError(f"plan: bindings['{k}'] must be >= 0, found {v}")
    if settings is not None and not isinstance(settings, PlanSettings):
        raise ArgumentTypeError(
            f"plan: settings must be a PlanSettings or None, found {type(settings).__name__}"
        )


def _finish(graph: Graph, p: object, binds: dict[str, int]) -> Plan:
    from kn_cuda_eval.planning.planner import _ID_SHIFT, _OFF_MASK, MAX_BUFFER_BYTES, _Planner

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
    # constants: their own region, the graph's first (in value order: the same offsets at
    # every binding, so a CPU backend's executors of several bindings share one arena), then
    # those the planner made (uniform values materialised at a binding's shape)
    base: dict[int, int] = {}
    buffers: list[Buffer] = []
    constants: list[tuple[int, np.ndarray]] = []
    pos = 0
    checked: set[int] = set()  # mapped model files found unchanged
    graph_arrays = {
        id(op.tensor.array) for v in graph.values() if isinstance(op := graph[v].op, Constant)
    }
    const_bufs = [
        b
        for b, buf in enumerate(p.bufs)
        if buf.kind is BufferKind.CONST and (last[b] >= 0 or first[b] >= 0)
    ]
    const_bufs.sort(key=lambda b: id(p.bufs[b].data) not in graph_arrays)  # stable
    for b in const_bufs:
        buf = p.bufs[b]
        base[b] = pos
        assert buf.data is not None
        check_unchanged(buf.data, checked)  # every backend copies them from the plan
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
    if work_off + peak >= MAX_BUFFER_BYTES:
        raise PlanError(
            f"plan: the arena needs {work_off + peak:,} bytes (constants {const_size:,}, "
            f"workspace {peak:,}), more than a plan can address (below 2^48 bytes = 256 TiB)"
        )
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
        graph_constants=sum(id(d) in graph_arrays for _, d in constants),
    )
