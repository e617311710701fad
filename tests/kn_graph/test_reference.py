"""The NumPy CPU executor, op by op, against NumPy/SciPy formulas or hand-computed values."""

from __future__ import annotations

import itertools
import math
import time
import tracemalloc

import numpy as np
import pytest
import scipy.special

from kn_graph import BinaryOp, DType, EvaluationError, Graph, ReduceOp, Size, UnaryOp
from kn_graph.reference import evaluate
from tests.conftest import graph_with, random_array, run

B = Size.sym("B")
FLOATS = [DType.F32, DType.F64, DType.F16]
INTS = [DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32, DType.U64]
SIGNED_INTS = [DType.I8, DType.I16, DType.I32, DType.I64]
ALL = [*FLOATS, *INTS, DType.BOOL]
RTOL = {DType.F16: 2e-3, DType.F32: 2e-6, DType.F64: 1e-13}


@pytest.fixture
def rng():
    return np.random.default_rng(42)


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: DType) -> None:
    """Exact for integers and bools; a few ulps of the dtype for floats."""
    assert got.dtype == dtype.np
    assert got.shape == np.shape(ref)
    if dtype.is_float:
        tol = RTOL[dtype]
        np.testing.assert_allclose(
            got.astype(np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol
        )
    else:
        np.testing.assert_array_equal(got, ref)


# -- unary ------------------------------------------------------------------------------------------
# op -> (float64 reference, input domain (lo, hi))
UNARY_FLOAT = {
    UnaryOp.SIN: (np.sin, (-4, 4)),
    UnaryOp.COS: (np.cos, (-4, 4)),
    UnaryOp.TAN: (np.tan, (-1.2, 1.2)),
    UnaryOp.ASIN: (np.arcsin, (-0.99, 0.99)),
    UnaryOp.ACOS: (np.arccos, (-0.99, 0.99)),
    UnaryOp.ATAN: (np.arctan, (-5, 5)),
    UnaryOp.SINH: (np.sinh, (-3, 3)),
    UnaryOp.COSH: (np.cosh, (-3, 3)),
    UnaryOp.ASINH: (np.arcsinh, (-5, 5)),
    UnaryOp.ACOSH: (np.arccosh, (1, 5)),
    UnaryOp.ATANH: (np.arctanh, (-0.9, 0.9)),
    UnaryOp.EXP: (np.exp, (-5, 5)),
    UnaryOp.LOG: (np.log, (0.01, 10)),
    UnaryOp.SQRT: (np.sqrt, (0, 10)),
    UnaryOp.SIGMOID: (lambda a: 1 / (1 + np.exp(-a)), (-8, 8)),
    UnaryOp.TANH: (np.tanh, (-4, 4)),
    UnaryOp.ERF: (scipy.special.erf, (-3, 3)),
    UnaryOp.SOFTPLUS: (lambda a: np.log1p(np.exp(a)), (-8, 8)),
    UnaryOp.RECIPROCAL: (lambda a: 1 / a, (0.1, 10)),
    UnaryOp.FLOOR: (np.floor, (-5, 5)),
    UnaryOp.CEIL: (np.ceil, (-5, 5)),
    UnaryOp.ROUND: (np.round, (-5, 5)),
    UnaryOp.ABS: (np.abs, (-5, 5)),
    UnaryOp.NEG: (np.negative, (-5, 5)),
    UnaryOp.SIGN: (np.sign, (-5, 5)),
    UnaryOp.GELU: (lambda a: a * 0.5 * (1 + scipy.special.erf(a / math.sqrt(2))), (-4, 4)),
    UnaryOp.GELU_TANH: (
        lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
        (-4, 4),
    ),
    UnaryOp.SILU: (lambda a: a / (1 + np.exp(-a)), (-8, 8)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(UNARY_FLOAT), ids=lambda o: o.value)
def test_unary_float_ops_match_float64_reference(op, dtype, rng):
    ref_fn, (lo, hi) = UNARY_FLOAT[op]
    a = rng.uniform(lo, hi, size=(3, 17)).astype(dtype.np)
    g, x = graph_with([3, 17], dtype)
    got = run(g, g.unary(op, x), a)
    assert_close(got, ref_fn(a.astype(np.float64)).astype(dtype.np), dtype)


def test_every_unary_op_is_covered():
    covered = set(UNARY_FLOAT) | {UnaryOp.NOT, UnaryOp.BIT_NOT, UnaryOp.CAST, UnaryOp.BITCAST}
    assert covered == set(UnaryOp)


@pytest.mark.parametrize("dtype", SIGNED_INTS)
@pytest.mark.parametrize(
    ("op", "ref"), [(UnaryOp.ABS, np.abs), (UnaryOp.NEG, np.negative), (UnaryOp.SIGN, np.sign)]
)
def test_unary_signed_int_ops(op, ref, dtype):
    a = np.array([-7, -1, 0, 1, 9], dtype.np)
    g, x = graph_with([5], dtype)
    assert_close(run(g, g.unary(op, x), a), ref(a), dtype)


@pytest.mark.parametrize("dtype", INTS)
def test_bit_not(dtype):
    a = np.array([0, 1, 5, 100], dtype.np)
    g, x = graph_with([4], dtype)
    assert_close(run(g, g.unary(UnaryOp.BIT_NOT, x), a), ~a, dtype)


def test_logical_not():
    g, x = graph_with([3], DType.BOOL)
    np.testing.assert_array_equal(
        run(g, g.unary(UnaryOp.NOT, x), np.array([True, False, True])), [False, True, False]
    )


def test_round_is_half_to_even():
    g, x = graph_with([7], DType.F32)
    a = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4, -2.6], np.float32)
    np.testing.assert_array_equal(run(g, g.unary(UnaryOp.ROUND, x), a), [0, 2, 2, -0.0, -2, 2, -3])


