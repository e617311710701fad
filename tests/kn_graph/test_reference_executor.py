"""The NumPy reference executor's loop: rank-0 and size-0 values, inputs and outputs, freeing
values after their last use, and long chains without recursion."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from kn_graph import DType, Graph, ReduceOp, Size, UnaryOp
from kn_graph.reference import evaluate
from tests.conftest import graph_with, run

B = Size.sym("B")


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
