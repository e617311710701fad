"""Kernel parameters of the CPU backend's C steps: sizes that reach fused programs as integer
constants are read from the kernel's parameters, so a new sequence length reuses the compiled
library (`csource.kernel.Args.const`)."""

from __future__ import annotations

import numpy as np

from kn_cuda_eval.planning import steps
from kn_graph import DType
from kn_graph.ops import BinaryOp
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import assert_close
from tests.paths import MODELS


def test_a_new_sequence_length_needs_no_new_kernel() -> None:
    """Sizes reach fused programs as integer constants (the exports compute shapes: BERT's
    position ids take the sequence length); they are kernel parameters, not literals, so a
    length the server has not met reuses the compiled library: the same kernels at 5, 9 and 12
    tokens, and the results the reference gives at each."""
    from kn_graph.onnx import load_onnx

    graph = load_onnx(MODELS / "bert_dynamo.onnx")
    prepared = Device.cpu().prepare(graph)
    rng = np.random.default_rng(3)
    kernels = []
    for seq in (5, 9, 12):
        ids = rng.integers(0, 100, (2, seq), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        feed["token_type_ids"] = np.zeros_like(ids)
        ex = prepared.executor(prepared.check_inputs(feed))
        assert ex.library is not None
        kernels.append(sorted(k.name for k in ex.library.kernels))
        got, want = prepared.eval(feed), evaluate(graph, feed)
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, f"seq {seq}")
    assert kernels[0] == kernels[1] == kernels[2]


def test_integer_constants_are_parameters_and_small_ones_literals() -> None:
    """`Args.const`: an i64 constant past -2..2 is read from the kernel's parameters (two
    values, one kernel), a small one or a float is printed."""
    from kn_cuda_eval.cpu import csource
    from kn_cuda_eval.planning.program import Bin, Const, Load, Program
    from kn_cuda_eval.planning.view import StridedView

    v = StridedView.dense(0, (4, 8), DType.I64)

    def call(c: int, f: float) -> csource.CCall:
        prog = Program(
            (
                Load(0, DType.I64),
                Const(c, DType.I64),
                Bin(BinaryOp.ADD, 0, 1, DType.I64),
                Const(f, DType.F32),
            ),
            (2, 3),
        )
        outs = (v.with_offset(256), StridedView.dense(512, (4, 8), DType.F32))
        got = csource.step_call(steps.Elementwise((4, 8), (v,), (), outs, prog))
        assert got is not None
        return got

    a, b = call(100, 0.5), call(101, 0.5)
    assert a.kernel == b.kernel and 100 in a.ints and 101 in b.ints
    assert call(2, 0.5).kernel != a.kernel and call(100, 0.25).kernel != a.kernel
    assert "0.25f" in call(100, 0.25).kernel.source


def test_integer_edge_constants_through_the_cpu_backend() -> None:
    """Constants read as parameters keep their exact values on Device.cpu(): i64 extremes and
    past 2^62, i32 bounds, a u64 mask past i64 (printed), small ones (printed), and a float NaN
    beside them (printed) — the reference's results, bit for bit."""
    from kn_graph import Graph, Shape

    g = Graph()
    x64 = g.input(Shape.of(3, 5), DType.I64, "x64")
    x32 = g.input(Shape.of(3, 5), DType.I32, "x32")
    u64 = g.input(Shape.of(3, 5), DType.U64, "u64")
    xf = g.input(Shape.of(3, 5), DType.F32, "xf")
    bounded = g.binary(BinaryOp.MIN, g.binary(BinaryOp.MAX, x64, -1000), 1000)  # no overflow
    outs = {
        "big": g.add(bounded, 2**62),
        "min": g.binary(BinaryOp.MAX, x64, -(2**63)),
        "max": g.binary(BinaryOp.MIN, x64, 2**63 - 1),
        "neg": g.mul(bounded, -7),
        "small": g.sub(bounded, 2),
        "i32": g.add(x32, 2**31 - 101),
        "i32min": g.binary(BinaryOp.MAX, x32, -(2**31)),
        "u64all": g.binary(BinaryOp.BIT_AND, u64, 2**64 - 1),
        "u64low": g.binary(BinaryOp.BIT_AND, u64, 2**63 - 1),
        "nan": g.add(g.mul(xf, 3.0), float("nan")),
    }
    for name, v in outs.items():
        g.add_output(v, name)
    rng = np.random.default_rng(2)
    feed = {
        "x64": rng.integers(-100, 100, (3, 5)).astype(np.int64),
        "x32": rng.integers(0, 100, (3, 5)).astype(np.int32),
        "u64": rng.integers(0, 2**63, (3, 5), dtype=np.uint64) * np.uint64(2),
        "xf": rng.standard_normal((3, 5)).astype(np.float32),
    }
    feed["x64"][0, :3] = [-(2**63), 2**63 - 1, 0]
    got = Device.cpu().prepare(g).eval(feed)
    want = evaluate(g, feed)
    for name, a, b in zip(outs, got, want, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert np.isnan(got[-1]).all()
