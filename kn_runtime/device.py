"""Devices: `Device.best().prepare(graph, batch_size).eval(inputs)`.

The CPU device runs the planner's plan on the host (`kn_cuda_eval.cpu`: compiled C steps,
oneDNN convolutions and GEMMs); `Device.cpu(reference=True)` runs the NumPy reference executor,
the oracle of every test. CUDA devices run `kn_cuda_eval`'s `CudaExecutor` when CuPy, a driver
and a GPU work; `Device.best()` probes for one without ever crashing and falls back to the CPU.
`prepare` gives the one `PreparedGraph` (kn_runtime.prepared) over the device's backend
(kn_runtime.backend): an executor per binding of the size symbols, built on first use and cached.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kn_graph.errors import ArgumentTypeError, ArgumentValueError, CudaUnavailableError
from kn_graph.graph import Graph
from kn_runtime.backend import Backend, CudaBackend, HostBackend, ReferenceBackend
from kn_runtime.prepared import DEFAULT_MAX_BINDINGS, PreparedGraph, ValueSpecializing

if TYPE_CHECKING:
    from kn_graph.onnx import ValueSpecializedModel
    from kn_graph.optimizer import OptimizerSettings

__all__ = ["Device", "PreparedGraph"]

log = logging.getLogger(__name__)


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
        optimize: bool | None = None,
    ) -> PreparedGraph:
        """Bind a graph to this device. With `batch_size=None` symbols are inferred per call.
        `graph` may also be what `load_onnx` takes (a path, bytes, an `onnx.ModelProto`) or a
        `ValueSpecializedModel` (shapes decided by input values: one graph per distinct value).
        On CUDA, `settings` is a `kn_cuda_eval.cuda.device.ExecutorSettings` (None: the defaults).
        `max_bindings` executors are kept per graph (the whole graph, or each segment of a graph
        with data-dependent ops), one per binding of the size symbols (a sequence length, an
        image size; least recently used first out; None: `kn_runtime.prepared.DEFAULT_MAX_BINDINGS`,
        8), and as many prepared graphs of a `ValueSpecializedModel`, one per distinct value; on
        the CPU backend the executors of a graph share one arena that grows to the largest
        binding seen, with the weights packed once.
        `optimize`: rewrite the graph with `kn_graph.optimizer.optimize` first, as onnxruntime's
        session does (None, the default: on the fast CPU backend and on CUDA, not on the
        reference executor, which is the oracle and runs a graph as given; a graph that
        `optimize` returned is never optimized twice). `optimize=False` runs the graph as
        loaded."""
        max_bindings = _checked_max_bindings(max_bindings)
        batch_size = _checked_batch_size(batch_size)
        from kn_graph.onnx import ValueSpecializedModel

        graph = _as_graph(graph)
        if _checked_flag(optimize, "optimize", self.kind == "cuda" or self.fast):
            graph = _optimized(graph, self.optimizer_settings())
        source: Graph | ValueSpecializing = graph
        if isinstance(graph, ValueSpecializedModel):

            def prepare(g: Graph) -> PreparedGraph:  # each graph optimized as it is made, or not
                return self.prepare(
                    g, batch_size, settings=settings, max_bindings=max_bindings, optimize=False
                )

            source = ValueSpecializing(graph, prepare, max_bindings)
        return PreparedGraph(source, self, batch_size, self._backend(settings), max_bindings)

    def optimizer_settings(self) -> OptimizerSettings:
        """What `prepare` optimizes with here: the defaults, plus QDQ fusion on the fast CPU
        backend when oneDNN runs its integer convolutions (unless `KN_INT8_CONV=0`, see
        `onednn.int8.conv_enabled`; with 7-bit weights only where its int8 kernels are exact
        for no more: x86 without VNNI; docs/quantization.md). Fused, a QDQ convolution computes
        what onnxruntime's integer kernels do, exactly, on every CPU; its float form rounds each
        requantization of a float32 sum whose order depends on the ISA, and one value that lands
        the other side of a .5 moves whole layers after it (the per-channel MobileNetV2 fixture:
        1 unit on AVX2, 11 on AVX-512)."""
        from kn_graph.optimizer import OptimizerSettings

        if not self.fast:
            return OptimizerSettings()
        from kn_cuda_eval.cpu import onednn
        from kn_cuda_eval.cpu.runtime import onednn_usable, wait_policy

        wait_policy(self.threads)  # chosen for this device's threads, before oneDNN loads
        if not onednn_usable() or not onednn.conv_enabled():  # (onednn_usable first: it sets
            return OptimizerSettings()  # libgomp's spin count before oneDNN loads it)
        bits = 8 if onednn.has_vnni() else 7
        return OptimizerSettings(fuse_qdq=True, qdq_weight_bits=bits, split_int_weights=True)

    def _backend(self, settings: Any) -> Backend:
        """What runs a pure graph at one binding on this device (`kn_runtime.backend`)."""
        if self.kind == "cuda":
            return CudaBackend(self.index, settings)
        if self.fast:
            return HostBackend(self.threads)
        return ReferenceBackend(str(self))

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu (plan on the host)" if self.fast else "cpu (reference executor)"
        return f"cuda:{self.index}"


def _checked_flag(value: bool | None, name: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"prepare: {name} must be True, False or None, found {value!r}")
    return value


def _optimized(
    graph: Graph | ValueSpecializedModel, settings: OptimizerSettings
) -> Graph | ValueSpecializedModel:
    """`graph` through the optimizer unless it has been already (a Graph that `optimize`
    returned; a ValueSpecializedModel that optimizes the graphs it makes)."""
    from kn_graph.optimizer import optimize

    if isinstance(graph, Graph):
        return graph if graph.optimized else optimize(graph, settings)
    return graph if graph.optimizations else optimize(graph, settings)


def _checked_max_bindings(max_bindings: int | None) -> int:
    if max_bindings is None:
        return DEFAULT_MAX_BINDINGS
    if isinstance(max_bindings, bool) or not isinstance(max_bindings, int) or max_bindings < 1:
        raise ArgumentValueError(
            f"prepare: max_bindings must be an int >= 1, found {max_bindings!r}"
        )
    return max_bindings


def _checked_batch_size(batch_size: int | None) -> int | None:
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ArgumentTypeError(f"prepare: batch_size must be an int, found {batch_size!r}")
    if batch_size < 0:
        raise ArgumentValueError(f"prepare: batch_size must be >= 0, found {batch_size}")
    return int(batch_size)


def _as_graph(graph: Any) -> Graph | ValueSpecializedModel:
    """A Graph or a ValueSpecializedModel as given, else what `load_onnx` makes of it."""
    import os

    import onnx

    from kn_graph.onnx import ValueSpecializedModel, load_onnx

    if isinstance(graph, Graph | ValueSpecializedModel):
        return graph
    if not isinstance(graph, str | bytes | os.PathLike | onnx.ModelProto):
        raise ArgumentTypeError(
            f"prepare: expected a Graph, a ValueSpecializedModel or an ONNX model "
            f"(path, bytes, ModelProto), found {type(graph).__name__}"
        )
    return load_onnx(graph)


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
