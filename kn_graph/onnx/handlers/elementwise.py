"""Elementwise ONNX ops: arithmetic, comparisons, logic, bit ops, Where, Clip, variadic Max/Min/
Sum/Mean, unary math, activations and casts.

Every integer op also has a load-time path: when all inputs are `Known` (shape tensors), the
result is computed here (symbolically where a `Size` is involved), so `Equal(Shape(x), -1)` is
statically False and `Where` on it picks a branch. Whatever depends on the actual value of a
symbol falls back to the same op in the graph, on the materialised sizes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import numpy as np

from kn_graph import numpy_ops
from kn_graph.dtype import DType, float_to_int
from kn_graph.errors import GraphError, UnsupportedOnnxError
from kn_graph.graph import Graph
from kn_graph.onnx.context import Known, NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.onnx.handlers.common import all_known
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.shape import Shape, Size, broadcast_shapes

Elem = int | bool | Size
"""One element of a (possibly symbolic) Known."""


class Undecidable(Exception):
    """A load-time result would depend on the run-time value of a size symbol; callers catch it
    and build the op in the graph instead."""


# -- load-time elementwise arithmetic ---------------------------------------------------------------
def _known_map(
    ks: Sequence[Known],
    np_fn: Callable[..., np.ndarray],
    elem_fn: Callable[..., Elem],
    dtype: DType,
) -> Known:
    """np_fn on plain data, elem_fn per element (with NumPy broadcasting) when any is symbolic."""
    if not any(k.is_symbolic for k in ks):
        with np.errstate(all="ignore"):
            res = np.asarray(np_fn(*[k.data for k in ks]))
        return Known(res.astype(dtype.np, copy=False), dtype)
    arrays = np.broadcast_arrays(*[k.data.astype(object) for k in ks])
    flat = [elem_fn(*xs) for xs in zip(*(a.reshape(-1) for a in arrays), strict=True)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return Known.of(out.reshape(arrays[0].shape), dtype)


def _known_or_graph(
    ctx: NodeContext,
    known: Callable[[list[Known]], Result],
    graph: Callable[[], Result],
    indices: list[int] | None = None,
) -> Result:
    """`known` on the inputs (all, or those at `indices`) when all are Known and the result is
    decidable at load time, else `graph`."""
    ks = all_known(ctx, indices)
    if ks is not None:
        try:
            return known(ks)
        except (Undecidable, GraphError, ValueError, ZeroDivisionError):
            pass  # the graph computes it at run time (or reports the real problem)
    return graph()


def _bounds(x: Elem) -> tuple[float, float]:
    """The values an element can take: a symbolic size is a monomial of non-negative symbols."""
    if isinstance(x, Size):
        if x.is_fixed:
            return float(x.as_int()), float(x.as_int())
        lo, hi = x.bounds()
        return float(lo), float(hi)
    return float(x), float(x)


def _diff_bounds(a: Elem, b: Elem) -> tuple[float, float]:
    """Bounds of a - b: exact when both are the same monomial (2B - B = B), else interval math."""
    if not isinstance(a, Size) and not isinstance(b, Size):
        return float(a - b), float(a - b)
    try:
        return _bounds(Size.of(a) - Size.of(b))
    except GraphError:
        la, ha = _bounds(a)
        lb, hb = _bounds(b)
        return la - hb, ha - lb


def _elem_compare(op: BinaryOp, a: Elem, b: Elem) -> bool:
    lo, hi = _diff_bounds(a, b)
    decided: dict[BinaryOp, tuple[bool, bool]] = {  # (provably true, provably false)
        BinaryOp.EQ: (lo == hi == 0, lo > 0 or hi < 0),
        BinaryOp.LT: (hi < 0, lo >= 0),
        BinaryOp.LE: (hi <= 0, lo > 0),
        BinaryOp.GT: (lo > 0, hi <= 0),
        BinaryOp.GE: (lo >= 0, hi < 0),
    }
    yes, no = decided[op]
    if yes or no:
        return yes
    raise Undecidable


def _elem_max(a: Elem, b: Elem) -> Elem:
    return a if _elem_compare(BinaryOp.GE, a, b) else b


def _elem_min(a: Elem, b: Elem) -> Elem:
    return a if _elem_compare(BinaryOp.LE, a, b) else b


def _c_div(a: int, b: int) -> int:
    """C integer division (truncation toward zero); division by zero gives 0 like the executor."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _elem_div(a: Elem, b: Elem) -> Elem:
    if not isinstance(a, Size) and not isinstance(b, Size):
        return _c_div(int(a), int(b))
    if b == 0:
        raise Undecidable
    return Size.of(a) // b  # exact for sizes; raises GraphError when not divisible


