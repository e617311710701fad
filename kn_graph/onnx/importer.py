"""One import of an ONNX graph: the `Loader` binds the inputs with symbolic dims, reads the
initializers, and runs the registered handler of each node (`kn_graph.onnx.context`), in nested
scopes for subgraphs. Sizes an op needs equal are unified when one is a plain input symbol: the
import then restarts with it replaced (`load_graph`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from kn_graph.dtype import DType
from kn_graph.errors import (
    FixedSizeRequiredError,
    GraphError,
    OnnxImportError,
    StaticInputRequiredError,
    SymbolicSizeError,
    UnknownOperatorError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph
from kn_graph.onnx.context import (
    DOMAINS,
    HANDLERS,
    KNOWN_LIMIT,
    MAX_RANK,
    Known,
    NodeContext,
    Result,
    Seq,
    onnx_dtype,
)
from kn_graph.onnx.dims import parse_size_expr, unnamed_dim
from kn_graph.onnx.mapped import FileMaps
from kn_graph.onnx.options import LoadOptions
from kn_graph.onnx.order import topological_order
from kn_graph.onnx.reading import tensor_to_array
from kn_graph.onnx.sequences import STACKED
from kn_graph.ops import Constant, Tensor, Value
from kn_graph.shape import BATCH, Shape, Size, SizeLike

__all__ = ["Loader", "load_graph"]

MAX_UNIFICATIONS = 64
"""A load restarts once per pair of symbols it unifies; more than this is a bug."""


class _Unify(BaseException):
    """Raised inside a builder when two sizes must be equal and one is a plain input symbol:
    the load restarts with that symbol replaced (a BaseException, so no handler swallows it)."""

    def __init__(self, sym: str, value: Size) -> None:
        self.sym = sym
        self.value = value


def load_graph(
    model: onnx.ModelProto, folder: Path | None, options: LoadOptions, files: FileMaps
) -> Graph:
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


@dataclass
class _Enclosing:
    """A scope around the subgraph being loaded: its graph and names, and the values of it
    that the subgraph captured (the subgraph's extra inputs, in order)."""

    graph: Graph
    env: dict[str, Result]
    captures: list[Value]


class Loader:
    """The state of one import: the graph being built and the name → value environment. It is
    the `ImportScope` that node contexts and handlers see."""

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

    @property
    def in_subgraph(self) -> bool:
        """Whether a subgraph is loading as a graph of its own (a Loop body, an If branch)."""
        return bool(self._outer)

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
        """Import `nodes` in an order they can run in (`order.topological_order`)."""
        for node in topological_order(list(nodes)):
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
        """A tensor's values (an initializer, a tensor attribute), read as this model's are."""
        return tensor_to_array(t, where, self.folder, self.files)

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
                    dims.append(self.dim_param_size(unnamed_dim(name, axis)))
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
        expr = parse_size_expr(p, self.symbol)
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
        if domain not in DOMAINS:
            raise UnknownOperatorError(
                ctx.name,
                ctx.op_type,
                f"domain '{node.domain}' is not supported (supported: {', '.join(DOMAINS)})",
            )
        handler = HANDLERS.get((domain, node.op_type))
        if handler is None:
            where = "" if domain == "ai.onnx" else f" of domain '{domain}'"
            raise UnknownOperatorError(ctx.name, ctx.op_type, f"operator{where} not supported")
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
