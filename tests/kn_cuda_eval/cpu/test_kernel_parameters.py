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
