"""ONNX → kn_graph: parse the model, bind inputs with symbolic dims, read initializers (external
data included), and run one registered handler per node."""

from __future__ import annotations

import ast
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from kn_graph.dtype import DType
from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    FixedSizeRequiredError,
    GraphError,
    OnnxImportError,
    StaticInputRequiredError,
    SymbolicSizeError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph
from kn_graph.onnx.context import HANDLERS, MAX_RANK, Known, NodeContext, Result, Seq, onnx_dtype
from kn_graph.onnx.mapped import MAPPED_LOCATION, FileMaps, MappedFile, strip_initializers
from kn_graph.ops import Constant, Tensor, Value
from kn_graph.shape import BATCH, Shape, Size, SizeLike

if TYPE_CHECKING:
    from kn_graph.optimizer import OptimizerSettings

__all__ = ["DEFAULT_BATCH_AXES", "ValueSpecializedModel", "load_onnx"]

DEFAULT_BATCH_AXES = ("batch_size", "batch", "N", "B", "b", "batch_dim", "unk__batch")
"""dim_params unified into the batch symbol B."""

KNOWN_LIMIT = 4096
"""Integer initializers up to this many elements are kept as load-time `Known` tensors."""

Source = str | os.PathLike[str] | bytes | onnx.ModelProto

MAX_UNIFICATIONS = 64
"""A load restarts once per pair of symbols it unifies; more than this is a bug."""


class _Unify(BaseException):
    """Raised inside a builder when two sizes must be equal and one is a plain input symbol:
    the load restarts with that symbol replaced (a BaseException, so no handler swallows it)."""

    def __init__(self, sym: str, value: Size) -> None:
        self.sym = sym
        self.value = value


def load_onnx(
    source: Source,
    *,
    batch_axes: Iterable[str] = DEFAULT_BATCH_AXES,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[SizeLike]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    static: bool = False,
    mmap: bool = True,
) -> Graph | ValueSpecializedModel:
    """Load an ONNX model (path, bytes or ModelProto) into a new `Graph`.

    - every `dim_param` becomes a size symbol (`"past + 1"` an expression of one); those named
      in `batch_axes` become `B`; dims without a name become `<input>_<axis>`;
    - sizes an op needs equal (broadcasting, concat, matmul, reshape) are unified when one is a
      plain input symbol (the exporter named one length twice), else recorded as a guard;
    - `dims` pins symbols to numbers (`dims={"seq": 77}`), `input_shapes` gives whole shapes;
    - `input_values` turns graph inputs into constants. When a shape, repeats, pads, sizes or a
      condition comes from a graph input and no value is given, the result is a
      `ValueSpecializedModel` (`Device.prepare` accepts it: one graph per distinct value),
      or with `static=True` a `StaticInputRequiredError` naming the input;
    - external data is read relative to `base_dir` (default: the model's folder) and may not
      leave it;
    - with `mmap` (the default) a model given by path keeps its large initializers and its
      external data as read-only views of the files (`kn_graph.onnx.mapped`): no copy, and a
      backend that packed them can give their pages back. The files must then stay as they
      are while the graph lives; `mmap=False` reads everything into memory.
    Raises `ArgumentTypeError`/`ArgumentValueError` for misused arguments, `OnnxImportError`
    for unreadable or invalid models and `UnsupportedOnnxError` for what the IR cannot express.
    """
    options = _check_arguments(batch_axes, dims, input_shapes, input_values, base_dir, static, mmap)
    model, folder, mapped = _read_model(_check_source(source), base_dir, mmap)
    _check_model(model, options)
    files = FileMaps(mapped, mmap)
    if sequence_outputs(model) and not static:  # outputs regrouped into lists per call
        return ValueSpecializedModel(model, folder, options, [], files=files)
    try:
        return _load(model, folder, options, files)
    except StaticInputRequiredError as e:
        if static:
            raise
        return ValueSpecializedModel(model, folder, options, [e.input_name], files=files)
    except SymbolicSizeError:
        if static:
            raise
        return ValueSpecializedModel(model, folder, options, [], by_shape=True, files=files)


