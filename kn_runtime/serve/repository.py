"""A Triton model repository that runs Kyanite: `write_repository(model.onnx, out)` writes
`out/<name>/config.pbtxt` (inputs and outputs from the graph, the batch axis folded into
`max_batch_size`, -1 for every other symbolic size, dynamic batching, an instance group) and
`out/<name>/1/model.py`, whose `TritonPythonModel` (defined here) loads the model with
`load_model` and answers the requests of each `execute` with one `BatchedModel.run_batch`.

    kyanite/
      config.pbtxt
      1/model.py     from kn_runtime.serve.repository import TritonPythonModel
      1/model.onnx   (or a path in config.pbtxt's parameters: `copy_model=False`)

Any Triton server with the Python backend serves it, provided its Python can import kyanite
(`pip install kyanite` in the server's image, or `python_path=` a folder that holds it). Tensors
cross the backend's boundary by DLPack: the stub's own NumPy conversion (`as_numpy`,
`Tensor(name, array)`) is compiled against NumPy 1's ABI in the stubs PyTriton 0.5-0.7 ship and
reads NumPy 2 arrays as zeros (see `kn_runtime.serve.triton`); DLPack does not go through it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kn_graph.errors import ArgumentValueError
from kn_runtime.serve.batching import BatchedModel, TensorSpec

__all__ = ["TRITON_TYPES", "TritonPythonModel", "config_text", "triton_type", "write_repository"]

log = logging.getLogger(__name__)

TRITON_TYPES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "TYPE_BOOL",
    np.dtype(np.uint8): "TYPE_UINT8",
    np.dtype(np.uint16): "TYPE_UINT16",
    np.dtype(np.uint32): "TYPE_UINT32",
    np.dtype(np.uint64): "TYPE_UINT64",
    np.dtype(np.int8): "TYPE_INT8",
    np.dtype(np.int16): "TYPE_INT16",
    np.dtype(np.int32): "TYPE_INT32",
    np.dtype(np.int64): "TYPE_INT64",
    np.dtype(np.float16): "TYPE_FP16",
    np.dtype(np.float32): "TYPE_FP32",
    np.dtype(np.float64): "TYPE_FP64",
}
"""NumPy dtypes and the `data_type` Triton's model configuration names them by."""

MODEL_FILE = "model.onnx"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# parameters model.py reads back from config.pbtxt
P_MODEL = "kyanite_model"
P_DEVICE = "kyanite_device"
P_THREADS = "kyanite_threads"
P_RUNTIME = "kyanite_runtime"
P_WARMUP = "kyanite_warmup"

MODEL_PY = '''"""Kyanite behind Triton's Python backend (written by kn_runtime.serve.repository).
The model file, device and threads are parameters in ../config.pbtxt."""

import sys

_PATH = {path!r}  # a folder put first on sys.path (where kyanite is installed), or None
if _PATH and _PATH not in sys.path:
    sys.path.insert(0, _PATH)

from kn_runtime.serve.repository import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
'''


def triton_type(dtype: np.dtype, what: str) -> str:
    """Triton's `data_type` of a NumPy dtype; ArgumentValueError naming `what` for a dtype Triton
    has no type for."""
    try:
        return TRITON_TYPES[np.dtype(dtype)]
    except KeyError:
        raise ArgumentValueError(
            f"{what}: dtype {np.dtype(dtype).name} has no Triton data type (expected one of "
            f"{', '.join(sorted(d.name for d in TRITON_TYPES))})"
        ) from None


def _quoted(text: str, what: str) -> str:
    if any(c in text for c in '"\\\n\r'):
        raise ArgumentValueError(f"{what}: {text!r} cannot be written into config.pbtxt")
    return f'"{text}"'


def _tensor(spec: TensorSpec, batched: bool, what: str) -> str:
    """One `input`/`output` entry: the batch axis left out when Triton batches (it is
    `max_batch_size`'s), -1 for a symbolic size; a scalar is `[1]` reshaped to `[]`."""
    shape = spec.shape[1:] if batched and spec.batched else spec.shape
    dims = [-1 if d is None else d for d in shape]
    reshape = ""
    if not dims:
        dims, reshape = [1], " reshape: { shape: [ ] }"
    return (
        f"  {{ name: {_quoted(spec.name, what)} data_type: {triton_type(spec.dtype, what)} "
        f"dims: [ {', '.join(str(d) for d in dims)} ]{reshape} }}"
    )


