"""The SSA graph: append-only, hash-consed, with validating and canonicalising builders.

>>> g = Graph()
>>> x = g.input(Shape.of(Size.sym("B"), 4), DType.F32, "x")
>>> y = g.relu(g.add(x, 1.0))
>>> g.add_output(y, "y")
>>> print(g)
%0: f32[B,4] = input #0 "x"
%1: f32[] = const 1.0
%2: f32[1,1] = view(%1)
%3: f32[B,4] = broadcast(%2)
%4: f32[B,4] = add(%0, %3)
%5: f32[] = const 0.0
%6: f32[1,1] = view(%5)
%7: f32[B,4] = broadcast(%6)
%8: f32[B,4] = max(%4, %7)
outputs: %8 "y"
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kn_graph.dtype import DType
from kn_graph.errors import GraphError, ShapeMismatchError
from kn_graph.nn import NNBuilders
from kn_graph.ops import (
    Attention,
    Binary,
    BinaryOp,
    Broadcast,
    Concat,
    Constant,
    Conv,
    ConvDetails,
    Dynamic,
    Gather,
    Input,
    Iota,
    Layernorm,
    MatMul,
    Op,
    Permute,
    Reduce,
    ReduceOp,
    Select,
    Slice,
    Softmax,
    Tensor,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.shape import Guard, Shape, Size, SizeLike, _Node, check_guards

__all__ = ["Graph", "ValueInfo", "broadcast_shapes", "slice_bounds"]

_graph_ids = itertools.count()


def _no_subgraphs(
    graph: Graph, inputs: list[np.ndarray], bindings: Mapping[str, int]
) -> list[np.ndarray]:
    raise GraphError("internal: a dynamic op without subgraphs ran one")


Operand = Value | float | int | bool


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


Equate = Callable[[Size, Size, str], Size]
"""Decides that two sizes that must be equal are (returns the one to use) or raises."""


def broadcast_shapes(*shapes: Shape, equate: Equate | None = None) -> Shape:
    """NumPy broadcasting of symbolic shapes: a size 1 stretches, other sizes must be equal
    (symbolic sizes that differ are passed to `equate`, when given)."""
    rank = max(s.rank for s in shapes)
    out: list[Size] = []
    for i in range(rank):
        dim = Size(1)
        for s in shapes:
            j = i - (rank - s.rank)
            if j < 0:
                continue
            d = s[j]
            if d == dim or d == Size(1):
                continue
            if dim == Size(1):
                dim = d
            elif equate is not None and not (dim.is_fixed and d.is_fixed):
                dim = equate(dim, d, f"broadcasting {', '.join(map(str, shapes))} (axis {i})")
            else:
                raise GraphError(
                    f"cannot broadcast shapes {', '.join(map(str, shapes))}: axis {i} has sizes "
                    f"{dim} and {d}"
                )
        out.append(dim)
    return Shape(tuple(out))


def slice_bounds(
    dim: Size,
    start: Size | None,
    end: Size | None,
    step: int,
    huge: int = 2**24,
    clamp: bool = False,
) -> tuple[Size, Size, list[tuple[Size, Size]]]:
    """(first index, element count, assumptions) of Python/ONNX slicing `[start:end:step]` on
    an axis of `dim` elements. With fixed bounds on a fixed axis, bounds are clamped exactly.
    Otherwise fixed negative bounds count from the end, fixed bounds of `huge` or more mean "to
    the end" (exporters write 1e9, INT32_MAX, INT64_MAX), and the bounds are assumed to lie on
    the axis: the assumptions `(lhs, rhs)` mean lhs >= rhs and become guards. With `clamp`
    (an axis of a run-time size: a detector keeps `[:100]` of however many boxes it found),
    fixed bounds are clamped exactly with min/max instead."""
    n = dim.fixed_value()
    sv = None if start is None else start.fixed_value()
    ev = None if end is None else end.fixed_value()
    if (
        clamp
        and n is None
        and (start is None or sv is not None)
        and (end is None or ev is not None)
    ):
        return _clamped_bounds(dim, sv, ev, step, huge)
    sv = None if start is None else start.fixed_value()
    ev = None if end is None else end.fixed_value()
    if n is not None and (start is None or sv is not None) and (end is None or ev is not None):
        r = range(*slice(sv, ev, step).indices(n))
        return Size(r.start if len(r) else 0), Size(len(r)), []
    conds: list[tuple[Size, Size]] = []

    def norm(b: Size | None, default: Size, lo: int, hi: Size) -> Size:
        if b is None:
            return default
        v = b.fixed_value()
        if v is not None:
            if v >= huge or (n is not None and v >= n):
                return hi
            if v <= -huge or (n is not None and v < -n):
                return Size(lo)
            if v < 0:
                b = dim + v
        conds.append((b, Size(lo)))
        conds.append((hi, b))
        return b

    if step > 0:
        s = norm(start, Size(0), 0, dim)
        e = norm(end, dim, 0, dim)
        length = (e - s).ceildiv(step)
    else:
        s = norm(start, dim - 1, -1, dim - 1)
        e = norm(end, Size(-1), -1, dim - 1)
        length = (s - e).ceildiv(-step)
    lv = length.fixed_value()
    if lv is not None and lv <= 0:
        return Size(0), Size(0), []
    conds.append((length, Size(0)))
    return s, length, conds


def _clamped_bounds(
    dim: Size, sv: int | None, ev: int | None, step: int, huge: int
) -> tuple[Size, Size, list[tuple[Size, Size]]]:
    """Fixed bounds on a symbolic axis, clamped as Python slicing does (no assumptions)."""

    def clamp(v: int | None, default: Size, lo: int, hi: Size) -> Size:
        if v is None:
            return default
        if v >= huge:
            return hi
        if v <= -huge:
            return Size(lo)
        if v < 0:
            return Size.max(dim + v, lo)
        return Size.min(v, hi)

    if step > 0:
        s = clamp(sv, Size(0), 0, dim)
        e = clamp(ev, dim, 0, dim)
        length = Size.max(e - s, 0).ceildiv(step)
    else:
        s = clamp(sv, dim - 1, -1, dim - 1)
        e = clamp(ev, Size(-1), -1, dim - 1)
        length = Size.max(s - e, 0).ceildiv(-step)
    return Size.max(s, 0), length, []


def _norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise GraphError(f"{what} {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


class Graph(NNBuilders):
    """An append-only SSA graph. Index order is topological order."""

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
        self._runtime_symbols: tuple[int, frozenset[str]] = (-1, frozenset())
        self._fresh_names: set[str] = set()
        self._taken_names: set[str] = set()
        """How two symbolic sizes that must be equal become one (the ONNX loader records a
        guard or unifies symbols); None: they must be identical, else GraphError."""

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

    def copy_guards(self, other: Graph) -> None:
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

    def share_fresh_names(self, other: Graph) -> None:
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

    def _same(self, a: Size, b: Size, what: str) -> Size:
        """The size to use where `a` and `b` must be equal; GraphError when they cannot be."""
        if a == b:
            return a
        if self.equate is None or (a.is_fixed and b.is_fixed):
            raise GraphError(f"{what}: sizes {a} and {b} differ")
        return self.equate(a, b, what)

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

    def full(
        self, value: float | int | bool, shape: Shape | Sequence[SizeLike], dtype: DType
    ) -> Value:
        """A broadcast scalar: costs one element of storage, whatever the shape."""
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        return self.broadcast(self.scalar(value, dtype), shape)

    def const_value(self, v: Value) -> np.ndarray | None:
        """The data of a Constant value, else None."""
        op = self[v].op
        return op.tensor.array if isinstance(op, Constant) else None

    def size_value(self, s: SizeLike, dtype: DType = DType.I64) -> Value:
        """A size as a rank-0 runtime value: a symbol is the element count of a broadcast of
        ones (no new op, and a GPU fuses it); floordiv, min and max become integer ops."""
        s = Size.of(s)
        v = s.fixed_value()
        if v is not None:
            return self.scalar(v, dtype)
        if not dtype.is_int:  # integer arithmetic (floor division), then the cast
            return self.cast(self.size_value(s, DType.I64), dtype)
        total: Value | None = None
        for mono, coef in s.terms:
            term: Value | None = None if coef == 1 and mono else self.scalar(coef, dtype)
            for atom, exp in mono:
                if isinstance(atom, str):
                    full = self.full(1, Shape.of(Size.sym(atom)), dtype)
                    x = self.reduce(full, [0], ReduceOp.SUM)
                else:
                    args = [self.size_value(a, dtype) for a in atom.args]
                    x = self._atom_value(atom, args)
                for _ in range(exp):
                    term = x if term is None else self.mul(term, x)
            assert term is not None
            total = term if total is None else self.add(total, term)
        assert total is not None
        return total

    def _atom_value(self, atom: _Node, args: list[Value]) -> Value:
        if atom.kind == "floordiv":
            a, b = args
            if atom.args[0].provably_nonneg() and atom.args[1].provably_nonneg():
                return self.binary(BinaryOp.DIV, a, b)  # truncation is floor here
            return self.binary(BinaryOp.DIV, self.sub(a, self.binary(BinaryOp.MOD, a, b)), b)
        op = BinaryOp.MIN if atom.kind == "min" else BinaryOp.MAX
        out = args[0]
        for x in args[1:]:
            out = self.binary(op, out, x)
        return out

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

    # -- shape ops -----------------------------------------------------------------------------------
    def view(self, x: Value, shape: Shape | Sequence[SizeLike]) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        info = self[x]
        if info.shape == shape:
            return x
        if info.shape.size() != shape.size():
            if self.equate is None or (info.shape.is_fixed and shape.is_fixed):
                raise GraphError(
                    f"view: cannot reshape {info.shape} to {shape} (element counts differ)"
                )
            self._same(
                info.shape.size(), shape.size(), f"reshape {info.shape} to {shape} (element count)"
            )
        if isinstance(info.op, View):
            inner = self[info.op.x].shape
            if inner.size() == shape.size() or self.equate is not None:
                return self.view(info.op.x, shape)
            return self._push(shape, info.dtype, View(x))
        return self._push(shape, info.dtype, View(x))

    def broadcast(self, x: Value, shape: Shape | Sequence[SizeLike]) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        info = self[x]
        if info.rank > shape.rank:
            raise GraphError(f"broadcast: cannot broadcast {info.shape} to lower rank {shape}")
        if info.rank < shape.rank:
            x = self.view(x, Shape((Size(1),) * (shape.rank - info.rank)) + info.shape)
            info = self[x]
        if info.shape == shape:
            return x
        for i, (a, b) in enumerate(zip(info.shape, shape, strict=True)):
            if a != b and a != Size(1):
                raise GraphError(f"broadcast: cannot broadcast {info.shape} to {shape} (axis {i})")
        if isinstance(info.op, Broadcast):
            return self.broadcast(info.op.x, shape)
        return self._push(shape, info.dtype, Broadcast(x))

    def permute(self, x: Value, perm: Sequence[int]) -> Value:
        info = self[x]
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(info.rank)):
            raise GraphError(f"permute: {list(perm)} is not a permutation of rank {info.rank}")
        if perm == tuple(range(info.rank)):
            return x
        if isinstance(info.op, Permute):
            inner = info.op.perm
            return self.permute(info.op.x, [inner[p] for p in perm])
        shape = Shape(tuple(info.shape[p] for p in perm))
        return self._push(shape, info.dtype, Permute(x, perm))

    def transpose(self, x: Value, a: int = -1, b: int = -2) -> Value:
        r = self[x].rank
        perm = list(range(r))
        a, b = _norm_axis(a, r), _norm_axis(b, r)
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(x, perm)

    def slice(
        self,
        x: Value,
        axis: int,
        start: SizeLike | None = None,
        end: SizeLike | None = None,
        step: int = 1,
    ) -> Value:
        """Python slicing `x[start:end:step]` along one axis: negative fixed bounds count from
        the end, bounds are clamped to the axis (symbolically: `min(end, seq)`)."""
        info = self[x]
        axis = _norm_axis(axis, info.rank)
        if step == 0:
            raise GraphError("slice: step must not be zero")
        dim = info.shape[axis]
        n = dim.fixed_value()
        if n is not None and all(
            s is None or isinstance(s, int) or Size.of(s).is_fixed for s in (start, end)
        ):

            def as_int(s: SizeLike | None) -> int | None:
                return None if s is None else Size.of(s).as_int()

            r = range(*slice(as_int(start), as_int(end), step).indices(n))
            return self.slice_raw(x, axis, Size(r.start if len(r) else 0), step, len(r))
        first, length, conds = slice_bounds(
            dim,
            None if start is None else Size.of(start),
            None if end is None else Size.of(end),
            step,
            clamp=self.is_runtime_size(dim),
        )
        for lhs, rhs in conds:
            self.add_guard(lhs, ">=", rhs, f"slice [{start}:{end}:{step}] of axis {axis} ({dim})")
        return self.slice_raw(x, axis, first, step, length)

    def slice_raw(self, x: Value, axis: int, start: SizeLike, step: int, length: SizeLike) -> Value:
        """Elements start, start+step, … (`length` of them) along `axis`; bounds are checked."""
        info = self[x]
        axis = _norm_axis(axis, info.rank)
        start, length = Size.of(start), Size.of(length)
        dim = info.shape[axis]
        if step == 0:
            raise GraphError("slice: step must not be zero")
        if length == Size(0):
            start, step = Size(0), 1
        elif start.is_fixed and length.is_fixed and dim.is_fixed:
            s0, n = start.as_int(), length.as_int()
            last = s0 + (n - 1) * step
            if not (0 <= s0 < dim.as_int() and 0 <= last < dim.as_int()):
                raise GraphError(
                    f"slice: start {start}, step {step}, length {length} out of range for axis "
                    f"{axis} of size {dim}"
                )
        else:
            if start.bounds()[1] < 0:
                raise GraphError(f"slice: negative start {start} on axis {axis} ({dim})")
            what = f"slice of axis {axis} ({dim}): start {start}, step {step}, length {length}"
            if step > 0:
                self.add_guard(start, ">=", 0, what)
                self.add_guard(dim, ">=", start + (length - 1) * step + 1, what)
            else:
                self.add_guard(dim, ">=", start + 1, what)
                self.add_guard(start + (length - 1) * step, ">=", 0, what)
        if length == Size(1):
            step = 1
        if length == dim and start == Size(0) and step == 1:
            return x
        return self._push(info.shape.replace(axis, length), info.dtype, Slice(x, axis, start, step))

    def flip(self, x: Value, axis: int) -> Value:
        info = self[x]
        axis = _norm_axis(axis, info.rank)
        n = info.shape[axis]
        if n == Size(1) or n == Size(0):
            return x
        return self.slice_raw(x, axis, n - 1, -1, n)

    def gather(self, x: Value, axis: int, indices: Value) -> Value:
        """x.take(indices, axis) for rank-1 integer indices (other ranks: view around it)."""
        info, ii = self[x], self[indices]
        axis = _norm_axis(axis, info.rank)
        if ii.rank != 1 or not ii.dtype.is_int:
            raise GraphError(
                f"gather: indices must be a rank-1 integer tensor, found {ii.dtype}{ii.shape}"
            )
        idx = self.const_value(indices)
        dim = info.shape[axis]
        if idx is not None and dim.is_fixed:
            n = dim.as_int()
            idx = idx.astype(np.int64) if idx.dtype.kind == "i" else idx
            bad = (idx < -n) | (idx >= n)
            if bad.any():
                raise GraphError(
                    f"gather: index {idx[bad][0]} out of range for axis {axis} of size {n}"
                )
            if (idx < 0).any():  # the Gather op takes indices in [0, n)
                idx = np.where(idx < 0, idx + n, idx)
                indices = self.constant(idx)
            if idx.size >= 1 and np.all(idx == idx[0]):
                one = self.slice_raw(x, axis, int(idx[0]), 1, 1)
                return self.broadcast(one, info.shape.replace(axis, idx.size))
            if idx.size >= 2:
                step = int(idx[1] - idx[0])
                if step != 0 and np.array_equal(idx, idx[0] + step * np.arange(idx.size)):
                    return self.slice_raw(x, axis, int(idx[0]), step, idx.size)
        shape = info.shape.replace(axis, ii.shape[0])
        return self._push(shape, info.dtype, Gather(x, axis, indices))

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        if not xs:
            raise GraphError("concat: no operands")
        infos = [self[x] for x in xs]
        first = infos[0]
        axis = _norm_axis(axis, first.rank)
        total = Size(0)
        for i, inf in enumerate(infos):
            if inf.dtype != first.dtype or inf.rank != first.rank:
                raise GraphError(
                    f"concat: operand {i} is {inf.dtype}{inf.shape}, expected {first.dtype} of rank {first.rank}"
                )
            for a in range(first.rank):
                if a != axis and inf.shape[a] != first.shape[a]:
                    if self.equate is None or (inf.shape[a].is_fixed and first.shape[a].is_fixed):
                        raise GraphError(
                            f"concat: operand {i} has shape {inf.shape}, which differs from "
                            f"{first.shape} off the concat axis {axis}"
                        )
                    self._same(
                        first.shape[a], inf.shape[a], f"concat of {first.shape} and {inf.shape}"
                    )
            total = total + inf.shape[axis]
        if self.equate is not None:
            like = first.shape
            xs = [
                self._conform(x, like.replace(axis, inf.shape[axis]))
                for x, inf in zip(xs, infos, strict=True)
            ]
            infos = [self[x] for x in xs]
        kept = tuple(x for x, inf in zip(xs, infos, strict=True) if inf.shape[axis] != Size(0))
        if len(kept) == 1:
            return kept[0]
        if not kept:
            return xs[0]
        return self._push(first.shape.replace(axis, total), first.dtype, Concat(kept, axis))

    # -- compute ops ----------------------------------------------------------------------------------
    def conv(
        self,
        x: Value,
        w: Value,
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        groups: int = 1,
    ) -> Value:
        """N-d cross-correlation; x [N, C, *sp], w [K, C/groups, *k]; symmetric padding."""
        xi, wi = self[x], self[w]
        nd = xi.rank - 2
        if nd < 1 or wi.rank != xi.rank:
            raise GraphError(
                f"conv: expected x [N,C,*spatial] and w of equal rank, found {xi.shape} and {wi.shape}"
            )
        if xi.dtype != wi.dtype or not xi.dtype.is_float:
            raise GraphError(f"conv: expected equal float dtypes, found {xi.dtype} and {wi.dtype}")
        stride = tuple(stride or (1,) * nd)
        padding = tuple(padding or (0,) * nd)
        dilation = tuple(dilation or (1,) * nd)
        if not (len(stride) == len(padding) == len(dilation) == nd):
            raise GraphError(f"conv: stride/padding/dilation must have {nd} entries")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
            raise GraphError(
                f"conv: invalid stride {stride}, padding {padding}, dilation {dilation} or groups {groups}"
            )
        k_out, c_per_group = wi.shape[0], wi.shape[1]
        if xi.shape[1] != c_per_group * groups and self.equate is not None:
            self._same(xi.shape[1], c_per_group * groups, "conv input channels")
            x = self._conform(x, xi.shape.replace(1, c_per_group * groups))
            xi = self[x]
        if xi.shape[1] != c_per_group * groups or not Size(groups).divides(k_out):
            raise GraphError(
                f"conv: input channels {xi.shape[1]} != {groups} groups x {c_per_group} (filter {wi.shape}), "
                f"or {k_out} filters not divisible by the groups"
            )
        out = [xi.shape[0], k_out]
        stride, dilation = list(stride), list(dilation)
        for i in range(nd):
            k = wi.shape[2 + i].as_int("conv: kernel size")
            if k < 1:
                raise GraphError(f"conv: filter {wi.shape} has an empty kernel axis")
            if k == 1:
                dilation[i] = 1  # no effect on a kernel of one tap
            c = 2 * padding[i] - dilation[i] * (k - 1) - 1 + stride[i]
            o = (xi.shape[2 + i] + c) // stride[i]
            span = xi.shape[2 + i] + 2 * padding[i] - dilation[i] * (k - 1)
            if o == Size(1) and span.is_fixed:
                # one window: a stride past the span has no effect (backends refuse huge ones)
                stride[i] = min(stride[i], max(span.as_int(), 1))
            if o.bounds()[1] <= 0:
                raise GraphError(f"conv: kernel {wi.shape} larger than padded input {xi.shape}")
            if not o.is_fixed:
                self.add_guard(
                    xi.shape[2 + i] + 2 * padding[i],
                    ">=",
                    dilation[i] * (k - 1) + 1,
                    f"conv: spatial axis {i} ({xi.shape[2 + i]}) padded by {padding[i]} must hold "
                    f"the kernel ({k}, dilation {dilation[i]})",
                )
            out.append(o)
        details = ConvDetails(tuple(stride), padding, tuple(dilation), groups)
        return self._push(Shape.from_seq(out), xi.dtype, Conv(x, w, details))

    def matmul(self, a: Value, b: Value) -> Value:
        """Batched product [b, m, k] @ [b, k, n] (rank 3, equal batch); see `matmul_nd`."""
        ai, bi = self[a], self[b]
        if self.equate is not None and ai.rank == 3 and bi.rank == 3:
            what = f"matmul {ai.shape} @ {bi.shape}"
            bsz = self._same(ai.shape[0], bi.shape[0], what)
            k = self._same(ai.shape[2], bi.shape[1], what)
            a = self._conform(a, Shape.of(bsz, ai.shape[1], k))
            b = self._conform(b, Shape.of(bsz, k, bi.shape[2]))
            ai, bi = self[a], self[b]
        if ai.rank != 3 or bi.rank != 3 or ai.shape[0] != bi.shape[0] or ai.shape[2] != bi.shape[1]:
            raise GraphError(f"matmul: expected [b,m,k] @ [b,k,n], found {ai.shape} @ {bi.shape}")
        if ai.dtype != bi.dtype:
            raise GraphError(f"matmul: dtypes differ ({ai.dtype} and {bi.dtype})")
        if ai.dtype.is_bool:
            raise GraphError("matmul: bool operands")
        bsz, m, k = ai.shape
        n = bi.shape[2]
        if ai.dtype.is_int:
            # cuBLAS and oneDNN have no integer GEMM: a broadcast product summed over k, which
            # every device fuses into one reduction (exact, and wrapping as np.matmul does)
            full = Shape.of(bsz, m, k, n)
            pa = self.broadcast(self.view(a, Shape.of(bsz, m, k, 1)), full)
            pb = self.broadcast(self.view(b, Shape.of(bsz, 1, k, n)), full)
            return self.reduce(self.binary(BinaryOp.MUL, pa, pb), [2], ReduceOp.SUM)
        return self._push(Shape.of(bsz, m, n), ai.dtype, MatMul(a, b))

    def unary(self, op: UnaryOp, x: Value) -> Value:
        info = self[x]
        if op.changes_dtype:
            raise GraphError(f"{op.value}: use cast()/bitcast()")
        if op.float_only and not info.dtype.is_float:
            raise GraphError(f"{op.value}: expected a float operand, found {info.dtype}")
        if op is UnaryOp.NOT and not info.dtype.is_bool:
            raise GraphError(f"not: expected a bool operand, found {info.dtype}")
        if op is UnaryOp.BIT_NOT and not info.dtype.is_int:
            raise GraphError(f"bit_not: expected an integer operand, found {info.dtype}")
        if op in (UnaryOp.ABS, UnaryOp.NEG, UnaryOp.SIGN) and info.dtype.is_bool:
            raise GraphError(f"{op.value}: bool operand")
        return self._push(info.shape, info.dtype, Unary(x, op))

    def cast(self, x: Value, dtype: DType) -> Value:
        info = self[x]
        if info.dtype == dtype:
            return x
        return self._push(info.shape, dtype, Unary(x, UnaryOp.CAST))

    def bitcast(self, x: Value, dtype: DType) -> Value:
        info = self[x]
        if info.dtype == dtype:
            return x
        if info.dtype.size != dtype.size:
            raise GraphError(f"bitcast: {info.dtype} and {dtype} differ in size")
        return self._push(info.shape, dtype, Unary(x, UnaryOp.BITCAST))

    def _equate_or_none(self) -> Equate | None:
        return self._same if self.equate is not None else None

    def _operand(self, x: Operand, like: Value) -> Value:
        if isinstance(x, Value):
            return x
        return self.scalar(x, self[like].dtype)

    def binary(self, op: BinaryOp, a: Operand, b: Operand) -> Value:
        """Elementwise binary op with NumPy broadcasting; python scalars take the other's dtype."""
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise GraphError(f"{op.value}: at least one operand must be a Value")
        a = self._operand(a, b) if not isinstance(a, Value) else a  # type: ignore[arg-type]
        b = self._operand(b, a)
        ai, bi = self[a], self[b]
        if ai.dtype != bi.dtype:
            raise GraphError(f"{op.value}: operand dtypes differ ({ai.dtype} and {bi.dtype})")
        dt = ai.dtype
        if op.is_logical and not dt.is_bool:
            raise GraphError(f"{op.value}: expected bool operands, found {dt}")
        if op.is_bitwise and not dt.is_int:
            raise GraphError(f"{op.value}: expected integer operands, found {dt}")
        if dt.is_bool and not (op.is_logical or op is BinaryOp.EQ):
            raise GraphError(f"{op.value}: not defined on bool operands")
        shape = broadcast_shapes(ai.shape, bi.shape, equate=self._equate_or_none())
        if self.equate is not None:
            a, b = self._conform(a, shape), self._conform(b, shape)
            ai, bi = self[a], self[b]
        # canonicalise: identities vanish (x+0, x-0, x*1, x/1, x**1, and 0+x, 1*x)
        ident = op.identity
        if ident is not None and ai.shape == shape and self.scalar_value(b) == ident:
            return a
        if (
            op in (BinaryOp.ADD, BinaryOp.MUL)
            and bi.shape == shape
            and self.scalar_value(a) == ident
        ):
            return b
        out_dt = DType.BOOL if op.is_comparison else dt
        a, b = self.broadcast(a, shape), self.broadcast(b, shape)
        return self._push(shape, out_dt, Binary(a, b, op))

    def select(self, cond: Value, a: Operand, b: Operand) -> Value:
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise GraphError("select: at least one of the branches must be a Value")
        a = self._operand(a, b) if not isinstance(a, Value) else a  # type: ignore[arg-type]
        b = self._operand(b, a)
        ci, ai, bi = self[cond], self[a], self[b]
        if not ci.dtype.is_bool:
            raise GraphError(f"select: condition must be bool, found {ci.dtype}")
        if ai.dtype != bi.dtype:
            raise GraphError(f"select: branch dtypes differ ({ai.dtype} and {bi.dtype})")
        shape = broadcast_shapes(ci.shape, ai.shape, bi.shape, equate=self._equate_or_none())
        if self.equate is not None:
            cond, a, b = (self._conform(v, shape) for v in (cond, a, b))
        if a == b:
            return self.broadcast(a, shape)
        c = self.broadcast(cond, shape)
        return self._push(
            shape, ai.dtype, Select(c, self.broadcast(a, shape), self.broadcast(b, shape))
        )

    def iota(self, shape: Shape | Sequence[SizeLike], axis: int, dtype: DType = DType.I64) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        axis = _norm_axis(axis, shape.rank)
        if dtype.is_bool:
            raise GraphError("iota: bool dtype")
        return self._push(shape, dtype, Iota(axis))

    def softmax(self, x: Value, axis: int) -> Value:
        info = self[x]
        if not info.dtype.is_float:
            raise GraphError(f"softmax: expected a float operand, found {info.dtype}")
        return self._push(info.shape, info.dtype, Softmax(x, _norm_axis(axis, info.rank)))

    def layernorm(self, x: Value, axis: int, eps: float) -> Value:
        info = self[x]
        if not info.dtype.is_float:
            raise GraphError(f"layernorm: expected a float operand, found {info.dtype}")
        return self._push(
            info.shape, info.dtype, Layernorm(x, _norm_axis(axis, info.rank), float(eps))
        )

    def attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        mask: Value | None = None,
        scale: float | None = None,
        causal: bool = False,
    ) -> Value:
        """softmax(q·kᵀ·scale + mask [+ causal]) · v on q [b,m,d], k [b,n,d], v [b,n,dv] and an
        optional additive mask [b,m,n]; `scale` defaults to 1/√d (see `ops.Attention`)."""
        qi, ki, vi = self[q], self[k], self[v]
        shapes = f"q {qi.shape}, k {ki.shape}, v {vi.shape}"
        if qi.rank != 3 or ki.rank != 3 or vi.rank != 3:
            raise GraphError(
                f"attention: expected q [b,m,d], k [b,n,d], v [b,n,dv], found {shapes}"
            )
        if not (qi.dtype == ki.dtype == vi.dtype) or not qi.dtype.is_float:
            raise GraphError(
                f"attention: expected equal float dtypes, found {qi.dtype}, {ki.dtype}, {vi.dtype}"
            )
        b, m, d = qi.shape
        n = ki.shape[1]
        if ki.shape[0] != b or vi.shape[0] != b or ki.shape[2] != d or vi.shape[1] != n:
            raise GraphError(
                f"attention: expected q [b,m,d], k [b,n,d], v [b,n,dv], found {shapes}"
            )
        if mask is not None:
            mi = self[mask]
            if mi.shape != Shape.of(b, m, n) or mi.dtype != qi.dtype:
                raise GraphError(
                    f"attention: mask must be {qi.dtype}{Shape.of(b, m, n)} for {shapes}, found {mi.dtype}{mi.shape}"
                )
        if causal and m.is_fixed and n.is_fixed and n.as_int() < m.as_int():
            raise GraphError(
                f"attention: causal with fewer keys than queries ({shapes}) masks whole rows"
            )
        if scale is None:
            scale = 1.0 / float(
                np.sqrt(d.as_int("attention: default scale needs a fixed head size"))
            )
        op = Attention(q, k, v, mask, float(scale), bool(causal))
        return self._push(Shape.of(b, m, vi.shape[2]), qi.dtype, op)

    def dynamic(
        self,
        kind: str,
        args: Sequence[Value],
        params: Sequence[object],
        shapes: Sequence[Shape],
        dtypes: Sequence[DType],
    ) -> list[Value]:
        """The results of a data-dependent op (`kn_graph.dynamic`), one value each. Sizes that
        are only known once it ran are fresh symbols (`fresh_symbol`) in `shapes`. With every
        argument a constant, a kind without subgraphs is computed now: constants come back."""
        from kn_graph.dynamic import CONTROL, KINDS, run_dynamic

        if kind not in KINDS:
            raise GraphError(f"dynamic: unknown kind '{kind}'")
        args = tuple(self.check(a) for a in args)
        shapes = tuple(s if isinstance(s, Shape) else Shape.from_seq(s) for s in shapes)
        op = Dynamic(kind, args, tuple(params), shapes, tuple(dtypes))
        if len(op.shapes) != len(op.dtypes) or not op.shapes:
            raise GraphError(f"dynamic {kind}: {len(shapes)} shapes for {len(dtypes)} dtypes")
        consts = [self.const_value(a) for a in args]
        if kind not in CONTROL and all(c is not None for c in consts):
            results = run_dynamic(op, consts, {}, _no_subgraphs)  # type: ignore[arg-type]
            return [self.constant(r) for r in results]
        return [self.dynamic_result(dataclasses.replace(op, output=j)) for j in range(len(shapes))]

    def dynamic_result(self, op: Dynamic) -> Value:
        """The value of result `op.output` of `op` (operands already in this graph)."""
        return self._push(op.shapes[op.output], op.dtypes[op.output], op)

    def reduce(self, x: Value, axes: Sequence[int], op: ReduceOp, keepdims: bool = False) -> Value:
        info = self[x]
        axes_t = tuple(sorted({_norm_axis(a, info.rank) for a in axes}))
        if op.is_arg and len(axes_t) != 1:
            raise GraphError(f"reduce {op.value}: exactly one axis, found {list(axes)}")
        if info.dtype.is_bool and op not in (ReduceOp.MIN, ReduceOp.MAX):
            raise GraphError(f"reduce {op.value}: bool operand")
        if op is ReduceOp.MEAN and not info.dtype.is_float:
            raise GraphError(f"reduce mean: expected a float operand, found {info.dtype}")
        kept = Shape(tuple(d for i, d in enumerate(info.shape) if i not in axes_t))
        if op.is_arg:
            out = self._push(kept, DType.I64, Reduce(x, axes_t, op))
        elif not axes_t:
            out = x
        else:
            out = self._push(kept, info.dtype, Reduce(x, axes_t, op))
        if keepdims:
            out = self.view(
                out, Shape(tuple(Size(1) if i in axes_t else d for i, d in enumerate(info.shape)))
            )
        return out

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
