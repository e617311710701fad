"""The NumPy reference executor's unary element ops and casts, against float64 formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

from kn_graph import DType, UnaryOp
from kn_graph.reference import evaluate
from tests.conftest import graph_with, random_array, run
from tests.kn_graph.reference_tables import ALL, FLOATS, INTS, SIGNED_INTS, assert_close

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
