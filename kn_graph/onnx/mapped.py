"""Initializers read in place from the model file, as onnxruntime, safetensors and
`torch.load(mmap=True)` read their weights.

A model given by path is memory-mapped (read-only) and parsed without the bytes of its
top-level initializers: `strip_initializers` walks the protobuf wire format and rewrites each
`raw_data` of at least `MIN_MAPPED` bytes as an external-data reference into the model file
itself (location `MAPPED_LOCATION`, offset, length). The loader then makes those tensors
`np.frombuffer` views of the map: no copy in the parsed proto, none in the graph, and the
pages are the file's (clean, shared with the page cache) — a backend that has copied or
packed a constant gives them back with `release_pages`, and a later read faults them in
again from the file. External-data files are mapped the same way.

The trade-off is the one of every mapped-weights loader: the file must not be truncated or
rewritten while a graph loaded from it is alive (`load_onnx(..., mmap=False)` reads the
weights into memory instead). Rewriting it in place — what `torch.onnx.export` and
`onnx.save` do to an existing path — is caught where the weights are read (`check_unchanged`:
the reference executor, and `plan` for every other backend) as a clear `EvaluationError`
instead of wrong weights or a crash on pages past the new end; a file replaced by rename or
deleted leaves the mapped one intact and the graph working.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from kn_graph.filemap import MappedFile, check_unchanged, release_pages

__all__ = [
    "MAPPED_LOCATION",
    "MIN_MAPPED",
    "FileMaps",
    "MappedFile",
    "check_unchanged",
    "release_pages",
    "strip_initializers",
]

MAPPED_LOCATION = "kn:model-file"
"""The external-data location that means "the mapped model file itself"."""

MIN_MAPPED = 4096
"""Initializers with fewer raw bytes stay in the parsed proto (copied, as before)."""

# protobuf field numbers (onnx.proto3)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_TENSOR_EXTERNAL_DATA = 13
_TENSOR_DATA_LOCATION = 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class FileMaps:
    """The maps one model's loads share: the model file's own (`model`, for tensors stripped by
    `strip_initializers`) and its external-data files' (made on first use; none when
    `enabled` is false)."""

    def __init__(self, model: MappedFile | None, enabled: bool) -> None:
        self.model = model
        self.enabled = enabled
        self._files: dict[Path, MappedFile] = {}

    def file(self, path: Path) -> MappedFile | None:
        if not self.enabled:
            return None
        m = self._files.get(path)
        if m is None:
            m = self._files[path] = MappedFile(path)
        return m


class _Malformed(Exception):
    pass


def _varint(b: mmap.mmap | bytes, i: int, end: int) -> tuple[int, int]:
    r = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _Malformed
        c = b[i]
        i += 1
        r |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return r, i


def _fields(b: mmap.mmap | bytes, lo: int, hi: int):  # type: ignore[no-untyped-def]
    """(field number, wire type, start of the field's key, start and end of its payload)."""
    i = lo
    while i < hi:
        start = i
        key, i = _varint(b, i, hi)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, j = _varint(b, i, hi)
            yield number, wire, start, i, j
        elif wire in (_I64, _I32):
            j = i + (8 if wire == _I64 else 4)
            yield number, wire, start, i, j
        elif wire == _LEN:
            n, i = _varint(b, i, hi)
            j = i + n
            yield number, wire, start, i, j
        else:  # groups: not in ONNX
            raise _Malformed
        if j > hi:
            raise _Malformed
        i = j


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _entry(key: str, value: str) -> bytes:
    return _len_field(
        _TENSOR_EXTERNAL_DATA, _len_field(1, key.encode()) + _len_field(2, value.encode())
    )


def _tensor(b: mmap.mmap, lo: int, hi: int) -> bytes | None:
    """The TensorProto at [lo, hi) with its raw data as a reference into the file, or None to
    keep it as it is (small, typed values, already external)."""
    raw = None
    kept: list[tuple[int, int]] = []
    for number, wire, start, plo, phi in _fields(b, lo, hi):
        if number in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            return None
        if number == _TENSOR_RAW_DATA and wire == _LEN:
            raw = (plo, phi)
        else:
            kept.append((start, phi))
    if raw is None or raw[1] - raw[0] < MIN_MAPPED:
        return None
    parts = [b[s:e] for s, e in kept]
    parts.append(_entry("location", MAPPED_LOCATION))
    parts.append(_entry("offset", str(raw[0])))
    parts.append(_entry("length", str(raw[1] - raw[0])))
    parts.append(_encode_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _encode_varint(_EXTERNAL))
    return b"".join(parts)


def _graph(b: mmap.mmap, lo: int, hi: int) -> tuple[bytes, int]:
    parts: list[bytes] = []
    mapped = 0
    for number, wire, start, plo, phi in _fields(b, lo, hi):
        t = _tensor(b, plo, phi) if number == _GRAPH_INITIALIZER and wire == _LEN else None
        if t is None:
            parts.append(b[start:phi])
        else:
            parts.append(_len_field(_GRAPH_INITIALIZER, t))
            mapped += 1
    return b"".join(parts), mapped


def strip_initializers(b: mmap.mmap) -> bytes | None:
    """The serialized ModelProto in `b` with its large top-level initializers' raw data
    replaced by references into `b` (see the module's text); None when nothing was replaced
    or the bytes do not walk as protobuf (the caller parses them whole, and reports)."""
    try:
        parts: list[bytes] = []
        mapped = 0
        for number, wire, start, plo, phi in _fields(b, 0, len(b)):
            if number == _MODEL_GRAPH and wire == _LEN:
                g, n = _graph(b, plo, phi)
                parts.append(_len_field(_MODEL_GRAPH, g))
                mapped += n
            else:
                parts.append(b[start:phi])
    except (_Malformed, IndexError):
        return None
    return b"".join(parts) if mapped else None