def config_text(
    model: BatchedModel,
    *,
    name: str = "kyanite",
    max_batch_size: int = 16,
    instances: int = 1,
    dynamic_batching: bool = True,
    max_queue_delay_us: int = 0,
    kind: str = "KIND_CPU",
    parameters: dict[str, str] | None = None,
    gpus: Sequence[int] | None = None,
) -> str:
    """The `config.pbtxt` of a model served by the Python backend. A model whose requests cannot
    share an evaluation (`model.batchable` is False) gets `max_batch_size: 0` and its full shapes:
    Triton then hands each request over as it came. `gpus` (KIND_GPU): the GPUs that get
    `instances` each (None: every GPU)."""
    if kind not in ("KIND_CPU", "KIND_GPU"):
        raise ArgumentValueError(f"kind: expected KIND_CPU or KIND_GPU, found {kind!r}")
    if gpus is not None:
        if kind != "KIND_GPU":
            raise ArgumentValueError(f"gpus: only with kind KIND_GPU, found kind {kind}")
        if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise ArgumentValueError(f"gpus: expected GPU indices >= 0, found {list(gpus)!r}")
    for value, what in ((max_batch_size, "max_batch_size"), (instances, "instances")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentValueError(f"{what}: expected a positive int, found {value!r}")
    if isinstance(max_queue_delay_us, bool) or not isinstance(max_queue_delay_us, int):
        raise ArgumentValueError(
            f"max_queue_delay_us: expected an int, found {max_queue_delay_us!r}"
        )
    if max_queue_delay_us < 0:
        raise ArgumentValueError(f"max_queue_delay_us must be >= 0, found {max_queue_delay_us}")
    batched = model.batchable
    lines = [
        f"name: {_quoted(name, 'name')}",
        'backend: "python"',
        f"max_batch_size: {max_batch_size if batched else 0}",
        "input [",
        ",\n".join(_tensor(s, batched, f"input '{s.name}'") for s in model.inputs),
        "]",
        "output [",
        ",\n".join(_tensor(s, batched, f"output '{s.name}'") for s in model.outputs),
        "]",
    ]
    if batched and dynamic_batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}")
    placed = "" if gpus is None else f" gpus: [ {', '.join(str(g) for g in gpus)} ]"
    lines.append(f"instance_group [ {{ count: {instances} kind: {kind}{placed} }} ]")
    for key, text in (parameters or {}).items():
        lines.append(
            f"parameters {{ key: {_quoted(key, 'parameter')} "
            f"value: {{ string_value: {_quoted(text, f'parameter {key}')} }} }}"
        )
    return "\n".join(lines) + "\n"


