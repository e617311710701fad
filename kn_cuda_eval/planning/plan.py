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

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.assign import assign_memory
from kn_cuda_eval.planning.memory import Buffer, BufferKind, MemoryReport, align
from kn_cuda_eval.planning.planner import Planner, bind_symbols
from kn_cuda_eval.planning.settings import PlanSettings
from kn_cuda_eval.planning.validate import validate_once, validate_plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.blockquant import has_block_products, lower_block_products
from kn_graph.errors import ArgumentTypeError, ArgumentValueError, PlanError
from kn_graph.filemap import check_all
from kn_graph.graph import Graph
from kn_graph.integer import has_integer_products, lower_integer_products
from kn_graph.ops import Constant, Dynamic

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
        validate_plan(self)

    def validate_once(self) -> None:
        """`validate()`, skipped for a plan that already passed: what the emulator and the
        executor call before running a plan."""
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
    if not sets.integer_steps and has_integer_products(graph):  # exact float64 ones instead
        graph = lower_integer_products(graph)
    if not sets.block_quant_steps and has_block_products(graph):  # dequantized weights instead
        graph = lower_block_products(graph)
    binds = bind_symbols(graph, batch_size, bindings)
    p = Planner(graph, binds, sets)
    p.run()
    graph_arrays = frozenset(
        id(op.tensor.array) for v in graph.values() if isinstance(op := graph[v].op, Constant)
    )
    layout = assign_memory(
        p.steps, p.bufs, p.views(graph.inputs), p.views(graph.outputs), graph_arrays, p.resident
    )
    return Plan(
        steps=layout.steps,
        inputs=layout.inputs,
        outputs=layout.outputs,
        input_names=tuple(graph.input_names),
        output_names=tuple(graph.output_names),
        constants=layout.constants,
        buffers=layout.buffers,
        status=layout.status,
        arena_size=layout.arena_size,
        const_size=layout.const_size,
        workspace_offset=layout.workspace_offset,
        lower_bound=layout.lower_bound,
        bindings=dict(binds),
        graph_constants=layout.graph_constants,
    )


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def _check_arguments(graph: object, batch_size: object, bindings: object, settings: object) -> None:
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