def _elem_mod(a: Elem, b: Elem, fmod: bool) -> Elem:
    if not isinstance(a, Size) and not isinstance(b, Size):
        if b == 0:
            return 0
        return int(a) - _c_div(int(a), int(b)) * int(b) if fmod else int(a) % int(b)
    return Size.of(a) % b  # only ever a provable 0 (Size.__mod__ raises otherwise)


def _no_elem(*_: Elem) -> Elem:
    raise Undecidable


_KNOWN_ELEM: dict[BinaryOp, Callable[..., Elem]] = {
    BinaryOp.ADD: operator.add,
    BinaryOp.SUB: operator.sub,
    BinaryOp.MUL: operator.mul,
    BinaryOp.DIV: _elem_div,
    BinaryOp.MOD: lambda a, b: _elem_mod(a, b, False),
    BinaryOp.FMOD: lambda a, b: _elem_mod(a, b, True),
    BinaryOp.MAX: _elem_max,
    BinaryOp.MIN: _elem_min,
    BinaryOp.EQ: lambda a, b: _elem_compare(BinaryOp.EQ, a, b),
    BinaryOp.LT: lambda a, b: _elem_compare(BinaryOp.LT, a, b),
    BinaryOp.LE: lambda a, b: _elem_compare(BinaryOp.LE, a, b),
    BinaryOp.GT: lambda a, b: _elem_compare(BinaryOp.GT, a, b),
    BinaryOp.GE: lambda a, b: _elem_compare(BinaryOp.GE, a, b),
    BinaryOp.AND: _no_elem,
    BinaryOp.OR: _no_elem,
    BinaryOp.XOR: _no_elem,
    BinaryOp.BIT_AND: _no_elem,
    BinaryOp.BIT_OR: _no_elem,
    BinaryOp.BIT_XOR: _no_elem,
}
"""The ops decided at load time, per element when a size is symbolic; on plain data they are
the IR's own NumPy semantics (`kn_graph.numpy_ops.BINARY`: C's integer division and remainder,
0 for a zero divisor), so a value folded here equals the one the graph would compute."""


def known_binary(op: BinaryOp, a: Known, b: Known) -> Known:
    """The load-time result of `a op b`; raises Undecidable/GraphError when it needs run time."""
    if a.dtype != b.dtype or op not in _KNOWN_ELEM:
        raise Undecidable
    out = DType.BOOL if op.is_comparison else a.dtype
    return _known_map([a, b], numpy_ops.BINARY[op], _KNOWN_ELEM[op], out)


# -- binary ops ------------------------------------------------------------------------------------
_BINARY_OPS: dict[str, BinaryOp] = {
    "Add": BinaryOp.ADD,
    "Sub": BinaryOp.SUB,
    "Mul": BinaryOp.MUL,
    "Div": BinaryOp.DIV,
    "Equal": BinaryOp.EQ,
    "Less": BinaryOp.LT,
    "LessOrEqual": BinaryOp.LE,
    "Greater": BinaryOp.GT,
    "GreaterOrEqual": BinaryOp.GE,
    "And": BinaryOp.AND,
    "Or": BinaryOp.OR,
    "Xor": BinaryOp.XOR,
    "BitwiseAnd": BinaryOp.BIT_AND,
    "BitwiseOr": BinaryOp.BIT_OR,
    "BitwiseXor": BinaryOp.BIT_XOR,
}