@pytest.mark.parametrize("dtype", FLOATS)
def test_sigmoid_and_softplus_saturate_without_overflow(dtype):
    a = np.array(
        [-1e4, -50, 0, 50, 1e4] if dtype != DType.F16 else [-6e4, -50, 0, 50, 6e4], dtype.np
    )
    g, x = graph_with([5], dtype)
    s = g.unary(UnaryOp.SIGMOID, x)
    sp = g.unary(UnaryOp.SOFTPLUS, x)
    g.add_output(s)
    g.add_output(sp)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got_s, got_sp = evaluate(g, [a])
    np.testing.assert_allclose(got_s.astype(np.float64), [0, 0, 0.5, 1, 1], atol=1e-6)
    np.testing.assert_allclose(
        got_sp.astype(np.float64), np.logaddexp(0, a.astype(np.float64)), rtol=1e-3, atol=1e-6
    )


# -- cast and bitcast ----------------------------------------------------------------------------
@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", SIGNED_INTS)
def test_float_to_int_cast_truncates_toward_zero(src, dst):
    a = np.array([-2.75, -1.5, -0.5, -0.0, 0.5, 1.5, 2.75, 100.0], src.np)
    g, x = graph_with([8], src)
    np.testing.assert_array_equal(
        run(g, g.cast(x, dst), a), np.array([-2, -1, 0, 0, 0, 1, 2, 100], dst.np)
    )


@pytest.mark.parametrize("src", [d for d in ALL if d is not DType.BOOL])
def test_cast_to_bool_is_nonzero(src):
    a = np.array([0, 1, 2, 0], src.np)
    g, x = graph_with([4], src)
    np.testing.assert_array_equal(run(g, g.cast(x, DType.BOOL), a), [False, True, True, False])


def test_float_to_bool_cast_edge_values():
    a = np.array([-0.0, 0.0, 0.25, np.nan, -np.inf], np.float32)
    g, x = graph_with([5])
    np.testing.assert_array_equal(
        run(g, g.cast(x, DType.BOOL), a), [False, False, True, True, True]
    )


@pytest.mark.parametrize("dst", ALL)
def test_cast_from_bool(dst):
    g, x = graph_with([2], DType.BOOL)
    out = run(g, g.cast(x, dst), np.array([True, False]))
    assert out.dtype == dst.np
    np.testing.assert_array_equal(out, np.array([1, 0], dst.np))


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (DType.I32, DType.U8),
        (DType.I64, DType.I16),
        (DType.U16, DType.I8),
        (DType.I32, DType.F16),
        (DType.F64, DType.F16),
        (DType.I8, DType.I64),
        (DType.U8, DType.F32),
    ],
)
def test_int_and_float_casts_follow_numpy(src, dst):
    a = np.array([0, 1, 127, 255, 300, 70000], np.int64)
    if src.is_int and not src.is_signed:
        a = a[a < np.iinfo(src.np).max]
    a = a.astype(src.np)
    g, x = graph_with([a.size], src)
    with np.errstate(over="ignore"):
        ref = a.astype(dst.np)
    np.testing.assert_array_equal(run(g, g.cast(x, dst), a), ref)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (DType.F32, DType.I32),
        (DType.F32, DType.U32),
        (DType.I8, DType.U8),
        (DType.F16, DType.U16),
        (DType.F64, DType.I64),
        (DType.U64, DType.I64),
    ],
)
def test_bitcast_reinterprets_bits(src, dst, rng):
    a = random_array(rng, (3, 4), src)
    g, x = graph_with([3, 4], src)
    np.testing.assert_array_equal(run(g, g.bitcast(x, dst), a), a.view(dst.np))


def test_bitcast_of_a_transposed_value():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    g, x = graph_with([2, 3])
    out = run(g, g.bitcast(g.permute(x, [1, 0]), DType.I32), a)
    np.testing.assert_array_equal(out, np.ascontiguousarray(a.T).view(np.int32))


# -- binary -----------------------------------------------------------------------------------------
FLOAT_BINARY = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.divide,
    BinaryOp.MIN: np.minimum,
    BinaryOp.MAX: np.maximum,
    BinaryOp.MOD: np.mod,
    BinaryOp.FMOD: np.fmod,
}
COMPARISONS = {
    BinaryOp.EQ: np.equal,
    BinaryOp.LT: np.less,
    BinaryOp.LE: np.less_equal,
    BinaryOp.GT: np.greater,
    BinaryOp.GE: np.greater_equal,
}


def binary_graph(op, dtype, shape=(4, 6)):
    g = Graph()
    a, b = g.input(shape, dtype, "a"), g.input(shape, dtype, "b")
    return g, g.binary(op, a, b)


