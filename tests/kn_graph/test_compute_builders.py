"""Compute builders (conv, matmul, unary, cast, binary, select, iota, softmax, layernorm, reduce):
validation and the identities they fold away."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import (
    BinaryOp,
    DType,
    Graph,
    GraphError,
    ReduceOp,
    Shape,
    ShapeMismatchError,
    Size,
    UnaryOp,
)
from kn_graph.ops import (
    Binary,
    Reduce,
    Unary,
    View,
)
from tests.conftest import graph_with

B = Size.sym("B")


# -- conv and matmul --------------------------------------------------------------------------------
def test_conv_output_shape():
    g, x = graph_with([B, 4, 9, 8])
    w = g.constant(np.zeros((6, 2, 3, 2), np.float32))
    y = g.conv(x, w, stride=(2, 3), padding=(1, 0), dilation=(1, 2), groups=2)
    # (9 + 2 - 2 - 1) // 2 + 1 = 5 ; (8 - 2 - 1) // 3 + 1 = 2
    assert g.shape(y) == Shape.of(B, 6, 5, 2)


@pytest.mark.parametrize(
    ("xs", "ws", "kw", "match"),
    [
        ([1, 4, 8], [2, 4], {}, r"expected x \[N,C,\*spatial\] and w of equal rank"),
        ([1, 4], [2, 4], {}, r"expected x \[N,C,\*spatial\]"),
        ([1, 4, 8], [2, 3, 3], {}, "input channels 4 != 1 groups x 3"),
        ([1, 4, 8], [5, 2, 3], {"groups": 2}, "5 filters not divisible by the groups"),
        ([1, 4, 8], [6, 2, 3], {"groups": 3}, "input channels 4 != 3 groups x 2"),
        ([1, 4, 8], [2, 4, 3], {"stride": (1, 1)}, "stride/padding/dilation must have 1 entries"),
        ([1, 4, 8], [2, 4, 3], {"stride": (0,)}, "invalid stride"),
        ([1, 4, 8], [2, 4, 3], {"padding": (-1,)}, "invalid stride"),
        ([1, 4, 8], [2, 4, 3], {"groups": 0}, "invalid stride"),
        ([1, 4, 2], [2, 4, 3], {}, r"kernel \[2,4,3\] larger than padded input \[1,4,2\]"),
        ([1, 4, 8], [2, 4, 5], {"dilation": (2,)}, "larger than padded input"),
    ],
)
def test_conv_validation(xs, ws, kw, match):
    g, x = graph_with(xs)
    w = g.constant(np.zeros(ws, np.float32))
    with pytest.raises(GraphError, match=match):
        g.conv(x, w, **kw)


def test_conv_requires_equal_float_dtypes():
    g, x = graph_with([1, 1, 4], DType.I32)
    with pytest.raises(GraphError, match="conv: expected equal float dtypes, found i32 and i32"):
        g.conv(x, g.constant(np.zeros((1, 1, 1), np.int32)))
    g, x = graph_with([1, 1, 4])
    with pytest.raises(GraphError, match="found f32 and f64"):
        g.conv(x, g.constant(np.zeros((1, 1, 1), np.float64)))


def test_conv_symbolic_spatial_size():
    g, x = graph_with([1, 1, B])
    w = g.constant(np.zeros((1, 1, 3), np.float32))
    assert g.shape(g.conv(x, w, padding=(1,))) == Shape.of(1, 1, B)
    assert g.shape(g.conv(x, w)) == Shape.of(1, 1, B - 2)
    assert str(g.shape(g.conv(x, w, stride=(2,), padding=(1,)))) == "[1,1,(B+1)//2]"
    g.check_bindings({"B": 3})
    with pytest.raises(ShapeMismatchError, match="must hold the kernel"):
        g.check_bindings({"B": 2})


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (
            ([2, 3, 4], DType.F32),
            ([2, 5, 6], DType.F32),
            r"matmul: expected \[b,m,k\] @ \[b,k,n\], found \[2,3,4\] @ \[2,5,6\]",
        ),
        (([2, 3, 4], DType.F32), ([3, 4, 6], DType.F32), "expected"),
        (([3, 4], DType.F32), ([4, 6], DType.F32), "expected"),
        (([1, 3, 4], DType.F32), ([1, 4, 6], DType.F64), r"matmul: dtypes differ \(f32 and f64\)"),
        (([1, 3, 4], DType.BOOL), ([1, 4, 6], DType.BOOL), "matmul: bool operands"),
    ],
)
def test_matmul_validation(a, b, match):
    g = Graph()
    with pytest.raises(GraphError, match=match):
        g.matmul(g.input(*a), g.input(*b))


# -- unary, cast, bitcast ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "dtype", "match"),
    [
        (UnaryOp.EXP, DType.I32, "exp: expected a float operand, found i32"),
        (UnaryOp.FLOOR, DType.I64, "floor: expected a float operand, found i64"),
        (UnaryOp.NOT, DType.F32, "not: expected a bool operand, found f32"),
        (UnaryOp.BIT_NOT, DType.F32, "bit_not: expected an integer operand, found f32"),
        (UnaryOp.BIT_NOT, DType.BOOL, "bit_not: expected an integer operand, found bool"),
        (UnaryOp.NEG, DType.BOOL, "neg: bool operand"),
        (UnaryOp.ABS, DType.BOOL, "abs: bool operand"),
        (UnaryOp.CAST, DType.F32, r"cast: use cast\(\)/bitcast\(\)"),
        (UnaryOp.BITCAST, DType.F32, r"bitcast: use cast\(\)/bitcast\(\)"),
    ],
)
def test_unary_validation(op, dtype, match):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=match):
        g.unary(op, x)


def test_same_dtype_cast_and_bitcast_vanish():
    g, x = graph_with([2])
    assert g.cast(x, DType.F32) == x
    assert g.bitcast(x, DType.F32) == x


def test_cast_and_bitcast_nodes():
    g, x = graph_with([2])
    c = g.cast(x, DType.I8)
    assert g[c].op == Unary(x, UnaryOp.CAST) and g.dtype(c) is DType.I8
    b = g.bitcast(x, DType.U32)
    assert g[b].op == Unary(x, UnaryOp.BITCAST) and g.dtype(b) is DType.U32
    # casts to different types are different nodes
    assert g.cast(x, DType.I16) != c


def test_bitcast_between_sizes_raises():
    g, x = graph_with([2])
    with pytest.raises(GraphError, match="bitcast: f32 and f64 differ in size"):
        g.bitcast(x, DType.F64)


# -- binary -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "dtype"),
    [
        (lambda g, x: g.add(x, 0), DType.F32),
        (lambda g, x: g.add(0.0, x), DType.F32),
        (lambda g, x: g.sub(x, 0), DType.I32),
        (lambda g, x: g.mul(x, 1), DType.F16),
        (lambda g, x: g.mul(1, x), DType.I64),
        (lambda g, x: g.div(x, 1), DType.F64),
        (lambda g, x: g.pow(x, 1.0), DType.F32),
        (lambda g, x: g.add(x, g.full(0.0, [2, 3], DType.F32)), DType.F32),
        (lambda g, x: g.mul(x, g.constant(np.ones((1, 3), np.float32))), DType.F32),
        (lambda g, x: g.add(x, -0.0), DType.F32),
    ],
    ids=["x+0", "0+x", "x-0", "x*1", "1*x", "x/1", "x**1", "x+full0", "x*ones", "x+-0"],
)
def test_identity_binary_ops_vanish(build, dtype):
    g, x = graph_with([2, 3], dtype)
    assert build(g, x) == x


@pytest.mark.parametrize(
    "build",
    [
        lambda g, x: g.sub(0, x),
        lambda g, x: g.div(1, x),
        lambda g, x: g.pow(1, x),
        lambda g, x: g.add(x, g.constant(np.zeros((4, 2, 3), np.float32))),  # broadcasts x
        lambda g, x: g.mul(x, g.constant(np.array([1.0, 1.0, 2.0], np.float32))),
        lambda g, x: g.add(x, float("nan")),
    ],
    ids=["0-x", "1/x", "1**x", "x+zeros-bigger", "x*[1,1,2]", "x+nan"],
)
def test_non_identity_binary_ops_stay(build):
    g, x = graph_with([2, 3])
    y = build(g, x)
    assert y != x
    assert isinstance(g[y].op, Binary)


def test_binary_broadcasts_numpy_style():
    g, x = graph_with([B, 1, 3])
    y = g.input([4, 1], DType.F32)
    z = g.add(x, y)
    assert g.shape(z) == Shape.of(B, 4, 3)
    op = g[z].op
    assert isinstance(op, Binary)
    assert g.shape(op.a) == g.shape(op.b) == Shape.of(B, 4, 3)


def test_python_scalar_takes_the_other_operands_dtype():
    g, x = graph_with([2], DType.I16)
    y = g.add(x, 3)
    assert g.dtype(y) is DType.I16
    assert g.scalar_value(g[y].op.b) == 3


@pytest.mark.parametrize(
    ("dtype", "value"),
    [(DType.I32, 0.5), (DType.U8, 300), (DType.U8, -1), (DType.I8, float("inf")), (DType.BOOL, 2)],
)
def test_python_scalar_not_representable_in_the_dtype_raises(dtype, value):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=f"{value!r}"):
        g.binary(BinaryOp.EQ, x, value)


def test_comparison_gives_bool():
    g, x = graph_with([2])
    for op in (BinaryOp.EQ, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE):
        assert g.dtype(g.binary(op, x, 1.0)) is DType.BOOL


@pytest.mark.parametrize(
    ("op", "dtype", "match"),
    [
        (BinaryOp.AND, DType.I32, "and: expected bool operands, found i32"),
        (BinaryOp.XOR, DType.F32, "xor: expected bool operands, found f32"),
        (BinaryOp.BIT_AND, DType.F32, "bit_and: expected integer operands, found f32"),
        (BinaryOp.SHL, DType.BOOL, "shl: expected integer operands, found bool"),
        (BinaryOp.ADD, DType.BOOL, "add: not defined on bool operands"),
        (BinaryOp.LT, DType.BOOL, "lt: not defined on bool operands"),
    ],
)
def test_binary_dtype_validation(op, dtype, match):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=match):
        g.binary(op, x, x)


def test_binary_operand_dtypes_must_match():
    g, x = graph_with([2])
    with pytest.raises(GraphError, match=r"add: operand dtypes differ \(f32 and f64\)"):
        g.add(x, g.input([2], DType.F64))


def test_binary_shapes_must_broadcast():
    g, x = graph_with([2, 3])
    with pytest.raises(GraphError, match=r"cannot broadcast shapes \[2,3\], \[4\]"):
        g.mul(x, g.input([4], DType.F32))


def test_binary_needs_a_value():
    with pytest.raises(GraphError, match="mul: at least one operand must be a Value"):
        Graph().mul(2, 3)


# -- select, iota ------------------------------------------------------------------------------------
def test_select_broadcasts_all_three():
    g, x = graph_with([2, 1])
    c = g.input([3], DType.BOOL)
    s = g.select(c, x, 0.0)
    assert g.shape(s) == Shape.of(2, 3)
    assert all(g.shape(v) == Shape.of(2, 3) for v in g[s].op.inputs)


def test_select_with_equal_branches_vanishes():
    g, x = graph_with([2, 3])
    c = g.input([2, 3], DType.BOOL)
    assert g.select(c, x, x) == x


@pytest.mark.parametrize(
    ("cond", "b", "match"),
    [
        (DType.F32, DType.F32, "select: condition must be bool, found f32"),
        (DType.BOOL, DType.F64, r"select: branch dtypes differ \(f32 and f64\)"),
    ],
)
def test_select_validation(cond, b, match):
    g, x = graph_with([2])
    with pytest.raises(GraphError, match=match):
        g.select(g.input([2], cond), x, g.input([2], b))


def test_select_needs_a_value_branch():
    g = Graph()
    with pytest.raises(GraphError, match="select: at least one of the branches must be a Value"):
        g.select(g.input([2], DType.BOOL), 1.0, 2.0)


def test_iota_validation_and_shape():
    g = Graph()
    v = g.iota([B, 4], -1, DType.I32)
    assert g.shape(v) == Shape.of(B, 4) and g.dtype(v) is DType.I32
    assert g[v].op.axis == 1
    with pytest.raises(GraphError, match="iota: bool dtype"):
        g.iota([3], 0, DType.BOOL)
    with pytest.raises(GraphError, match="axis 2 out of range for rank 2"):
        g.iota([3, 3], 2)


# -- softmax, layernorm, reduce ------------------------------------------------------------------------
@pytest.mark.parametrize("builder", ["softmax", "layernorm"])
def test_normalisations_need_floats(builder):
    g, x = graph_with([2, 3], DType.I32)
    args = (x, 1) if builder == "softmax" else (x, 1, 1e-5)
    with pytest.raises(GraphError, match=f"{builder}: expected a float operand, found i32"):
        getattr(g, builder)(*args)


def test_softmax_normalises_axis():
    g, x = graph_with([2, 3])
    assert g.softmax(x, -1) == g.softmax(x, 1)
    with pytest.raises(GraphError, match="axis 2 out of range for rank 2"):
        g.softmax(x, 2)


@pytest.mark.parametrize("builder", ["softmax", "reduce", "iota", "layernorm"])
def test_axis_zero_of_a_rank_zero_value_is_out_of_range(builder):
    g, x = graph_with([])
    calls = {
        "softmax": lambda: g.softmax(x, 0),
        "reduce": lambda: g.reduce(x, [0], ReduceOp.SUM),
        "iota": lambda: g.iota([], 0),
        "layernorm": lambda: g.layernorm(x, 0, 1e-5),
    }
    with pytest.raises(GraphError, match="axis 0 out of range for rank 0"):
        calls[builder]()


def test_reduce_removes_sorted_unique_axes():
    g, x = graph_with([2, 3, 4, 5])
    y = g.reduce(x, [-1, 1, 3], ReduceOp.SUM)
    assert g[y].op == Reduce(x, (1, 3), ReduceOp.SUM)
    assert g.shape(y) == Shape.of(2, 4)


def test_reduce_keepdims_views_back():
    g, x = graph_with([2, 3, 4])
    y = g.reduce(x, [1], ReduceOp.MAX, keepdims=True)
    assert g.shape(y) == Shape.of(2, 1, 4)
    assert isinstance(g[y].op, View)


def test_reduce_over_no_axes_is_identity():
    g, x = graph_with([2, 3])
    assert g.reduce(x, [], ReduceOp.SUM) == x


def test_arg_reduce_gives_i64():
    g, x = graph_with([2, 3])
    y = g.reduce(x, [1], ReduceOp.ARGMAX)
    assert g.dtype(y) is DType.I64 and g.shape(y) == Shape.of(2)


@pytest.mark.parametrize(
    ("dtype", "axes", "op", "match"),
    [
        (DType.F32, [0, 1], ReduceOp.ARGMIN, r"reduce argmin: exactly one axis, found \[0, 1\]"),
        (DType.F32, [], ReduceOp.ARGMAX, "reduce argmax: exactly one axis"),
        (DType.BOOL, [0], ReduceOp.SUM, "reduce sum: bool operand"),
        (DType.I32, [0], ReduceOp.MEAN, "reduce mean: expected a float operand, found i32"),
        (DType.F32, [2], ReduceOp.SUM, "axis 2 out of range for rank 2"),
    ],
)
def test_reduce_validation(dtype, axes, op, match):
    g, x = graph_with([2, 3], dtype)
    with pytest.raises(GraphError, match=match):
        g.reduce(x, axes, op)
