"""The optimizer's machinery: a forward rebuild of the graph from its outputs, trying named
rewrites on each live value in a declared order.

A rewrite is a small function `fuse_x(rw: Rewriter, v: Value) -> Value | None`: it looks at the
*old* graph around `v` (ops, shapes, use counts via `rw.old`), and when it matches, builds the
replacement in the *new* graph from already-mapped operands (`rw.get(x)`) and returns it. Returning
None means "no match"; the value is then copied with `rw.copy(v)`.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Protocol, Self, TypeVar, assert_never, overload, runtime_checkable

from kn_graph.errors import ArgumentTypeError
from kn_graph.filemap import check_all
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import (
    Attention,
    Binary,
    BlockQuantMatMul,
    Broadcast,
    Concat,
    Constant,
    Conv,
    Dynamic,
    Gather,
    Input,
    IntConv,
    IntMatMul,
    Iota,
    Layernorm,
    MatMul,
    Op,
    Permute,
    Reduce,
    Select,
    Slice,
    Softmax,
    Unary,
    UnaryOp,
    Value,
    View,
)

__all__ = [
    "REWRITES",
    "OptimizerSettings",
    "Reoptimizable",
    "Rewrite",
    "Rewriter",
    "copy_op",
    "optimize",
    "rewrite",
]


@dataclass(frozen=True, slots=True)
class OptimizerSettings:
    """Which rewrites run. Every flag defaults to on; `optimize(g, OptimizerSettings(x=False))`
    turns one off (e.g. to compare, or to keep a pattern for a device that handles it)."""

    fold_constants: bool = True
    """Compute values whose operands are all constant once, at optimize time (CPU executor)."""
    fold_max_growth: int = 4
    """...unless the result has more than this many times the elements of its constant inputs
    (a broadcast scalar stays a broadcast)."""
    fuse_affine: bool = True
    """Collapse per-channel Add/Sub/Mul/Div-by-constant chains and fold them into convolutions."""
    fuse_clamp: bool = True
    """Chains of Min/Max with scalar constants become at most one Min and one Max."""
    max_through_pool: bool = True
    """max(x, c) (a ReLU) whose only users are a max pool's taps moves after the pool."""
    div_to_mul: bool = True
    """Division by a constant becomes multiplication by its reciprocal."""
    detect_layernorm: bool = True
    """The mean/sub/pow/mean/add/sqrt/div pattern (and exporter variants) becomes Layernorm."""
    detect_gelu_silu: bool = True
    """Erf-GELU, tanh-GELU and x·sigmoid(x) become one unary each."""
    detect_attention: bool = True
    """softmax(Q·Kᵀ·s [+ mask])·V becomes one Attention op."""
    fuse_qdq: bool = False
    """A Conv / MatMul of dequantized operands becomes the integer product, scaled
    (`kn_graph.optimizer.qdq`). Off by default: a device with integer steps turns it on."""
    qdq_weight_bits: int = 8
    """With `fuse_qdq`: fuse only where the shifted constant weights stay within ±2^(bits-1)
    (7: ±64, for int8 kernels that are exact only with such weights)."""
    split_int_weights: bool = False
    """An integer convolution whose constant weights minus their zero point do not fit
    `qdq_weight_bits` becomes two that do (`kn_graph.optimizer.intweights`). Off by default: a
    device whose int8 convolutions take only signed 8-bit weights turns it on."""
    group_shared_matmul: bool = True
    """A batched product whose right operand repeats G groups R times (grouped-query
    attention's repeated keys and values) becomes one product per group with R times the rows
    (`kn_graph.optimizer.grouped`): the repeats are never materialized."""
    max_rounds: int = 4
    """Rebuild rounds until the value count stops shrinking."""


_SWEEP = OptimizerSettings(**{f.name: False for f in fields(OptimizerSettings) if f.type == "bool"})
"""No rewrite on: a round that only drops dead values."""

Rewrite = Callable[["Rewriter", Value], "Value | None"]
REWRITES: list[tuple[str, Rewrite]] = []
"""(settings flag, rewrite) in the order they are tried on each value."""


def rewrite(flag: str) -> Callable[[Rewrite], Rewrite]:
    """Register a rewrite under a settings flag; registration order is trial order."""
    if flag not in {f.name for f in fields(OptimizerSettings)}:
        raise ValueError(f"unknown optimizer flag {flag}")

    def register(f: Rewrite) -> Rewrite:
        REWRITES.append((flag, f))
        return f

    return register