def write_repository(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    name: str = "kyanite",
    max_batch_size: int = 16,
    instances: int = 1,
    dynamic_batching: bool = True,
    max_queue_delay_us: int = 0,
    kind: str = "KIND_CPU",
    copy_model: bool = True,
    threads: int | None = 1,
    python_path: str | os.PathLike[str] | None = None,
    runtime: str = "kyanite",
    warmup: bool | Mapping[str, int] = False,
    gpus: Sequence[int] | None = None,
) -> Path:
    """Write (or overwrite) `out_dir/<name>/` and return that folder. The model is loaded here
    once, for its inputs and outputs (and to fail now, not in the server, on a model Kyanite
    cannot load). `copy_model=False` refers to the model by its absolute path instead of copying
    it (with its external data) into `1/`. `threads`: intra-op threads of each instance's CPU
    backend (None: all cores; `instances` times `threads` should not exceed them). `kind="KIND_GPU"`
    runs each instance on its GPU (`Device.cuda(device_id)`). `python_path`: a folder model.py
    puts first on `sys.path`, for a server whose Python lacks kyanite. `runtime="onnxruntime"`
    puts an onnxruntime session behind the same model.py (the peer, as `load_model` does).
    `warmup` (True, or the sizes of the model's other symbols, `{"seq": 128}`): each instance
    plans every batch size up to `max_batch_size` when Triton loads it, before its first
    request (`load_model(warmup=...)`). `gpus`: with KIND_GPU, the GPUs that get `instances`
    each (None: every GPU)."""
    from kn_graph.onnx import load_onnx
    from kn_runtime.device import Device

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ArgumentValueError(
            f"name: expected letters, digits, '_', '.', '-' (a folder name), found {name!r}"
        )
    src = Path(model_path)
    if not src.is_file():
        raise ArgumentValueError(f"model_path: '{src}' is not a file")
    # the NumPy reference prepares nothing ahead: the specs without packing any weight
    model = BatchedModel(Device.cpu(reference=True).prepare(load_onnx(str(src))))
    params = {P_MODEL: MODEL_FILE if copy_model else str(src.resolve())}
    params[P_DEVICE] = "cuda" if kind == "KIND_GPU" else "cpu"
    if threads is not None:
        params[P_THREADS] = str(threads)
    if runtime not in ("kyanite", "onnxruntime"):
        raise ArgumentValueError(f"runtime: expected kyanite or onnxruntime, found {runtime!r}")
    if runtime != "kyanite":
        params[P_RUNTIME] = runtime
    if warmup is not False:
        params[P_WARMUP] = _warmup_text(warmup)
    text = config_text(
        model,
        name=name,
        max_batch_size=max_batch_size,
        instances=instances,
        dynamic_batching=dynamic_batching,
        max_queue_delay_us=max_queue_delay_us,
        kind=kind,
        parameters=params,
        gpus=gpus,
    )
    folder = Path(out_dir) / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(text)
    extra = None if python_path is None else str(Path(python_path).resolve())
    (version / "model.py").write_text(MODEL_PY.format(path=extra))
    if copy_model:
        _copy_model(src, version)
    elif (version / MODEL_FILE).exists():
        (version / MODEL_FILE).unlink()
    log.info("wrote the Triton model repository %s", folder)
    return folder


def _warmup_text(warmup: bool | Mapping[str, int]) -> str:
    """`warmup` as config.pbtxt's parameter: "true", or "seq=128,past=0"."""
    if warmup is True:
        return "true"
    if not isinstance(warmup, Mapping):
        raise ArgumentValueError(
            f"warmup: expected True, False or {{symbol: size}}, found {warmup!r}"
        )
    for key, size in warmup.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise ArgumentValueError(f"warmup: expected symbol names, found {key!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ArgumentValueError(f"warmup[{key!r}]: expected a size >= 0, found {size!r}")
    return ",".join(f"{k}={v}" for k, v in warmup.items())


def _warmup_value(text: str) -> bool | dict[str, int]:
    """The parameter back (`_warmup_text`'s inverse)."""
    if text == "true":
        return True
    sizes = {}
    for item in text.split(","):
        key, _, size = item.partition("=")
        sizes[key] = int(size)
    return sizes


def _copy_model(src: Path, version: Path) -> None:
    """The ONNX file as `1/model.onnx`, with the external-data files it names beside it (their
    paths are relative to the model's folder)."""
    import onnx

    shutil.copyfile(src, version / MODEL_FILE)
    proto = onnx.load(str(src), load_external_data=False)
    tensors = list(proto.graph.initializer)
    for node in proto.graph.node:
        tensors.extend(a.t for a in node.attribute if a.HasField("t"))
    files = {e.value for t in tensors for e in t.external_data if e.key == "location"}
    for location in sorted(files):  # one file usually holds every tensor: copied once
        dst = (version / location).resolve()
        if not dst.is_relative_to(version.resolve()):
            raise ArgumentValueError(
                f"model_path: external data '{location}' lies outside the model's folder"
            )
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.parent / location, dst)


# -- the model Triton's Python backend runs -----------------------------------------------------


