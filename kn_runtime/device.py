"""Devices and prepared graphs: `Device.best().prepare(graph, batch_size).eval(inputs)`.

The CPU device runs the planner's plan on the host (`kn_cuda_eval.cpu`: compiled C steps,
oneDNN convolutions and GEMMs); `Device.cpu(reference=True)` runs the NumPy reference executor,
the oracle of every test. CUDA devices run `kn_cuda_eval`'s
`CudaExecutor` (one per binding of the size symbols, built on first use and cached) when CuPy, a
driver and a GPU work; `Device.best()` probes for one without ever crashing and falls back to the
CPU.
"""

from __future__ import annotations

import collections
import importlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kn_graph.binding import bind_inputs, bind_shapes, inputs_in_order
from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CudaUnavailableError,
    KnError,
)
from kn_graph.graph import Graph
from kn_graph.reference import evaluate
from kn_graph.shape import BATCH

__all__ = ["Device", "PreparedGraph"]

log = logging.getLogger(__name__)

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Device:
    """A place to run graphs: `Device.cpu()` (`reference=True`: the NumPy reference executor),
    `Device.cuda(i)` or `Device.best()`."""

    kind: str  # "cpu" | "cuda"
    index: int = 0
    fast: bool = True
    """CPU only: run the planner's plan on the host (fused steps compiled as C, convolutions and
    GEMMs through oneDNN: `kn_cuda_eval.cpu`) instead of the NumPy reference executor."""
    threads: int | None = None
    """Intra-op threads of the CPU backend (None: the cores the process may use)."""

    @staticmethod
    def cpu(
        threads: int | None = None, *, reference: bool = False, fast: bool | None = None
    ) -> Device:
        """The CPU. By default the fast backend: the planner's plan run on the host (fused steps
        compiled as C, convolutions and GEMMs through oneDNN, `kn_cuda_eval.cpu`), with
        `threads` intra-op threads (None: the cores this process may use).
        `reference=True`: the NumPy reference executor (`kn_graph.reference.evaluate`), the oracle of
        every test — simple, slow, single-threaded in Python. `fast=True/False` is the older
        spelling of the same choice (`fast=False` is `reference=True`)."""
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise ArgumentTypeError(f"Device.cpu: threads must be an int, found {threads!r}")
        if threads is not None and threads < 1:
            raise ArgumentValueError(f"Device.cpu: threads must be >= 1, found {threads}")
        if fast and reference:
            raise ArgumentValueError("Device.cpu: fast=True and reference=True contradict")
        return Device("cpu", 0, not reference if fast is None else bool(fast), threads)

    @staticmethod
    def cuda(index: int = 0) -> Device:
        """A CUDA device; raises CudaUnavailableError (saying why) when it cannot be used."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ArgumentTypeError(f"Device.cuda: index must be an int >= 0, found {index!r}")
        reason = _cuda_problem(index)
        if reason is not None:
            raise CudaUnavailableError(f"CUDA device {index} is not usable: {reason}")
        return Device("cuda", index)

    @staticmethod
    def best() -> Device:
        """The first working CUDA device, else the CPU. Decided now, never crashes."""
        for index in range(max(_cuda_count(), 1)):
            if _cuda_problem(index) is None:
                return Device("cuda", index)
        return Device.cpu()

    def prepare(
        self,
        graph: Any,
        batch_size: int | None = None,
        *,
        settings: Any = None,
        max_bindings: int | None = None,
    ) -> PreparedGraph:
        """Bind a graph to this device. With `batch_size=None` symbols are inferred per call.
        `graph` may also be what `load_onnx` takes (a path, bytes, an `onnx.ModelProto`) or a
        `ValueSpecializedModel` (shapes decided by input values: one graph per distinct value).
        On CUDA, `settings` is a `kn_cuda_eval.cuda.device.ExecutorSettings` (None: the defaults).
        `max_bindings` executors are kept, one per binding of the size symbols (a sequence
        length, an image size; least recently used first out; None:
        `kn_cuda_eval.cpu.executor.DEFAULT_MAX_BINDINGS`, 8); on the CPU backend they share one
        arena that grows to the largest binding seen, with the weights packed once."""
        if max_bindings is not None and (
            isinstance(max_bindings, bool) or not isinstance(max_bindings, int) or max_bindings < 1
        ):
            raise ArgumentValueError(
                f"prepare: max_bindings must be an int >= 1, found {max_bindings!r}"
            )
        if max_bindings is None:
            from kn_cuda_eval.cpu.executor import DEFAULT_MAX_BINDINGS

            max_bindings = DEFAULT_MAX_BINDINGS
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer)
        ):
            raise ArgumentTypeError(f"prepare: batch_size must be an int, found {batch_size!r}")
        if batch_size is not None and batch_size < 0:
            raise ArgumentValueError(f"prepare: batch_size must be >= 0, found {batch_size}")
        batch_size = None if batch_size is None else int(batch_size)
        from kn_graph.onnx import ValueSpecializedModel, load_onnx

        if not isinstance(graph, Graph | ValueSpecializedModel):
            import os

            import onnx

            if not isinstance(graph, str | bytes | os.PathLike | onnx.ModelProto):
                raise ArgumentTypeError(
                    f"prepare: expected a Graph, a ValueSpecializedModel or an ONNX model "
                    f"(path, bytes, ModelProto), found {type(graph).__name__}"
                )
            graph = load_onnx(graph)
        if isinstance(graph, ValueSpecializedModel):
            return SpecializingPreparedGraph(graph, self, batch_size, settings, max_bindings)
        if self.kind == "cpu" and self.fast:
            return HostDevicePreparedGraph(graph, self, batch_size, max_bindings)
        if self.kind == "cuda" and graph.has_dynamic:
            return SegmentedCudaPreparedGraph(graph, self, batch_size, settings)
        if self.kind == "cuda":
            return CudaPreparedGraph(graph, self, batch_size, settings, max_bindings)
        return PreparedGraph(graph, self, batch_size)

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu (plan on the host)" if self.fast else "cpu (reference executor)"
        return f"cuda:{self.index}"


def _cuda_count() -> int:
    """CUDA devices the driver shows; 0 when anything is missing."""
    try:
        return int(importlib.import_module("kn_cuda_eval.cuda.device").device_count())
    except Exception:
        return 0


def _cuda_problem(index: int) -> str | None:
    """Why CUDA device `index` cannot be used, or None when it can."""
    try:
        importlib.import_module("kn_cuda_eval")
    except ImportError:
        return "the kn_cuda_eval backend is not installed"
    try:
        probe = importlib.import_module("kn_cuda_eval.cuda.device").probe  # type: ignore[attr-defined]
        reason = probe(index)
    except Exception as e:  # any failure of the driver, CuPy or the libraries means "no CUDA"
        reason = f"{type(e).__name__}: {e}"
    return None if reason is None else _one_line(reason)


def _one_line(text: str, limit: int = 300) -> str:
    """Library errors (CuPy's list the folders they searched) become one readable line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class PreparedGraph:
    """A graph bound to a device (and optionally to a batch size). `eval` is thread-safe: the
    CPU executor keeps no state between calls; CUDA evaluations of one graph take turns."""

    def __init__(self, graph: Graph, device: Device, batch_size: int | None) -> None:
        self.graph = graph
        self.device = device
        self.batch_size = batch_size
        if batch_size is not None:
            uses_batch = any(BATCH in graph[v].shape.symbols for v in graph.inputs)
            if not uses_batch and graph.inputs:
                log.info("batch size %d given but no input has a batch axis", batch_size)

    def eval(self, inputs: Inputs) -> list[np.ndarray]:
        """Evaluate for a list of arrays in input order (or a name → array map).

        Checks count, dtype and shape of every input (InputMismatchError / ShapeMismatchError)."""
        return evaluate(self.graph, inputs, self.batch_size)

    def profile(self, inputs: Inputs) -> Any:
        """Per-step device times of one evaluation (`kn_cuda_eval.cuda.device.Profile`); CUDA only."""
        raise KnError(
            f"profiling times device steps; {self.device} has none (use Device.cpu() or a CUDA "
            "device)"
        )

    def check_inputs(self, inputs: Inputs) -> dict[str, int]:
        """The symbol bindings the inputs imply (raises on any mismatch)."""
        return bind_inputs(self.graph, inputs, self.batch_size)[1]

    def __repr__(self) -> str:
        return f"<PreparedGraph on {self.device}, batch_size={self.batch_size}, {len(self.graph)} values>"


class CudaPreparedGraph(PreparedGraph):
    """A graph on a CUDA device: one `CudaExecutor` per binding of the size symbols (built on
    first use, or at once when `batch_size` fixes every symbol), the last `max_bindings` kept
    for later calls (least recently used first out: closed, their device memory freed)."""

    def __init__(
        self,
        graph: Graph,
        device: Device,
        batch_size: int | None,
        settings: Any,
        max_bindings: int = 8,
    ) -> None:
        super().__init__(graph, device, batch_size)
        self.settings = settings
        self.max_bindings = max_bindings
        self.executors: collections.OrderedDict[tuple[tuple[str, int], ...], Any] = (
            collections.OrderedDict()
        )
        # one arena and one stream per executor: evaluations from several threads take turns
        # (the GPU runs one stream's work in order anyway)
        self._lock = threading.RLock()
        symbols = (
            set().union(*(graph[v].shape.symbols for v in graph.inputs)) if graph.inputs else set()
        )
        if batch_size is not None and symbols <= {BATCH}:
            self.executor({BATCH: batch_size} if BATCH in symbols else {})

    def executor(self, bindings: Mapping[str, int]) -> Any:
        """The executor for these symbol values (planned, compiled and allocated once)."""
        key = tuple(sorted(bindings.items()))
        ex = self.executors.get(key)
        if ex is None:
            from kn_cuda_eval.cuda.device import CudaExecutor

            ex = CudaExecutor(
                self.graph,
                device=self.device.index,
                bindings=dict(bindings),
                settings=self.settings,
            )
            self.executors[key] = ex
            while len(self.executors) > self.max_bindings:
                self.executors.popitem(last=False)[1].close()
        else:
            self.executors.move_to_end(key)
        return ex

    def _bindings(self, inputs: Inputs) -> dict[str, int]:
        return bind_shapes(self.graph, inputs, self.batch_size)

    def eval(self, inputs: Inputs, *, return_device: bool = False) -> list[Any]:
        """Evaluate on the device; NumPy or device arrays in, NumPy (or device) arrays out.
        Thread-safe: concurrent calls are serialised."""
        with self._lock:
            ex = self.executor(self._bindings(inputs))
            return ex.eval(inputs, return_device=return_device)  # type: ignore[no-any-return]

    def profile(self, inputs: Inputs) -> Any:
        with self._lock:
            return self.executor(self._bindings(inputs)).profile(inputs)


class SegmentedCudaPreparedGraph(PreparedGraph):
    """A graph with data-dependent ops (`Dynamic`) on a CUDA device, run segment by segment
    (`kn_cuda_eval.planning.segments`): each segment on an executor made once per binding of its sizes;
    at each data-dependent point its arguments are copied to the host, it runs there (the CPU
    semantics), and the sizes it produces bind the next segment. Values stay on the device
    between segments."""

    def __init__(self, graph: Graph, device: Device, batch_size: int | None, settings: Any) -> None:
        super().__init__(graph, device, batch_size)
        from kn_cuda_eval.planning.segments import SegmentedRunner, per_binding

        self.settings = settings
        self.executors: list[Any] = []
        """Every executor made: one per segment and binding of its sizes."""
        self._lock = threading.RLock()
        self._runner = SegmentedRunner(
            per_binding(self._executor, lambda ex, a: ex.eval(list(a), return_device=True))
        )

    def _executor(self, seg: Any, bindings: dict[str, int]) -> Any:
        from kn_cuda_eval.cuda.device import CudaExecutor

        ex = CudaExecutor(
            seg.graph, device=self.device.index, bindings=bindings, settings=self.settings
        )
        self.executors.append(ex)
        return ex

    def eval(self, inputs: Inputs, *, return_device: bool = False) -> list[Any]:
        with self._lock:
            return self._runner.run(
                self.graph, inputs, self.batch_size, host_outputs=not return_device
            )

    def profile(self, inputs: Inputs) -> Any:
        raise KnError(
            "profiling a graph with data-dependent ops (run in segments) is not supported"
        )


class HostDevicePreparedGraph(PreparedGraph):
    """A graph on the CPU backend (`Device.cpu()`): a
    `kn_cuda_eval.cpu.executor.HostPreparedGraph` — one plan and `HostExecutor` per binding,
    at most `max_bindings` kept, all in one arena with the weights packed once; a graph with
    data-dependent ops runs in segments (`kn_cuda_eval.planning.segments`), each segment such a
    prepared graph of its own."""

    def __init__(
        self, graph: Graph, device: Device, batch_size: int | None, max_bindings: int
    ) -> None:
        super().__init__(graph, device, batch_size)
        from kn_cuda_eval.cpu.executor import HostPreparedGraph
        from kn_cuda_eval.planning.segments import SegmentedRunner

        self._lock = threading.RLock()
        self.max_bindings = max_bindings
        self._whole = (
            None
            if graph.has_dynamic
            else HostPreparedGraph(graph, batch_size, device.threads, max_bindings=max_bindings)
        )
        self.segments: dict[int, HostPreparedGraph] = {}
        """The prepared graph of each segment (by its graph's id), for a graph run in segments."""

        def run_segment(seg: Any, arrays: Sequence[Any], bindings: Mapping[str, int]) -> list:
            prepared = self.segments.get(seg.graph.id)
            if prepared is None:
                prepared = self.segments[seg.graph.id] = HostPreparedGraph(
                    seg.graph, None, device.threads, max_bindings=max_bindings, eager=False
                )
            return prepared.executor(bindings, check=False).eval(list(arrays))

        self._runner = SegmentedRunner(run_segment)

    def memory(self) -> dict[str, int]:
        """Bytes this prepared graph holds: its arenas (the mapped size, pages given back
        included), the packed weights, oneDNN's workspace, and the executors kept."""
        parts = [self._whole] if self._whole is not None else list(self.segments.values())
        total = {"arena": 0, "packed": 0, "workspace": 0, "executors": 0}
        for p in parts:
            for k, v in p.memory.nbytes().items():
                total[k] += v
            total["executors"] += len(p.executors)
        return total

    def eval(self, inputs: Inputs) -> list[np.ndarray]:
        with self._lock:
            if self._whole is not None:
                return self._whole.eval(inputs)  # type: ignore[no-any-return]
            return self._runner.run(self.graph, inputs, self.batch_size)

    def profile(self, inputs: Inputs) -> Any:
        if self._whole is None:
            raise KnError("profiling a graph with data-dependent ops (run in segments)")
        with self._lock:
            return self._whole.profile(inputs)


class SpecializingPreparedGraph(PreparedGraph):
    """A `ValueSpecializedModel` on a device: per call, the values of the shape-deciding inputs
    pick (or load, once) a graph in which they are constants; that graph is prepared on the
    device and evaluated with the other inputs. The prepared graphs of the last `max_bindings`
    distinct values are kept (least recently used first out)."""

    def __init__(
        self,
        model: Any,
        device: Device,
        batch_size: int | None,
        settings: Any,
        max_bindings: int,
    ) -> None:
        self.model = model
        self.device = device
        self.batch_size = batch_size
        self.settings = settings
        self.max_bindings = max_bindings
        self._prepared: collections.OrderedDict[int, PreparedGraph] = collections.OrderedDict()
        self._lock = threading.Lock()  # one load per new value, whichever thread asks first

    @property
    def graph(self) -> Graph:  # type: ignore[override]
        raise KnError(
            f"this model's shapes depend on the values of {self.model.value_inputs}: "
            "there is one graph per value (model.specialize(values))"
        )

    def _split(self, inputs: Inputs) -> tuple[PreparedGraph, dict[str, Any]]:
        names = self.model.input_names
        by_name = dict(zip(names, inputs_in_order(names, inputs, "model"), strict=True))
        with self._lock:
            graph = self.model.specialize({k: _pinned(v) for k, v in by_name.items()})
            prepared = self._prepared.get(id(graph))  # the model keeps its graphs: ids stay
            if prepared is None:
                prepared = self.device.prepare(
                    graph, self.batch_size, settings=self.settings, max_bindings=self.max_bindings
                )
                self._prepared[id(graph)] = prepared
                while len(self._prepared) > self.max_bindings:
                    self._prepared.popitem(last=False)
            else:
                self._prepared.move_to_end(id(graph))
        rest = {}
        for n in graph.input_names:
            if n in by_name:
                rest[n] = by_name[n]
            else:  # element i of a sequence input, `name.i`
                base, _, i = n.rpartition(".")
                rest[n] = by_name[base][int(i)]
        return prepared, rest

    def eval(self, inputs: Inputs) -> list[Any]:
        """Outputs in the model's terms: a sequence output is a list of arrays."""
        from kn_graph.onnx.sequences import regroup_outputs

        prepared, rest = self._split(inputs)
        return regroup_outputs(self.model.model, prepared.graph, prepared.eval(rest))

    def profile(self, inputs: Inputs) -> Any:
        prepared, rest = self._split(inputs)
        return prepared.profile(rest)

    def check_inputs(self, inputs: Inputs) -> dict[str, int]:
        prepared, rest = self._split(inputs)
        return prepared.check_inputs(rest)

    def __repr__(self) -> str:
        return f"<SpecializingPreparedGraph on {self.device}, {self.model!r}>"


def _pinned(v: Any) -> Any:
    """A model input as `specialize` takes it: an array, or a list of arrays (a sequence)."""
    if isinstance(v, list | tuple):
        return [np.asarray(a) for a in v]
    return np.asarray(v)
