"""The storage half of the graph: values in index (= topological) order, each a frozen
`ValueInfo`, hash-consed by the one `_push`; use counts, input/output lists, the guards on size
symbols, constants, and printing. Nothing here builds an op beyond `View` (`_conform`): the
builders are layered on top, each module importing only the one below it, so no module of the
graph imports one that imports it back —

    GraphBase (here) <- LayoutBuilders (`layout_builders`) <- ComputeBuilders (`compute_builders`)
    <- NNBuilders (`nn`) <- Graph (`graph`)

Evaluators (`kn_graph.dynamic`, whose control-flow kinds hand subgraphs to a runner) only read a
graph, so they may name this class without seeing the builders.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kn_graph.dtype import DType
from kn_graph.errors import GraphError, ShapeMismatchError
from kn_graph.ops import (
    Binary,
    Broadcast,
    Constant,
    Dynamic,
    Input,
    Op,
    Reduce,
    Tensor,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.shape import Equate, Guard, Shape, Size, SizeLike, check_guards

__all__ = ["GraphBase", "ValueInfo"]

_graph_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """What the graph knows of one value. `debug_name` is not part of the value's identity."""

    shape: Shape
    dtype: DType
    op: Op
    debug_name: str = ""

    @property
    def rank(self) -> int:
        return self.shape.rank