class _Options:
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


def _check_source(source: object) -> Source:
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


def _check_arguments(
    batch_axes: object,
    dims: object,
    input_shapes: object,
    input_values: object,
    base_dir: object,
    static: object,
    mmap: object = True,
) -> _Options:
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
    return _Options(set(axes), pinned, shapes, values, mmap)


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


def _check_model(model: onnx.ModelProto, options: _Options) -> None:
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


def _load(model: onnx.ModelProto, folder: Path | None, options: _Options, files: FileMaps) -> Graph:
    """One import; restarted with a substitution whenever it unifies two input symbols."""
    subs: dict[str, Size] = {}
    arrays: dict[str, np.ndarray] = {}
    tensors: dict[str, Tensor] = {}
    for _ in range(MAX_UNIFICATIONS):
        loader = Loader(
            model,
            folder,
            options.batch_axes,
            options.dims,
            options.input_shapes,
            options.input_values,
            subs=subs,
            arrays=arrays,
            tensors=tensors,
            files=files,
        )
        try:
            return loader.run()
        except _Unify as u:
            subs = {k: v.subs({u.sym: u.value}) for k, v in subs.items()}
            subs[u.sym] = u.value
    raise OnnxImportError(
        f"the model's input sizes needed more than {MAX_UNIFICATIONS} unifications"
    )


class ValueSpecializedModel:
    """A model loaded per call: its shapes depend on the values of some integer inputs (a
    Reshape target, Tile repeats, Resize sizes, a Range limit, an If condition fed by a graph
    input), or it has a node the IR expresses for fixed sizes only (an LSTM over a symbolic
    length, SAME padding with a stride). `specialize` loads it once per distinct value of those
    inputs (and, with `by_shape`, per input shapes) and caches the graph; `Device.prepare`
    accepts it and does that per call. The cost: one load per new value or shape.
    `optimize(model)` returns a copy whose graphs are optimized as they are made (`optimized`)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        folder: Path | None,
        options: _Options,
        value_inputs: list[str],
        by_shape: bool = False,
        files: FileMaps | None = None,
    ) -> None:
        self.model = model
        self.folder = folder
        self.files = files if files is not None else FileMaps(None, options.mmap)
        self.options = options
        self.value_inputs: list[str] = list(value_inputs)
        """The inputs whose values decide shapes (found so far; more may be found per call)."""
        init = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]
        self.by_shape = by_shape
        """Whether the other inputs' shapes are pinned too (set when symbolic dims fail)."""
        self.optimizations: tuple[OptimizerSettings, ...] = ()
        """Optimizer settings applied in order to each graph as it is made (`optimized`)."""
        self._cache: dict[tuple[object, ...], Graph] = {}

    def optimized(self, settings: OptimizerSettings) -> ValueSpecializedModel:
        """A copy of this model whose graphs are optimized with `settings` as they are made:
        what `optimize(model, settings)` returns, so `optimize(load_onnx(path))` works whatever
        the model is. The copy keeps its own graph cache (this one's graphs are not optimized)
        and starts from what this model found out (the value inputs, `by_shape`)."""
        new = ValueSpecializedModel(
            self.model, self.folder, self.options, self.value_inputs, self.by_shape, self.files
        )
        new.optimizations = (*self.optimizations, settings)
        return new

    def specialize(self, values: Mapping[str, np.ndarray]) -> Graph:
        """The graph for these input values (all inputs by name, or at least the value inputs);
        the value inputs become constants and leave the graph's inputs. The other inputs keep
        their symbolic dims unless a shape then cannot be expressed (a Resize to a size given
        by value on a symbolic axis): then their shapes are pinned as well (`by_shape`)."""
        for _ in range(len(self.input_names) + 1):
            missing = [n for n in self.value_inputs if n not in values]
            if missing:
                raise OnnxImportError(
                    f"the model's shapes depend on the values of inputs {missing}; pass them"
                )
            if self.by_shape:
                missing = [
                    n
                    for n in self.input_names
                    if n not in values and n not in self.options.input_shapes
                ]
                if missing:
                    raise OnnxImportError(
                        f"the model is loaded per input shape; pass inputs {missing} too"
                    )
            pinned = dict(self.options.input_values)
            pinned.update({n: _pin(values[n]) for n in self.value_inputs})
            shapes = dict(self.options.input_shapes)
            if self.by_shape:
                shapes.update({n: list(np.shape(v)) for n, v in values.items() if n not in pinned})
            key = tuple((n, _key(pinned[n])) for n in sorted(pinned)) + tuple(
                (n, tuple(shapes[n])) for n in sorted(shapes)
            )
            hit = self._cache.get(key)
            if hit is not None:
                return hit
            opts = _Options(
                self.options.batch_axes, self.options.dims, shapes, pinned, self.options.mmap
            )
            try:
                graph = _load(self.model, self.folder, opts, self.files)
            except StaticInputRequiredError as e:
                if e.input_name in self.value_inputs or e.input_name not in values:
                    raise
                self.value_inputs.append(e.input_name)
                continue
            except SymbolicSizeError:
                if self.by_shape:
                    raise
                self.by_shape = True
                continue
            if self.optimizations:
                from kn_graph.optimizer import optimize

                for settings in self.optimizations:
                    graph = optimize(graph, settings)
            self._cache[key] = graph
            return graph
        raise OnnxImportError("could not find the inputs that decide the model's shapes")

    def __repr__(self) -> str:
        what = f"the values of {self.value_inputs}" if self.value_inputs else ""
        if self.by_shape:
            what += (" and " if what else "") + "the input shapes"
        opt = "; optimized" if self.optimizations else ""
        return f"<ValueSpecializedModel: inputs {self.input_names}; loaded per {what}{opt}>"


