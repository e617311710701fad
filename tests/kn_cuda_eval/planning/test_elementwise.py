"""Fused elementwise kernels: chains become one step, constants are inlined, shared values are
materialised once, and every op/dtype combination matches the CPU executor."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_cuda_eval.planning import steps
from kn_graph import BinaryOp, DType, Graph, Shape, Size, UnaryOp
from tests.kn_cuda_eval.helpers import check_plan

B = Size.sym("B")
RNG = np.random.default_rng(0)


def _input(g: Graph, shape: tuple, dtype: DType, name: str = "x"):
    return g.input(Shape.of(*shape), dtype, name)


def _data(shape: tuple, dtype: DType, positive: bool = False) -> np.ndarray:
    if dtype.is_bool:
        return RNG.random(shape) < 0.5
    if dtype.is_float:
        a = RNG.standard_normal(shape) * 2
        if positive:
            a = np.abs(a) + 0.1
        return a.astype(dtype.np)
    info = np.iinfo(dtype.np)
    lo = 1 if positive else max(info.min, -20)
    return RNG.integers(lo, min(info.max, 20), size=shape).astype(dtype.np)


def test_chain_is_one_kernel_with_inlined_constants() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 8), DType.F32, "x")
    y = g.relu(g.mul(g.add(x, 1.0), g.unary(UnaryOp.SIGMOID, x)))
    g.add_output(y, "y")
    (p, _) = check_plan(g, [_data((3, 8), DType.F32)], 3)
    assert [type(s).__name__ for s in p.steps] == ["Elementwise"]
    assert p.const_size == 0, "scalar constants are inlined, not stored"
    text = str(p)
    assert "max(mul(add(ld0, 1.0), sigmoid(ld0)), 0.0)" in text, text


def test_shared_value_is_materialised_once() -> None:
    g = Graph()
    x = g.input(Shape.of(4, 8), DType.F32, "x")
    e = g.exp(x)  # used twice: computed once, stored
    g.add_output(g.add(g.mul(e, 2.0), g.sqrt(g.add(e, 1.0))), "y")
    p, _ = check_plan(g, [_data((4, 8), DType.F32)])
    ew = [s for s in p.steps if isinstance(s, steps.Elementwise)]
    assert len(ew) == 2
    assert sum("exp" in s.program.format() for s in ew) == 1


def test_output_that_is_also_used_is_stored() -> None:
    g = Graph()
    x = g.input(Shape.of(5), DType.F32, "x")
    t = g.unary(UnaryOp.TANH, x)
    g.add_output(t, "t")
    g.add_output(g.mul(t, t), "t2")
    check_plan(g, [_data((5,), DType.F32)])


UNARY_FLOAT = [op for op in UnaryOp if not op.changes_dtype and op.float_only]


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.F64])
@pytest.mark.parametrize("op", UNARY_FLOAT, ids=lambda o: o.value)
def test_unary_float(op: UnaryOp, dtype: DType) -> None:
    g = Graph()
    x = _input(g, (3, 7), dtype)
    g.add_output(g.unary(op, x), "y")
    a = _data((3, 7), dtype)
    if op in (UnaryOp.LOG, UnaryOp.SQRT, UnaryOp.ACOSH):
        a = (np.abs(a) + 1.0).astype(dtype.np)
    if op in (UnaryOp.ASIN, UnaryOp.ACOS, UnaryOp.ATANH):
        a = (np.tanh(a) * 0.9).astype(dtype.np)
    check_plan(g, [a], optimized=False)


@pytest.mark.parametrize(
    "op,dtype",
    [
        (op, dt)
        for op in (UnaryOp.ABS, UnaryOp.NEG, UnaryOp.SIGN)
        for dt in (DType.I32, DType.I64, DType.I8, DType.U8, DType.F32)
        if dt.is_signed or op is not UnaryOp.NEG
    ],
    ids=str,
)
def test_unary_any_type(op: UnaryOp, dtype: DType) -> None:
    g = Graph()
    x = _input(g, (4, 5), dtype)
    g.add_output(g.unary(op, x), "y")
    check_plan(g, [_data((4, 5), dtype)], optimized=False)


BINARY_FLOAT = [
    BinaryOp.ADD,
    BinaryOp.SUB,
    BinaryOp.MUL,
    BinaryOp.DIV,
    BinaryOp.POW,
    BinaryOp.MIN,
    BinaryOp.MAX,
    BinaryOp.MOD,
    BinaryOp.FMOD,
    BinaryOp.EQ,
    BinaryOp.LT,
    BinaryOp.LE,
    BinaryOp.GT,
    BinaryOp.GE,
]
BINARY_INT = [*BINARY_FLOAT, BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR]


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.F64])
@pytest.mark.parametrize("op", BINARY_FLOAT, ids=lambda o: o.value)
def test_binary_float(op: BinaryOp, dtype: DType) -> None:
    g = Graph()
    a, b = _input(g, (3, 6), dtype, "a"), _input(g, (3, 6), dtype, "b")
    g.add_output(g.binary(op, a, b), "y")
    xa = _data((3, 6), dtype, positive=op is BinaryOp.POW)
    xb = _data((3, 6), dtype)
    if op is BinaryOp.POW:
        xb = (xb / 2).astype(dtype.np)
    check_plan(g, [xa, xb], optimized=False)


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.I16, DType.U8, DType.U32])
@pytest.mark.parametrize("op", BINARY_INT, ids=lambda o: o.value)
def test_binary_int(op: BinaryOp, dtype: DType) -> None:
    g = Graph()
    a, b = _input(g, (4, 5), dtype, "a"), _input(g, (4, 5), dtype, "b")
    g.add_output(g.binary(op, a, b), "y")
    xa = _data((4, 5), dtype)
    xb = _data((4, 5), dtype, positive=op in (BinaryOp.DIV, BinaryOp.MOD, BinaryOp.FMOD))
    if op is BinaryOp.POW:
        xa = (xa % 4).astype(dtype.np)
        xb = (np.abs(xb) % 4).astype(dtype.np)
    check_plan(g, [xa, xb], optimized=False)


@pytest.mark.parametrize("op", [BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR, BinaryOp.EQ])
def test_binary_bool(op: BinaryOp) -> None:
    g = Graph()
    a, b = _input(g, (9,), DType.BOOL, "a"), _input(g, (9,), DType.BOOL, "b")
    g.add_output(g.binary(op, a, b), "y")
    g.add_output(g.unary(UnaryOp.NOT, a), "n")
    check_plan(g, [_data((9,), DType.BOOL), _data((9,), DType.BOOL)], optimized=False)


def test_integer_division_by_zero_and_shifts() -> None:
    g = Graph()
    a, b = _input(g, (6,), DType.I32, "a"), _input(g, (6,), DType.I32, "b")
    g.add_output(g.div(a, b), "q")
    g.add_output(g.binary(BinaryOp.SHL, a, g.binary(BinaryOp.BIT_AND, b, 7)), "s")
    xa = np.array([7, -7, 9, -9, 5, 0], np.int32)
    xb = np.array([2, 2, -2, -2, 0, 3], np.int32)
    check_plan(g, [xa, xb], optimized=False)


@pytest.mark.parametrize(
    "src,dst",
    [
        (DType.F32, DType.I32),
        (DType.F32, DType.F16),
        (DType.F16, DType.F32),
        (DType.I64, DType.F32),
        (DType.F32, DType.BOOL),
        (DType.BOOL, DType.F32),
        (DType.I32, DType.I8),
        (DType.F64, DType.F16),
        (DType.U8, DType.I64),
        (DType.F32, DType.F64),
    ],
)
def test_cast(src: DType, dst: DType) -> None:
    g = Graph()
    x = _input(g, (3, 5), src)
    g.add_output(g.cast(x, dst), "y")
    check_plan(g, [_data((3, 5), src)], optimized=False)


@pytest.mark.parametrize(
    "src,dst",
    [
        (DType.F32, DType.I32),
        (DType.I32, DType.F32),
        (DType.F16, DType.I16),
        (DType.U16, DType.F16),
    ],
)
def test_bitcast(src: DType, dst: DType) -> None:
    g = Graph()
    x = _input(g, (8,), src)
    g.add_output(g.add(g.bitcast(x, dst), g.bitcast(x, dst)), "y")
    a = _data((8,), src)
    if src.is_int:
        a = (
            (np.abs(a) + 15360).astype(src.np)
            if src is DType.U16
            else (np.abs(a) * 1000 + 1065353216).astype(src.np)
        )
    check_plan(g, [a], optimized=False)


def test_select_and_iota_causal_mask() -> None:
    S = Size.sym("seq")
    g = Graph()
    x = g.input(Shape.of(B, S, S), DType.F32, "x")
    i = g.iota(Shape.of(B, S, S), 1)
    j = g.iota(Shape.of(B, S, S), 2)
    y = g.select(g.binary(BinaryOp.GT, j, i), -1e9, x)
    g.add_output(y, "y")
    g.add_output(g.cast(g.iota(Shape.of(S), 0, DType.I64), DType.F32), "pos")
    (p, _) = check_plan(g, [_data((2, 5, 5), DType.F32)], 2, {"seq": 5})
    assert len(p.steps) == 2


def test_f16_chain_computes_in_f32() -> None:
    g = Graph()
    x = _input(g, (64,), DType.F16)
    g.add_output(g.gelu(g.mul(g.add(x, 0.1), 3.0)), "y")
    (p, _) = check_plan(g, [_data((64,), DType.F16)])
    src = plan_launches(p)[0].kernel.source
    assert "__half2float" in src and "__float2half" in src


def test_broadcast_lazy_value_is_recomputed_only_when_cheap() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 16), DType.F32, "x")
    m = g.input(Shape.of(1, 16), DType.F32, "m")
    cheap = g.mul(g.sub(1.0, m), -1e4)  # [1,16] -> broadcast into the add: fused
    g.add_output(g.add(x, cheap), "y")
    (p, _) = check_plan(g, [_data((4, 16), DType.F32), _data((1, 16), DType.F32)], 4)
    assert len(p.steps) == 1
    expensive = m
    for _ in range(10):
        expensive = g.unary(UnaryOp.SIN, g.add(expensive, 1.0))
    g2 = Graph()
    x2 = g2.input(Shape.of(B, 16), DType.F32, "x")
    m2 = g2.input(Shape.of(1, 16), DType.F32, "m")
    e = m2
    for _ in range(10):
        e = g2.unary(UnaryOp.SIN, g2.add(e, 1.0))
    g2.add_output(g2.add(x2, e), "y")
    (p2, _) = check_plan(g2, [_data((4, 16), DType.F32), _data((1, 16), DType.F32)], 4)
    assert len(p2.steps) == 2  # the [1,16] chain is materialised before the broadcast


def test_nan_constant_and_infinities() -> None:
    g = Graph()
    x = _input(g, (4,), DType.F32)
    g.add_output(
        g.add(g.mul(x, float("inf")), g.constant(np.array([np.nan, 1, 2, 3], np.float32))), "y"
    )
    g.add_output(g.maximum(x, float("nan")), "z")
    check_plan(g, [np.array([1, -1, 0, 2], np.float32)], optimized=False)


def test_plan_needs_every_symbol() -> None:
    from kn_graph.errors import PlanError

    g = Graph()
    x = g.input(Shape.of(B, Size.sym("seq")), DType.F32, "x")
    g.add_output(g.exp(x), "y")
    with pytest.raises(PlanError, match="seq"):
        plan(g, 2)
    with pytest.raises(PlanError, match="B"):
        plan(g, bindings={"seq": 3})