def eval_binary(op, dtype, a, b):
    g, y = binary_graph(op, dtype, a.shape)
    return run(g, y, a, b)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(FLOAT_BINARY), ids=lambda o: o.value)
def test_binary_float_ops(op, dtype, rng):
    a = random_array(rng, (4, 6), dtype)
    b = random_array(rng, (4, 6), dtype)
    b = np.where(np.abs(b) < 0.1, 0.5, b).astype(dtype.np)  # keep div/mod well conditioned
    ref = FLOAT_BINARY[op](a.astype(np.float64), b.astype(np.float64)).astype(dtype.np)
    assert_close(eval_binary(op, dtype, a, b), ref, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_pow(dtype, rng):
    a = rng.uniform(0.1, 3, (4, 6)).astype(dtype.np)
    b = rng.uniform(-2, 2, (4, 6)).astype(dtype.np)
    assert_close(
        eval_binary(BinaryOp.POW, dtype, a, b),
        np.power(a.astype(np.float64), b.astype(np.float64)).astype(dtype.np),
        dtype,
    )


INT_BINARY = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.MIN: np.minimum,
    BinaryOp.MAX: np.maximum,
    BinaryOp.BIT_AND: np.bitwise_and,
    BinaryOp.BIT_OR: np.bitwise_or,
    BinaryOp.BIT_XOR: np.bitwise_xor,
}


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", list(INT_BINARY), ids=lambda o: o.value)
def test_binary_int_ops_wrap_like_numpy(op, dtype, rng):
    a = random_array(rng, (4, 6), dtype)
    b = random_array(rng, (4, 6), dtype)
    with np.errstate(over="ignore"):
        ref = INT_BINARY[op](a, b)
    assert_close(eval_binary(op, dtype, a, b), ref, dtype)


@pytest.mark.parametrize("dtype", SIGNED_INTS)
def test_integer_division_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1], dtype.np)
    b = np.array([2, 2, -2, -2, 3, 3, 5, 0], dtype.np)
    # C semantics; division by zero gives 0 rather than a crash
    assert_close(
        eval_binary(BinaryOp.DIV, dtype, a, b),
        np.array([3, -3, -3, 3, 2, -2, 0, 0], dtype.np),
        dtype,
    )


@pytest.mark.parametrize("dtype", [DType.U8, DType.U32, DType.U64])
def test_unsigned_integer_division(dtype):
    a = np.array([7, 200, 0, 9], dtype.np)
    b = np.array([2, 7, 3, 0], dtype.np)
    assert_close(eval_binary(BinaryOp.DIV, dtype, a, b), np.array([3, 28, 0, 0], dtype.np), dtype)


@pytest.mark.parametrize("dtype", [DType.I32, DType.F32, DType.I8, DType.F64])
def test_mod_takes_divisor_sign_and_fmod_dividend_sign(dtype):
    a = np.array([7, -7, 7, -7], dtype.np)
    b = np.array([3, 3, -3, -3], dtype.np)
    assert_close(eval_binary(BinaryOp.MOD, dtype, a, b), np.array([1, 2, -2, -1], dtype.np), dtype)
    assert_close(eval_binary(BinaryOp.FMOD, dtype, a, b), np.array([1, -1, 1, -1], dtype.np), dtype)


@pytest.mark.parametrize("op", [BinaryOp.MOD, BinaryOp.FMOD])
def test_integer_mod_by_zero_gives_zero(op):
    a = np.array([5, -5], np.int32)
    assert_close(
        eval_binary(op, DType.I32, a, np.zeros(2, np.int32)), np.zeros(2, np.int32), DType.I32
    )


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.U8])
def test_integer_pow(dtype):
    a = np.array([2, 3, 0, 5], dtype.np)
    b = np.array([3, 2, 0, 1], dtype.np)
    assert_close(eval_binary(BinaryOp.POW, dtype, a, b), np.array([8, 9, 1, 5], dtype.np), dtype)


def test_integer_pow_with_negative_exponent_raises_naming_the_value():
    g, y = binary_graph(BinaryOp.POW, DType.I32, (2,))
    g.add_output(y)
    with pytest.raises(EvaluationError) as e:
        evaluate(g, [np.array([2, 2], np.int32), np.array([1, -1], np.int32)])
    assert "pow: negative integer exponent" in str(e.value)
    assert "%2: i32[2] = pow(%0, %1)" in str(e.value)


@pytest.mark.parametrize("dtype", [DType.U8, DType.I16, DType.I32, DType.U64])
@pytest.mark.parametrize(
    ("op", "ref"), [(BinaryOp.SHL, np.left_shift), (BinaryOp.SHR, np.right_shift)]
)
def test_shifts(op, ref, dtype):
    a = np.array([1, 3, 64, 5], dtype.np)
    b = np.array([0, 2, 1, 3], dtype.np)
    assert_close(eval_binary(op, dtype, a, b), ref(a, b), dtype)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS])
