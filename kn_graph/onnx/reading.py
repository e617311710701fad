"""Reading what a model is made of: the model file (parsed, its large initializers left in the
mapped file, `kn_graph.onnx.mapped`) and each tensor's data (raw bytes, typed fields, bfloat16,
external files that may not leave the model's folder), checked against the declared size before
a byte is read."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from kn_graph.errors import OnnxImportError
from kn_graph.onnx.context import onnx_dtype
from kn_graph.onnx.mapped import MAPPED_LOCATION, FileMaps, MappedFile, strip_initializers
from kn_graph.onnx.options import Source

__all__ = ["read_model", "tensor_to_array"]


def read_model(
    source: Source, base_dir: str | os.PathLike[str] | None, use_mmap: bool
) -> tuple[onnx.ModelProto, Path | None, MappedFile | None]:
    """The parsed model, the folder of its external data, and the map of the model file when
    its large initializers stay in it (`kn_graph.onnx.mapped`)."""
    folder = Path(base_dir) if base_dir is not None else None
    mapped = None
    if isinstance(source, onnx.ModelProto):
        return source, folder, None
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        where = "<bytes>"
    else:
        path = Path(source)
        where = str(path)
        try:
            if use_mmap:
                mapped = MappedFile(path)
                stripped = strip_initializers(mapped.map) if mapped.map is not None else None
                if stripped is None:  # nothing to map, or not protobuf: parsed whole
                    mapped = None
            data = stripped if mapped is not None else path.read_bytes()
        except OSError as e:
            raise OnnxImportError(f"cannot read ONNX model '{path}': {e.strerror or e}") from None
        folder = folder or path.parent
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-ish errors, ValueError
        raise OnnxImportError(
            f"{where} is not a valid ONNX model (protobuf decoding failed: {e})"
        ) from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxImportError(f"{where} is not a valid ONNX model (it has no graph)")
    return model, folder, mapped


def _extent(
    size: int, offset: int, length: int | None, expected: int, where: str, what: str, path: Path
) -> int:
    """The length of an external tensor at `offset` in a file of `size` bytes, checked."""
    if offset + (length or 0) > size:
        raise OnnxImportError(
            f"{where}: external data file '{path}' holds {size} bytes, but the "
            f"tensor is at offset {offset} with length {length} (beyond its end)"
        )
    if length is None:
        length = size - offset
    if length != expected:
        raise OnnxImportError(
            f"{where}: external data holds {length} bytes, expected {expected} for {what}"
        )
    return length


def tensor_to_array(
    t: onnx.TensorProto, where: str, folder: Path | None, files: FileMaps
) -> np.ndarray:
    """The tensor's values as an array of its dtype (bfloat16 widened to float32); external
    data is read relative to `folder`, or viewed in the maps of `files`."""
    dims = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{where}: negative dims {list(dims)}")
    count = math.prod(dims)
    if t.data_type == onnx.TensorProto.BFLOAT16:
        raw = _tensor_bytes(t, where, folder, files, count * 2, f"bfloat16{list(dims)}")
        if raw is not None:
            u16 = np.frombuffer(raw, dtype="<u2")
        else:
            if len(t.int32_data) != count:
                raise OnnxImportError(
                    f"{where}: holds {len(t.int32_data)} values, expected {count} for "
                    f"bfloat16{list(dims)}"
                )
            u16 = np.asarray(t.int32_data, dtype=np.uint32).astype(np.uint16)
        return (u16.astype(np.uint32) << 16).view(np.float32).reshape(dims)
    if t.data_type in _NIBBLES:
        return _nibbles(t, where, folder, files, dims)
    dt = onnx_dtype(t.data_type, where)
    raw = _tensor_bytes(t, where, folder, files, count * dt.size, f"{dt}{list(dims)}")
    if raw is not None:
        return (
            np.frombuffer(raw, dtype=dt.np.newbyteorder("<"))
            .astype(dt.np, copy=False)
            .reshape(dims)
        )
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise OnnxImportError(f"{where}: cannot decode tensor data ({e})") from None
    return arr.astype(dt.np, copy=False)


_NIBBLES = {onnx.TensorProto.INT4: np.int8, onnx.TensorProto.UINT4: np.uint8}
"""4-bit element types, widened to int8 / uint8 constants (the IR's narrowest integers), as
bfloat16 widens to float32: 4-bit weights load, and their dequantization is exact."""


def _nibbles(
    t: onnx.TensorProto, where: str, folder: Path | None, files: FileMaps, dims: tuple[int, ...]
) -> np.ndarray:
    """An INT4 / UINT4 tensor: two values per byte, the first in the low nibble."""
    count = math.prod(dims)
    wide = _NIBBLES[t.data_type]
    raw = _tensor_bytes(t, where, folder, files, (count + 1) // 2, f"int4{list(dims)}")
    if raw is None:
        try:
            return numpy_helper.to_array(t).astype(wide).reshape(dims)
        except Exception as e:
            raise OnnxImportError(f"{where}: cannot decode tensor data ({e})") from None
    packed = np.frombuffer(raw, dtype=np.uint8)
    vals = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(-1)[:count]
    if wide is np.int8:
        vals = ((vals ^ 8).astype(np.int16) - 8).astype(np.int8)  # sign-extend the nibble
    return vals.astype(wide).reshape(dims)


def _tensor_bytes(
    t: onnx.TensorProto, where: str, folder: Path | None, files: FileMaps, expected: int, what: str
) -> bytes | memoryview | None:
    """The tensor's bytes (raw, or external: a view of the mapped file), checked to be
    `expected` long before reading; None when the values are in the typed fields."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        if not t.HasField("raw_data"):
            return None
        if len(t.raw_data) != expected:
            raise OnnxImportError(
                f"{where}: raw data holds {len(t.raw_data)} bytes, expected {expected} for "
                f"{what} (is the data type right?)"
            )
        return t.raw_data
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location")
    if loc == MAPPED_LOCATION and files.model is not None:  # kept in the model file
        offset, length = int(info["offset"]), int(info["length"])
        if length != expected:
            raise OnnxImportError(
                f"{where}: raw data holds {length} bytes, expected {expected} for "
                f"{what} (is the data type right?)"
            )
        return files.model.view(offset, length)
    if not loc:
        raise OnnxImportError(f"{where}: external data without a location")
    if "\0" in loc:
        raise OnnxImportError(f"{where}: external data location {loc!r} contains a NUL byte")
    if folder is None:
        raise OnnxImportError(
            f"{where}: external data '{loc}' but the model was given as bytes; pass base_dir="
        )
    base = folder.resolve()
    path = (base / loc).resolve()
    if base != path and base not in path.parents:
        raise OnnxImportError(f"{where}: external data path '{loc}' leaves the model folder {base}")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise OnnxImportError(
            f"{where}: external data offset/length must be integers, found "
            f"{info.get('offset')!r}/{info.get('length')!r}"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise OnnxImportError(
            f"{where}: external data offset {offset} and length {length} must be >= 0"
        )
    try:
        mapped = files.file(path)
        if mapped is not None:  # a view of the mapped file
            length = _extent(mapped.size, offset, length, expected, where, what, path)
            return mapped.view(offset, length)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            length = _extent(size, offset, length, expected, where, what, path)
            f.seek(offset)
            data = f.read(length)
    except OSError as e:
        raise OnnxImportError(
            f"{where}: cannot read external data file '{path}': {e.strerror or e}"
        ) from None
    if len(data) != length:
        raise OnnxImportError(
            f"{where}: external data file '{path}' is truncated ({len(data)} of {length} bytes)"
        )
    return data
