"""Large synthetic graphs for the planner's scaling tests and `benchmarks/plan_scaling.py`: a long
elementwise chain (one fused kernel, or several once the chain passes the kernel-size cap) and a
general graph of repeated blocks mixing conv, matmul, softmax, reduce, views and elementwise ops.
Tensors are tiny so that the emulator and the CPU executor run them in a moment."""

from __future__ import annotations

import numpy as np

from kn_graph import DType, Graph, ReduceOp, Shape, Size, UnaryOp


def chain_graph(n: int) -> Graph:
    """x [B, 4, 8] through `n` elementwise ops (add, mul, relu, tanh, sub in turn), all of them
    single-use: the whole chain is one lazy value."""
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 4, 8), DType.F32, "x")
    y = x
    for k in range(n):
        match k % 5:
            case 0:
                y = g.add(y, 0.25 + (k % 7) * 0.125)
            case 1:
                y = g.mul(y, 0.75)
            case 2:
                y = g.relu(y)
            case 3:
                y = g.unary(UnaryOp.TANH, y)
            case _:
                y = g.sub(y, 0.0625)
    g.add_output(y, "y")
    return g


def _block(g: Graph, h: object, rng: np.random.Generator, k: int) -> object:
    """One block of the general graph on h [B, 8, 4, 4] (about 30 values, constants included)."""
    w = g.constant((rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32))
    bias = g.constant(rng.standard_normal((1, 8, 1, 1)).astype(np.float32))
    c = g.relu(g.add(g.conv(h, w, padding=[1, 1]), bias))  # type: ignore[arg-type]
    t = g.permute(g.view(c, Shape.of(Size.sym("B"), 8, 16)), [0, 2, 1])  # [B, 16, 8]
    wm = g.constant((rng.standard_normal((8, 8)) * 0.3).astype(np.float32))
    m = g.matmul_nd(t, wm)
    s = g.softmax(g.mul(m, 0.5), 2)
    r = g.reduce(s, [2], ReduceOp.MEAN, keepdims=True)
    e = g.unary(UnaryOp.TANH, g.mul(g.sub(s, r), 2.0 + k % 3))
    if k % 2:
        e = g.add(e, g.exp(g.neg(g.unary(UnaryOp.ABS, e))))
    back = g.view(g.permute(e, [0, 2, 1]), Shape.of(Size.sym("B"), 8, 4, 4))
    z = g.reduce(c, [1], ReduceOp.MAX, keepdims=True)  # [B, 1, 4, 4], broadcast back
    return g.add(g.mul(h, 0.5), g.add(back, g.mul(z, 0.125)))


def general_graph(n: int, seed: int = 0) -> Graph:
    """Blocks of conv + bias + relu, view/permute, matmul, softmax, reduce and elementwise ops on
    x [B, 8, 4, 4] until the graph has at least `n` values."""
    rng = np.random.default_rng(seed)
    g = Graph()
    h: object = g.input(Shape.of(Size.sym("B"), 8, 4, 4), DType.F32, "x")
    k = 0
    marks = [n // 4, n // 2, 3 * n // 4]
    while len(g) < n:
        h = _block(g, h, rng, k)
        k += 1
        if marks and len(g) >= marks[0]:  # a few intermediate outputs: long-lived buffers
            marks.pop(0)
            g.add_output(h, f"y{k}")  # type: ignore[arg-type]
    g.add_output(h, "y")  # type: ignore[arg-type]
    return g


def inputs_for(g: Graph, batch: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(g[v].shape.eval({"B": batch})).astype(np.float32) for v in g.inputs]
