"""Printing the graph: module doctests, the golden printout, constants and op attributes."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import kn_graph.binding
import kn_graph.graph
import kn_graph.reference
import kn_graph.shape
import kn_graph.size
from kn_graph import (
    DType,
    Graph,
    ReduceOp,
    Shape,
    Size,
)
from tests.conftest import graph_with

B = Size.sym("B")


# -- doctests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module",
    [kn_graph.size, kn_graph.shape, kn_graph.graph, kn_graph.reference, kn_graph.binding],
    ids=lambda m: m.__name__,
)
def test_module_doctests_pass(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


# -- printing ---------------------------------------------------------------------------------------
def test_str_graph_golden():
    g = Graph()
    x = g.input(Shape.of(B, 3), DType.F32, "x")
    w = g.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    y = g.softmax(g.matmul_nd(x, w), -1)
    z = g.reduce(y, [1], ReduceOp.MAX)
    c = g.cast(g.slice(x, 1, 0, 2), DType.F16)
    k = g.conv(
        g.input([1, 2, 5, 5], DType.F32, "img"),
        g.constant(np.ones((4, 1, 3, 3), np.float32)),
        stride=(2, 1),
        padding=(1, 1),
        groups=2,
    )
    g.add_output(z, "z")
    g.add_output(c)
    g.add_output(k, "k")
    assert str(g) == "\n".join(
        [
            '%0: f32[B,3] = input #0 "x"',
            "%1: f32[3,2] = const <6 values>",
            "%2: f32[1,B,3] = view(%0)",
            "%3: f32[1,3,2] = view(%1)",
            "%4: f32[1,B,2] = matmul(%2, %3)",
            "%5: f32[B,2] = view(%4)",
            "%6: f32[B,2] = softmax(%5) axis=1",
            "%7: f32[B] = reduce_max(%6) axes=[1]",
            "%8: f32[B,2] = slice(%0) axis=1 start=0 step=1",
            "%9: f16[B,2] = cast_f16(%8)",
            '%10: f32[1,2,5,5] = input #1 "img"',
            "%11: f32[4,1,3,3] = const <36 values>",
            "%12: f32[1,4,3,5] = conv(%10, %11) s=2x1 p=1 g=2",
            'outputs: %7 "z", %9 "output1", %12 "k"',
        ]
    )


def test_constant_printing_small_and_scalar():
    g = Graph()
    assert g.format_value(g.constant(np.array([1, 2], np.int32))) == "%0: i32[2] = const [1,2]"
    assert g.format_value(g.scalar(True, DType.BOOL)) == "%1: bool[] = const True"


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (
            lambda g, x: g.conv(
                x, g.constant(np.zeros((4, 2, 3, 3), np.float32)), (1, 1), (0, 0), (2, 2), 2
            ),
            "s=1 p=0 d=2 g=2",
        ),
        (
            lambda g, x: g.conv(x, g.constant(np.zeros((2, 4, 1, 3), np.float32)), (2, 2), (0, 1)),
            "s=2 p=0x1",
        ),
        (lambda g, x: g.slice(x, 2, 1, None, 2), "axis=2 start=1 step=2"),
        (lambda g, x: g.reduce(x, [3, 1], ReduceOp.MEAN), "axes=[1, 3]"),
        (lambda g, x: g.permute(x, [0, 2, 3, 1]), "perm=[0, 2, 3, 1]"),
        (lambda g, x: g.layernorm(x, 3, 1e-5), "axis=3 eps=1e-05"),
        (lambda g, x: g.iota([2, 3], 1), "axis=1"),
    ],
)
def test_op_attributes_print(build, text):
    g, x = graph_with([1, 4, 8, 8])
    v = build(g, x)
    assert g.format_value(v).endswith(" " + text)