STACKED = ".stacked"
"""Suffix of a graph output holding a sequence output's elements stacked on axis 0."""


def _pin(v: object) -> object:
    """A value input as pinned: an array, or for a sequence input the list of its arrays."""
    if isinstance(v, list | tuple):
        return [np.asarray(a) for a in v]
    return np.asarray(v)


def _key(v: object) -> object:
    """The cache key of a pinned value: its bytes; a sequence by its structure only (its
    elements are graph inputs)."""
    if isinstance(v, list):
        return ("seq", tuple((a.dtype.str, a.shape) for a in v))
    a = np.asarray(v)
    return (a.dtype.str, a.shape, a.tobytes())


def sequence_outputs(model: onnx.ModelProto) -> list[str]:
    """The names of the model's sequence-typed outputs."""
    out = []
    for o in model.graph.output:
        t = o.type.optional_type.elem_type if o.type.HasField("optional_type") else o.type
        if t.HasField("sequence_type"):
            out.append(o.name)
    return out


def regroup_outputs(
    model: onnx.ModelProto, graph: Graph, outputs: Sequence[object]
) -> list[object]:
    """The graph's outputs in the model's terms: a sequence output (graph outputs `name.0`,
    `name.1`, ... or `name.stacked`) becomes one list."""
    seqs = set(sequence_outputs(model))
    by_name = dict(zip(graph.output_names, outputs, strict=True))
    result: list[object] = []
    for o in model.graph.output:
        if o.name not in seqs:
            result.append(by_name[o.name])
        elif f"{o.name}{STACKED}" in by_name:
            result.append(list(np.asarray(by_name[f"{o.name}{STACKED}"])))
        else:
            k = 0
            items = []
            while f"{o.name}.{k}" in by_name:
                items.append(by_name[f"{o.name}.{k}"])
                k += 1
            result.append(items)
    return result