def _operands(ctx: NodeContext) -> tuple[Value, Value]:
    """Both inputs as values; before opset 7 `broadcast=1, axis=k` aligns b at axis k of a."""
    a, b = ctx.input(0), ctx.input(1)
    if ctx.opset >= 7:
        return a, b
    ctx.ignore_attrs("consumed_inputs")
    if not ctx.attr_bool("broadcast", False) or not ctx.has_attr("axis"):
        return a, b
    g = ctx.graph
    ra, sb = g[a].rank, g.shape(b)
    axis = ctx.axis(ctx.attr_int("axis"), ra)
    trailing = ra - axis - sb.rank
    if trailing < 0:
        ctx.unsupported(f"legacy broadcast of {sb} at axis {axis} of rank {ra}")
    return a, g.view(b, sb + Shape.of(*([1] * trailing)))


def _binary(ctx: NodeContext, op: BinaryOp) -> Result:
    if ctx.opset < 7:
        ctx.ignore_attrs("consumed_inputs", "broadcast", "axis")
        if ctx.has_attr("axis"):  # legacy alignment: only the graph path implements it
            return ctx.graph.binary(op, *_operands(ctx))
    return _known_or_graph(
        ctx,
        lambda ks: known_binary(op, ks[0], ks[1]),
        lambda: ctx.graph.binary(op, *_operands(ctx)),
        indices=[0, 1],
    )


@onnx_op(*_BINARY_OPS)
def binary(ctx: NodeContext) -> Result:
    return _binary(ctx, _BINARY_OPS[ctx.op_type])


@onnx_op("Mod")
def mod(ctx: NodeContext) -> Result:
    """fmod=1 is C fmod (sign of the dividend); fmod=0 takes the sign of the divisor."""
    return _binary(ctx, BinaryOp.FMOD if ctx.attr_bool("fmod", False) else BinaryOp.MOD)


@onnx_op("Pow")
def pow_(ctx: NodeContext) -> Result:
    """The exponent may have another type: compute in NumPy's common type, cast to the base's."""
    if ctx.opset < 7:
        ctx.ignore_attrs("broadcast", "axis")
    g = ctx.graph
    a, b = _operands(ctx)
    da, db = g.dtype(a), g.dtype(b)
    if da == db:
        return g.pow(a, b)
    common = DType.from_np(np.result_type(da.np, db.np))
    return g.cast(g.pow(g.cast(a, common), g.cast(b, common)), da)


@onnx_op("BitShift")
def bit_shift(ctx: NodeContext) -> Result:
    """Shift amounts outside [0, bits) give 0 (and -1 for right shifts of negative numbers)."""
    direction = ctx.attr_str("direction")
    if direction not in ("LEFT", "RIGHT"):
        ctx.unsupported(f"direction '{direction}'")
    op = BinaryOp.SHL if direction == "LEFT" else BinaryOp.SHR
    g = ctx.graph
    a, b = _operands(ctx)
    dt = g.dtype(a)
    if not dt.is_int:
        ctx.unsupported(f"expected integer operands, found {dt}")
    bits = dt.size * 8
    amounts = g.const_value(b)
    if amounts is not None and np.all((amounts >= 0) & (amounts < bits)):
        return g.binary(op, a, b)
    valid = g.binary(BinaryOp.AND, g.binary(BinaryOp.GE, b, 0), g.binary(BinaryOp.LT, b, bits))
    shifted = g.binary(op, a, g.select(valid, b, 0))
    fill: Value | int = 0
    if op is BinaryOp.SHR and dt.is_signed:
        fill = g.select(g.binary(BinaryOp.LT, a, 0), g.full(-1, g.shape(a), dt), 0)
    return g.select(valid, shifted, fill)


# -- Where, Clip and the variadic ops -------------------------------------------------------------
def _known_where(c: Known, a: Known, b: Known) -> Known:
    if a.dtype != b.dtype or c.is_symbolic:
        raise Undecidable
    if not a.is_symbolic and not b.is_symbolic:
        return Known(np.where(c.data, a.data, b.data).astype(a.dtype.np), a.dtype)
    return Known.of(np.where(c.data, a.data.astype(object), b.data.astype(object)), a.dtype)