class TritonPythonModel:
    """Kyanite in Triton's Python backend: `initialize` loads the model named in config.pbtxt
    (`load_model`, on the instance's GPU for KIND_GPU), `execute` answers every request Triton
    hands over (a dynamic batch) from one `run_batch`; a request that fails (a shape the model
    rejects, an evaluation error) gets its own error response and the others their outputs."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        from kn_runtime.serve.loading import load_model

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(params.get(P_MODEL, MODEL_FILE))
        if not path.is_absolute():
            path = Path(args["model_repository"]) / args["model_version"] / path
        device = params.get(P_DEVICE, "cpu")
        if device == "cuda" or args.get("model_instance_kind") == "GPU":
            device = f"cuda:{int(args.get('model_instance_device_id', 0))}"
        threads = int(params[P_THREADS]) if params.get(P_THREADS) else None
        warmup = _warmup_value(params[P_WARMUP]) if params.get(P_WARMUP) else False
        self.model = load_model(
            path,
            device=device,
            threads=threads,
            max_batch_size=config.get("max_batch_size") or None,  # executors kept per size
            runtime=params.get(P_RUNTIME, "kyanite"),
            warmup=warmup,
        )
        log.info("kyanite: %s on %s (%s)", path, device, args.get("model_instance_name"))

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        pb = self._pb
        names = self.model.input_names
        arrays: list[Any] = []
        for request in requests:
            try:
                got = {}
                for n in names:
                    tensor = pb.get_input_tensor_by_name(request, n)
                    if tensor is not None:  # Triton checks required inputs; run_batch names it
                        got[n] = _to_numpy(tensor)
                arrays.append(got)
            except Exception as exc:  # a tensor that cannot be read fails its request alone
                arrays.append(exc)
        readable = [a for a in arrays if not isinstance(a, Exception)]
        answers = iter(self.model.run_batch(readable, return_exceptions=True))
        responses = []
        for a in arrays:
            result = a if isinstance(a, Exception) else next(answers)
            if isinstance(result, BaseException):
                error = pb.TritonError(f"{type(result).__name__}: {result}")
                responses.append(pb.InferenceResponse(output_tensors=[], error=error))
            else:
                tensors = [_to_tensor(pb, n, v) for n, v in result.items()]
                responses.append(pb.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        """The executors' memory goes with the instance (Triton unloads it)."""
        close = getattr(self.model.prepared, "close", None)
        if close is not None:
            close()


def _to_numpy(tensor: Any) -> np.ndarray:
    """An input as NumPy: by DLPack (a view of the request's memory, valid during `execute`),
    else `as_numpy()` (string tensors, and bool, which NumPy 1 does not take by DLPack)."""
    try:
        return np.from_dlpack(tensor)
    except Exception:
        return tensor.as_numpy()


def _to_tensor(pb: Any, name: str, array: np.ndarray) -> Any:
    """An output for the backend, handed over by DLPack (see `_to_numpy`)."""
    array = np.ascontiguousarray(array)
    try:
        capsule = array.__dlpack__()
    except Exception:  # bool on NumPy 1
        return pb.Tensor(name, array)
    tensor = pb.Tensor.from_dlpack(name, capsule)
    _mark_consumed(capsule)
    return tensor


_USED = b"used_dltensor"
_GET_NAME = ctypes.pythonapi.PyCapsule_GetName
_GET_NAME.argtypes, _GET_NAME.restype = [ctypes.py_object], ctypes.c_char_p
_SET_NAME = ctypes.pythonapi.PyCapsule_SetName
_SET_NAME.argtypes, _SET_NAME.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int


def _mark_consumed(capsule: Any) -> None:
    """The backend's stub renames a capsule it consumed `used_dlpack` where the DLPack protocol
    says `used_dltensor`; NumPy's capsule destructor then reports an unraisable ValueError
    ("PyCapsule_GetPointer called with incorrect name") for every output. Its tensor owns the
    DLPack tensor either way (it calls the deleter); the protocol's name keeps NumPy quiet."""
    try:
        if _GET_NAME(capsule) == b"used_dlpack":
            _SET_NAME(capsule, _USED)
    except Exception as exc:  # not a capsule of this kind: nothing to mend
        log.debug("capsule left as it was: %s", exc)