def _read_model(
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


@dataclass
class _Enclosing:
    """A scope around the subgraph being loaded: its graph and names, and the values of it
    that the subgraph captured (the subgraph's extra inputs, in order)."""

    graph: Graph
    env: dict[str, Result]
    captures: list[Value]


class Loader:
    """The state of one import: the graph being built and the name → value environment."""

    def __init__(
        self,
        model: onnx.ModelProto,
        folder: Path | None,
        batch_axes: set[str],
        dims: dict[str, int],
        input_shapes: Mapping[str, Sequence[SizeLike]],
        input_values: Mapping[str, np.ndarray],
        subs: Mapping[str, Size] | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        tensors: dict[str, Tensor] | None = None,
        files: FileMaps | None = None,
    ) -> None:
        self.model = model
        self.files = files if files is not None else FileMaps(None, False)
        self.subs = dict(subs or {})
        self.arrays = arrays if arrays is not None else {}
        self.tensors: dict[str, Tensor] = tensors if tensors is not None else {}
        self.symbol_order: list[str] = []
        self.value_sizes: dict[Value, Size] = {}
        """Graph values known to equal a size (a size cast to float), for Range bounds."""
        self.folder = folder
        self.batch_axes = batch_axes
        self.dims = dims
        self.input_shapes = input_shapes
        self.input_values = input_values
        self.graph = Graph()
        self.graph.equate = self.equate
        self.env: dict[str, Result] = {}
        self._outer: list[_Enclosing] = []
        """The enclosing scopes while a subgraph loads (innermost last)."""
        self.bad_initializers: dict[str, str] = {}
        self.node_index = 0
        self.opsets: dict[str, int] = {}
        for o in model.opset_import:
            self.opsets[o.domain or "ai.onnx"] = int(o.version)
        # onnxruntime reads a model that imports other domains only at the newest default opset
        self.opsets.setdefault("ai.onnx", onnx.defs.onnx_opset_version())

    # -- entry --------------------------------------------------------------------------------
    def run(self) -> Graph:
        model = self.model
        if model.functions:
            try:
                import onnx.inliner

                model = onnx.inliner.inline_local_functions(model)
            except Exception as e:
                raise OnnxImportError(f"cannot inline the model's local functions: {e}") from None
        g = model.graph
        self.add_initializers(g.initializer)
        if g.sparse_initializer:
            for s in g.sparse_initializer:
                self.bad_initializers[s.values.name] = "sparse initializers are not supported"
        for inp in g.input:
            if inp.name in self.env:
                continue  # old-style: an initializer listed as an input is a constant
            self.add_input(inp)
        self.run_nodes(g.node)
        if not g.output:
            raise OnnxImportError("the model has no outputs")
        for out in g.output:
            r = self.lookup(out.name, None)
            if isinstance(r, Seq):  # one graph output per element, or the stack of them
                parts = (
                    [(r.stacked, f"{out.name}{STACKED}")]
                    if r.stacked is not None
                    else [(x, f"{out.name}.{i}") for i, x in enumerate(r.items)]
                )
                for x, name in parts:
                    if isinstance(x, Seq):
                        raise UnsupportedOnnxError(out.name, "", "a sequence of sequences")
                    v = self.as_value(x)
                    self.graph.add_output(v, name)
                continue
            v = self.as_value(r)
            self.graph.set_debug_name(v, out.name)
            self.graph.add_output(v, out.name)
        self.graph.equate = self.graph.guard_equal  # no more unification once loaded
        self.graph.where = ""
        return self.graph

    def run_nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            self.run_node(node)
            self.node_index += 1

    def inline_graph(
        self,
        sub: onnx.GraphProto,
        ctx: NodeContext,
        bound: Mapping[str, Result] | None = None,
    ) -> list[Result]:
        """Import a subgraph into the current graph (an If branch whose condition is known, one
        unrolled Loop/Scan step with its inputs `bound` by name); returns its outputs. Its names
        live in a scope of their own: they shadow outer names and vanish afterwards."""
        names = [i.name for i in sub.input]
        missing = [n for n in names if n not in (bound or {})]
        if missing:
            ctx.unsupported(f"subgraph inputs {missing} are not bound")
        outer = self.env
        self.env = {**outer, **(bound or {})}
        try:
            self.add_initializers(sub.initializer)
            self.run_nodes(sub.node)
            return [self.lookup(o.name, ctx) for o in sub.output]
        finally:
            self.env = outer

    def subgraph(
        self,
        sub: onnx.GraphProto,
        formals: Sequence[tuple[str, Shape, DType]],
        ctx: NodeContext,
    ) -> tuple[Graph, list[Value]]:
        """Load a subgraph (Loop/Scan body, If branch) as a graph of its own: inputs `formals`
        (ONNX inputs, in order), then one input per value of the enclosing scopes it uses
        (captures, in first-use order; constants and load-time Knowns are copied in instead).
        Returns the graph and the captured values of the enclosing graph."""
        body = Graph()
        body.equate = body.guard_equal  # no unification inside: guards, checked per run
        body.share_fresh_names(self.graph)  # run-time symbols stay distinct across the scopes
        self._outer.append(_Enclosing(self.graph, self.env, []))
        self.graph, self.env = body, {}
        try:
            for name, shape, dt in formals:
                self.env[name] = body.input(shape, dt, name)
            self.add_initializers(sub.initializer)
            self.run_nodes(sub.node)
            for o in sub.output:
                r = self.lookup(o.name, ctx)
                if isinstance(r, Seq):
                    ctx.unsupported(f"subgraph output '{o.name}' is a sequence")
                v = self.as_value(r)
                body.set_debug_name(v, o.name)
                body.add_output(v, o.name)
        finally:
            enc = self._outer.pop()
            self.graph, self.env = enc.graph, enc.env
        body.where = ""
        return body, enc.captures

    def _level(self, k: int) -> tuple[Graph, dict[str, Result]]:
        if k == len(self._outer):
            return self.graph, self.env
        return self._outer[k].graph, self._outer[k].env

    def _resolve(self, k: int, name: str) -> Result | None:
        """`name` as a result valid at scope level k (0: the model's graph), captured from the
        enclosing levels when it is defined there."""
        env = self._level(k)[1]
        r = env.get(name)
        if r is not None or k == 0:
            return r
        outer = self._resolve(k - 1, name)
        if outer is None:
            return None
        r = self._import(k, outer, name)
        env[name] = r
        return r

    def _import(self, k: int, r: Result, name: str) -> Result:
        if isinstance(r, Known):
            return r
        if isinstance(r, Seq):
            items = (self._import(k, x, f"{name}.{i}") for i, x in enumerate(r.items))
            return Seq(tuple(items), r.dtype)
        outer, graph = self._level(k - 1)[0], self._level(k)[0]
        info = outer[r]
        if isinstance(info.op, Constant):
            return graph.constant_tensor(info.op.tensor)
        taken = set(graph.input_names)
        label = name if name not in taken else f"{name}.outer{k}"
        v = graph.input(info.shape, info.dtype, label)
        self._outer[k - 1].captures.append(r)
        return v

    # -- inputs and initializers ----------------------------------------------------------------
    def add_initializers(self, tensors: Iterable[onnx.TensorProto]) -> None:
        tensors = list(tensors)
        last = {t.name: i for i, t in enumerate(tensors)}
        for i, t in enumerate(tensors):
            if last[t.name] != i:
                continue  # a name given twice: the last one counts, as in onnxruntime
            cache = bool(t.name) and not self._outer  # names are per scope inside subgraphs
            cached = self.tensors.get(t.name) if cache else None
            if cached is not None:  # a restarted load: no second decode or hash of the weights
                self.env[t.name] = self.graph.constant_tensor(cached)
                continue
            arr = self.arrays.get(t.name) if cache else None
            if arr is None:
                try:
                    arr = self.tensor_to_array(t, f"initializer '{t.name}'")
                except UnsupportedOnnxError as e:
                    self.bad_initializers[t.name] = e.detail
                    continue
            r = self.result_of_array(arr)
            op = self.graph[r].op if isinstance(r, Value) else None
            if isinstance(op, Constant) and cache:
                self.tensors[t.name] = op.tensor  # holds the data: the array is not kept twice
            elif cache:
                self.arrays[t.name] = arr  # small integer tensors (load-time Known values)
            self.env[t.name] = r

    def result_of_array(self, arr: np.ndarray) -> Result:
        dt = DType.from_np(arr.dtype)
        if (dt.is_int or dt.is_bool) and arr.size <= KNOWN_LIMIT:
            return Known(arr, dt)
        return self.graph.constant(arr)

    def tensor_to_array(self, t: onnx.TensorProto, where: str) -> np.ndarray:
        dims = tuple(int(d) for d in t.dims)
        if any(d < 0 for d in dims):
            raise OnnxImportError(f"{where}: negative dims {list(dims)}")
        count = math.prod(dims)
        if t.data_type == onnx.TensorProto.BFLOAT16:
            raw = self._tensor_bytes(t, where, count * 2, f"bfloat16{list(dims)}")
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
        dt = onnx_dtype(t.data_type, where)
        raw = self._tensor_bytes(t, where, count * dt.size, f"{dt}{list(dims)}")
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

    def _tensor_bytes(
        self, t: onnx.TensorProto, where: str, expected: int, what: str
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
        if loc == MAPPED_LOCATION and self.files.model is not None:  # kept in the model file
            offset, length = int(info["offset"]), int(info["length"])
            if length != expected:
                raise OnnxImportError(
                    f"{where}: raw data holds {length} bytes, expected {expected} for "
                    f"{what} (is the data type right?)"
                )
            return self.files.model.view(offset, length)
        if not loc:
            raise OnnxImportError(f"{where}: external data without a location")
        if "\0" in loc:
            raise OnnxImportError(f"{where}: external data location {loc!r} contains a NUL byte")
        if self.folder is None:
            raise OnnxImportError(
                f"{where}: external data '{loc}' but the model was given as bytes; pass base_dir="
            )
        base = self.folder.resolve()
        path = (base / loc).resolve()
        if base != path and base not in path.parents:
            raise OnnxImportError(
                f"{where}: external data path '{loc}' leaves the model folder {base}"
            )
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
            mapped = self.files.file(path)
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

    def add_input(self, inp: onnx.ValueInfoProto) -> None:
        name = inp.name
        where = f"input '{name}'"
        t = inp.type
        if t.HasField("optional_type"):  # an optional input given a value is that value
            t = t.optional_type.elem_type
        if t.HasField("sequence_type"):
            self.add_sequence_input(name, t.sequence_type.elem_type)
            return
        if not t.HasField("tensor_type"):
            raise UnsupportedOnnxError(where, "", "only tensor and sequence inputs are supported")
        tt = t.tensor_type
        dt = onnx_dtype(tt.elem_type, where)
        if name in self.input_values:
            arr = np.asarray(self.input_values[name])
            if arr.dtype != dt.np:
                raise OnnxImportError(
                    f"input_values['{name}']: expected dtype {dt}, found {arr.dtype}"
                )
            self.env[name] = self.result_of_array(arr)
            return
        if name in self.input_shapes:
            shape = Shape.from_seq(self.input_shapes[name])
        else:
            if not tt.HasField("shape"):
                raise OnnxImportError(
                    f"{where} has no shape; pass input_shapes={{'{name}': [...]}}"
                )
            dims: list[Size] = []
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(Size(int(d.dim_value)))
                elif d.HasField("dim_param") and d.dim_param and d.dim_param != "?":
                    dims.append(self.dim_param_size(d.dim_param))
                else:  # no name, "?" or -1: a fresh symbol named after the input and axis
                    dims.append(self.dim_param_size(_fresh_symbol(name, axis)))
            shape = Shape(tuple(dims))
        shape = shape.subs(self.subs)
        if shape.rank > MAX_RANK:
            raise UnsupportedOnnxError(where, "", f"rank {shape.rank} is more than {MAX_RANK}")
        for d in shape:
            for s in sorted(d.symbols):
                if s not in self.symbol_order:
                    self.symbol_order.append(s)
        self.env[name] = self.graph.input(shape, dt, name)

    def add_sequence_input(self, name: str, elem: onnx.TypeProto) -> None:
        """A sequence input: its elements become graph inputs `name.0`, `name.1`, ... shaped
        like the given arrays (the model loads per sequence structure: `ValueSpecializedModel`
        is asked for the list in `input_values`)."""
        if not elem.HasField("tensor_type"):
            raise UnsupportedOnnxError(f"input '{name}'", "", "a sequence of non-tensors")
        dt = onnx_dtype(elem.tensor_type.elem_type, f"input '{name}'")
        given = self.input_values.get(name)
        if given is None:
            raise StaticInputRequiredError("", "", name, "the elements of a sequence input")
        items: list[Result] = []
        for i, a in enumerate(given):
            a = np.asarray(a)
            if a.dtype != dt.np:
                raise OnnxImportError(f"input '{name}' element {i}: expected {dt}, found {a.dtype}")
            items.append(self.graph.input(Shape.of(*a.shape), dt, f"{name}.{i}"))
        self.env[name] = Seq(tuple(items), dt)

    def symbol(self, p: str) -> Size:
        """The size of one named dim: B for the batch axes, a number when pinned by `dims`."""
        sym = BATCH if p in self.batch_axes else p
        if p in self.dims:
            return Size(int(self.dims[p]))
        if sym in self.dims:
            return Size(int(self.dims[sym]))
        return Size.sym(sym)

    def dim_param_size(self, p: str) -> Size:
        """A dim_param as a size: a name, or an expression of names (`past_sequence_length + 1`,
        `32*h32`, as exporters write them); anything else is one opaque symbol."""
        if isinstance(p, bytes):  # protobuf hands over invalid UTF-8 as bytes
            p = p.decode(errors="replace")
        expr = _parse_size_expr(p, self.symbol)
        return expr if expr is not None else self.symbol(p)

    # -- unification ------------------------------------------------------------------------------
    def equate(self, a: Size, b: Size, what: str) -> Size:
        """Two sizes an op needs equal: unify a plain input symbol with the other side (the
        load restarts), else record a guard and use `a`."""
        if a.is_fixed and b.is_fixed:
            raise GraphError(f"{what}: sizes {a} and {b} differ")
        order = {s: i for i, s in enumerate(self.symbol_order)}
        options = []
        for x, y in ((a, b), (b, a)):
            s = x.symbol
            if s is not None and s in order and s not in y.symbols and s not in self.dims:
                # keep B and the symbol seen first; replace the later one
                rank = (s != BATCH, order[s]) if y.symbol is not None else (True, 10**9)
                options.append((rank, s, y))
        if options:
            _, s, y = max(options, key=lambda t: t[0])
            raise _Unify(s, y)
        self.graph.add_guard(a, "==", b, what)
        return a

    # -- nodes ----------------------------------------------------------------------------------
    def lookup(self, name: str, ctx: NodeContext | None) -> Result:
        r = self.env.get(name)
        if r is not None:
            return r
        if self._outer:
            r = self._resolve(len(self._outer), name)
            if r is not None:
                return r
        where = f"node '{ctx.name}' ({ctx.op_type})" if ctx else "graph output"
        if name in self.bad_initializers:
            raise UnsupportedOnnxError(
                ctx.name if ctx else name,
                ctx.op_type if ctx else "",
                f"initializer '{name}': {self.bad_initializers[name]}",
            )
        raise OnnxImportError(f"{where} uses '{name}', which is not defined before it")

    def as_value(self, r: Result) -> Value:
        if isinstance(r, Known):
            ctx = NodeContext(self, onnx.NodeProto(), 0)
            return ctx.materialize(r)
        return r

    def run_node(self, node: onnx.NodeProto) -> None:
        domain = node.domain or "ai.onnx"
        ctx = NodeContext(self, node, self.opsets.get(domain, 0))
        if domain != "ai.onnx":
            ctx.unsupported(f"domain '{node.domain}' is not supported")
        handler = HANDLERS.get(node.op_type)
        if handler is None:
            ctx.unsupported("operator not supported")
        self.graph.where = f"node '{ctx.name}' ({ctx.op_type})"
        try:
            out = handler(ctx)
            ctx.check_all_used()
        except StaticInputRequiredError as e:
            if not self._outer:
                raise
            # a subgraph's own inputs change per step: no specialization can help
            raise UnsupportedOnnxError(
                ctx.name,
                ctx.op_type,
                f"inside a subgraph, a value must be known at load time, but it comes from "
                f"'{e.input_name}'",
            ) from None
        except FixedSizeRequiredError as e:  # fine for fixed sizes: specialize on shapes
            if self._outer:
                raise UnsupportedOnnxError(ctx.name, ctx.op_type, str(e)) from None
            raise SymbolicSizeError(ctx.name, ctx.op_type, str(e)) from None
        except GraphError as e:
            raise UnsupportedOnnxError(ctx.name, ctx.op_type, str(e)) from None
        results = [out] if isinstance(out, Value | Known | Seq) else list(out)
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(results) or results[i] is None:
                ctx.unsupported(f"output {i} ('{name}') is not supported")
            r = results[i]
            assert r is not None
            if isinstance(r, Seq):
                self.env[name] = r
                continue
            rank = len(r.shape) if isinstance(r, Known) else self.graph[r].rank
            if rank > MAX_RANK:
                ctx.unsupported(f"output {i} ('{name}') has rank {rank}, more than {MAX_RANK}")
            if isinstance(r, Value):
                self.graph.set_debug_name(r, name)
            self.env[name] = r


def _fresh_symbol(input_name: str, axis: int) -> str:
    base = re.sub(r"\W", "_", input_name) or "input"
    return f"{base}_{axis}"


_EXPR_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Constant, ast.Load)
_EXPR_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd)


def _parse_size_expr(text: str, symbol: object) -> Size | None:
    """`past + 1`, `2*seq`, `(h+1)//2` as a Size; None unless the text is such an expression
    with at least one operator (plain names stay opaque symbols)."""
    if not any(c in text for c in "+-*/%"):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    for n in ast.walk(tree):
        if isinstance(n, ast.operator | ast.unaryop):
            if not isinstance(n, _EXPR_OPS):
                return None
        elif not isinstance(n, _EXPR_NODES):
            return None
        if isinstance(n, ast.Constant) and (type(n.value) is not int):
            return None

    def ev(n: ast.AST) -> Size:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return Size(int(n.value))
        if isinstance(n, ast.Name):
            return symbol(n.id)  # type: ignore[operator,no-any-return]
        if isinstance(n, ast.UnaryOp):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else v
        assert isinstance(n, ast.BinOp)
        a, b = ev(n.left), ev(n.right)
        match n.op:
            case ast.Add():
                return a + b
            case ast.Sub():
                return a - b
            case ast.Mult():
                return a * b
            case ast.FloorDiv():
                return a // b
            case _:
                return a % b

    try:
        return ev(tree)
    except GraphError:
        return None