@onnx_op("Where")
def where(ctx: NodeContext) -> Result:
    """A condition known at load time picks its branch statically when it is uniform."""
    cond = ctx.input_known(0)
    if cond is not None and not cond.is_symbolic:
        ka, kb = ctx.input_known(1), ctx.input_known(2)
        if ka is not None and kb is not None:
            try:
                return _known_where(cond, ka, kb)
            except (Undecidable, ValueError):
                pass
        flat = cond.data.reshape(-1).astype(bool)
        if flat.size and (flat.all() or not flat.any()):
            pick = 1 if flat[0] else 2
            shape = broadcast_shapes(
                *(ctx.input_shape(i) for i in range(3)), equate=ctx.graph._equate_or_none()
            )
            chosen = ka if pick == 1 else kb
            if chosen is not None and Shape.of(*chosen.shape) == shape:
                return chosen  # stays a load-time value (a shape tensor stays usable)
            g = ctx.graph
            x = ctx.input(pick)
            return g.broadcast(g._conform(x, shape) if g.equate else x, shape)
    return ctx.graph.select(ctx.input(0), ctx.input(1), ctx.input(2))


def _fold(ctx: NodeContext, op: BinaryOp, xs: Sequence[Known | Value]) -> Result:
    """Combine left to right, at load time while every operand is Known."""
    acc = xs[0]
    for x in xs[1:]:
        if isinstance(acc, Known) and isinstance(x, Known):
            try:
                acc = known_binary(op, acc, x)
                continue
            except (Undecidable, GraphError, ValueError):
                pass
        va = ctx.materialize(acc) if isinstance(acc, Known) else acc
        vb = ctx.materialize(x) if isinstance(x, Known) else x
        acc = ctx.graph.binary(op, va, vb)
    return acc


def _operand_or_known(ctx: NodeContext, i: int) -> Known | Value:
    k = ctx.input_known(i)
    return k if k is not None else ctx.input(i)


@onnx_op("Clip")
def clip(ctx: NodeContext) -> Result:
    """max(x, min) then min(·, max), as NumPy's clip: min > max gives max everywhere."""
    x = _operand_or_known(ctx, 0)
    bounds: list[tuple[BinaryOp, Known | Value]] = []
    if ctx.opset < 11:
        ctx.ignore_attrs("consumed_inputs")
        dt = ctx.input_dtype(0)
        for name, op in (("min", BinaryOp.MAX), ("max", BinaryOp.MIN)):
            if ctx.has_attr(name):
                bounds.append((op, ctx.graph.scalar(ctx.attr_float(name), dt)))
    else:
        for i, op in ((1, BinaryOp.MAX), (2, BinaryOp.MIN)):
            if ctx.has_input(i):
                bounds.append((op, _operand_or_known(ctx, i)))
    for op, bound in bounds:
        x = _fold(ctx, op, [x, bound])
    return x


_VARIADIC = {"Max": BinaryOp.MAX, "Min": BinaryOp.MIN, "Sum": BinaryOp.ADD, "Mean": BinaryOp.ADD}


@onnx_op("Max", "Min", "Sum", "Mean")
def variadic(ctx: NodeContext) -> Result:
    """Broadcasting folds of one or more inputs; Mean is the Sum divided by the count."""
    if ctx.opset < 6:
        ctx.ignore_attrs("consumed_inputs")
    idx = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    if not idx:
        ctx.unsupported("no inputs")
    out = _fold(ctx, _VARIADIC[ctx.op_type], [_operand_or_known(ctx, i) for i in idx])
    if ctx.op_type != "Mean" or len(idx) == 1:
        return out
    v = ctx.materialize(out) if isinstance(out, Known) else out
    if not ctx.graph.dtype(v).is_float:
        ctx.unsupported(f"Mean of {ctx.graph.dtype(v)} inputs")
    return ctx.graph.div(v, float(len(idx)))


