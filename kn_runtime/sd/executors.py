"""Model executors for the pipeline: Kyanite (load_onnx -> optimize -> Device.prepare) or
onnxruntime, behind one small interface so the same pipeline code runs on either and the two
can be compared tensor for tensor."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kn_graph import Graph
from kn_graph.onnx import load_onnx
from kn_runtime import Device, PreparedGraph
from kn_runtime.sd.signature import PipelineError

if TYPE_CHECKING:
    import onnxruntime

__all__ = ["Executor", "KyaniteExecutor", "LoadedModel", "OnnxruntimeExecutor", "make_executor"]

Shapes = Mapping[str, Sequence[int]]


class LoadedModel(Protocol):
    """A model ready to run: feeds by input name, outputs in the model's output order."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...


class Executor(Protocol):
    """Loads ONNX files. `input_shapes` are the shapes the pipeline will feed (an executor may
    specialise on them); `times` collects named load-phase durations in seconds."""

    name: str

    def load(self, path: Path, input_shapes: Shapes, times: dict[str, float]) -> LoadedModel: ...


class _KyaniteModel:
    def __init__(self, prepared: PreparedGraph, input_names: list[str]) -> None:
        self.prepared = prepared
        self.input_names = input_names

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.prepared.eval({n: feeds[n] for n in self.input_names})


class KyaniteExecutor:
    """Kyanite: the graph is loaded with the fed shapes pinned (so shape arithmetic folds to
    constants), optimized, and prepared on `device`."""

    def __init__(self, device: Device, optimize: bool = True) -> None:
        self.device = device
        self.optimize = optimize
        self.name = f"kyanite ({device})"

    def load(self, path: Path, input_shapes: Shapes, times: dict[str, float]) -> LoadedModel:
        t0 = time.perf_counter()
        graph = load_onnx(path, input_shapes={k: list(v) for k, v in input_shapes.items()})
        times["load"] = time.perf_counter() - t0
        # a ValueSpecializedModel (shapes decided by input values) is left to Device.prepare
        if self.optimize and isinstance(graph, Graph):
            from kn_graph.optimizer import optimize

            t0 = time.perf_counter()
            graph = optimize(graph)
            times["optimize"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepared = self.device.prepare(graph)
        times["prepare"] = time.perf_counter() - t0
        return _KyaniteModel(prepared, graph.input_names)


class _OrtModel:
    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session = session

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(a) for a in self.session.run(None, dict(feeds))]


class OnnxruntimeExecutor:
    """onnxruntime's CPU provider: the independent reference the tests compare against."""

    name = "onnxruntime"

    def __init__(self, threads: int = 0) -> None:
        self.threads = threads

    def load(self, path: Path, input_shapes: Shapes, times: dict[str, float]) -> LoadedModel:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.log_severity_level = 3
        t0 = time.perf_counter()
        try:
            session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's pybind errors share no useful base class
            raise PipelineError(f"onnxruntime cannot load {path}: {e}") from None
        times["load"] = time.perf_counter() - t0
        return _OrtModel(session)


def make_executor(name: str, device: str = "best") -> Executor:
    """`kyanite` on cpu|cuda|best, or `onnxruntime` (CPU)."""
    if name == "onnxruntime":
        if importlib.util.find_spec("onnxruntime") is None:
            raise PipelineError(
                "--executor onnxruntime needs the 'onnxruntime' package: pip install 'kyanite[sd]'"
            )
        return OnnxruntimeExecutor()
    dev = {"cpu": Device.cpu, "cuda": Device.cuda, "best": Device.best}[device]()
    return KyaniteExecutor(dev)
