"""`PreparedGraph`: a graph bound to a device, the same for every device. Per call it binds the
size symbols from the input shapes once, then runs a pure graph on the backend's executor for
that binding (built on first use, kept in a `BindingCache`), a graph with data-dependent ops
segment by segment (`kn_cuda_eval.planning.segments.SegmentedRunner`, each segment's executors
in the same cache), and a `ValueSpecializedModel` through the graph its shape-deciding values
pick (`ValueSpecializing`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kn_graph.binding import bind_inputs, bind_shapes, inputs_in_order
from kn_graph.errors import KnError
from kn_graph.graph import Graph
from kn_graph.shape import BATCH
from kn_runtime.backend import Backend, Executor

if TYPE_CHECKING:
    from kn_cuda_eval.planning.cache import BindingCache
    from kn_cuda_eval.planning.segments import Segment, SegmentedRunner
    from kn_graph.onnx import ValueSpecializedModel

__all__ = ["DEFAULT_MAX_BINDINGS", "PreparedGraph", "ValueSpecializing"]

log = logging.getLogger(__name__)

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]

DEFAULT_MAX_BINDINGS = 8
"""Executors a prepared graph keeps per graph (a whole graph, each segment of one), one per
binding of its size symbols (least recently used first out), and prepared graphs a
value-specialized model keeps, one per distinct value: 8 covers a batch, a few sequence-length
buckets and image sizes while bounding what a stream of distinct shapes can hold. On the CPU
they share one arena, the packed weights and oneDNN's workspace, so each one kept costs its
oneDNN primitives and compiled steps only."""

SMALL_SEGMENT_ELEMENTS = 1 << 20
"""A segment of a data-dependent graph that keeps meeting new sizes (a decoder Loop's body,
whose sequence grows by one per step) runs on the NumPy reference once more distinct bindings
have been planned for it than the cache keeps, while all its values together hold at most this
many elements: planning and compiling a size seen once costs more than running a small segment
once (a 501-step decoder loop: 8.4 s with every step planned, 2.7 s so; onnxruntime 0.08 s)."""


def _signature(inputs: Inputs) -> Hashable | None:
    """The shapes and dtypes of NumPy inputs (with their names when given by name), hashable;
    None for anything else (device arrays, lists), which always takes the full path."""
    if isinstance(inputs, Mapping):
        items = inputs.items()
        if all(type(a) is np.ndarray for _, a in items):
            return tuple((n, a.shape, a.dtype) for n, a in items)
        return None
    if isinstance(inputs, list | tuple) and all(type(a) is np.ndarray for a in inputs):
        return tuple((a.shape, a.dtype) for a in inputs)
    return None


class PreparedGraph:
    """A graph bound to a device (and optionally to a batch size): `eval`, `profile`,
    `check_inputs`, and on the CPU backend `memory()`. Thread-safe: evaluations of one prepared
    graph take turns (one arena, one stream per executor); the reference executor keeps no
    state, so its evaluations run side by side."""

    stale: ClassVar[bool] = False
    """As kept in a `BindingCache` (a value-specialized model's graphs): never stale, it
    rebuilds what went stale itself."""

    def __init__(
        self,
        graph: Graph | ValueSpecializing,
        device: Any,
        batch_size: int | None,
        backend: Backend,
        max_bindings: int = DEFAULT_MAX_BINDINGS,
    ) -> None:
        """`graph`: a graph, or a value-specialized model's graphs (`ValueSpecializing`, which
        prepares each on the device itself); `device`: the `kn_runtime.Device`."""
        from kn_cuda_eval.planning.cache import BindingCache

        self.device = device
        self.batch_size = batch_size
        self.backend = backend
        self.max_bindings = max_bindings
        self.cache: BindingCache[Executor] = BindingCache(max_bindings)
        """The executors kept: per graph (`graph.id`: the whole graph or one segment), one per
        binding of its size symbols."""
        self._lock = threading.RLock()
        self._graph: Graph | None = None
        self._specializing: ValueSpecializing | None = None
        self._direct: Executor | None = None  # the reference executor: every binding
        self._runner: SegmentedRunner | None = None
        self._segment_builds: dict[int, int] = {}  # segment graph id -> executors built
        self._last: tuple[Hashable, int, Executor] | None = None
        """The last call's input signature (`_signature`), the cache's `dropped` count then, and
        the executor it ran on: a call with the same signature skips binding and the lookup."""
        self._seg_last: dict[int, tuple[Hashable, int, Executor]] = {}
        self._batched: Any = None  # the BatchedModel of `run_batch`, made on first use
        """The same per segment (graph id): its last binding, `dropped`, executor."""
        if isinstance(graph, ValueSpecializing):
            self._specializing = graph
            return
        self._graph = graph
        uses_batch = any(BATCH in graph[v].shape.symbols for v in graph.inputs)
        if batch_size is not None and graph.inputs and not uses_batch:
            log.info("batch size %d given but no input has a batch axis", batch_size)
        if not backend.per_binding:
            self._direct = backend.executor(
                graph, {} if batch_size is None else {BATCH: batch_size}
            )
        elif graph.has_dynamic:
            from kn_cuda_eval.cpu.recurrence import HOST_KINDS
            from kn_cuda_eval.planning.segments import SegmentedRunner

            self._runner = SegmentedRunner(self._run_segment, HOST_KINDS)
        else:
            fixed = self._fixed_bindings()
            if fixed is not None:
                self.executor(fixed)

    def _fixed_bindings(self) -> dict[str, int] | None:
        """The binding of a graph with nothing left to bind (no size symbol in its inputs, or
        only B with a batch size): planned at once, as onnxruntime's session does all its work
        up front, so that the first evaluation costs what every other one does."""
        graph = self.graph
        symbols = set().union(*(graph[v].shape.symbols for v in graph.inputs))
        if not symbols:
            return {}
        if self.batch_size is not None and symbols == {BATCH}:
            return {BATCH: self.batch_size}
        return None

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            assert self._specializing is not None
            raise KnError(
                f"this model's shapes depend on the values of "
                f"{self._specializing.model.value_inputs}: there is one graph per value "
                "(model.specialize(values))"
            )
        return self._graph

    def executor(self, bindings: Mapping[str, int]) -> Executor:
        """The executor of the whole graph at these symbol values (planned, compiled and
        allocated once, or again after it went stale or was evicted)."""
        return self._executor(self.graph, bindings)

    def warm(self, bindings: Mapping[str, int]) -> bool:
        """Plan, compile and allocate the evaluation at these symbol values now, so that the first
        call at them costs what every other one does (a server's warm-up). False when there is
        nothing to do per binding: the backend planned once for every size, or the graph runs in
        segments or per input value (those plan as they meet sizes)."""
        if self._specializing is not None or self._direct is not None or self._runner is not None:
            return False
        with self._lock:
            self.executor(bindings)
        return True

    def _executor(self, graph: Graph, bindings: Mapping[str, int]) -> Executor:
        from kn_cuda_eval.planning.cache import binding_key

        def make() -> Executor:
            return self.backend.executor(graph, bindings)

        return self.cache.get(graph.id, binding_key(bindings), make)

    def _kw(self, return_device: bool) -> dict[str, bool]:
        """Where outputs go: device memory when asked and the backend has any (a host backend's
        arrays are where they were made)."""
        return {"return_device": True} if return_device and self.backend.device_arrays else {}

    def _run_segment(
        self, seg: Segment, arrays: Sequence[Any], bindings: Mapping[str, int]
    ) -> list[Any]:
        from kn_cuda_eval.planning.cache import binding_key

        graph = seg.graph
        key = binding_key(bindings)
        last = self._seg_last.get(graph.id)
        if last is not None and last[0] == key and last[1] == self.cache.dropped:
            ex = last[2]
            if not ex.stale:  # as `_repeat_executor`: this segment's last binding again
                return ex.eval(list(arrays), **self._kw(True))
        fresh = not self.cache.has(graph.id, key)
        if fresh and self._churning(graph, bindings):
            from kn_graph.reference import evaluate

            return evaluate(graph, list(arrays), known=bindings)
        if fresh:
            self._segment_builds[graph.id] = self._segment_builds.get(graph.id, 0) + 1
        ex = self._executor(graph, bindings)
        self._seg_last[graph.id] = (key, self.cache.dropped, ex)
        return ex.eval(list(arrays), **self._kw(True))

    def _churning(self, graph: Graph, bindings: Mapping[str, int]) -> bool:
        """Whether a segment meets more distinct sizes than are worth planning and is small
        enough for NumPy (`SMALL_SEGMENT_ELEMENTS`); host backends only (the reference's
        arrays are host arrays)."""
        if self.backend.device_arrays or self._segment_builds.get(graph.id, 0) < self.max_bindings:
            return False
        total = 0
        for info in graph.value_infos():
            total += info.shape.size().eval(bindings)
            if total > SMALL_SEGMENT_ELEMENTS:
                return False
        return True

    def eval(self, inputs: Inputs, *, return_device: bool = False) -> list[Any]:
        """Evaluate for a list of arrays in input order (or a name → array map): NumPy arrays
        (or, on a CUDA device, device arrays) in, NumPy arrays out, or with `return_device=True`
        device arrays. Checks count, dtype and shape of every input (InputMismatchError /
        ShapeMismatchError). A value-specialized model's sequence outputs are lists."""
        if self._specializing is not None:
            return self._specializing.eval(inputs, return_device)
        if self._direct is not None:
            return self._direct.eval(inputs)
        with self._lock:
            if self._runner is not None:
                host = not (return_device and self.backend.device_arrays)
                return self._runner.run(self.graph, inputs, self.batch_size, host_outputs=host)
            return self._repeat_executor(inputs).eval(inputs, **self._kw(return_device))

    def resident_executor(self, inputs: Inputs) -> Any:
        """The executor `eval(inputs)` would run when it keeps inputs in its arena between
        evaluations (the CPU backend's `input_view`, `kept_inputs`), else None (other devices,
        graphs run in segments or per value). A decoder keeps its cache there."""
        if self._specializing is not None or self._direct is not None or self._runner is not None:
            return None
        with self._lock:
            ex = self._repeat_executor(inputs)
        return ex if hasattr(ex, "input_view") else None

    def _repeat_executor(self, inputs: Inputs) -> Executor:
        """The executor for these inputs; a call whose inputs have the shapes, dtypes (and names)
        of the last one reuses its executor while the cache has let go of nothing since (a
        VAD's chunk, a wake-word head's frame: ~20 µs of binding and lookup saved per call).
        Every input is still checked against the plan by the executor itself."""
        sig = _signature(inputs)
        last = self._last
        if sig is not None and last is not None and last[0] == sig:
            ex = last[2]
            if last[1] == self.cache.dropped and not ex.stale:
                return ex
        ex = self.executor(bind_shapes(self.graph, inputs, self.batch_size))
        self._last = None if sig is None else (sig, self.cache.dropped, ex)
        return ex

    def run_batch(
        self, requests: Sequence[Mapping[str, np.ndarray]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Many requests (name -> array maps, each with its own batch axis), as few evaluations as
        the graph allows: concatenated along the batch axis, ragged sequences padded when the
        model has an attention mask, one evaluation per request when neither is possible; each
        request's outputs by name (`kn_runtime.serve.BatchedModel.run_batch`)."""
        batched = self._batched
        if batched is None:
            from kn_runtime.serve.batching import BatchedModel

            batched = self._batched = BatchedModel(self)
        return batched.run_batch(requests, return_exceptions=return_exceptions)

    def profile(self, inputs: Inputs) -> Any:
        """Per-step device times of one evaluation (`kn_cuda_eval.planning.profile.Profile`):
        the CPU backend and CUDA devices; a graph with data-dependent ops gets one row per
        segment and host point (wall time), as it runs in segments."""
        if self._specializing is not None:
            prepared, rest = self._specializing.pick(inputs)
            return prepared.profile(rest)
        if self._direct is not None:
            return self._direct.profile(inputs)
        if self._runner is not None:  # per stage: segments and host points, wall time
            from kn_cuda_eval.planning.profile import Profile, ProfileRow

            rows: list[ProfileRow] = []
            with self._lock:
                self._runner.run(self.graph, inputs, self.batch_size, timings=rows)
            return Profile(f"{self.device}, in segments and host points (wall time)", tuple(rows))
        with self._lock:
            return self.executor(bind_shapes(self.graph, inputs, self.batch_size)).profile(inputs)

    def check_inputs(self, inputs: Inputs) -> dict[str, int]:
        """The symbol bindings the inputs imply (raises on any mismatch)."""
        if self._specializing is not None:
            prepared, rest = self._specializing.pick(inputs)
            return prepared.check_inputs(rest)
        return bind_inputs(self.graph, inputs, self.batch_size)[1]

    def memory(self) -> dict[str, int]:
        """Bytes this prepared graph holds (the CPU backend): its arenas (the mapped size, pages
        given back included), the packed weights, oneDNN's workspace, and the executors kept."""
        if self._specializing is not None:
            total: dict[str, int] = {}
            for prepared in self._specializing.prepared():
                for k, v in prepared.memory().items():
                    total[k] = total.get(k, 0) + v
            return total
        with self._lock:  # not while an evaluation makes a segment's memory
            held = self.backend.memory()
            if held is None:
                raise KnError(f"memory(): {self.device} does not report what it holds")
            return held | {"executors": len(self.cache)}

    def close(self) -> None:
        """Close every executor kept (their device memory, oneDNN primitives and arenas go);
        the prepared graph builds them again when evaluated."""
        with self._lock:
            if self._specializing is not None:
                self._specializing.close()
            self.cache.clear()
            self._last = None
            self._seg_last.clear()
            self.backend.close()

    def __repr__(self) -> str:
        if self._specializing is not None:
            return f"<PreparedGraph on {self.device}, {self._specializing.model!r}>"
        return (
            f"<PreparedGraph on {self.device}, batch_size={self.batch_size}, "
            f"{len(self.graph)} values>"
        )


class ValueSpecializing:
    """A `ValueSpecializedModel` on a device: per call, the values of the shape-deciding inputs
    pick (or load, once) a graph in which they are constants; that graph is prepared on the
    device and evaluated with the other inputs. The prepared graphs of the last `max_bindings`
    distinct values are kept (least recently used first out, closed). `prepare` is the
    device's, with the batch size, settings and bound of the prepared model."""

    def __init__(
        self,
        model: ValueSpecializedModel,
        prepare: Callable[[Graph], PreparedGraph],
        max_bindings: int,
    ) -> None:
        from kn_cuda_eval.planning.cache import BindingCache

        self.model = model
        self._prepare = prepare
        self._prepared: BindingCache[PreparedGraph] = BindingCache(max_bindings)
        self._lock = threading.Lock()  # one load per new value, whichever thread asks first

    def pick(self, inputs: Inputs) -> tuple[PreparedGraph, dict[str, Any]]:
        """The prepared graph of these inputs' values, and the inputs it takes (by name)."""
        names = self.model.input_names
        by_name = dict(zip(names, inputs_in_order(names, inputs, "model"), strict=True))
        with self._lock:
            graph = self.model.specialize({k: _pinned(v) for k, v in by_name.items()})
            # the model keeps its graphs: one graph per value, its id the key
            prepared = self._prepared.get(None, graph.id, lambda: self._prepare(graph))
        rest = {}
        for n in graph.input_names:
            if n in by_name:
                rest[n] = by_name[n]
            else:  # element i of a sequence input, `name.i`
                base, _, i = n.rpartition(".")
                rest[n] = by_name[base][int(i)]
        return prepared, rest

    def eval(self, inputs: Inputs, return_device: bool) -> list[Any]:
        """Outputs in the model's terms: a sequence output is a list of arrays."""
        from kn_graph.onnx.sequences import regroup_outputs

        prepared, rest = self.pick(inputs)
        outs = prepared.eval(rest, return_device=return_device)
        return regroup_outputs(self.model.model, prepared.graph, outs)

    def prepared(self) -> list[PreparedGraph]:
        return self._prepared.values()

    def close(self) -> None:
        self._prepared.clear()


def _pinned(v: Any) -> Any:
    """A model input as `specialize` takes it: an array, or a list of arrays (a sequence)."""
    if isinstance(v, list | tuple):
        return [np.asarray(a) for a in v]
    return np.asarray(v)