# -- unary math ------------------------------------------------------------------------------------
_UNARY_OPS: dict[str, UnaryOp] = {
    "Abs": UnaryOp.ABS,
    "Neg": UnaryOp.NEG,
    "Sqrt": UnaryOp.SQRT,
    "Exp": UnaryOp.EXP,
    "Log": UnaryOp.LOG,
    "Sin": UnaryOp.SIN,
    "Cos": UnaryOp.COS,
    "Tan": UnaryOp.TAN,
    "Asin": UnaryOp.ASIN,
    "Acos": UnaryOp.ACOS,
    "Atan": UnaryOp.ATAN,
    "Sinh": UnaryOp.SINH,
    "Cosh": UnaryOp.COSH,
    "Asinh": UnaryOp.ASINH,
    "Acosh": UnaryOp.ACOSH,
    "Atanh": UnaryOp.ATANH,
    "Erf": UnaryOp.ERF,
    "Sigmoid": UnaryOp.SIGMOID,
    "Tanh": UnaryOp.TANH,
    "Softplus": UnaryOp.SOFTPLUS,
    "Reciprocal": UnaryOp.RECIPROCAL,
    "Floor": UnaryOp.FLOOR,
    "Ceil": UnaryOp.CEIL,
    "Round": UnaryOp.ROUND,
    "Sign": UnaryOp.SIGN,
    "Not": UnaryOp.NOT,
    "BitwiseNot": UnaryOp.BIT_NOT,
}


def _elem_abs(x: Elem) -> Elem:
    return x if _elem_compare(BinaryOp.GE, x, 0) else -x


def _elem_sign(x: Elem) -> Elem:
    lo, hi = _bounds(x)
    if lo > 0 or hi < 0:
        return 1 if lo > 0 else -1
    if lo == hi == 0:
        return 0
    raise Undecidable


_KNOWN_UNARY: dict[UnaryOp, tuple[Callable[..., np.ndarray], Callable[..., Elem]]] = {
    UnaryOp.NEG: (np.negative, operator.neg),
    UnaryOp.ABS: (np.abs, _elem_abs),
    UnaryOp.SIGN: (np.sign, _elem_sign),
    UnaryOp.NOT: (np.logical_not, _no_elem),
    UnaryOp.BIT_NOT: (np.invert, _no_elem),
}


def _known_unary(op: UnaryOp, k: Known) -> Known:
    if op not in _KNOWN_UNARY or k.dtype.is_bool != (op is UnaryOp.NOT):
        raise Undecidable
    np_fn, elem_fn = _KNOWN_UNARY[op]
    return _known_map([k], np_fn, elem_fn, k.dtype)


@onnx_op(*_UNARY_OPS)
def unary(ctx: NodeContext) -> Result:
    op = _UNARY_OPS[ctx.op_type]
    ctx.ignore_attrs("consumed_inputs")  # opset 1 bookkeeping, no effect on the result
    return _known_or_graph(
        ctx,
        lambda ks: _known_unary(op, ks[0]),
        lambda: ctx.graph.unary(op, ctx.input(0)),
        indices=[0],
    )


@onnx_op("IsNaN")
def is_nan(ctx: NodeContext) -> Result:
    """NaN is the one value not equal to itself."""
    g, x = ctx.graph, ctx.input(0)
    if not g.dtype(x).is_float:
        return g.full(False, g.shape(x), DType.BOOL)
    return g.unary(UnaryOp.NOT, g.binary(BinaryOp.EQ, x, x))


@onnx_op("IsInf")
def is_inf(ctx: NodeContext) -> Result:
    g, x = ctx.graph, ctx.input(0)
    signs = [
        s
        for s, attr in ((1, "detect_positive"), (-1, "detect_negative"))
        if ctx.attr_bool(attr, True)
    ]
    if not signs or not g.dtype(x).is_float:
        return g.full(False, g.shape(x), DType.BOOL)
    hits = [g.binary(BinaryOp.EQ, x, s * math.inf) for s in signs]
    return hits[0] if len(hits) == 1 else g.binary(BinaryOp.OR, hits[0], hits[1])