@pytest.mark.parametrize("op", list(COMPARISONS), ids=lambda o: o.value)
def test_comparisons(op, dtype, rng):
    a = random_array(rng, (4, 6), dtype)
    b = np.where(rng.random((4, 6)) < 0.3, a, random_array(rng, (4, 6), dtype)).astype(dtype.np)
    got = eval_binary(op, dtype, a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, COMPARISONS[op](a, b))


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 1.0], np.float32)
    for op in COMPARISONS:
        np.testing.assert_array_equal(eval_binary(op, DType.F32, a, b), [False, False, False])


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        (BinaryOp.AND, np.logical_and),
        (BinaryOp.OR, np.logical_or),
        (BinaryOp.XOR, np.logical_xor),
        (BinaryOp.EQ, np.equal),
    ],
)
def test_logical_ops(op, ref):
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    np.testing.assert_array_equal(eval_binary(op, DType.BOOL, a, b), ref(a, b))


def test_min_max_propagate_nan():
    a = np.array([np.nan, 1.0], np.float32)
    b = np.array([0.0, np.nan], np.float32)
    assert np.isnan(eval_binary(BinaryOp.MIN, DType.F32, a, b)).all()
    assert np.isnan(eval_binary(BinaryOp.MAX, DType.F32, a, b)).all()


def test_f16_binary_is_rounded_once_from_f32():
    a = np.array([2048.0, 0.1], np.float16)
    b = np.array([1.0, 3.0], np.float16)
    ref = (a.astype(np.float32) * b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(eval_binary(BinaryOp.MUL, DType.F16, a, b), ref)
    ref = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(eval_binary(BinaryOp.ADD, DType.F16, a, b), ref)


def test_binary_with_broadcast_and_python_scalar(rng):
    a = rng.standard_normal((3, 1, 4)).astype(np.float32)
    c = rng.standard_normal((5, 1)).astype(np.float32)
    g = Graph()
    x = g.input([3, 1, 4], DType.F32)
    y = g.input([5, 1], DType.F32)
    z = g.sub(g.mul(g.add(x, y), 2.0), 1.0)
    np.testing.assert_allclose(run(g, z, a, c), (a + c) * 2 - 1, rtol=1e-6)


# -- reduce -----------------------------------------------------------------------------------------
REDUCERS = {
    ReduceOp.SUM: np.sum,
    ReduceOp.MEAN: np.mean,
    ReduceOp.PROD: np.prod,
    ReduceOp.MIN: np.min,
    ReduceOp.MAX: np.max,
}


@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("op", list(REDUCERS), ids=lambda o: o.value)
@pytest.mark.parametrize("dtype", FLOATS)
def test_float_reductions(op, dtype, axes, rng):
    a = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    ref = REDUCERS[op](a.astype(np.float64), axis=axes).astype(dtype.np)
    assert_close(run(g, g.reduce(x, axes, op), a), ref, dtype)


@pytest.mark.parametrize(
    "op", [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX], ids=lambda o: o.value
)
@pytest.mark.parametrize("dtype", INTS)
def test_int_reductions_stay_in_the_dtype(op, dtype, rng):
    a = rng.integers(0, 4, (3, 4, 5)).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    with np.errstate(over="ignore"):
        ref = REDUCERS[op](
            a, axis=(0, 2), **({} if op in (ReduceOp.MIN, ReduceOp.MAX) else {"dtype": dtype.np})
        )
    assert_close(run(g, g.reduce(x, [0, 2], op), a), ref, dtype)


@pytest.mark.parametrize(("op", "ref"), [(ReduceOp.MIN, np.all), (ReduceOp.MAX, np.any)])
def test_bool_min_max_are_all_any(op, ref, rng):
    a = rng.random((4, 5)) < 0.7
    g, x = graph_with([4, 5], DType.BOOL)
    np.testing.assert_array_equal(run(g, g.reduce(x, [1], op), a), ref(a, axis=1))


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I32, DType.U8])
@pytest.mark.parametrize(
    ("op", "ref"), [(ReduceOp.ARGMIN, np.argmin), (ReduceOp.ARGMAX, np.argmax)]
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_arg_reductions_pick_the_first_extreme(op, ref, dtype, axis):
    a = np.array([[3, 1, 3, 0], [1, 1, 5, 5], [0, 2, 5, 0]], dtype.np)
    g, x = graph_with([3, 4], dtype)
    got = run(g, g.reduce(x, [axis], op), a)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref(a, axis=axis))


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MEAN])
def test_f16_reductions_accumulate_in_f32_on_every_axis(op):
    # f16 accumulation would stall at 256 (spacing 0.25 > 0.1) when reducing a leading axis,
    # and a product of 2000 x 1.001 would end near 5.8 instead of 7.0
    n, value = (2000, 1.001) if op is ReduceOp.PROD else (5000, 0.1)
    a = np.full((n, 2), value, np.float16)
    g, x = graph_with([n, 2], DType.F16)
    ref = REDUCERS[op](a.astype(np.float32), axis=0).astype(np.float16)
    np.testing.assert_array_equal(run(g, g.reduce(x, [0], op), a), ref)


def test_reductions_over_an_empty_axis():
    a = np.zeros((2, 0), np.float32)
    expected = {ReduceOp.SUM: 0.0, ReduceOp.PROD: 1.0, ReduceOp.MIN: np.inf, ReduceOp.MAX: -np.inf}
    for op, value in expected.items():
        g, x = graph_with([2, 0])
        np.testing.assert_array_equal(run(g, g.reduce(x, [1], op), a), [value, value])
    g, x = graph_with([2, 0], DType.I16)
    np.testing.assert_array_equal(
        run(g, g.reduce(x, [1], ReduceOp.MAX), a.astype(np.int16)), [-32768, -32768]
    )


