"""The NumPy reference executor's binary element ops: float, integer (C semantics), comparisons,
logic, and the identity/commutativity the ops declare."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import BinaryOp, DType, EvaluationError, Graph
from kn_graph.reference import evaluate
from tests.conftest import random_array, run
from tests.kn_graph.reference_tables import FLOATS, INTS, SIGNED_INTS, assert_close

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


def test_every_binary_op_is_covered():
    covered = set(FLOAT_BINARY) | set(INT_BINARY) | set(COMPARISONS)
    covered |= {BinaryOp.POW, BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR, BinaryOp.SHL, BinaryOp.SHR}
    assert covered == set(BinaryOp)


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
