"""HTTP bodies of a served model, the same for every front end (Ray Serve, `kn-serve`, the
benchmarks): requests in JSON, `.npy` or `.npz`; responses in what was asked for; errors as JSON
with an HTTP status.

Request bodies:
- `application/json`: `{"inputs": {name: nested list | {"data": [...], "shape": [...],
  "dtype": "float32"}}}` (a bare `{name: ...}` object too), or the KServe v2 / Triton form
  `{"inputs": [{"name", "shape", "datatype": "FP32", "data"}]}`. A nested list takes the model
  input's dtype;
- `application/x-npy` (or `application/octet-stream`): one `.npy` array, for a model with one
  input; `application/x-npz`: an `.npz` archive of the inputs by name. Both are read with
  `allow_pickle=False`: a body never runs code.
Responses: JSON `{"outputs": {name: {"data", "shape", "dtype"}}}` to a JSON request, `.npy` to a
`.npy` request when the model has one output, else `.npz`; `Accept` overrides.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    KnError,
    RequestError,
    ShapeMismatchError,
)

if TYPE_CHECKING:
    from kn_runtime.serve.batching import BatchedModel

__all__ = [
    "JSON",
    "MAX_BODY_BYTES",
    "NPY",
    "NPZ",
    "decode_request",
    "encode_error",
    "encode_response",
    "http_status",
    "json_object",
]

MAX_BODY_BYTES = 64 << 20
"""The largest request body taken (413 above): 64 MiB holds a batch of 80 ImageNet images in
float32 as `.npy`, and about a tenth of that as JSON text."""

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
_OCTET = "application/octet-stream"

_KSERVE_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
"""The KServe v2 / Triton tensor datatypes a JSON request may name."""


def media_type(header: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json` ('' for none)."""
    return (header or "").split(";", 1)[0].strip().lower()


def decode_request(
    body: bytes,
    content_type: str | None,
    model: BatchedModel,
    max_bytes: int = MAX_BODY_BYTES,
) -> dict[str, np.ndarray]:
    """The request's inputs by name (dtypes and shapes are checked by `BatchedModel.check`).
    RequestError: 413 for a body over `max_bytes`, 415 for a media type not listed above, 400
    for a body that does not parse or does not fit the model."""
    if len(body) > max_bytes:
        raise RequestError(
            f"request body of {len(body)} bytes is over the limit of {max_bytes} bytes", 413
        )
    kind = media_type(content_type)
    if not kind:  # curl -d without -H: guess from the first byte
        kind = JSON if body.lstrip()[:1] in (b"{", b"[") else NPY
    if kind == JSON:
        return _from_json(body, model)
    if kind in (NPY, _OCTET):
        names = model.input_names
        if len(names) != 1:
            raise RequestError(
                f"a .npy body holds one array, but the model takes {len(names)} inputs "
                f"({', '.join(names)}): send an .npz archive ({NPZ}) or JSON"
            )
        return {names[0]: _load_npy(body)}
    if kind == NPZ:
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as archive:
                if not isinstance(archive, np.lib.npyio.NpzFile):
                    raise RequestError(f"{NPZ} body is not an .npz archive")
                return {name: archive[name] for name in archive.files}
        except RequestError:
            raise
        except Exception as exc:
            raise RequestError(f"{NPZ} body is not a readable .npz archive: {exc}") from None
    raise RequestError(f"unsupported media type {kind!r}: send {JSON}, {NPY} or {NPZ}", 415)


def _load_npy(body: bytes) -> np.ndarray:
    """The array of a `.npy` body as a read-only view of it, without a copy (`np.load` reads a
    BytesIO in chunks and copies them: 0.7 ms for a 600 kB image on this project's CI VM,
    against microseconds here). A header that is not 1.0 or 2.0 goes to `np.load`."""
    fmt = np.lib.format
    try:
        f = io.BytesIO(body)  # shares the bytes until written to
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = fmt.read_array_header_2_0(f)
        else:
            a = np.load(io.BytesIO(body), allow_pickle=False)
            if not isinstance(a, np.ndarray):
                raise RequestError("body is not a single .npy array")
            return a
    except RequestError:
        raise
    except Exception as exc:
        raise RequestError(f"body is not a readable .npy array: {exc}") from None
    if dtype.hasobject:
        raise RequestError(
            f"body is not a readable .npy array: it holds Python objects ({dtype}), which a "
            "server never unpickles"
        )
    count = math.prod(shape)
    offset = f.tell()
    if len(body) - offset != count * dtype.itemsize:
        raise RequestError(
            f"body is not a readable .npy array: {len(body) - offset} bytes of data, but its "
            f"header says {list(shape)} {dtype}: {count * dtype.itemsize} bytes"
        )
    a = np.frombuffer(body, dtype, count, offset)
    return a.reshape(shape[::-1]).transpose() if fortran_order else a.reshape(shape)