def test_reduce_with_symbolic_batch(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    g, x = graph_with([B, 4])
    y = g.reduce(x, [0], ReduceOp.SUM, keepdims=True)
    np.testing.assert_allclose(run(g, y, a), a.sum(axis=0, keepdims=True), rtol=1e-6)


# -- softmax, layernorm ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_matches_formula(axis, dtype, rng):
    a = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    e = np.exp(a.astype(np.float64))
    ref = e / e.sum(axis=axis, keepdims=True)
    assert_close(run(g, g.softmax(x, axis), a), ref.astype(dtype.np), dtype)


def test_softmax_is_stable_for_large_and_masked_inputs():
    a = np.array([[1000.0, 1000.0, -np.inf], [-1e4, 0.0, -np.inf]], np.float32)
    g, x = graph_with([2, 3])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = run(g, g.softmax(x, 1), a)
    np.testing.assert_allclose(got, [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], atol=1e-7)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_layernorm_matches_formula(axis, dtype, rng):
    a = (rng.standard_normal((3, 4, 6)) * 3 + 1).astype(dtype.np)
    g, x = graph_with([3, 4, 6], dtype)
    f = a.astype(np.float64)
    mean = f.mean(axis=axis, keepdims=True)
    ref = (f - mean) / np.sqrt(((f - mean) ** 2).mean(axis=axis, keepdims=True) + 1e-3)
    assert_close(run(g, g.layernorm(x, axis, 1e-3), a), ref.astype(dtype.np), dtype)


def test_layernorm_of_a_constant_row_is_zero():
    g, x = graph_with([2, 4])
    got = run(g, g.layernorm(x, 1, 1e-5), np.full((2, 4), 3.0, np.float32))
    np.testing.assert_array_equal(got, np.zeros((2, 4), np.float32))


# -- conv -------------------------------------------------------------------------------------------
def naive_conv(x, w, stride, padding, dilation, groups):
    """Cross-correlation written out element by element."""
    n_batch, c_in = x.shape[:2]
    k_out = w.shape[0]
    nd = x.ndim - 2
    cg, kg = c_in // groups, k_out // groups
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    ks = w.shape[2:]
    outs = [(xp.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    out = np.zeros((n_batch, k_out, *outs))
    for n, k in itertools.product(range(n_batch), range(k_out)):
        group = k // kg
        for o in np.ndindex(*outs):
            acc = 0.0
            for c in range(cg):
                for kk in np.ndindex(*ks):
                    pos = tuple(o[i] * stride[i] + kk[i] * dilation[i] for i in range(nd))
                    acc += xp[(n, group * cg + c, *pos)] * w[(k, c, *kk)]
            out[(n, k, *o)] = acc
    return out


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 9), (4, 3, 3), (1,), (0,), (1,), 1),
    ((1, 4, 10), (6, 2, 3), (2,), (1,), (2,), 2),
    ((2, 3, 6, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 2, 7, 8), (3, 2, 3, 2), (2, 3), (1, 0), (1, 2), 1),
    ((2, 4, 5, 5), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4),  # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), (2, 2), (1, 1), (1, 1), 4),  # depthwise, multiplier 2
    ((1, 6, 5, 6), (4, 3, 2, 2), (1, 2), (0, 1), (2, 1), 2),
    ((1, 3, 4, 4), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1),  # pointwise
    ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), (1, 1, 2), (1, 0, 1), (1, 1, 1), 1),
    ((1, 2, 5, 4, 4), (4, 1, 2, 2, 2), (2, 1, 1), (0, 1, 0), (2, 1, 1), 2),
]


@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups"), CONV_CASES)
@pytest.mark.parametrize("dtype", [DType.F64, DType.F32])
def test_conv_matches_naive_loops(xs, ws, stride, padding, dilation, groups, dtype, rng):
    a = rng.standard_normal(xs)
    wv = rng.standard_normal(ws)
    g, x = graph_with(xs, dtype)
    y = g.conv(x, g.constant(wv.astype(dtype.np)), stride, padding, dilation, groups)
    got = run(g, y, a.astype(dtype.np))
    ref = naive_conv(
        a.astype(dtype.np).astype(np.float64),
        wv.astype(dtype.np).astype(np.float64),
        stride,
        padding,
        dilation,
        groups,
    )
    assert g.shape(y).fixed_dims() == ref.shape
    tol = 1e-12 if dtype is DType.F64 else 1e-5  # sums of up to 54 products
    assert got.dtype == dtype.np
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_conv_f16_computes_in_f32(rng):
    a = rng.standard_normal((1, 2, 5, 5)).astype(np.float16)
    wv = rng.standard_normal((3, 2, 3, 3)).astype(np.float16)
    g, x = graph_with([1, 2, 5, 5], DType.F16)
    got = run(g, g.conv(x, g.constant(wv), padding=(1, 1)), a)
    assert got.dtype == np.float16
    ref = naive_conv(a.astype(np.float64), wv.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=3e-3, atol=3e-3)


