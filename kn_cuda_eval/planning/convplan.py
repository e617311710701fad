"""Which links of a conv → +bias → +residual → relu chain fold into one cuDNN call
(`cudnnConvolutionBiasActivationForward` computes act(conv(x, w) + z + bias))."""

from __future__ import annotations

from dataclasses import dataclass

from kn_cuda_eval.planning.context import PlannerContext
from kn_cuda_eval.planning.view import StridedView
from kn_graph.ops import Binary, BinaryOp

__all__ = ["ConvFusion", "conv_fusion"]


@dataclass(frozen=True, slots=True)
class ConvFusion:
    length: int
    """How many values of the chain the conv step computes (1: the conv alone)."""
    bias: StridedView | None
    residual: StridedView | None
    relu: bool


def _channel_vector(s: object, shape: tuple[int, ...]) -> StridedView | None:
    """The dense [K] vector behind a per-channel broadcast [N, K, *1] → [N, K, *spatial]."""
    if not isinstance(s, StridedView) or s.shape != shape or len(shape) < 3:
        return None
    if any(st != 0 for a, st in enumerate(s.strides) if a != 1 and shape[a] != 1):
        return None
    if shape[1] != 1 and s.strides[1] != 1:
        return None
    return StridedView(s.offset, (shape[1],), (1,), s.dtype)


def _drop(v: StridedView, axes: list[int]) -> StridedView:
    keep = [a for a in range(len(v.shape)) if a not in axes]
    return StridedView(
        v.offset, tuple(v.shape[a] for a in keep), tuple(v.strides[a] for a in keep), v.dtype
    )


@dataclass(frozen=True, slots=True)
class ConvViews:
    """What a Conv step reads and writes, and its geometry, as the step will have them."""

    x: StridedView
    w: StridedView
    residual: StridedView | None
    out: StridedView
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


def without_unit_axes(c: ConvViews) -> ConvViews:
    """`c` without the spatial axes the convolution leaves at 1 everywhere (input, kernel and
    output of size 1, no padding), at least one spatial axis kept. A 1-d convolution exported as
    2-d (kernel Kx1 over [N, C, L, 1]) then runs as the 1-d one it is, which oneDNN runs 1.9
    times as fast on AVX2 (a 256 to 512 channel, 5-tap convolution over 512 rows: 17 vs 32 ms;
    onnxruntime 14 ms)."""
    unit = [
        i
        for i, p in enumerate(c.padding)
        if p == 0 and c.x.shape[2 + i] == c.w.shape[2 + i] == c.out.shape[2 + i] == 1
    ][: len(c.padding) - 1]
    if not unit:
        return c
    axes = [2 + i for i in unit]
    keep = [i for i in range(len(c.padding)) if i not in unit]

    def geometry(t: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(t[i] for i in keep)

    return ConvViews(
        _drop(c.x, axes),
        _drop(c.w, axes),
        None if c.residual is None else _drop(c.residual, axes),
        _drop(c.out, axes),
        geometry(c.stride),
        geometry(c.padding),
        geometry(c.dilation),
    )


def conv_fusion(p: PlannerContext, chain: list[int]) -> ConvFusion:
    """Walk the chain while each link can fold: a per-channel add is the bias, a dense add of the
    full shape the residual, max with 0 the relu (which ends the chain)."""
    shape = p.shape(chain[0])
    bias: StridedView | None = None
    residual: StridedView | None = None
    length = 1
    for pos in range(1, len(chain)):
        op = p.g[p.val(chain[pos])].op
        assert isinstance(op, Binary)
        other = op.b if op.a.index == chain[pos - 1] else op.a
        if op.op is BinaryOp.MAX:
            if p.s.fuse_conv_relu and p.g.scalar_value(other) == 0 and p.g[other].dtype.is_float:
                return ConvFusion(pos + 1, bias, residual, True)
            break
        s = p.state[other.index]
        if bias is None and (vec := _channel_vector(s, shape)) is not None:
            bias = vec
        elif residual is None and isinstance(s, StridedView) and s.shape == shape and s.is_dense():
            residual = s
        else:
            break
        length = pos + 1
    return ConvFusion(length, bias, residual, False)
