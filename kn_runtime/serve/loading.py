"""`load_model`: an ONNX file prepared for serving, behind `BatchedModel`'s checks and batching;
Kyanite on a device, or onnxruntime (the peer the serving benchmark measures through the same
server code)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from kn_graph.errors import ArgumentValueError
from kn_runtime.serve.batching import BatchedModel

if TYPE_CHECKING:
    from kn_runtime.device import Device

__all__ = ["load_model", "resolve_device"]

log = logging.getLogger(__name__)


def load_model(
    path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    threads: int | None = None,
    max_batch_size: int | None = None,
    runtime: str = "kyanite",
    warmup: bool | Mapping[str, int] = False,
) -> BatchedModel:
    """An ONNX file prepared for serving: `device` "cpu" (the CPU backend with `threads`
    intra-op threads), "cuda" / "cuda:N", or "best" (a GPU when one works). `runtime=
    "onnxruntime"` puts an onnxruntime session (CPU, `threads` intra-op threads) behind the same
    checks and batching: the peer, measured through the same server code. `warmup` (True, or
    the sizes of the model's other symbols, `{"seq": 128}`) plans every batch size up to
    `max_batch_size` before this returns (`BatchedModel.warm_up`)."""
    from kn_graph.onnx import load_onnx
    from kn_runtime.device import Device

    if runtime == "onnxruntime":
        graph = load_onnx(os.fspath(path))
        return BatchedModel(
            Device.cpu(reference=True).prepare(graph),  # specs only: it never evaluates
            max_batch_size=max_batch_size,
            evaluate=_onnxruntime(path, threads),
        )
    if runtime != "kyanite":
        raise ArgumentValueError(f"runtime: expected kyanite or onnxruntime, found {runtime!r}")
    dev = resolve_device(device, threads)
    graph = load_onnx(os.fspath(path))
    model = BatchedModel(
        dev.prepare(graph, max_bindings=_bindings_kept(dev, max_batch_size)),
        max_batch_size=max_batch_size,
    )
    if warmup is not False:
        start = time.perf_counter()
        sizes = None if warmup is True else warmup
        planned = model.warm_up(sizes)
        log.info("%s: %d batch sizes planned in %.1f s", path, planned, time.perf_counter() - start)
    return model


def _bindings_kept(dev: Device, max_batch_size: int | None) -> int | None:
    """Executors a served graph keeps: a batching server meets every batch size up to
    `max_batch_size`, which the default (`DEFAULT_MAX_BINDINGS`, 8) would evict from each other
    and plan again. On the CPU, where executors share one arena and keep only their oneDNN
    primitives and compiled steps, room is made for each size beside the default (BERT-base,
    batches of 1-16 random sizes, 1 thread: 281-305 ms per sequence with 8 kept, 243-255 with
    24; alone 236). A GPU executor holds device memory of its own: the default stays there."""
    from kn_runtime.prepared import DEFAULT_MAX_BINDINGS

    if dev.kind != "cpu" or not max_batch_size:
        return None
    return DEFAULT_MAX_BINDINGS + max_batch_size


def _onnxruntime(
    path: str | os.PathLike[str], threads: int | None
) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or 0
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(os.fspath(path), opts, providers=["CPUExecutionProvider"])

    def evaluate(arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(session.run(None, arrays))

    return evaluate


def resolve_device(device: str, threads: int | None = None) -> Device:
    """The `Device` a server's `device` setting names: "cpu" (the CPU backend with `threads`
    intra-op threads), "cuda" / "cuda:N", or "best" (a GPU when one works, else the CPU with
    `threads`). Shared by everything a server loads (ONNX files, LLM folders)."""
    from kn_runtime.device import Device

    if device == "cpu":
        return Device.cpu(threads)
    if device == "best":
        dev = Device.best()
        return Device.cpu(threads) if dev.kind == "cpu" and threads is not None else dev
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2]
        if index and not index.isdigit():
            raise ArgumentValueError(f"device: expected cuda or cuda:N, found {device!r}")
        return Device.cuda(int(index or 0))
    raise ArgumentValueError(f"device: expected cpu, cuda, cuda:N or best, found {device!r}")