def json_object(body: bytes, shape: str = "an object") -> dict[str, Any]:
    """The JSON object in a body, or a RequestError (400): not JSON, or not an object (`shape`
    says what one looks like in the message)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(f"JSON body: expected {shape}, found {type(doc).__name__}")
    return doc


def _from_json(body: bytes, model: BatchedModel) -> dict[str, np.ndarray]:
    doc = json_object(body)
    dtypes = {s.name: s.dtype for s in model.inputs}
    wrapped = "inputs" in doc and "inputs" not in dtypes  # else a bare map with an input "inputs"
    inputs = doc["inputs"] if wrapped else doc
    if not isinstance(inputs, dict | list):
        raise RequestError(
            f'JSON "inputs": expected an object or a list, found {type(inputs).__name__}'
        )
    if isinstance(inputs, list):  # KServe v2: [{"name", "shape", "datatype", "data"}]
        out = {}
        for i, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise RequestError(f"JSON inputs[{i}]: expected an object with a name")
            name = item["name"]
            kserve = item.get("datatype")
            dtype = _KSERVE_DTYPES.get(kserve) if isinstance(kserve, str) else None
            if kserve is not None and dtype is None:
                raise RequestError(
                    f"input '{name}': unknown datatype {kserve!r} (one of "
                    f"{', '.join(_KSERVE_DTYPES)})"
                )
            out[name] = _tensor(name, item, dtype or dtypes.get(name))
        return out
    return {name: _json_value(name, v, dtypes.get(name)) for name, v in inputs.items()}


def _json_value(name: str, value: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(value, dict):
        if "dtype" in value:
            try:
                dtype = np.dtype(value["dtype"])
            except TypeError:
                raise RequestError(f"input '{name}': unknown dtype {value['dtype']!r}") from None
        return _tensor(name, value, dtype)
    return _array(name, value, dtype)


def _tensor(name: str, item: Mapping[str, Any], dtype: np.dtype | str | None) -> np.ndarray:
    if "data" not in item:
        raise RequestError(f"input '{name}': no \"data\"")
    a = _array(name, item["data"], dtype)
    shape = item.get("shape")
    if shape is None:
        return a
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise RequestError(f"input '{name}': shape must be a list of sizes, found {shape!r}")
    if int(np.prod(shape)) != a.size:
        raise RequestError(
            f"input '{name}': shape {shape} holds {int(np.prod(shape))} values, data has {a.size}"
        )
    return a.reshape(shape)


def _array(name: str, value: Any, dtype: np.dtype | str | None) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RequestError(f"input '{name}': not an array of {dtype or 'numbers'}: {exc}") from None
    if a.dtype == object or a.dtype.kind in "USV":
        raise RequestError(f"input '{name}': expected numbers, found {a.dtype.name} data")
    return a


def encode_response(
    outputs: Mapping[str, np.ndarray], accept: str | None, request_type: str | None
) -> tuple[bytes, str]:
    """The body and its media type: what `Accept` names (JSON, .npy, .npz), else the request's
    own kind (JSON for JSON, .npy for one output of a .npy request, else .npz)."""
    want = media_type(accept)
    if want not in (JSON, NPY, NPZ):
        want = media_type(request_type)
        want = JSON if want in (JSON, "") else NPY
    if want == JSON:
        doc = {
            "outputs": {
                name: {"shape": list(a.shape), "dtype": a.dtype.name, "data": a.tolist()}
                for name, a in outputs.items()
            }
        }
        return json.dumps(doc).encode(), JSON
    buf = io.BytesIO()
    if want == NPY and len(outputs) == 1:
        np.save(buf, next(iter(outputs.values())), allow_pickle=False)
        return buf.getvalue(), NPY
    np.savez(buf, **dict(outputs))
    return buf.getvalue(), NPZ


def http_status(exc: BaseException) -> int:
    """400 for what the client sent (a bad body, inputs the model does not take), 413/415 as the
    request error says, 500 for the rest."""
    if isinstance(exc, RequestError):
        return exc.status
    if isinstance(exc, ShapeMismatchError | ArgumentTypeError | ArgumentValueError):
        return 400
    return 500


def encode_error(exc: BaseException) -> tuple[int, bytes]:
    """The status and a JSON body `{"error": <exception type>, "message": ...}`; an exception
    that is not ours says only its type and message (no traceback leaves the server)."""
    kind = (
        type(exc).__name__ if isinstance(exc, KnError) else f"internal error ({type(exc).__name__})"
    )
    return http_status(exc), json.dumps({"error": kind, "message": str(exc)}).encode()