class GraphBase:
    """Values, guards and symbols of an append-only SSA graph; see `kn_graph.graph.Graph`."""

    def __init__(self) -> None:
        self.id = next(_graph_ids)
        self._infos: list[ValueInfo] = []
        self._uses: list[int] = []
        self._dedup: dict[tuple[Shape, DType, Op], Value] = {}
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.output_names: list[str] = []
        self.guards: list[Guard] = []
        """Conditions on the size symbols that every binding must meet (`check_bindings`)."""
        self._guard_keys: set[tuple[Size, str, Size]] = set()
        self.where = ""
        """Where new values come from (the loader sets the node), for guard messages."""
        self.equate: Equate | None = None
        """How two symbolic sizes that must be equal become one (the ONNX loader records a
        guard or unifies symbols); None: they must be identical, else GraphError."""
        self.binding_memo: dict[tuple, dict[str, int]] = {}
        """Input shapes (and pre-bound symbols) -> the bindings they gave, for
        `kn_graph.binding` (bounded there): solving and guard checks run once per shape."""
        self.optimized = False
        """Set on the graphs `kn_graph.optimizer.optimize` returns: `Device.prepare`, which
        optimizes by default, leaves such a graph as it is instead of optimizing it twice."""
        self._runtime_symbols: tuple[int, frozenset[str]] = (-1, frozenset())
        self._fresh_names: set[str] = set()
        self._taken_names: set[str] = set()

    # -- access ----------------------------------------------------------------------------------
    def check(self, v: Value) -> Value:
        if type(v) is Value and v.graph_id == self.id and 0 <= v.index < len(self._infos):
            return v  # the common case, first and cheap: passes call this constantly
        if not isinstance(v, Value):
            raise GraphError(f"expected a Value, found {type(v).__name__} {v!r}")
        if v.graph_id != self.id:
            raise GraphError(f"value {v} belongs to another graph")
        if not 0 <= v.index < len(self._infos):
            raise GraphError(f"value {v} does not exist in this graph of {len(self._infos)} values")
        return v

    def __getitem__(self, v: Value) -> ValueInfo:
        if type(v) is Value and v.graph_id == self.id and v.index >= 0:
            try:
                return self._infos[v.index]
            except IndexError:
                pass
        return self._infos[self.check(v).index]

    def __len__(self) -> int:
        return len(self._infos)

    def value(self, index: int) -> Value:
        """The handle of the value at `index`."""
        return self.check(Value(index, self.id))

    def value_infos(self) -> tuple[ValueInfo, ...]:
        """Every value's info in index (= topological) order; for fast executor loops."""
        return tuple(self._infos)

    def values(self) -> Iterator[Value]:
        return (Value(i, self.id) for i in range(len(self._infos)))

    def shape(self, v: Value) -> Shape:
        return self[v].shape

    def dtype(self, v: Value) -> DType:
        return self[v].dtype

    def use_count(self, v: Value) -> int:
        """Operand slots that use `v` (an op using it twice counts twice); outputs not counted."""
        return self._uses[self.check(v).index]

    def is_hidden_with_uses(self, v: Value, n: int) -> bool:
        """Not an input, not an output, and used exactly `n` times: safe to fuse into its user."""
        return (
            self.use_count(v) == n and v not in self.outputs and not isinstance(self[v].op, Input)
        )

    @property
    def input_names(self) -> list[str]:
        return [self[v].debug_name for v in self.inputs]

    def set_debug_name(self, v: Value, name: str) -> None:
        """Names are for printing and error messages only; set them on first use."""
        i = self.check(v).index
        if not self._infos[i].debug_name:
            info = self._infos[i]
            self._infos[i] = ValueInfo(info.shape, info.dtype, info.op, name)

    # -- guards ----------------------------------------------------------------------------------
    def add_guard(self, lhs: SizeLike, rel: str, rhs: SizeLike, what: str) -> None:
        """Record that every binding must satisfy `lhs rel rhs` (`==` or `>=`); a condition that
        holds for every binding is dropped, one that holds for none raises GraphError."""
        g = Guard.make(lhs, rel, rhs, self.where, what)
        if not g.trivial:
            self._keep_guard(g)

    def copy_guards(self, other: GraphBase) -> None:
        """Take over another graph's guards (rebuilding passes keep the assumptions)."""
        for g in other.guards:
            self._keep_guard(g)

    def _keep_guard(self, g: Guard) -> None:
        key = (g.lhs, g.rel, g.rhs)
        if key not in self._guard_keys:
            self._guard_keys.add(key)
            self.guards.append(g)

    def symbol_origins(self) -> dict[str, str]:
        """For each size symbol, the first input axis that carries it (for error messages)."""
        out: dict[str, str] = {}
        for v in self.inputs:
            info = self[v]
            for axis, d in enumerate(info.shape):
                for s in sorted(d.symbols):
                    out.setdefault(s, f"input '{info.debug_name}', axis {axis}")
        return out

    def check_bindings(self, bindings: Mapping[str, int]) -> None:
        """Raise ShapeMismatchError when the bindings violate one of the graph's guards; a guard
        on a run-time symbol not bound yet waits until an executor binds it."""
        if not self.guards:
            return
        guards = self.guards
        late = self.runtime_symbols - bindings.keys()
        if late:
            guards = [g for g in guards if not (g.lhs.symbols | g.rhs.symbols) & late]
        try:
            check_guards(guards, bindings)
        except ShapeMismatchError:  # again, saying where each symbol comes from (only now)
            check_guards(guards, bindings, self.symbol_origins())
            raise

    @property
    def runtime_symbols(self) -> frozenset[str]:
        """Size symbols bound while evaluating (result sizes of Dynamic ops), not by inputs."""
        n = len(self._infos)
        if self._runtime_symbols[0] != n:
            inputs: set[str] = set()
            for v in self.inputs:
                inputs |= self[v].shape.symbols
            found: set[str] = set()
            for info in self._infos:
                if isinstance(info.op, Dynamic):
                    found |= info.shape.symbols
            self._runtime_symbols = (n, frozenset(found - inputs))
        return self._runtime_symbols[1]

    @property
    def has_dynamic(self) -> bool:
        """Whether some value is a Dynamic op (data-dependent sizes or control flow)."""
        return any(isinstance(info.op, Dynamic) for info in self._infos)

    def share_fresh_names(self, other: GraphBase) -> None:
        """Draw fresh symbols from one pool with `other` (a subgraph and its enclosing graph),
        so no name means two sizes, and know `other`'s run-time symbols as such."""
        for info in other._infos:
            other._taken_names |= info.shape.symbols
        self._taken_names = other._taken_names
        self._fresh_names = other._fresh_names

    def is_runtime_size(self, d: Size) -> bool:
        """Whether size `d` involves a symbol made by `fresh_symbol` (here or in an enclosing
        graph): a result size of a data-dependent op, bound only while evaluating."""
        return bool(d.symbols & self._fresh_names)

    def fresh_symbol(self, hint: str) -> Size:
        """A size symbol no value of this graph uses yet, named `hint` plus a number."""
        used: set[str] = set(self._taken_names)
        for info in self._infos:
            used |= info.shape.symbols
        used |= self._fresh_names
        k = 0
        while f"{hint}{k}" in used:
            k += 1
        self._fresh_names.add(f"{hint}{k}")
        return Size.sym(f"{hint}{k}")

    def guard_equal(self, a: Size, b: Size, what: str) -> Size:
        """An `equate` policy: record the guard `a == b` and use `a` (what a loaded graph keeps,
        so passes that rebuild it may combine the sizes its loader equated)."""
        if a.is_fixed and b.is_fixed and a != b:
            raise GraphError(f"{what}: sizes {a} and {b} differ")
        self.add_guard(a, "==", b, what)
        return a

    def assume_size(self, x: Value, axis: int, size: SizeLike, what: str) -> Value:
        """`x` with axis `axis` labelled `size`, under the guard that the two are equal at every
        binding (checked when symbols are bound, naming `what`): how a loader takes an axis
        that is 1 only for the inputs a model is meant for (a Squeeze of `(samples+320)//512`).
        GraphError when they can never be equal."""
        info = self[x]
        d, want = info.shape[axis], Size.of(size)
        if d == want:
            return x
        self.add_guard(d, "==", want, what)
        dims = list(info.shape.dims)
        dims[axis] = want
        return self._push(Shape(tuple(dims)), info.dtype, View(x))

    def same_size(self, a: Size, b: Size, what: str) -> Size:
        """The size to use where an op needs `a` and `b` equal: a loader unifies them or records
        a guard (`equate`); GraphError when they can never be equal."""
        return self._same(a, b, what)

    def _same(self, a: Size, b: Size, what: str) -> Size:
        """The size to use where `a` and `b` must be equal; GraphError when they cannot be."""
        if a == b:
            return a
        if self.equate is None or (a.is_fixed and b.is_fixed):
            raise GraphError(f"{what}: sizes {a} and {b} differ")
        return self.equate(a, b, what)

    def _equate_or_none(self) -> Equate | None:
        return self._same if self.equate is not None else None

    def _conform(self, x: Value, shape: Shape) -> Value:
        """`x` re-labelled with the sizes of `shape` (right-aligned; size-1 axes kept) where they
        were equated with a guard: same data, same element count at every valid binding."""
        info = self[x]
        if info.shape == shape:
            return x
        off = shape.rank - info.rank
        dims = list(info.shape.dims)
        for i, d in enumerate(dims):
            t = shape[i + off] if i + off >= 0 else d
            if d != t and d != Size(1):
                dims[i] = t
        new = Shape(tuple(dims))
        if new == info.shape:
            return x
        return self._push(new, info.dtype, View(x))

    # -- the one place values are created ---------------------------------------------------------
    def _push(self, shape: Shape, dtype: DType, op: Op, name: str = "") -> Value:
        if not isinstance(dtype, DType):
            raise GraphError(f"{op.NAME}: expected a DType, found {dtype!r}")
        for axis, d in enumerate(shape.dims):
            v = d.fixed_value()
            if v is not None:
                if v < 0:
                    raise GraphError(f"{op.NAME}: negative size {d} in shape {shape}")
            elif not d.provably_nonneg():
                if d.bounds()[1] < 0:
                    raise GraphError(f"{op.NAME}: negative size {d} in shape {shape}")
                self.add_guard(d, ">=", 0, f"{op.NAME}: size of axis {axis} must not be negative")
        for x in op.inputs:
            self.check(x)
        key = (shape, dtype, op)
        if not isinstance(op, Input) and (hit := self._dedup.get(key)) is not None:
            return hit
        v = Value(len(self._infos), self.id)
        self._infos.append(ValueInfo(shape, dtype, op, name))
        self._uses.append(0)
        for x in op.inputs:
            self._uses[x.index] += 1
        if not isinstance(op, Input):
            self._dedup[key] = v
        return v

    # -- inputs, outputs, constants ----------------------------------------------------------------
    def input(self, shape: Shape | Sequence[SizeLike], dtype: DType, name: str = "") -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        used = set(self.input_names)  # inputs can be passed by name: names must be unique
        if name in used:
            raise GraphError(f"input: the name '{name}' is already taken by another input")
        k = len(self.inputs)
        while not name:
            name = f"input{k}" if f"input{k}" not in used else ""
            k += 1
        v = self._push(shape, dtype, Input(len(self.inputs)), name)
        self.inputs.append(v)
        return v

    def add_output(self, v: Value, name: str = "") -> None:
        self.check(v)
        self.outputs.append(v)
        self.output_names.append(name or f"output{len(self.outputs) - 1}")

    def constant(self, array: np.ndarray | float | int | bool, dtype: DType | None = None) -> Value:
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtype.np, copy=False)
        dt = DType.from_np(arr.dtype)
        return self._push(Shape.of(*arr.shape), dt, Constant(Tensor(arr)))

    def constant_tensor(self, tensor: Tensor) -> Value:
        """A constant from an existing Tensor (no copy, no re-hash: rebuilding passes use it)."""
        arr = tensor.array
        return self._push(Shape.of(*arr.shape), DType.from_np(arr.dtype), Constant(tensor))

    def scalar(self, value: float | int | bool, dtype: DType) -> Value:
        """A rank-0 constant; a value the dtype cannot hold exactly (0.5 or 300 as u8) raises."""
        try:
            with np.errstate(all="ignore"):
                arr = np.array(value, dtype=dtype.np)
        except (OverflowError, ValueError, TypeError):
            arr = None
        if arr is None or (not dtype.is_float and arr.item() != value):
            raise GraphError(f"scalar {value!r} is not representable as {dtype}")
        return self.constant(arr)

    def const_value(self, v: Value) -> np.ndarray | None:
        """The data of a Constant value, else None."""
        op = self[v].op
        return op.tensor.array if isinstance(op, Constant) else None

    def scalar_value(self, v: Value) -> float | int | bool | None:
        """The element value when `v` is a constant whose elements are all equal, looking through
        views and broadcasts; else None."""
        while True:
            op = self[v].op
            match op:
                case View(x) | Broadcast(x):
                    v = x
                case Constant(t):
                    a = t.array
                    if a.size == 0:
                        return None
                    first = a.reshape(-1)[0]
                    if a.size == 1 or bool(np.all(a == first)):
                        return first.item()
                    return None
                case _:
                    return None

    # -- printing -------------------------------------------------------------------------------------
    def format_value(self, v: Value) -> str:
        info = self[v]
        op = info.op
        match op:
            case Unary(x, u):
                if u is UnaryOp.CAST or u is UnaryOp.BITCAST:
                    call = f"{u.value}_{info.dtype}({x})"
                else:
                    call = f"{u.value}({x})"
            case Binary(a, b, bop):
                call = f"{bop.value}({a}, {b})"
            case Reduce(x, _, rop):
                call = f"reduce_{rop.value}({x})"
            case Input():
                call = "input"
            case Constant():
                call = "const"
            case _:
                call = f"{op.NAME}({', '.join(str(x) for x in op.inputs)})"
        attrs = op.attrs()
        line = f"{v}: {info.dtype}{info.shape} = {call}"
        if attrs:
            line += f" {attrs}"
        if isinstance(op, Input):
            line += f' "{info.debug_name}"'
        return line

    def __str__(self) -> str:
        lines = [self.format_value(v) for v in self.values()]
        outs = ", ".join(f'{v} "{n}"' for v, n in zip(self.outputs, self.output_names, strict=True))
        lines.append(f"outputs: {outs}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {len(self)} values, {len(self.inputs)} inputs, {len(self.outputs)} outputs>"
