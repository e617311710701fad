"""What oneDNN implements on this CPU, asked of oneDNN itself, for the tests whose expectation
depends on it. oneDNN 3.2 has F16 convolutions and matmuls only on CPUs with AVX512-FP16,
AVX2-VNNI-2 or AMX-FP16 (not on AVX2-only machines, nor on AVX-512 without FP16, such as this
one's Xeon); F32 everywhere. A test then asserts oneDNN's runner where it is implemented and the
documented fallback (the runner factory's None, the emulator's step or NumPy) where it is not,
instead of assuming the CPU it was written on (`ONEDNN_MAX_CPU_ISA=AVX2` plays an older one)."""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np

from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["implements"]


def _conv(dt: DType) -> bool:
    """A 3x3 convolution with bias, residual and relu, in the layout oneDNN chooses: the shape
    of every convolution the tests build."""
    x = StridedView.dense(0, (1, 8, 8, 8), dt)
    w = StridedView.dense(4096, (8, 8, 3, 3), dt)
    b = StridedView.dense(8192, (8,), dt)
    res = StridedView.dense(8448, (1, 8, 8, 8), dt)
    out = StridedView.dense(12544, (1, 8, 8, 8), dt)
    step = st.Conv(x, w, b, res, out, (1, 1), (1, 1), (1, 1), 1, True)
    desc = onednn.conv_desc(step, 1, "blocked")
    if desc is None:
        return False
    desc.close()
    return True


def _gemm(dt: DType) -> bool:
    """A 16x16x16 GEMM batched twice, through oneDNN's matmul (not the BLAS path)."""
    a = StridedView.dense(0, (2, 16, 16), dt)
    b = StridedView.dense(4096, (2, 16, 16), dt)
    c = StridedView.dense(8192, (2, 16, 16), dt)
    step = st.MatMul(a, b, c, False, False, 16, 16, 16, 2, 1.0, 0.0)
    arena = np.zeros(16384, np.uint8)
    runner = onednn.gemm_runner(step, arena, 1, backend="onednn")
    if runner is None:
        return False
    if isinstance(runner, onednn.Runner):
        runner.close()
    return True


def implements(kind: Literal["conv", "gemm"], dtype: DType) -> bool:
    """Whether oneDNN runs `kind` in `dtype` here (False without oneDNN, or with it hidden by
    $KN_ONEDNN, as the runner factories answer then)."""
    return onednn.available() is None and _asked(kind, dtype)


@functools.cache
def _asked(kind: str, dtype: DType) -> bool:
    return _conv(dtype) if kind == "conv" else _gemm(dtype)
