"""What `load_onnx` accepts, checked before any node is read: the source argument, the keyword
arguments (each error names the argument), and the model's own well-formedness (an opset, names
defined once, valid UTF-8), so that a misuse fails with its cause rather than deep in a handler."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from kn_graph.errors import ArgumentTypeError, ArgumentValueError, OnnxImportError
from kn_graph.shape import Size, SizeLike

__all__ = ["LoadOptions", "Source", "check_arguments", "check_model", "check_source"]

Source = str | os.PathLike[str] | bytes | onnx.ModelProto


class LoadOptions:
    """What the caller said about the model's inputs."""

    def __init__(
        self,
        batch_axes: set[str],
        dims: dict[str, int],
        input_shapes: dict[str, Sequence[SizeLike]],
        input_values: dict[str, np.ndarray],
        mmap: bool = True,
    ) -> None:
        self.batch_axes = batch_axes
        self.dims = dims
        self.input_shapes = input_shapes
        self.input_values = input_values
        self.mmap = mmap


def check_source(source: object) -> Source:
    """The model argument: a ModelProto, bytes, or a path without NUL bytes."""
    if isinstance(source, onnx.ModelProto | bytes | bytearray | memoryview):
        return source  # type: ignore[return-value]
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        text = os.fsdecode(path)
        if "\0" in text:
            raise ArgumentValueError(f"load_onnx: source: the path {text!r} contains a NUL byte")
        return text
    raise ArgumentTypeError(
        "load_onnx: source: expected a path, bytes or an onnx.ModelProto, "
        f"found {type(source).__name__}"
    )


def check_arguments(
    batch_axes: object,
    dims: object,
    input_shapes: object,
    input_values: object,
    base_dir: object,
    static: object,
    mmap: object = True,
) -> LoadOptions:
    """Validate load_onnx's keyword arguments up front, naming the argument that is wrong."""
    if isinstance(batch_axes, str | bytes) or not isinstance(batch_axes, Iterable):
        raise ArgumentTypeError(
            "load_onnx: batch_axes: expected a collection of dim names (e.g. ['batch']), "
            f"found {type(batch_axes).__name__} {batch_axes!r}"
        )
    axes = list(batch_axes)
    for a in axes:
        if not isinstance(a, str):
            raise ArgumentTypeError(
                f"load_onnx: batch_axes: expected dim names (str), found {type(a).__name__} {a!r}"
            )
    pinned: dict[str, int] = {}
    for k, v in _mapping(dims, "dims").items():
        pinned[k] = _check_dim(v, f"dims['{k}']")
    shapes: dict[str, Sequence[SizeLike]] = {}
    for k, v in _mapping(input_shapes, "input_shapes").items():
        if isinstance(v, str | bytes) or not isinstance(v, Sequence | np.ndarray):
            raise ArgumentTypeError(
                f"load_onnx: input_shapes['{k}']: expected a sequence of sizes, "
                f"found {type(v).__name__} {v!r}"
            )
        shapes[k] = [
            d if isinstance(d, Size) and not d.is_fixed else _check_dim(d, f"input_shapes['{k}']")
            for d in v
        ]
    values: dict[str, np.ndarray] = {}
    for k, v in _mapping(input_values, "input_values").items():
        if not isinstance(v, np.ndarray | np.generic):
            raise ArgumentTypeError(
                f"load_onnx: input_values['{k}']: expected a NumPy array, found {type(v).__name__}"
            )
        values[k] = np.asarray(v)
    if base_dir is not None:
        if not isinstance(base_dir, str | os.PathLike):
            raise ArgumentTypeError(
                f"load_onnx: base_dir: expected a folder path, found {type(base_dir).__name__}"
            )
        if "\0" in os.fsdecode(os.fspath(base_dir)):
            raise ArgumentValueError(f"load_onnx: base_dir: the path {base_dir!r} contains a NUL")
    if not isinstance(static, bool):
        raise ArgumentTypeError(f"load_onnx: static: expected a bool, found {static!r}")
    if not isinstance(mmap, bool):
        raise ArgumentTypeError(f"load_onnx: mmap: expected a bool, found {mmap!r}")
    return LoadOptions(set(axes), pinned, shapes, values, mmap)


def _mapping(arg: object, name: str) -> dict[str, object]:
    """An optional name → value argument as a dict; the keys must be strings."""
    if arg is None:
        return {}
    if not isinstance(arg, Mapping):
        raise ArgumentTypeError(
            f"load_onnx: {name}: expected a dict of names, found {type(arg).__name__} {arg!r}"
        )
    for k in arg:
        if not isinstance(k, str):
            raise ArgumentTypeError(
                f"load_onnx: {name}: expected names (str) as keys, found {type(k).__name__} {k!r}"
            )
    return dict(arg)


def _check_dim(d: object, where: str) -> int:
    """A size given by the caller: an int (or a fixed Size) >= 0."""
    if isinstance(d, Size) and d.is_fixed:
        d = d.as_int()
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise ArgumentTypeError(f"load_onnx: {where}: expected an int size, found {d!r}")
    if d < 0:
        raise ArgumentValueError(f"load_onnx: {where}: expected a size >= 0, found {d}")
    return int(d)


def check_model(model: onnx.ModelProto, options: LoadOptions) -> None:
    """What ONNX (and onnxruntime) refuse before any node is read: no opset import, a name
    defined twice, arguments naming inputs the model does not have."""
    if not model.opset_import:
        raise OnnxImportError(
            "the model imports no opset (ONNX requires an opset_import for the default domain)"
        )
    _check_text(model)
    g = model.graph
    inputs = [i.name for i in g.input]
    seen: set[str] = set()
    for name in inputs:
        if name in seen:
            raise OnnxImportError(f"graph input '{name}' is declared twice")
        seen.add(name)
    seen.update(t.name for t in g.initializer)
    for i, node in enumerate(g.node):
        for name in node.output:
            if not name:
                continue
            if name in seen:
                where = f"node '{node.name or f'{node.op_type}#{i}'}' ({node.op_type})"
                raise OnnxImportError(
                    f"{where} writes '{name}', which is already defined (a graph input, an "
                    "initializer or another node's output): every value name must be defined once"
                )
            seen.add(name)
    for arg, given in (
        ("input_shapes", options.input_shapes),
        ("input_values", options.input_values),
    ):
        unknown = sorted(set(given) - set(inputs))
        if unknown:
            raise ArgumentValueError(
                f"load_onnx: {arg} names {unknown}, which are not graph inputs (the inputs are "
                f"{inputs})"
            )


def _check_text(model: onnx.ModelProto) -> None:
    """The names the loader reads (values, nodes, op types, domains, attributes, dim params, in
    subgraphs too) are text: protobuf hands a string that is not valid UTF-8 over as `bytes`
    instead of refusing it."""
    texts: list[str | bytes] = [o.domain for o in model.opset_import]
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        texts.append(g.name)
        texts += [t.name for t in g.initializer]
        for vi in (*g.input, *g.output, *g.value_info):
            texts.append(vi.name)
            texts += [d.dim_param for d in vi.type.tensor_type.shape.dim]
        for n in g.node:
            texts += (n.name, n.op_type, n.domain, *n.input, *n.output)
            for a in n.attribute:
                texts.append(a.name)
                if a.type == onnx.AttributeProto.GRAPH:
                    graphs.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(a.graphs)
    bad = next((t for t in texts if isinstance(t, bytes)), None)
    if bad is not None:
        raise OnnxImportError(f"the model has a name that is not valid UTF-8: {bad[:80]!r}")