class Rewriter:
    """The state of one rebuild: old graph, new graph and the old → new value map."""

    def __init__(self, old: Graph, settings: OptimizerSettings) -> None:
        self.old = old
        self.new = Graph()
        self.new.copy_guards(old)
        if old.equate is not None:
            self.new.equate = self.new.guard_equal
        self.settings = settings
        self._map: dict[int, Value] = {}

    def get(self, old_value: Value) -> Value:
        """The new value standing for an (earlier) old value."""
        return self._map[old_value.index]

    def set(self, old_value: Value, new_value: Value) -> None:
        self._map[old_value.index] = new_value

    def info(self, old_value: Value) -> ValueInfo:
        return self.old[old_value]

    def copy(self, old_value: Value) -> Value:
        """Rebuild the old value's op in the new graph from mapped operands (builders
        re-validate and re-canonicalise, so simplifications cascade)."""
        info = self.old[old_value]
        return copy_op(self.new, info, info.op.map_inputs(self.get))


def rebuild_with(graph: Graph, rule: Callable[[Graph, ValueInfo, Op], Value | None]) -> Graph:
    """A copy of `graph` whose ops `rule` rebuilds (given the new graph, the old value's info
    and its op with operands mapped; None: rebuilt as it is), debug names and outputs kept:
    the loop of a lowering (`kn_graph.integer`, `kn_graph.blockquant`)."""
    rw = Rewriter(graph, OptimizerSettings())
    g = rw.new
    for v in graph.values():
        info = graph[v]
        op = info.op.map_inputs(rw.get)
        new_v = rule(g, info, op)
        if new_v is None:
            new_v = copy_op(g, info, op)
        if info.debug_name:
            g.set_debug_name(new_v, info.debug_name)
        rw.set(v, new_v)
    for v, name in zip(graph.outputs, graph.output_names, strict=True):
        g.add_output(rw.get(v), name)
    return g


def copy_op(g: Graph, info: ValueInfo, op: Op) -> Value:
    """Build `op` (whose operands already belong to `g`) with `info`'s shape and dtype."""
    match op:
        case Input():
            return g.input(info.shape, info.dtype, info.debug_name)
        case Constant(t):
            return g.constant_tensor(t)
        case View(x):
            return g.view(x, info.shape)
        case Broadcast(x):
            return g.broadcast(x, info.shape)
        case Permute(x, perm):
            return g.permute(x, perm)
        case Slice(x, axis, start, step):
            return g.slice_raw(x, axis, start, step, info.shape[axis])
        case Gather(x, axis, idx):
            return g.gather(x, axis, idx)
        case Concat(xs, axis):
            return g.concat(xs, axis)
        case Conv(x, w, d):
            return g.conv(x, w, d.stride, d.padding, d.dilation, d.groups)
        case MatMul(a, b):
            return g.matmul(a, b)
        case IntMatMul(a, b, za, zb):
            return g.int_matmul(a, b, za, zb)
        case BlockQuantMatMul(a, packed, scales, zeros, bits, block):
            return g.block_quant_matmul(a, packed, scales, zeros, bits, block)
        case IntConv(x, w, zx, zw, d):
            return g.int_conv(x, w, zx, zw, d.stride, d.padding, d.dilation, d.groups)
        case Unary(x, u):
            if u is UnaryOp.CAST:
                return g.cast(x, info.dtype)
            if u is UnaryOp.BITCAST:
                return g.bitcast(x, info.dtype)
            return g.unary(u, x)
        case Binary(a, b, bop):
            return g.binary(bop, a, b)
        case Select(c, a, b):
            return g.select(c, a, b)
        case Iota(axis):
            return g.iota(info.shape, axis, info.dtype)
        case Softmax(x, axis):
            return g.softmax(x, axis)
        case Layernorm(x, axis, eps):
            return g.layernorm(x, axis, eps)
        case Reduce(x, axes, rop):
            return g.reduce(x, axes, rop)
        case Attention(q, k, v, mask, scale, causal):
            return g.attention(q, k, v, mask, scale, causal)
        case Dynamic():
            return g.dynamic_result(_with_optimized_bodies(op))
        case _:
            assert_never(op)  # type: ignore[arg-type]


_BODIES: weakref.WeakKeyDictionary[Graph, Graph] = weakref.WeakKeyDictionary()
"""Each subgraph (If branch, Loop/Scan body) seen, with its optimized version (which maps to
itself): rounds and repeated optimize calls optimize a body once."""