def test_conv_with_runtime_weights_and_symbolic_batch(rng):
    a = rng.standard_normal((3, 2, 6))
    wv = rng.standard_normal((4, 2, 3))
    g = Graph()
    x = g.input([B, 2, 6], DType.F64)
    w = g.input([4, 2, 3], DType.F64)
    np.testing.assert_allclose(
        run(g, g.conv(x, w, padding=(1,)), a, wv),
        naive_conv(a, wv, (1,), (1,), (1,), 1),
        rtol=1e-12,
    )


# -- matmul (the core rank-3 op) ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.F16, DType.I32, DType.I64, DType.U8])
def test_batched_matmul(dtype, rng):
    a = (
        random_array(rng, (3, 4, 5), dtype) % 7
        if dtype.is_int
        else random_array(rng, (3, 4, 5), dtype)
    )
    b = (
        random_array(rng, (3, 5, 2), dtype) % 7
        if dtype.is_int
        else random_array(rng, (3, 5, 2), dtype)
    )
    g = Graph()
    y = g.matmul(g.input([3, 4, 5], dtype), g.input([3, 5, 2], dtype))
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if dtype.is_int:
        ref = ref.astype(dtype.np)
    assert_close(run(g, y, a, b), ref, dtype)


def test_matmul_with_empty_inner_axis_is_zero():
    g = Graph()
    y = g.matmul(g.input([2, 3, 0], DType.F32), g.input([2, 0, 4], DType.F32))
    np.testing.assert_array_equal(
        run(g, y, np.zeros((2, 3, 0), np.float32), np.zeros((2, 0, 4), np.float32)),
        np.zeros((2, 3, 4)),
    )


# -- shape ops --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "end", "step"),
    [
        (None, None, -1),
        (None, None, -2),
        (5, 1, -1),
        (6, None, -3),
        (-2, 0, -2),
        (0, None, 3),
        (2, 7, 2),
        (None, -8, -1),
        (3, 3, -1),
    ],
)
def test_slice_matches_python_slicing(start, end, step):
    a = np.arange(7 * 3, dtype=np.int32).reshape(7, 3)
    g, x = graph_with([7, 3], DType.I32)
    np.testing.assert_array_equal(run(g, g.slice(x, 0, start, end, step), a), a[start:end:step])


