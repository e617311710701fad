"""Integer products (IntMatMul, IntConv) through the planner: planned as exact float64 GEMMs and
convolutions (kn_graph.integer), checked on the emulator and the fake CUDA device against the
reference executor, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import DType, Graph, Shape
from tests.kn_cuda_eval.helpers import check_plan

RNG = np.random.default_rng(7)


@pytest.mark.parametrize(("ta", "tb"), [(DType.U8, DType.I8), (DType.I8, DType.U8)])
def test_int_matmul_plans_exactly(ta: DType, tb: DType) -> None:
    g = Graph()
    a = g.input(Shape.of(2, 5, 33), ta, "a")
    b = g.constant(RNG.integers(-128, 128, (2, 33, 7)).astype(tb.np))
    za = g.constant(RNG.integers(0, 100, (2, 5, 1)).astype(ta.np))
    y = g.int_matmul(a, b, za, g.scalar(3, tb))
    g.add_output(y, "y")
    g.add_output(g.mul(g.cast(y, DType.F32), 0.125), "scaled")
    lo, hi = (0, 256) if ta is DType.U8 else (-128, 128)
    check_plan(g, [RNG.integers(lo, hi, (2, 5, 33)).astype(ta.np)])


@pytest.mark.parametrize("groups", [1, 3])
def test_int_conv_plans_exactly(groups: int) -> None:
    g = Graph()
    x = g.input(Shape.of(1, 6, 7, 9), DType.U8, "x")
    w = g.constant(RNG.integers(-128, 128, (9, 6 // groups, 3, 3)).astype(np.int8))
    zw = g.constant(RNG.integers(-3, 3, 9).astype(np.int8))
    y = g.int_conv(x, w, g.scalar(128, DType.U8), zw, (2, 1), (1, 1), (1, 2), groups)
    g.add_output(y, "y")
    check_plan(g, [RNG.integers(0, 256, (1, 6, 7, 9)).astype(np.uint8)])
