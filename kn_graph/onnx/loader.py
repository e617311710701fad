"""ONNX → kn_graph: parse the model, bind inputs with symbolic dims, read initializers (external
data included), and run one registered handler per node."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from kn_graph.dtype import DType
from kn_graph.errors import GraphError, OnnxImportError, UnsupportedOnnxError
from kn_graph.graph import Graph
from kn_graph.onnx.context import HANDLERS, Known, NodeContext, Result, onnx_dtype
from kn_graph.ops import Value
from kn_graph.shape import BATCH, Shape, Size, SizeLike

__all__ = ["DEFAULT_BATCH_AXES", "load_onnx"]

DEFAULT_BATCH_AXES = ("batch_size", "batch", "N", "B", "b", "batch_dim", "unk__batch")
"""dim_params unified into the batch symbol B."""

KNOWN_LIMIT = 4096
"""Integer initializers up to this many elements are kept as load-time `Known` tensors."""

Source = str | os.PathLike[str] | bytes | onnx.ModelProto


def load_onnx(
    source: Source,
    *,
    batch_axes: Iterable[str] = DEFAULT_BATCH_AXES,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[SizeLike]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Graph:
    """Load an ONNX model (path, bytes or ModelProto) into a new `Graph`.

    - every `dim_param` becomes a size symbol; those named in `batch_axes` become `B`;
    - `dims` pins symbols to numbers (`dims={"seq": 77}`), `input_shapes` gives whole shapes;
    - `input_values` turns graph inputs into constants (needed when an input determines a shape);
    - external data is read relative to `base_dir` (default: the model's folder) and may not
      leave it.
    Raises `OnnxImportError` for unreadable models and `UnsupportedOnnxError` for what the IR
    cannot express.
    """
    model, folder = _read_model(source, base_dir)
    loader = Loader(
        model, folder, set(batch_axes), dict(dims or {}), input_shapes or {}, input_values or {}
    )
    return loader.run()


def _read_model(
    source: Source, base_dir: str | os.PathLike[str] | None
) -> tuple[onnx.ModelProto, Path | None]:
    folder = Path(base_dir) if base_dir is not None else None
    if isinstance(source, onnx.ModelProto):
        return source, folder
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        where = "<bytes>"
    else:
        path = Path(source)
        where = str(path)
        try:
            data = path.read_bytes()
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
    return model, folder


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
    ) -> None:
        self.model = model
        self.folder = folder
        self.batch_axes = batch_axes
        self.dims = dims
        self.input_shapes = input_shapes
        self.input_values = input_values
        self.graph = Graph()
        self.env: dict[str, Result] = {}
        self.bad_initializers: dict[str, str] = {}
        self.node_index = 0
        self.opsets: dict[str, int] = {}
        for o in model.opset_import:
            self.opsets[o.domain or "ai.onnx"] = int(o.version)

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
        unknown = set(self.input_values) - {i.name for i in g.input}
        if unknown:
            raise OnnxImportError(
                f"input_values names {sorted(unknown)}, which are not graph inputs"
            )
        self.run_nodes(g.node)
        if not g.output:
            raise OnnxImportError("the model has no outputs")
        for out in g.output:
            r = self.lookup(out.name, None)
            v = self.as_value(r)
            self.graph.set_debug_name(v, out.name)
            self.graph.add_output(v, out.name)
        return self.graph

    def run_nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            self.run_node(node)
            self.node_index += 1

    def inline_graph(self, sub: onnx.GraphProto, ctx: NodeContext) -> list[Result]:
        """Import a subgraph (If branch) in the current scope; returns its outputs."""
        if sub.input:
            ctx.unsupported("subgraphs with inputs (Loop/Scan bodies) are not supported")
        self.add_initializers(sub.initializer)
        self.run_nodes(sub.node)
        return [self.lookup(o.name, ctx) for o in sub.output]

    # -- inputs and initializers ----------------------------------------------------------------
    def add_initializers(self, tensors: Iterable[onnx.TensorProto]) -> None:
        for t in tensors:
            try:
                arr = self.tensor_to_array(t, f"initializer '{t.name}'")
            except UnsupportedOnnxError as e:
                self.bad_initializers[t.name] = e.detail
                continue
            self.env[t.name] = self.result_of_array(arr)

    def result_of_array(self, arr: np.ndarray) -> Result:
        dt = DType.from_np(arr.dtype)
        if (dt.is_int or dt.is_bool) and arr.size <= KNOWN_LIMIT:
            return Known(arr, dt)
        return self.graph.constant(arr)

    def tensor_to_array(self, t: onnx.TensorProto, where: str) -> np.ndarray:
        if t.data_type == onnx.TensorProto.BFLOAT16:
            raw = self._tensor_bytes(t, where)
            if raw is not None:
                u16 = np.frombuffer(raw, dtype="<u2")
            else:
                u16 = np.asarray(t.int32_data, dtype=np.uint32).astype(np.uint16)
            return (u16.astype(np.uint32) << 16).view(np.float32).reshape(tuple(t.dims))
        dt = onnx_dtype(t.data_type, where)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raw = self._tensor_bytes(t, where)
            assert raw is not None
            count = int(np.prod(t.dims, dtype=np.int64))
            if len(raw) != count * dt.size:
                raise OnnxImportError(
                    f"{where}: external data holds {len(raw)} bytes, expected {count * dt.size} "
                    f"for {dt}{list(t.dims)}"
                )
            return (
                np.frombuffer(raw, dtype=dt.np.newbyteorder("<"))
                .astype(dt.np, copy=False)
                .reshape(tuple(t.dims))
            )
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:
            raise OnnxImportError(f"{where}: cannot decode tensor data ({e})") from None
        return arr.astype(dt.np, copy=False)

    def _tensor_bytes(self, t: onnx.TensorProto, where: str) -> bytes | None:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return t.raw_data if t.HasField("raw_data") else None
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location")
        if not loc:
            raise OnnxImportError(f"{where}: external data without a location")
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
            length = int(info["length"]) if "length" in info else -1
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(length) if length >= 0 else f.read()
        except (OSError, ValueError) as e:
            raise OnnxImportError(
                f"{where}: cannot read external data file '{path}': {e}"
            ) from None
        if length >= 0 and len(data) != length:
            raise OnnxImportError(
                f"{where}: external data file '{path}' is truncated ({len(data)} of {length} bytes)"
            )
        return data

    def add_input(self, inp: onnx.ValueInfoProto) -> None:
        name = inp.name
        where = f"input '{name}'"
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOnnxError(where, "", "only tensor inputs are supported")
        tt = inp.type.tensor_type
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
                elif d.HasField("dim_param") and d.dim_param:
                    p = d.dim_param
                    sym = BATCH if p in self.batch_axes else p
                    if p in self.dims:
                        dims.append(Size(int(self.dims[p])))
                    elif sym in self.dims:
                        dims.append(Size(int(self.dims[sym])))
                    else:
                        dims.append(Size.sym(sym))
                else:
                    raise OnnxImportError(
                        f"{where}, axis {axis}: the size is neither a number nor named; pass "
                        f"input_shapes={{'{name}': [...]}}"
                    )
            shape = Shape(tuple(dims))
        self.env[name] = self.graph.input(shape, dt, name)

    # -- nodes ----------------------------------------------------------------------------------
    def lookup(self, name: str, ctx: NodeContext | None) -> Result:
        r = self.env.get(name)
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
        try:
            out = handler(ctx)
            ctx.check_all_used()
        except GraphError as e:
            raise UnsupportedOnnxError(ctx.name, ctx.op_type, str(e)) from None
        results = [out] if isinstance(out, Value | Known) else list(out)
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(results) or results[i] is None:
                ctx.unsupported(f"output {i} ('{name}') is not supported")
            r = results[i]
            assert r is not None
            if isinstance(r, Value):
                self.graph.set_debug_name(r, name)
            self.env[name] = r