def test_slice_symbolic_start(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    g, x = graph_with([2 * B, 6])
    y = g.slice(x, 0, B, None)
    np.testing.assert_array_equal(run(g, y, a), a[2:])


def test_flip_and_strided_slices_compose():
    a = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    g, x = graph_with([2, 3, 4], DType.I64)
    y = g.slice(g.flip(g.flip(x, 2), 0), 2, 1, None, 2)
    np.testing.assert_array_equal(run(g, y, a), a[::-1, :, ::-1][:, :, 1::2])


def test_view_permute_broadcast(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g, x = graph_with([2, 3, 4])
    y = g.broadcast(g.view(g.permute(x, [2, 0, 1]), [4, 1, 6]), [4, 5, 6])
    np.testing.assert_array_equal(
        run(g, y, a), np.broadcast_to(a.transpose(2, 0, 1).reshape(4, 1, 6), (4, 5, 6))
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_matches_numpy(axis, rng):
    parts = [rng.standard_normal(s).astype(np.float32) for s in ([2, 3, 4], [2, 3, 4], [2, 3, 4])]
    g = Graph()
    xs = [g.input([2, 3, 4], DType.F32) for _ in parts]
    np.testing.assert_array_equal(
        run(g, g.concat(xs, axis), *parts), np.concatenate(parts, axis=axis)
    )


def test_concat_unequal_parts_and_empty(rng):
    a = rng.standard_normal((2, 1)).astype(np.float32)
    b = rng.standard_normal((2, 3)).astype(np.float32)
    g = Graph()
    x, y, e = g.input([2, 1], DType.F32), g.input([2, 3], DType.F32), g.input([2, 0], DType.F32)
    got = run(g, g.concat([x, e, y, x], 1), a, b, np.zeros((2, 0), np.float32))
    np.testing.assert_array_equal(got, np.concatenate([a, b, a], axis=1))


@pytest.mark.parametrize("dtype", [DType.I64, DType.I32, DType.U8, DType.I8])
def test_gather_with_runtime_indices(dtype, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    i = np.array([4, 0, 0, 2], dtype.np)
    g, x = graph_with([3, 5])
    y = g.gather(x, 1, g.input([4], dtype, "i"))
    np.testing.assert_array_equal(run(g, y, a, i), np.take(a, i, axis=1))


def test_gather_with_irregular_constant_indices_including_negative(rng):
    a = rng.standard_normal((5, 2)).astype(np.float32)
    g, x = graph_with([5, 2])
    y = g.gather(x, 0, g.constant(np.array([0, -1, 1, 1], np.int64)))
    np.testing.assert_array_equal(run(g, y, a), a[[0, 4, 1, 1]])


@pytest.mark.parametrize("indices", [[0, 5], [-1, 0], [7]])
def test_gather_out_of_range_runtime_index_raises(indices):
    g, x = graph_with([2, 5])
    i = g.input([len(indices)], DType.I64, "i")
    g.add_output(g.gather(x, 1, i))
    with pytest.raises(EvaluationError) as e:
        evaluate(g, [np.zeros((2, 5), np.float32), np.array(indices, np.int64)])
    bad = next(v for v in indices if not 0 <= v < 5)
    assert f"gather: index {bad} out of range [0, 5) on axis 1" in str(e.value)
    assert "%2: f32[2," in str(e.value)  # names the value being computed


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32, DType.I64, DType.F16, DType.U8])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_iota(axis, dtype):
    g = Graph()
    y = g.iota([2, 3, 4], axis, dtype)
    shape = [1, 1, 1]
    shape[axis] = [2, 3, 4][axis]
    ref = np.broadcast_to(np.arange(shape[axis]).reshape(shape), (2, 3, 4)).astype(dtype.np)
    out = run(g, y)
    assert out.dtype == dtype.np
    np.testing.assert_array_equal(out, ref)


def test_iota_with_symbolic_length():
    g = Graph()
    x = g.input([B], DType.F32)
    y = g.add(g.cast(g.iota([B], 0, DType.I32), DType.F32), x)
    np.testing.assert_array_equal(run(g, y, np.full(4, 0.5, np.float32)), [0.5, 1.5, 2.5, 3.5])


def test_causal_mask_from_two_iotas():
    g = Graph()
    y = g.binary(BinaryOp.LE, g.iota([3, 4], 1), g.iota([3, 4], 0))
    np.testing.assert_array_equal(run(g, y), np.tril(np.ones((3, 4), bool)))


@pytest.mark.parametrize("dtype", [DType.F32, DType.I16, DType.BOOL])
def test_select_matches_np_where(dtype, rng):
    c = rng.random((3, 1)) < 0.5
    a = random_array(rng, (3, 4), dtype)
    b = random_array(rng, (4,), dtype)
    g = Graph()
    y = g.select(g.input([3, 1], DType.BOOL), g.input([3, 4], dtype), g.input([4], dtype))
    np.testing.assert_array_equal(run(g, y, c, a, b), np.where(c, a, b))


def test_select_with_python_scalar_branch():
    g = Graph()
    c = g.input([3], DType.BOOL)
    x = g.input([3], DType.F32)
    got = run(
        g, g.select(c, x, -1.0), np.array([True, False, True]), np.array([1, 2, 3], np.float32)
    )
    np.testing.assert_array_equal(got, [1, -1, 3])


# -- rank 0 and size 0 ---------------------------------------------------------------------------
def test_rank_zero_values():
    g = Graph()
    x = g.input([], DType.F32, "x")
    y = g.mul(g.exp(x), g.constant(np.array(2.0, np.float32)))
    v = g.view(y, [1, 1])
    s = g.reduce(g.broadcast(v, [2, 3]), [0, 1], ReduceOp.SUM)
    g.add_output(y)
    g.add_output(s)
    out_y, out_s = evaluate(g, [np.array(1.0, np.float32)])
    assert out_y.shape == () and out_s.shape == ()
    np.testing.assert_allclose(out_y, 2 * np.e, rtol=1e-6)
    np.testing.assert_allclose(out_s, 12 * np.e, rtol=1e-6)


def test_size_zero_values_flow_through_every_kind_of_op():
    g = Graph()
    x = g.input([B, 3], DType.F32, "x")
    y = g.softmax(g.add(g.exp(x), 1.0), 1)
    z = g.layernorm(g.permute(y, [1, 0]), 0, 1e-5)
    s = g.reduce(x, [0], ReduceOp.SUM)
    g.add_output(z)
    g.add_output(s)
    g.add_output(g.cast(g.slice(x, 1, None, None, -1), DType.I32))
    outs = evaluate(g, [np.zeros((0, 3), np.float32)])
    assert [o.shape for o in outs] == [(3, 0), (3,), (0, 3)]
    np.testing.assert_array_equal(outs[1], [0, 0, 0])


def test_conv_with_empty_batch():
    g, x = graph_with([B, 2, 4])
    y = g.conv(x, g.constant(np.ones((3, 2, 2), np.float32)))
    assert run(g, y, np.zeros((0, 2, 4), np.float32)).shape == (0, 3, 3)


# -- the executor loop ------------------------------------------------------------------------------
def test_inputs_by_name_and_outputs_are_writable_copies():
    g = Graph()
    x = g.input([2], DType.F32, "x")
    c = g.constant(np.array([1.0, 2.0], np.float32))
    g.add_output(c, "c")
    g.add_output(x, "x_again")
    a = np.array([5.0, 6.0], np.float32)
    out_c, out_x = evaluate(g, {"x": a})
    out_c[0] = 100.0
    out_x[0] = 100.0
    assert g.const_value(c).tolist() == [1.0, 2.0]
    assert a.tolist() == [5.0, 6.0]
    assert evaluate(g, {"x": a})[0].tolist() == [1.0, 2.0]


def test_same_value_as_two_outputs():
    g, x = graph_with([2])
    y = g.exp(x)
    g.add_output(y)
    g.add_output(y)
    a, b = evaluate(g, [np.zeros(2, np.float32)])
    np.testing.assert_array_equal(a, [1, 1])
    np.testing.assert_array_equal(b, [1, 1])


def test_intermediate_values_are_freed_after_last_use():
    n, length = 1 << 18, 60  # 1 MiB per f32 value; without freeing the chain holds 60 MiB
    g, x = graph_with([n])
    y = x
    for i in range(length):
        y = g.unary(UnaryOp.SIN if i % 2 else UnaryOp.COS, y)
    g.add_output(y)
    a = np.zeros(n, np.float32)
    tracemalloc.start()
    try:
        evaluate(g, [a])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * a.nbytes


def test_value_used_by_several_ops_is_kept_until_its_last_use():
    g, x = graph_with([3])
    e = g.exp(x)
    chain = g.unary(UnaryOp.SIN, e)
    for _ in range(5):
        chain = g.unary(UnaryOp.COS, chain)
    y = g.add(chain, e)  # e is used again at the very end
    a = np.array([0.0, 1.0, 2.0], np.float32)
    ref = np.exp(a)
    c = np.sin(ref)
    for _ in range(5):
        c = np.cos(c)
    np.testing.assert_allclose(run(g, y, a), c + ref, rtol=1e-6)


def test_long_chain_builds_and_evaluates_without_recursion():
    start = time.perf_counter()
    g, x = graph_with([B, 4])
    y = x
    for i in range(5000):
        match i % 5:
            case 0:
                y = g.add(y, 1.0)
            case 1:
                y = g.mul(y, 0.5)
            case 2:
                y = g.permute(g.view(y, [4, B]), [1, 0])  # a view+permute pair per step
            case 3:
                y = g.unary(UnaryOp.NEG, y)
            case _:
                y = g.maximum(y, -1e6)
    assert len(g) > 5000
    text = str(g)
    assert text.count("\n") == len(g)
    a = np.ones((2, 4), np.float32)
    out = run(g, y, a)
    ref = a.copy()
    for i in range(5000):
        match i % 5:
            case 0:
                ref = ref + 1.0
            case 1:
                ref = ref * 0.5
            case 2:
                ref = ref.reshape(4, 2).T
            case 3:
                ref = -ref
            case _:
                ref = np.maximum(ref, np.float32(-1e6))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert time.perf_counter() - start < 10


def test_every_binary_op_is_covered():
    covered = set(FLOAT_BINARY) | set(INT_BINARY) | set(COMPARISONS)
    covered |= {BinaryOp.POW, BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR, BinaryOp.SHL, BinaryOp.SHR}
    assert covered == set(BinaryOp)


# -- attention ------------------------------------------------------------------------------------
def naive_attention(q, k, v, mask, scale, causal):
    b, m, _ = q.shape
    n = k.shape[1]
    out = np.zeros((b, m, v.shape[2]))
    for bi, i in itertools.product(range(b), range(m)):
        scores = np.array([q[bi, i] @ k[bi, j] * scale for j in range(n)])
        if mask is not None:
            scores = scores + mask[bi, i]
        if causal:
            scores[[j for j in range(n) if j > i + (n - m)]] = -np.inf
        w = np.exp(scores - scores.max())
        out[bi, i] = (w / w.sum()) @ v[bi]
    return out


@pytest.mark.parametrize(("m", "n"), [(4, 4), (2, 5), (1, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_matches_naive_formula(m, n, causal, with_mask, rng):
    q, k, v = (
        rng.standard_normal((2, m, 8)),
        rng.standard_normal((2, n, 8)),
        rng.standard_normal((2, n, 3)),
    )
    mask = rng.standard_normal((2, m, n)) if with_mask else None
    g = Graph()
    qi, ki, vi = (
        g.input([2, m, 8], DType.F64),
        g.input([2, n, 8], DType.F64),
        g.input([2, n, 3], DType.F64),
    )
    mi = g.input([2, m, n], DType.F64) if with_mask else None
    y = g.attention(qi, ki, vi, mi, None, causal)
    args = [q, k, v] + ([mask] if with_mask else [])
    ref = naive_attention(q, k, v, mask, 1 / math.sqrt(8), causal)
    np.testing.assert_allclose(run(g, y, *args), ref, rtol=1e-12, atol=1e-12)


# -- op metadata agrees with the executor -------------------------------------------------------------
def _operands_for(op: BinaryOp, rng):
    dtype = DType.BOOL if op.is_logical else DType.I32 if op.is_bitwise else DType.F64
    if op in (BinaryOp.SHL, BinaryOp.SHR):
        return (
            dtype,
            rng.integers(0, 100, 20).astype(np.int32),
            rng.integers(0, 5, 20).astype(np.int32),
        )
    a, b = random_array(rng, (20,), dtype), random_array(rng, (20,), dtype)
    if dtype.is_float:
        a, b = np.abs(a) + 0.5, np.abs(b) + 0.5  # a domain where pow, div and mod are all defined
    return dtype, a, b


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.value)
def test_declared_identity_and_commutativity_hold_in_the_executor(op, rng):
    dtype, a, b = _operands_for(op, rng)
    g = Graph()
    x, y = g.input([20], dtype, "a"), g.input([20], dtype, "b")
    g.add_output(g.binary(op, x, y))
    g.add_output(g.binary(op, y, x))
    ab, ba = evaluate(g, [a, b])
    if op.is_commutative:
        np.testing.assert_array_equal(ab, ba)
    else:
        assert not np.array_equal(ab, ba)
    if op.identity is not None:
        g = Graph()
        x = g.input([20], dtype, "a")
        ident = g.input([20], dtype, "identity")  # an input, so the builder cannot fold it away
        g.add_output(g.binary(op, x, ident))
        (out,) = evaluate(g, [a, np.full(20, op.identity, dtype.np)])
        np.testing.assert_array_equal(out, a)