# -- activations -----------------------------------------------------------------------------------
def _negative_part(g: Graph, x: Value, neg: Value, strict: bool = True) -> Value:
    """x where x > 0 (>= 0 when not strict), `neg` elsewhere."""
    positive = g.binary(BinaryOp.GT if strict else BinaryOp.GE, x, 0)
    return g.select(positive, x, neg)


def _activation(ctx: NodeContext) -> Value:
    ctx.ignore_attrs("consumed_inputs")
    x = ctx.input(0)
    if not ctx.graph.dtype(x).is_float and ctx.op_type not in ("PRelu", "Shrink", "Relu"):
        ctx.unsupported(f"expected a float input, found {ctx.graph.dtype(x)}")
    return x


@onnx_op("Relu")
def relu(ctx: NodeContext) -> Result:
    return ctx.graph.relu(_activation(ctx))


@onnx_op("LeakyRelu")
def leaky_relu(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return _negative_part(g, x, g.mul(x, ctx.attr_float("alpha", 0.01)))


@onnx_op("PRelu")
def prelu(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return _negative_part(g, x, g.mul(x, ctx.input(1)))


def _expm1_scaled(g: Graph, x: Value, alpha: float) -> Value:
    """alpha·(exp(x) - 1), written as the ONNX reference does."""
    return g.sub(g.mul(g.exp(x), alpha), alpha)


@onnx_op("Elu")
def elu(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return _negative_part(g, x, _expm1_scaled(g, x, ctx.attr_float("alpha", 1.0)))


@onnx_op("Selu")
def selu(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    alpha = ctx.attr_float("alpha", 1.6732632423543772848170429916717)
    gamma = ctx.attr_float("gamma", 1.0507009873554804934193349852946)
    return g.mul(_negative_part(g, x, _expm1_scaled(g, x, alpha)), gamma)


@onnx_op("Celu")
def celu(ctx: NodeContext) -> Result:
    """max(0, x) + min(0, alpha·(exp(x/alpha) - 1))."""
    g, x = ctx.graph, _activation(ctx)
    alpha = ctx.attr_float("alpha", 1.0)
    neg = _expm1_scaled(g, g.div(x, alpha), alpha)
    return g.add(g.maximum(x, 0.0), g.minimum(neg, 0.0))


def _hard_sigmoid(g: Graph, x: Value, alpha: float, beta: float) -> Value:
    return g.minimum(g.maximum(g.add(g.mul(x, alpha), beta), 0.0), 1.0)


@onnx_op("HardSigmoid")
def hard_sigmoid(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return _hard_sigmoid(g, x, ctx.attr_float("alpha", 0.2), ctx.attr_float("beta", 0.5))


@onnx_op("HardSwish")
def hard_swish(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return g.mul(x, _hard_sigmoid(g, x, 1.0 / 6.0, 0.5))


@onnx_op("ThresholdedRelu")
def thresholded_relu(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return g.select(g.binary(BinaryOp.GT, x, ctx.attr_float("alpha", 1.0)), x, 0.0)


@onnx_op("Shrink")
def shrink(ctx: NodeContext) -> Result:
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    g, x = ctx.graph, _activation(ctx)
    bias, lambd = ctx.attr_float("bias", 0.0), ctx.attr_float("lambd", 0.5)
    dt = g.dtype(x)
    if not dt.is_float and not (bias.is_integer() and lambd.is_integer()):
        ctx.unsupported(f"non-integer bias {bias} or lambd {lambd} on {dt} input")
    cast = float if dt.is_float else int
    low = g.select(g.binary(BinaryOp.LT, x, cast(-lambd)), g.add(x, cast(bias)), 0)
    return g.select(g.binary(BinaryOp.GT, x, cast(lambd)), g.sub(x, cast(bias)), low)


@onnx_op("Softsign")
def softsign(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return g.div(x, g.add(g.unary(UnaryOp.ABS, x), 1.0))


@onnx_op("Mish")
def mish(ctx: NodeContext) -> Result:
    g, x = ctx.graph, _activation(ctx)
    return g.mul(x, g.unary(UnaryOp.TANH, g.unary(UnaryOp.SOFTPLUS, x)))


@onnx_op("Gelu")
def gelu(ctx: NodeContext) -> Result:
    x = _activation(ctx)
    approximate = ctx.attr_str("approximate", "none")
    if approximate not in ("none", "tanh"):
        ctx.unsupported(f"approximate='{approximate}'")
    return ctx.graph.gelu(x, "tanh" if approximate == "tanh" else "none")


@onnx_op("Swish")
def swish(ctx: NodeContext) -> Result:
    """x·sigmoid(alpha·x); alpha = 1 is SiLU."""
    g, x = ctx.graph, _activation(ctx)
    alpha = ctx.attr_float("alpha", 1.0)
    if alpha == 1.0:
        return g.silu(x)
    return g.mul(x, g.unary(UnaryOp.SIGMOID, g.mul(x, alpha)))


@onnx_op("SwiGLU")
def swiglu(ctx: NodeContext) -> Result:
    """Swish_alpha(a) · b, a and b of one shape (no broadcasting)."""
    g = ctx.graph
    a, b = ctx.input(0), ctx.input(1)
    if g[a].rank != g[b].rank:
        ctx.unsupported(f"a {g[a].shape} and b {g[b].shape} must have one shape")
    for i, (x, y) in enumerate(zip(g[a].shape, g[b].shape, strict=True)):
        g.guard_equal(x, y, f"SwiGLU: axis {i} of a and b")
    alpha = ctx.attr_float("alpha", 1.0)
    gate = g.silu(a) if alpha == 1.0 else g.mul(a, g.unary(UnaryOp.SIGMOID, g.mul(a, alpha)))
    return g.mul(gate, b)


# -- casts -----------------------------------------------------------------------------------------
def _target_dtype(ctx: NodeContext, elem_type: int) -> DType:
    try:
        return onnx_dtype(elem_type, ctx.name)
    except UnsupportedOnnxError as e:
        ctx.unsupported(f"cast target: {e.detail}")


def _known_cast(ctx: NodeContext, k: Known, to: DType) -> Result:
    if not k.is_symbolic:
        if to.is_float:
            return ctx.graph.constant(k.data.astype(to.np))
        if to.is_bool:
            data = k.data != 0
        elif k.data.dtype.kind == "f":
            data = float_to_int(k.data, to.np)  # as every executor converts
        else:
            data = k.data.astype(to.np)
        return Known(np.asarray(data), to)
    if to.is_int:
        return Known.of(k.data, to)  # sizes stay sizes
    raise Undecidable  # a size's truth value or float value is a run-time matter


def _cast(ctx: NodeContext, to: DType) -> Result:
    ctx.ignore_attrs("saturate", "round_mode")  # they only affect float8 targets, refused above
    r = ctx.raw_input(0)
    if isinstance(r, Known) and r.is_symbolic and r.data.size == 1 and to.is_float:
        # a size as a float (Range bounds in dynamo exports): remember which size it is
        v = ctx.graph.cast(ctx.materialize(r), to)
        ctx.loader.value_sizes[v] = r.sizes()[0]
        return v
    return _known_or_graph(
        ctx,
        lambda ks: _known_cast(ctx, ks[0], to),
        lambda: ctx.graph.cast(ctx.input(0), to),
        indices=[0],
    )


@onnx_op("Cast")
def cast(ctx: NodeContext) -> Result:
    return _cast(ctx, _target_dtype(ctx, ctx.attr_int("to")))


@onnx_op("CastLike")
def cast_like(ctx: NodeContext) -> Result:
    return _cast(ctx, ctx.input_dtype(1))


@onnx_op("BitCast")
def bit_cast(ctx: NodeContext) -> Result:
    """Reinterpret the bytes; both types must have the same width."""
    return ctx.graph.bitcast(ctx.input(0), _target_dtype(ctx, ctx.attr_int("to")))
