"""Segmented execution of graphs with data-dependent ops (`Dynamic`: NonZero, TopK, NMS, Unique,
If, Loop, Scan).

A plan needs every size. So the graph is split at its data-dependent points into **segments**
(pure graphs, each planned like any other graph once its sizes are bound) and **host points**
(the Dynamic ops). A runner executes segment 0, reads the arguments of the host points that
follow back to the host, runs them there with the CPU semantics of `kn_graph.dynamic`, binds
the run-time sizes they produce, and goes on with the next segment, planned for those sizes (and
cached per binding by the device). Control flow runs its subgraphs through the same runner, so a
Loop body is planned once per distinct binding of its sizes, not once per iteration.

Phases: a value's *phase* is the segment that computes it. Inputs are phase 0; an ordinary op
takes the latest phase of its operands (constants fit any phase and are copied into each segment
that uses them); a Dynamic op runs at the host point after the phase of its latest argument, and
its results belong to the next phase.

>>> import numpy as np
>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> x = g.input(Shape.of(6), DType.F32, "x")
>>> n = g.fresh_symbol("nonzero")
>>> (idx,) = g.dynamic("nonzero", [g.relu(x)], (), [Shape.of(1, n)], [DType.I64])
>>> g.add_output(g.mul(g.gather(x, 0, g.view(idx, Shape.of(n))), 2.0), "y")
>>> sg = split(g)
>>> [type(s).__name__ for s in sg.stages]
['Segment', 'HostPoint', 'Segment']
>>> emulate_graph(g, [np.array([1, -2, 3, 0, 5, -6], np.float32)])[0]
array([ 2.,  6., 10.], dtype=float32)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kn_cuda_eval.planning.cache import BindingCache, binding_key
from kn_cuda_eval.planning.profile import ProfileRow
from kn_graph.binding import bind_shapes, inputs_in_order
from kn_graph.dynamic import bind_results, run_dynamic
from kn_graph.errors import EvaluationError, KnError
from kn_graph.graph import Graph
from kn_graph.ops import Constant, Dynamic, Input, Slice, Value

if TYPE_CHECKING:
    from kn_cuda_eval.planning.plan import Plan

__all__ = [
    "HostPoint",
    "Segment",
    "SegmentedGraph",
    "SegmentedRunner",
    "emulate_graph",
    "split",
]


@dataclass(frozen=True, slots=True)
class Segment:
    """A pure graph (no Dynamic op) computing values `outputs` of the original graph from its
    values `inputs` (indices into the original graph, in the segment's input order)."""

    graph: Graph
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    symbols: frozenset[str]
    """The size symbols its plan depends on (a plan cache keys on their values)."""


@dataclass(frozen=True, slots=True)
class HostPoint:
    """One Dynamic op run on the host: `op` (its `key`), and the original values of its results
    as (value index, result number)."""

    op: Dynamic
    results: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class SegmentedGraph:
    graph: Graph
    stages: tuple[Segment | HostPoint, ...]

    def describe(self) -> str:
        lines = []
        for s in self.stages:
            if isinstance(s, Segment):
                lines.append(
                    f"segment: {len(s.graph)} values, {len(s.inputs)} in, {len(s.outputs)} out"
                )
            else:
                lines.append(f"host: {s.op.kind} -> {len(s.results)} results")
        return "\n".join(lines)


def split(graph: Graph) -> SegmentedGraph:
    """The stages of `graph`: segments and host points in execution order."""
    from kn_graph.optimizer.core import copy_op  # the one op-copying function

    n = len(graph)
    infos = graph.value_infos()
    phase = [0] * n
    host_phase: dict[Dynamic, int] = {}
    groups: dict[Dynamic, list[tuple[int, int]]] = {}
    bound_at: dict[str, int] = {}  # run-time symbol -> the phase from which it is bound
    for i, info in enumerate(infos):
        op = info.op
        if isinstance(op, Input | Constant):
            continue
        p = max((phase[x.index] for x in op.inputs), default=0)
        syms = info.shape.symbols | (op.start.symbols if isinstance(op, Slice) else frozenset())
        p = max([p, *(bound_at.get(s, 0) for s in syms)])
        if isinstance(op, Dynamic):
            hp = host_phase.setdefault(op.key, p)
            groups.setdefault(op.key, []).append((i, op.output))
            phase[i] = hp + 1
            for shape in op.shapes:
                for s in shape.symbols:
                    bound_at.setdefault(s, hp + 1)
        else:
            phase[i] = p
    last = max(phase, default=0)
    # which values each consumer needs, to find what crosses a stage boundary
    needed_after: dict[int, int] = {}  # value -> the latest phase that reads it
    host_args: set[int] = set()
    for i, info in enumerate(infos):
        op = info.op
        for x in op.inputs:
            if isinstance(op, Dynamic):
                host_args.add(x.index)
            else:
                needed_after[x.index] = max(needed_after.get(x.index, -1), phase[i])
    outputs = {v.index for v in graph.outputs}
    stages: list[Segment | HostPoint] = []
    for k in range(last + 1):
        members = [
            i
            for i in range(n)
            if phase[i] == k and not isinstance(infos[i].op, Input | Constant | Dynamic)
        ]
        exported = [
            i for i in members if i in outputs or i in host_args or needed_after.get(i, -1) > k
        ]
        if exported:
            stages.append(_segment(graph, members, exported, copy_op))
        for key, hp in host_phase.items():
            if hp == k:
                stages.append(HostPoint(key, tuple(groups[key])))
    return SegmentedGraph(graph, tuple(stages))


def _segment(
    graph: Graph,
    members: list[int],
    exported: list[int],
    copy_op: Callable[..., Value],
) -> Segment:
    sub = Graph()
    sub.equate = sub.guard_equal  # sizes the loader equated stay equated (with their guards)
    mapping: dict[int, Value] = {}
    inputs: list[int] = []
    member_set = set(members)

    def get(x: Value) -> Value:
        v = mapping.get(x.index)
        if v is None:
            info = graph[x]
            if isinstance(info.op, Constant):
                v = sub.constant_tensor(info.op.tensor)
            else:
                assert x.index not in member_set, "operands come before their users"
                v = sub.input(info.shape, info.dtype, info.debug_name or f"v{x.index}")
                inputs.append(x.index)
            mapping[x.index] = v
        return v

    for i in members:
        info = graph[graph.value(i)]
        op = info.op.map_inputs(get)
        mapping[i] = copy_op(sub, info, op)
    for i in exported:
        sub.add_output(mapping[i], graph[graph.value(i)].debug_name or f"v{i}")
    symbols: set[str] = set()
    for info in sub.value_infos():
        symbols |= info.shape.symbols
        if isinstance(info.op, Slice):
            symbols |= info.op.start.symbols
    return Segment(sub, tuple(inputs), tuple(exported), frozenset(symbols))


def _to_host(a: Any) -> np.ndarray:
    """A device array's data on the host (CuPy arrays via .get(); NumPy arrays as they are)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)
    return np.asarray(get() if callable(get) else a)


BOUND_MEMO = 256
"""Host-point results whose bindings a `SegmentedRunner` remembers (cleared when full)."""

HostKind = Callable[[Dynamic, list[np.ndarray]], "list[np.ndarray] | None"]
"""A device's own computation of a host point: its results, or None to leave it to NumPy."""

SegmentRun = Callable[[Segment, Sequence[Any], Mapping[str, int]], list[Any]]
"""Runs one segment on a device at the values of its `symbols`: arrays in, (device) arrays
out. Planning once per distinct binding and caching the plan is the device's business."""


@dataclass
class SegmentedRunner:
    """Runs graphs (and, recursively, the subgraphs of their control flow) segment by segment:
    `run_segment` executes a pure graph at a binding (planning and caching is its business)."""

    run_segment: SegmentRun
    host_kinds: Mapping[str, HostKind] = field(default_factory=dict)
    """Host points a device computes its own way (`kn_cuda_eval.cpu.recurrence.HOST_KINDS`),
    by kind; `run_dynamic` (NumPy) for the others and whenever one returns None."""
    _splits: dict[int, SegmentedGraph] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _bound_memo: dict[tuple, dict[str, int]] = field(default_factory=dict)
    _used: dict[int, frozenset[str]] = field(default_factory=dict)  # a subgraph's input symbols
    _timings: list[ProfileRow] | None = None  # while profiling: the rows of nested runs too

    def segmented(self, graph: Graph) -> SegmentedGraph:
        with self._lock:
            sg = self._splits.get(graph.id)
            if sg is None:
                sg = self._splits[graph.id] = split(graph)
            return sg

    def run(
        self,
        graph: Graph,
        inputs: Any,
        batch_size: int | None = None,
        *,
        host_outputs: bool = True,
        known: Mapping[str, int] | None = None,
        timings: list[ProfileRow] | None = None,
    ) -> list[Any]:
        """Evaluate `graph` on `inputs` (a list in input order or a name map; NumPy or device
        arrays). Outputs are NumPy arrays, or with `host_outputs=False` where they were made
        (device arrays from segments, NumPy arrays from host points). `timings` gets one row
        per stage: its wall time (a segment's, its device's calls included)."""
        arrays = inputs_in_order(graph.input_names, inputs)
        bindings = bind_shapes(graph, arrays, batch_size, known)
        env: dict[int, Any] = {}
        for v, a in zip(graph.inputs, arrays, strict=True):
            env[v.index] = a
        for n, stage in enumerate(self.segmented(graph).stages):
            t0 = time.perf_counter()
            if isinstance(stage, Segment):
                binds = {k: bindings[k] for k in stage.symbols}
                outs = self.run_segment(stage, [env[i] for i in stage.inputs], binds)
                env.update(zip(stage.outputs, outs, strict=True))
                if timings is not None:
                    ms = (time.perf_counter() - t0) * 1e3
                    timings.append(ProfileRow(n, "segment", f"{len(stage.graph)} values", ms))
                continue
            op = stage.op
            args = [_to_host(self._value(graph, env, x)) for x in op.args]
            prev, nested = self._timings, len(timings) if timings is not None else 0
            self._timings = timings
            try:
                own = self.host_kinds.get(op.kind)
                results = own(op, args) if own is not None else None
                if results is None:
                    results = run_dynamic(op, args, bindings, self._run_subgraph)
                new = self._bound(graph, stage, results, bindings)
            except KnError as e:
                where = graph.format_value(graph.value(stage.results[0][0]))
                raise type(e)(f"while computing {where}: {e}") from e
            finally:
                self._timings = prev
            bindings = new
            for i, j in stage.results:
                env[i] = results[j]
            if timings is not None:  # its own time: the stages of its subgraphs have rows
                name = graph[graph.value(stage.results[0][0])].debug_name or op.kind
                inner = sum(r.ms for r in timings[nested:])
                ms = (time.perf_counter() - t0) * 1e3 - inner
                timings.append(ProfileRow(n, f"host {op.kind}", name, ms))
        outs = [self._value(graph, env, v) for v in graph.outputs]
        return [np.array(_to_host(o)) for o in outs] if host_outputs else outs

    def _bound(
        self,
        graph: Graph,
        stage: HostPoint,
        results: Sequence[np.ndarray],
        bindings: dict[str, int],
    ) -> dict[str, int]:
        """`bindings` plus what the results of `stage` bind (`bind_results`), guards checked;
        remembered per stage, result shapes and bindings (`BOUND_MEMO`), so that a host point
        met again at the same sizes (a recurrence per VAD chunk) costs a lookup."""
        key = (id(stage), *(r.shape for r in results), *bindings.items())
        with self._lock:
            hit = self._bound_memo.get(key)
        if hit is not None and all(
            r.dtype == dt.np for r, dt in zip(results, stage.op.dtypes, strict=True)
        ):
            return dict(hit)
        new = bind_results(stage.op, results, bindings)
        if new.keys() != bindings.keys():
            graph.check_bindings(new)
        with self._lock:
            if len(self._bound_memo) >= BOUND_MEMO:
                self._bound_memo.clear()
            self._bound_memo[key] = dict(new)
        return new

    def _run_subgraph(
        self, graph: Graph, inputs: list[np.ndarray], bindings: Mapping[str, int]
    ) -> list[np.ndarray]:
        used = self._used.get(graph.id)
        if used is None:
            used = frozenset().union(*(graph[v].shape.symbols for v in graph.inputs))
            self._used[graph.id] = used  # what `outer_bindings` keeps
        known = {k: v for k, v in bindings.items() if k in used}
        outs = self.run(graph, inputs, known=known, timings=self._timings)
        return [_to_host(o) for o in outs]

    @staticmethod
    def _value(graph: Graph, env: Mapping[int, Any], v: Value) -> Any:
        if v.index in env:
            return env[v.index]
        arr = graph.const_value(v)
        if arr is None:
            raise EvaluationError(f"internal: {graph.format_value(v)} was never computed")
        return arr


EMULATOR_MAX_BINDINGS = 64
"""Plans the emulator keeps per segment (least recently used first out): enough for the
sequence lengths of a decoding Loop."""


@dataclass(frozen=True, slots=True)
class _Planned:
    """A segment's plan as the emulator's cache keeps it: nothing to close, never stale."""

    plan: Plan
    stale: ClassVar[bool] = False

    def close(self) -> None:
        pass


@functools.cache
def _emulator_runner() -> SegmentedRunner:
    from kn_cuda_eval.planning.emulator import emulate
    from kn_cuda_eval.planning.plan import plan

    plans = BindingCache[_Planned](EMULATOR_MAX_BINDINGS)

    def run_segment(seg: Segment, arrays: Sequence[Any], bindings: Mapping[str, int]) -> list:
        def make() -> _Planned:
            return _Planned(plan(seg.graph, bindings=dict(bindings)))

        planned = plans.get(seg.graph.id, binding_key(bindings), make)
        return emulate(planned.plan, [np.asarray(a) for a in arrays])

    return SegmentedRunner(run_segment)


def emulate_graph(graph: Graph, inputs: Any) -> list[np.ndarray]:
    """Evaluate any graph through plans run by the plan emulator: directly planned when it has
    no Dynamic op, else segment by segment (plans cached per segment and binding)."""
    return _emulator_runner().run(graph, inputs)