def _with_optimized_bodies(op: Dynamic) -> Dynamic:
    """`op` with its subgraphs optimized (same inputs and outputs, in order)."""
    if not any(isinstance(p, Graph) for p in op.params):
        return op
    params = []
    for p in op.params:
        if isinstance(p, Graph):
            opt = _BODIES.get(p)
            if opt is None:
                opt = optimize(p)
                _BODIES[p] = _BODIES[opt] = opt
            p = opt
        params.append(p)
    return dataclasses.replace(op, params=tuple(params))


def _live(g: Graph) -> list[bool]:
    live = [False] * len(g)
    for v in g.outputs:
        live[v.index] = True
    for i in range(len(g) - 1, -1, -1):  # reverse scan: users come after operands
        if live[i]:
            for x in g[Value(i, g.id)].op.inputs:
                live[x.index] = True
    return live


def _round(g: Graph, settings: OptimizerSettings) -> tuple[Graph, int]:
    """One rebuild; returns the new graph and how many rewrites fired."""
    rw = Rewriter(g, settings)
    for v in g.inputs:
        rw.set(v, rw.new.input(g[v].shape, g[v].dtype, g[v].debug_name))
    live = _live(g)
    active = [f for flag, f in REWRITES if getattr(settings, flag)]
    fired = 0
    for v in g.values():
        if not live[v.index] or isinstance(g[v].op, Input):
            continue
        out = None
        for f in active:
            out = f(rw, v)
            if out is not None:
                break
        fired += out is not None
        new_v = out if out is not None else rw.copy(v)
        if g[v].debug_name:
            rw.new.set_debug_name(new_v, g[v].debug_name)
        rw.set(v, new_v)
    for v, name in zip(g.outputs, g.output_names, strict=True):
        rw.new.add_output(rw.get(v), name)
    return rw.new, fired


@runtime_checkable
class Reoptimizable(Protocol):
    """What `optimize` takes besides a Graph: a model that makes its graphs later and optimizes
    each as it makes it (`kn_graph.onnx.ValueSpecializedModel`). The optimizer dispatches on
    this protocol, so it imports nothing of the ONNX loader (which imports the optimizer)."""

    def optimized(self, settings: OptimizerSettings) -> Self: ...


M = TypeVar("M", bound=Reoptimizable)


@overload
def optimize(graph: Graph, settings: OptimizerSettings | None = None) -> Graph: ...
@overload
def optimize(graph: M, settings: OptimizerSettings | None = None) -> M: ...
def optimize(graph: Graph | M, settings: OptimizerSettings | None = None) -> Graph | M:
    """A new, optimized graph computing the same outputs from the same inputs (in order).

    A `ValueSpecializedModel` (what `load_onnx` returns when shapes depend on input values) has
    no graph to rebuild until those values are known: `optimize` returns a copy of it whose
    graphs are optimized with `settings` as they are made (one per distinct value, when
    `Device.prepare(...).eval` or `model.specialize` meets it), so `optimize(load_onnx(path))`
    works for every model. The model passed in is unchanged.

    >>> import numpy as np
    >>> from kn_graph import Graph, DType, Shape
    >>> g = Graph()
    >>> x = g.input(Shape.of(4), DType.F32, "x")
    >>> g.add_output(g.div(g.add(x, g.mul(g.constant(np.float32(2)), 3.0)), 4.0), "y")
    >>> print(optimize(g))  # (x + 2·3) / 4: folded, then one scale and one bias
    %0: f32[4] = input #0 "x"
    %1: f32[1] = const [0.25]
    %2: f32[4] = broadcast(%1)
    %3: f32[4] = mul(%0, %2)
    %4: f32[1] = const [1.5]
    %5: f32[4] = broadcast(%4)
    %6: f32[4] = add(%3, %5)
    outputs: %6 "y"
    """
    if not isinstance(graph, Graph):
        if isinstance(graph, Reoptimizable):
            return graph.optimized(settings or OptimizerSettings())
        raise ArgumentTypeError(
            f"optimize: expected a Graph or a ValueSpecializedModel, found {type(graph).__name__}"
        )
    check_all(i.op.tensor.array for i in graph.value_infos() if isinstance(i.op, Constant))
    settings = settings or OptimizerSettings()
    g = graph
    for _ in range(max(1, settings.max_rounds)):
        new, fired = _round(g, settings)
        # a rewrite leaves the values it replaced dead in `new` (they were copied before their
        # user matched): count live values, so the next round sweeps them; a round in which
        # nothing fired and nothing died is a fixed point
        live = sum(_live(new))
        done = live >= len(g) or (fired == 0 and live == len(new))
        g = new
        if done:
            break
    if sum(_live(g)) < len(g):  # a rewrite that did not shrink the graph left values dead
        g, _ = _round(g, _SWEEP)
    g.optimized = True
    return g
