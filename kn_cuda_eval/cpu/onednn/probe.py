"""Special values through oneDNN's eltwise post-ops: whether an activation folded into a
convolution keeps NaN and ±inf as the reference does is asked of the library on this machine
(`kn_cuda_eval.cpu.passes.fuse` folds only chains that agree).
"""

from __future__ import annotations

import functools

import numpy as np

from kn_cuda_eval.cpu.onednn.conv import conv_runner
from kn_cuda_eval.cpu.onednn.lib import DATA_TYPES, available
from kn_cuda_eval.cpu.onednn.postops import PostOp
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["PROBE_CONVS", "PROBE_VALUES", "probe_post_ops"]

PROBE_VALUES = (
    *(float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0),
    *(6.0, -6.0, 7.5, -7.5, 20.0, -20.0, 100.0, -100.0, 1e-30, -1e-30, 6e4, -6e4, 3e38, -3e38),
)
"""What the probe convolutions' outputs hold: NaN, ±inf, ±0, values around common clamp bounds,
tiny and huge ones (f16 rounds the huge ones to ±inf)."""

PROBE_CONVS = (("blocked", 3, 1), ("nhwc", 3, 1), ("blocked", 3, 16), ("plain", 1, 1))
"""(layout, kernel size, groups) of the probe convolutions: the implementation families the
executor's convolutions run in (`auto_layout`'s blocked and plain picks, the layout pass's
channels-last chains, depthwise), each with its own post-op code."""


@functools.cache
def probe_post_ops(
    post: tuple[PostOp, ...], dtype: DType
) -> tuple[tuple[np.ndarray, np.ndarray], ...] | None:
    """What oneDNN's convolutions write without and with the eltwise post-ops `post`, over
    outputs that hold `PROBE_VALUES`: (t, y) for each of the `PROBE_CONVS` oneDNN runs (16
    channels, 6x6, identity weights at the centre tap); None when it runs none of them (no
    oneDNN, no `dtype` convolution on this CPU).

    Post-ops are JIT code generated per ISA (SSE4.1, AVX2, AVX-512) and implementation, and
    their max/min instructions return the second operand when the first is NaN, so whether an
    activation keeps NaN (and agrees on ±inf) is asked of the library on this machine: once
    per process, chain and dtype, a few milliseconds. `kn_cuda_eval.cpu.passes.fuse` folds only
    chains whose output agrees with the reference's."""
    if DATA_TYPES.get(dtype) is None or available() is not None:
        return None
    c, side = 16, 6
    x = np.resize(np.array(PROBE_VALUES[3:], np.float64), (1, c, side, side))
    # the non-finite values apart (a zero weight times inf is NaN: they spread to their window)
    x[0, 0, 0, 0], x[0, 1, side - 1, side - 1], x[0, 2, 0, side - 1] = PROBE_VALUES[:3]
    out = []
    for layout, k, groups in PROBE_CONVS:
        w = np.zeros((c, c // groups, k, k))
        w[np.arange(c), np.arange(c) % (c // groups), k // 2, k // 2] = 1.0  # identity
        end = 0
        views = []
        for shape in (x.shape, w.shape, x.shape):
            views.append(StridedView.dense(end, shape, dtype))
            end += -(-views[-1].nbytes // 256) * 256
        xv, wv, ov = views
        step = st.Conv(xv, wv, None, None, ov, (1, 1), (k // 2,) * 2, (1, 1), groups, False)
        got = []
        for chain in ((), post):
            arena = np.zeros(end, np.uint8)
            with np.errstate(over="ignore"):  # f16: the huge values become ±inf
                for v, a in ((xv, x), (wv, w)):
                    arena[v.offset : v.offset + v.nbytes].view(dtype.np)[...] = a.ravel()
            runner = conv_runner(step, arena, 1, layout=layout, post=chain)
            if runner is None:
                break
            try:
                runner()
            finally:
                runner.close()
            got.append(arena[ov.offset : ov.offset + ov.nbytes].view(dtype.np).copy())
        if len(got) == 2:
            out.append((got[0], got[1]))
    return tuple(out) if out else None
