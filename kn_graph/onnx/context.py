"""What an ONNX op handler sees: the node's inputs (graph values or load-time `Known` tensors),
its attributes (consumption is recorded, leftovers are refused), and the graph to build into.

Handlers live in a registry, one module per op family:

    @onnx_op("Relu")
    def relu(ctx: NodeContext) -> Result:
        return ctx.graph.relu(ctx.input(0))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

import numpy as np
import onnx

from kn_graph.dtype import DType
from kn_graph.errors import (
    KnError,
    StaticInputRequiredError,
    SymbolicSizeError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph
from kn_graph.ops import Input, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "DOMAINS",
    "HANDLERS",
    "KNOWN_LIMIT",
    "MAX_RANK",
    "MAX_UNROLL",
    "ImportScope",
    "Known",
    "NodeContext",
    "Result",
    "Seq",
    "onnx_dtype",
    "onnx_op",
]

MAX_RANK = 32
"""The highest rank a loaded value may have (NumPy 1.x's limit; ONNX models stay far below)."""

KNOWN_LIMIT = 4096
"""Integer tensors up to this many elements (initializers, shape arithmetic) are kept as
load-time `Known` tensors."""

MAX_UNROLL = 1 << 14
"""The most steps a handler unrolls into the graph (linear-attention time steps; recurrent
layers unroll at most `rnn_steps.RNN_MAX_UNROLL`): a declared length of 2^31 is refused
instead of building for hours."""


@dataclass(frozen=True, slots=True, eq=False)
class Known:
    """An integer/bool tensor whose value is known at load time, possibly symbolic: `data` is a
    NumPy array of `dtype` or, when any element is a symbolic `Size`, an object array of ints and
    Sizes (a *shape tensor*). Shape arithmetic runs on these, never in the graph."""

    data: np.ndarray
    dtype: DType

    @staticmethod
    def of(data: np.ndarray | Sequence[object], dtype: DType) -> Known:
        arr = np.asarray(data, dtype=object)
        flat = [_simplify(x) for x in arr.reshape(-1)]
        if all(not isinstance(x, Size) for x in flat):
            num = (
                np.array(flat, dtype=dtype.np).reshape(arr.shape)
                if flat
                else np.zeros(arr.shape, dtype.np)
            )
            return Known(num, dtype)
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return Known(out.reshape(arr.shape), dtype)

    @property
    def is_symbolic(self) -> bool:
        return self.data.dtype == object

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def sizes(self) -> list[Size]:
        """The elements as Sizes (for use as a shape)."""
        return [x if isinstance(x, Size) else Size(int(x)) for x in self.data.reshape(-1)]


def _simplify(x: object) -> object:
    if isinstance(x, Size):
        v = x.fixed_value()
        return x if v is None else v
    if isinstance(x, np.generic):
        return x.item()
    return x


_SIZES = Value(-1, -1)
"""What `_fold_constant` returns for a value computed from symbolic sizes (not from data)."""


def _fold_constant(g: Graph, v: Value) -> np.ndarray | Value | None:
    """Evaluate a computed value at load time when it depends on constants only (Cast(-inf),
    Max(Shape(x), [4]) …). Else the first graph input it depends on, `_SIZES` when it depends on
    symbolic sizes, or None when it cannot be evaluated."""
    from kn_graph.reference import evaluate

    seen: set[int] = set()
    stack, order = [v], []
    while stack:
        x = stack.pop()
        if x.index in seen:
            continue
        seen.add(x.index)
        info = g[x]
        if isinstance(info.op, Input):
            return x
        order.append(x)
        stack.extend(info.op.inputs)
    if not all(g[x].shape.is_fixed for x in order):
        return _SIZES
    sub = Graph()
    mapping: dict[Value, Value] = {}
    for x in sorted(order, key=lambda y: y.index):
        info = g[x]
        mapping[x] = sub._push(info.shape, info.dtype, info.op.map_inputs(lambda y: mapping[y]))
    sub.add_output(mapping[v])
    try:
        return evaluate(sub, [])[0]
    except KnError:
        return None


@dataclass(frozen=True, slots=True, eq=False)
class Seq:
    """An ONNX sequence whose length is known at load time: its elements, each a Result
    (SequenceConstruct, SplitToSequence, ... build these; ConcatFromSequence reads them).
    `dtype` is the element type (needed for an empty sequence)."""

    items: tuple[Value | Known | Seq, ...]
    dtype: DType | None = None
    stacked: Value | None = None
    """Instead of `items`: one value whose axis 0 runs over the elements (a Loop's appended
    sequence, of a length known at run time)."""


Result = Value | Known | Seq
Handler = Callable[["NodeContext"], Result | Sequence[Result | None]]
HANDLERS: dict[tuple[str, str], Handler] = {}
"""Handlers by (domain, op type); the default domain is "ai.onnx"."""

DOMAINS = ("ai.onnx", "com.microsoft")
"""The operator domains the loader reads: ONNX's and onnxruntime's contrib operators."""


def onnx_op(*op_types: str, domain: str = "ai.onnx") -> Callable[[Handler], Handler]:
    """Register a handler for one or more ONNX op types of `domain` (the default domain, or
    "com.microsoft" for onnxruntime's contrib operators)."""
    if domain not in DOMAINS:
        raise RuntimeError(f"unknown operator domain {domain!r}; known: {', '.join(DOMAINS)}")

    def register(f: Handler) -> Handler:
        for t in op_types:
            if (domain, t) in HANDLERS:
                raise RuntimeError(f"two handlers for ONNX op {domain}::{t}")
            HANDLERS[domain, t] = f
        return f

    return register


_ONNX_TO_DTYPE = {
    onnx.TensorProto.FLOAT: DType.F32,
    onnx.TensorProto.DOUBLE: DType.F64,
    onnx.TensorProto.FLOAT16: DType.F16,
    onnx.TensorProto.INT8: DType.I8,
    onnx.TensorProto.INT16: DType.I16,
    onnx.TensorProto.INT32: DType.I32,
    onnx.TensorProto.INT64: DType.I64,
    onnx.TensorProto.UINT8: DType.U8,
    onnx.TensorProto.UINT16: DType.U16,
    onnx.TensorProto.UINT32: DType.U32,
    onnx.TensorProto.UINT64: DType.U64,
    onnx.TensorProto.BOOL: DType.BOOL,
}


def onnx_dtype(elem_type: int, where: str) -> DType:
    """Our dtype for an ONNX element type; bf16 is not one (initializers convert it to f32)."""
    dt = _ONNX_TO_DTYPE.get(elem_type)
    if dt is None:
        name = (
            onnx.TensorProto.DataType.Name(elem_type)
            if elem_type in onnx.TensorProto.DataType.values()
            else str(elem_type)
        )
        raise UnsupportedOnnxError(where, "", f"element type {name} is not supported")
    return dt


class ImportScope(Protocol):
    """What a node and its handler may ask of the import in progress (`kn_graph.onnx.importer`'s
    `Loader` is the one implementation): this module names the protocol, not the loader, so
    handlers and the loader both import it and neither imports the other."""

    graph: Graph
    """The graph being built (a subgraph's own graph while one loads)."""
    node_index: int
    value_sizes: dict[Value, Size]
    """Graph values known to equal a size (a size cast to float), for Range bounds."""

    @property
    def in_subgraph(self) -> bool: ...

    def lookup(self, name: str, ctx: NodeContext | None) -> Result: ...

    def as_value(self, r: Result) -> Value: ...

    def result_of_array(self, arr: np.ndarray) -> Result: ...

    def tensor_to_array(self, t: onnx.TensorProto, where: str) -> np.ndarray: ...

    def inline_graph(
        self, sub: onnx.GraphProto, ctx: NodeContext, bound: Mapping[str, Result] | None = None
    ) -> list[Result]: ...

    def subgraph(
        self, sub: onnx.GraphProto, formals: Sequence[tuple[str, Shape, DType]], ctx: NodeContext
    ) -> tuple[Graph, list[Value]]: ...


class NodeContext:
    """One node being imported. Read inputs and attributes through it; it records what was used."""

    def __init__(self, loader: ImportScope, node: onnx.NodeProto, opset: int) -> None:
        self.loader = loader
        self.graph: Graph = loader.graph
        self.node = node
        self.opset = opset
        self.name = node.name or f"{node.op_type}#{loader.node_index}"
        self.op_type = node.op_type
        self._attrs = {a.name: a for a in node.attribute}
        self._used_attrs: set[str] = set()
        self._used_inputs: set[int] = set()

    # -- errors ---------------------------------------------------------------------------------
    def unsupported(self, detail: str) -> NoReturn:
        raise UnsupportedOnnxError(self.name, self.op_type, detail)

    def needs_fixed_sizes(self, detail: str) -> NoReturn:
        """Refuse what only fixed sizes allow: the loader then specializes on input shapes."""
        raise SymbolicSizeError(self.name, self.op_type, detail)

    @property
    def in_subgraph(self) -> bool:
        """Whether the node belongs to a subgraph loaded as a graph of its own (a Loop body)."""
        return self.loader.in_subgraph

    # -- inputs ---------------------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def input_name(self, i: int) -> str:
        return self.node.input[i]

    def raw_input(self, i: int) -> Result:
        if not self.has_input(i):
            self.unsupported(f"input {i} is required")
        self._used_inputs.add(i)
        return self.loader.lookup(self.node.input[i], self)

    def input(self, i: int) -> Value:
        """Input i as a graph value (a Known is materialised as a constant or size expression)."""
        r = self.tensor_input(i)
        return self.materialize(r) if isinstance(r, Known) else r

    def tensor_input(self, i: int) -> Value | Known:
        """Input i, which must be a tensor (not a sequence)."""
        r = self.raw_input(i)
        if isinstance(r, Seq):
            self.unsupported(f"input {i} ('{self.node.input[i]}') is a sequence, not a tensor")
        return r

    def optional_input(self, i: int) -> Value | None:
        return self.input(i) if self.has_input(i) else None

    def inputs(self) -> list[Value]:
        return [self.input(i) for i in range(self.num_inputs) if self.has_input(i)]

    def input_known(self, i: int) -> Known | None:
        """Input i as a Known when its value is known at load time (constant, shape tensor)."""
        r = self.tensor_input(i)
        if isinstance(r, Known):
            return r
        arr = self.graph.const_value(r)
        if arr is not None and (arr.dtype.kind in "iub"):
            return Known(arr, self.graph[r].dtype)
        return None

    def input_static(self, i: int, what: str) -> np.ndarray:
        """The concrete value of input i, which must be known at load time and free of symbols."""
        r = self.tensor_input(i)
        if isinstance(r, Known):
            if r.is_symbolic:
                self.unsupported(f"{what} (input {i}) depends on symbolic sizes {r.data.tolist()}")
            return r.data
        arr = self.graph.const_value(r)
        if arr is not None:
            return arr
        info = self.graph[r]
        if isinstance(info.op, Input):  # named as the graph input, even when reached via an alias
            raise StaticInputRequiredError(self.name, self.op_type, info.debug_name, what)
        folded = _fold_constant(self.graph, r)
        if isinstance(folded, np.ndarray):
            return folded
        if folded is _SIZES:  # float arithmetic on symbolic sizes: fine once sizes are fixed
            self.needs_fixed_sizes(
                f"{what} (input {i}) is computed from symbolic sizes in a way sizes cannot express"
            )
        if folded is not None:  # computed from a graph input: that input must be given
            name = self.graph[folded].debug_name
            raise StaticInputRequiredError(self.name, self.op_type, name, what)
        self.unsupported(
            f"{what} (input {i}, '{self.node.input[i]}') must be a constant, found a computed value"
        )

    def input_sizes(self, i: int, what: str) -> list[Size]:
        """Input i as a list of (possibly symbolic) sizes, e.g. the target of a Reshape."""
        r = self.tensor_input(i)
        if isinstance(r, Known):
            return r.sizes()
        arr = np.asarray(self.input_static(i, what))
        if arr.dtype.kind not in "iu":
            self.unsupported(f"{what} (input {i}) must be integers, found {arr.dtype}")
        return [Size(int(x)) for x in arr.reshape(-1)]

    def input_shape(self, i: int) -> Shape:
        r = self.tensor_input(i)
        if isinstance(r, Known):
            return Shape.of(*r.shape)
        return self.graph[r].shape

    def input_dtype(self, i: int) -> DType:
        r = self.tensor_input(i)
        return r.dtype if isinstance(r, Known) else self.graph[r].dtype

    def input_rank(self, i: int) -> int:
        return len(self.input_shape(i))

    def materialize(self, k: Known) -> Value:
        """A Known as a graph value: a constant, or for symbolic elements a size expression."""
        if not k.is_symbolic:
            return self.graph.constant(k.data, k.dtype)
        g = self.graph
        elems: list[Value] = []
        for x in k.data.reshape(-1):
            if isinstance(x, Size):
                elems.append(self.size_value(x, k.dtype))
            else:
                elems.append(g.view(g.scalar(int(x), k.dtype), [1]))
        flat = g.concat([g.view(e, [1]) for e in elems], 0)
        return g.view(flat, Shape.of(*k.shape))

    def size_value(self, s: Size, dtype: DType) -> Value:
        """A symbolic size as a rank-0 runtime value (`Graph.size_value`)."""
        return self.graph.size_value(s, dtype)

    # -- attributes -----------------------------------------------------------------------------
    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def _attr(self, name: str, kind: int | None = None) -> onnx.AttributeProto | None:
        a = self._attrs.get(name)
        if a is not None:
            self._used_attrs.add(name)
            if a.ref_attr_name:
                self.unsupported(f"attribute '{name}' refers to a function attribute")
            if kind is not None and a.type != kind and a.type != onnx.AttributeProto.UNDEFINED:
                want = onnx.AttributeProto.AttributeType.Name(kind)
                found = (
                    onnx.AttributeProto.AttributeType.Name(a.type)
                    if a.type in onnx.AttributeProto.AttributeType.values()
                    else str(a.type)
                )
                self.unsupported(f"attribute '{name}' must be of type {want}, found {found}")
        return a

    def attr_int(self, name: str, default: int | None = None) -> int:
        a = self._attr(name, onnx.AttributeProto.INT)
        if a is None:
            if default is None:
                self.unsupported(f"attribute '{name}' is required")
            return default
        return int(a.i)

    def attr_bool(self, name: str, default: bool) -> bool:
        """A flag attribute (an INT that ONNX allows to be 0 or 1 only). Other values are
        refused: onnxruntime reads 2 as true in some ops, as false in others, and refuses it in
        yet others, so no reading of it is the model's intent."""
        v = self.attr_int(name, int(default))
        if v not in (0, 1):
            self.unsupported(f"attribute '{name}' is a flag and must be 0 or 1, found {v}")
        return bool(v)

    def attr_float(self, name: str, default: float | None = None) -> float:
        a = self._attr(name, onnx.AttributeProto.FLOAT)
        if a is None:
            if default is None:
                self.unsupported(f"attribute '{name}' is required")
            return default
        return float(a.f)

    def attr_str(self, name: str, default: str | None = None) -> str:
        a = self._attr(name, onnx.AttributeProto.STRING)
        if a is None:
            if default is None:
                self.unsupported(f"attribute '{name}' is required")
            return default
        return a.s.decode(errors="replace")

    def attr_ints(self, name: str, default: Sequence[int] | None = None) -> list[int] | None:
        a = self._attr(name, onnx.AttributeProto.INTS)
        if a is None:
            return None if default is None else list(default)
        return [int(x) for x in a.ints]

    def attr_floats(self, name: str, default: Sequence[float] | None = None) -> list[float] | None:
        a = self._attr(name, onnx.AttributeProto.FLOATS)
        if a is None:
            return None if default is None else list(default)
        return [float(x) for x in a.floats]

    def attr_strings(self, name: str, default: Sequence[str] | None = None) -> list[str] | None:
        a = self._attr(name, onnx.AttributeProto.STRINGS)
        if a is None:
            return None if default is None else list(default)
        return [x.decode(errors="replace") for x in a.strings]

    def attr_tensor(self, name: str) -> np.ndarray | None:
        a = self._attr(name, onnx.AttributeProto.TENSOR)
        if a is None:
            return None
        return self.loader.tensor_to_array(a.t, self.name)

    def attr_graph(self, name: str) -> onnx.GraphProto | None:
        a = self._attr(name, onnx.AttributeProto.GRAPH)
        return None if a is None else a.g

    def ignore_attrs(self, *names: str) -> None:
        """Mark attributes as consumed that have no effect on inference (e.g. Dropout's seed)."""
        for n in names:
            if n in self._attrs:
                self._used_attrs.add(n)

    def check_all_used(self) -> None:
        left = [n for n in self._attrs if n not in self._used_attrs]
        if left:
            a = self._attrs[left[0]]
            self.unsupported(
                f"attribute '{left[0]}' ({onnx.helper.get_attribute_value(a)!r}) is not supported"
            )
        unused = [i for i, n in enumerate(self.node.input) if n and i not in self._used_inputs]
        if unused:
            self.unsupported(f"input {unused[0]} ('{self.node.input[unused[0]]}') is not supported")

    # -- helpers for handlers -------------------------------------------------------------------
    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            self.unsupported(f"axis {axis} out of range for rank {rank}")
        return axis + rank if axis < 0 else axis
