"""Devices and prepared graphs: `Device.best().prepare(graph, batch_size).eval(inputs)`.

The CPU device runs the NumPy reference executor. CUDA devices come from `kn_cuda_eval` when it is
installed and a GPU works; `Device.best()` probes for one without ever crashing and falls back to
the CPU.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kn_graph.cpu import bind_inputs, evaluate
from kn_graph.errors import CudaUnavailableError, ShapeMismatchError
from kn_graph.graph import Graph
from kn_graph.shape import BATCH

__all__ = ["Device", "PreparedGraph"]

log = logging.getLogger(__name__)

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Device:
    """A place to run graphs: `Device.cpu()`, `Device.cuda(i)` or `Device.best()`."""

    kind: str  # "cpu" | "cuda"
    index: int = 0

    @staticmethod
    def cpu() -> Device:
        return Device("cpu")

    @staticmethod
    def cuda(index: int = 0) -> Device:
        """A CUDA device; raises CudaUnavailableError (saying why) when it cannot be used."""
        reason = _cuda_problem(index)
        if reason is not None:
            raise CudaUnavailableError(f"CUDA device {index} is not usable: {reason}")
        return Device("cuda", index)

    @staticmethod
    def best() -> Device:
        """The first working CUDA device, else the CPU. Decided now, never crashes."""
        if _cuda_problem(0) is None:
            return Device("cuda", 0)
        return Device.cpu()

    def prepare(self, graph: Graph, batch_size: int | None = None) -> PreparedGraph:
        """Bind a graph to this device. With `batch_size=None` symbols are inferred per call."""
        if batch_size is not None and batch_size < 0:
            raise ShapeMismatchError(f"batch size must be >= 0, found {batch_size}")
        if self.kind == "cuda":
            raise CudaUnavailableError("the CUDA executor is not part of this build yet")
        return PreparedGraph(graph, self, batch_size)

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


def _cuda_problem(index: int) -> str | None:
    """Why CUDA device `index` cannot be used, or None when it can."""
    try:
        importlib.import_module("kn_cuda_eval")
    except ImportError:
        return "the kn_cuda_eval backend is not installed"
    try:
        probe = importlib.import_module("kn_cuda_eval.device").probe  # type: ignore[attr-defined]
        return probe(index)
    except Exception as e:  # any failure of the driver, CuPy or the libraries means "no CUDA"
        return f"{type(e).__name__}: {e}"


class PreparedGraph:
    """A graph bound to a device (and optionally to a batch size)."""

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

    def check_inputs(self, inputs: Inputs) -> dict[str, int]:
        """The symbol bindings the inputs imply (raises on any mismatch)."""
        return bind_inputs(self.graph, inputs, self.batch_size)[1]

    def __repr__(self) -> str:
        return f"<PreparedGraph on {self.device}, batch_size={self.batch_size}, {len(self.graph)} values>"
