"""Constant folding: values computed from constants only become constants, computed by the CPU
executor; broadcasts stay compact and results much larger than their inputs are not folded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.ops import Binary, BinaryOp, Constant
from kn_graph.optimizer import OptimizerSettings, optimize
from kn_graph.reference import evaluate
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

B = Size.sym("B")
FOLD = only("fold_constants")


def test_scalar_arithmetic_folds_to_one_broadcast_constant() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 4), DType.F32, "x")
    g.add_output(g.add(x, g.exp(g.mul(g.constant(np.float32(2)), 3.0))), "y")
    assert str(optimize(g, FOLD)) == "\n".join(
        [
            '%0: f32[B,4] = input #0 "x"',
            "%1: f32[1,1] = const [403.42877197265625]",
            "%2: f32[B,4] = broadcast(%1)",
            "%3: f32[B,4] = add(%0, %2)",
            'outputs: %3 "y"',
        ]
    )
    assert_same(g, optimize(g, FOLD), {"B": 3})


def test_broadcast_scalars_are_added_in_compact_form() -> None:
    """1 + 2 over [B, 64] is one element, broadcast: never a materialised [B, 64] array."""
    g = Graph()
    x = g.input(Shape.of(B, 64), DType.F32, "x")
    c = g.add(g.full(1.0, [B, 64], DType.F32), g.full(2.0, [B, 64], DType.F32))
    g.add_output(g.mul(x, c), "y")
    assert str(optimize(g, FOLD)) == "\n".join(
        [
            '%0: f32[B,64] = input #0 "x"',
            "%1: f32[1,1] = const [3.0]",
            "%2: f32[B,64] = broadcast(%1)",
            "%3: f32[B,64] = mul(%0, %2)",
            'outputs: %3 "y"',
        ]
    )
    assert_same(g, optimize(g, FOLD), {"B": 2})


def test_permute_and_reduce_of_a_constant_fold() -> None:
    g = Graph()
    x = g.input(Shape.of(3), DType.F32, "x")
    a = g.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    g.add_output(g.add(x, g.reduce(g.permute(a, [1, 0]), [1], ReduceOp.SUM)), "y")
    assert str(optimize(g, FOLD)) == "\n".join(
        [
            '%0: f32[3] = input #0 "x"',
            "%1: f32[3] = const [18.0,22.0,26.0]",  # column sums of arange(12).reshape(4, 3)
            "%2: f32[3] = add(%0, %1)",
            'outputs: %2 "y"',
        ]
    )


def _outer_sum_graph() -> Graph:
    g = Graph()
    x = g.input(Shape.of(64, 64), DType.F32, "x")
    col = g.constant(np.arange(64, dtype=np.float32).reshape(64, 1))
    row = g.constant(np.arange(64, dtype=np.float32).reshape(1, 64))
    g.add_output(g.add(x, g.add(col, row)), "y")
    return g


def test_does_not_fold_a_result_much_larger_than_its_inputs() -> None:
    """[64,1] + [1,64] would store 4096 values for 128: it stays an add of two broadcasts."""
    g = _outer_sum_graph()
    o = optimize(g, FOLD)
    assert str(o) == str(g)
    assert op_counts(o)["add"] == 2


def test_fold_max_growth_allows_larger_results() -> None:
    g = _outer_sum_graph()
    o = optimize(g, dataclasses.replace(FOLD, fold_max_growth=64))
    assert op_counts(o)["add"] == 1
    consts = [o.const_value(v) for v in o.values() if isinstance(o[v].op, Constant)]
    assert [c.shape for c in consts] == [(64, 64)]
    assert_same(g, o)


def test_does_not_fold_with_a_non_constant_operand() -> None:
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    g.add_output(g.exp(g.add(x, 1.0)), "y")
    assert str(optimize(g, FOLD)) == "\n".join(
        [
            '%0: f32[4] = input #0 "x"',
            "%1: f32[1] = const [1.0]",  # only the view of the scalar 1.0 folds
            "%2: f32[4] = broadcast(%1)",
            "%3: f32[4] = add(%0, %2)",
            "%4: f32[4] = exp(%3)",
            'outputs: %4 "y"',
        ]
    )


def test_broadcast_of_a_constant_stays_a_broadcast() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 8), DType.F32, "x")
    bias = g.constant(np.arange(8, dtype=np.float32))
    g.add_output(g.add(x, bias), "y")
    o = optimize(g, FOLD)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[1,8] = const <8 values>",  # the view of the [8] constant, folded
            "%2: f32[B,8] = broadcast(%1)",
            "%3: f32[B,8] = add(%0, %2)",
            'outputs: %3 "y"',
        ]
    )


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I64])
def test_folded_values_equal_the_executor_on_the_original(dtype: DType) -> None:
    """A mix of elementwise, comparison, select, cast, matmul, slice, concat and reduce on
    constants, next to an input: the folded graph computes exactly what the original does."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input(Shape.of(B, 6), dtype, "x")
    a = g.constant((rng.standard_normal((6, 6)) * 3).astype(dtype.np))
    b = g.constant((rng.standard_normal((6,)) * 3).astype(dtype.np))
    prod = g.matmul_nd(a, g.permute(a, [1, 0]))  # [6, 6]
    mixed = g.select(g.binary(BinaryOp.LT, b, 1), b, g.mul(b, 2))
    row = g.add(g.slice(prod, 0, 2, 3), mixed)  # [1, 6]
    both = g.concat([row, g.cast(g.cast(row, DType.F64), dtype)], 0)  # [2, 6]
    g.add_output(g.add(x, g.reduce(both, [0], ReduceOp.SUM)), "y")
    o = optimize(g, FOLD)
    assert sorted(op_counts(o).elements()) == ["add", "broadcast", "const", "input"]
    xs = (rng.standard_normal((3, 6)) * 3).astype(dtype.np)
    assert np.array_equal(evaluate(g, [xs])[0], evaluate(o, [xs])[0])


def test_folding_is_off_with_its_flag() -> None:
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    g.add_output(g.add(x, g.mul(g.constant(np.float32(2)), 3.0)), "y")
    o = optimize(g, dataclasses.replace(OptimizerSettings(), fold_constants=False))
    assert any(
        isinstance(o[v].op, Binary) and all(isinstance(o[i].op, Constant) for i in o[v].op.inputs)
        for v in o.values()
    )
