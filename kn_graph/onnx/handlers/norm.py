"""Normalisations: BatchNormalization (inference), InstanceNormalization, GroupNormalization,
LayerNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.

Statistics over trailing axes go through the IR's Layernorm (which the GPU fuses); the rest are
short compositions of reductions and elementwise ops.
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "MAX_LRN_SIZE",
    "batch_norm",
    "float_input",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "lp_norm",
    "lrn",
    "mean_variance_norm",
    "rms_norm",
    "stash_dtype",
    "stats_input",
    "wants_output",
]

MAX_LRN_SIZE = 4096
"""The widest LRN window (models use 3 to 5 channels)."""


def float_input(ctx: NodeContext, i: int = 0) -> Value:
    x = ctx.input(i)
    if not ctx.graph.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {ctx.graph.dtype(x)}")
    return x


def wants_output(ctx: NodeContext, i: int) -> bool:
    return i < len(ctx.node.output) and ctx.node.output[i] != ""


def _per_channel(ctx: NodeContext, v: Value, rank: int) -> Value:
    """A per-channel vector [C] as [C, 1, …] so that it broadcasts over x [N, C, *spatial];
    other shapes (BatchNormalization spatial=0) are left to NumPy broadcasting."""
    g = ctx.graph
    shape = g.shape(v)
    if shape.rank == 1:
        return g.view(v, Shape.of(shape[0], *([1] * (rank - 2))))
    return v


def _same_shape(ctx: NodeContext, y: Value, x: Value, what: str) -> Value:
    if ctx.graph.shape(y) != ctx.graph.shape(x):
        ctx.unsupported(f"{what} does not broadcast to the input {ctx.graph.shape(x)}")
    return y


# -- batch, instance and group normalisation ---------------------------------------------------------
@onnx_op("BatchNormalization")
def batch_norm(ctx: NodeContext) -> list[Result | None]:
    """Inference form: (x - mean) / sqrt(var + eps) * scale + bias, per channel."""
    g = ctx.graph
    if ctx.attr_bool("training_mode", False):
        ctx.unsupported("training_mode=1 (batch statistics and running-mean updates)")
    if ctx.opset < 7 and not ctx.attr_bool("is_test", False):
        ctx.unsupported("is_test=0 (training)")
    ctx.ignore_attrs("momentum", "consumed_inputs")
    spatial = ctx.attr_bool("spatial", True) if ctx.opset < 9 else 1
    eps = ctx.attr_float("epsilon", 1e-5)
    x = float_input(ctx)
    rank = g[x].rank
    if rank < 2:
        ctx.unsupported(f"expected an input [N, C, ...], found {g.shape(x)}")
    scale, bias, mean, var = (ctx.input(i) for i in range(1, 5))
    if not spatial and any(g[v].rank == 1 and rank > 2 for v in (scale, bias, mean, var)):
        ctx.unsupported("spatial=0 with per-channel statistics")
    # opset 15 lets scale/bias (T1) and mean/var (T2) differ from x's type: compute in x's
    scale, bias, mean, var = (
        _per_channel(ctx, g.cast(v, g.dtype(x)), rank) for v in (scale, bias, mean, var)
    )
    y = g.div(g.sub(x, mean), g.sqrt(g.add(var, eps)))
    y = g.add(g.mul(y, scale), bias)
    return [_same_shape(ctx, y, x, "the statistics"), None, None, None, None]


@onnx_op("InstanceNormalization")
def instance_norm(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = float_input(ctx)
    if g[x].rank < 3:
        ctx.unsupported(f"expected an input [N, C, *spatial], found {g.shape(x)}")
    eps = ctx.attr_float("epsilon", 1e-5)
    return g.instance_norm(x, eps, ctx.input(1), ctx.input(2))


@onnx_op("GroupNormalization")
def group_norm(ctx: NodeContext) -> Result:
    """Opset 18 takes scale and bias per group, opset 21 per channel."""
    g = ctx.graph
    x = float_input(ctx)
    if g[x].rank < 3:
        ctx.unsupported(f"expected an input [N, C, *spatial], found {g.shape(x)}")
    groups = ctx.attr_int("num_groups")
    eps = ctx.attr_float("epsilon", 1e-5)
    stash_dtype(ctx, g.dtype(x))
    scale, bias = ctx.input(1), ctx.input(2)
    c = g.shape(x)[1]
    if groups < 1 or not Size(groups).divides(c):
        ctx.unsupported(f"{c} channels not divisible into {groups} groups")
    if ctx.opset < 21:
        per_group = c // groups
        scale, bias = (g.repeat_interleave(v, 0, per_group) for v in (scale, bias))
    for v in (scale, bias):
        if g.shape(v) != Shape.of(c):
            ctx.unsupported(f"scale/bias of shape {g.shape(v)}, expected [{c}]")
    return g.group_norm(x, groups, eps, scale, bias)


# -- layer and RMS normalisation ----------------------------------------------------------------------
def stash_dtype(ctx: NodeContext, x_dtype: DType) -> DType:
    """The precision of the statistics (ONNX `stash_type`, float by default)."""
    if not ctx.has_attr("stash_type"):
        return DType.F32 if x_dtype == DType.F16 else x_dtype
    return onnx_dtype(ctx.attr_int("stash_type"), f"node '{ctx.name}' stash_type")


def stats_input(ctx: NodeContext, x: Value, stash: DType) -> Value:
    """x in the stash precision; f16 needs no cast (the Layernorm op computes it in f32)."""
    if stash == DType.F32 and ctx.graph.dtype(x) == DType.F16:
        return x
    return ctx.graph.cast(x, stash)


@onnx_op("LayerNormalization")
def layer_norm(ctx: NodeContext) -> list[Result | None]:
    """Normalise over axes axis..rank-1; the Mean and InvStdDev outputs (in the stash type) are
    computed only when the node names them."""
    g = ctx.graph
    x = float_input(ctx)
    rank = g[x].rank
    axis = ctx.axis(ctx.attr_int("axis", -1), rank)
    eps = ctx.attr_float("epsilon", 1e-5)
    dtype = g.dtype(x)
    stash = stash_dtype(ctx, dtype)
    xs = stats_input(ctx, x, stash)
    y = g.cast(g.layer_norm(xs, axis, eps), dtype)
    y = g.mul(y, ctx.input(1))
    if ctx.has_input(2):
        y = g.add(y, ctx.input(2))
    outs: list[Result | None] = [_same_shape(ctx, y, x, "scale/bias"), None, None]
    if wants_output(ctx, 1) or wants_output(ctx, 2):
        xc = g.cast(x, stash)
        axes = list(range(axis, rank))
        mean = g.reduce(xc, axes, ReduceOp.MEAN, keepdims=True)
        d = g.sub(xc, mean)
        var = g.reduce(g.mul(d, d), axes, ReduceOp.MEAN, keepdims=True)
        outs[1] = mean
        outs[2] = g.unary(UnaryOp.RECIPROCAL, g.sqrt(g.add(var, eps)))
    return outs


@onnx_op("RMSNormalization")
def rms_norm(ctx: NodeContext) -> Result:
    """x / sqrt(mean(x^2 over axis..rank-1) + eps) * scale."""
    g = ctx.graph
    x = float_input(ctx)
    rank = g[x].rank
    axis = ctx.axis(ctx.attr_int("axis", -1), rank)
    eps = ctx.attr_float("epsilon", 1e-5)
    dtype = g.dtype(x)
    xs = g.cast(x, stash_dtype(ctx, dtype))
    ms = g.reduce(g.mul(xs, xs), list(range(axis, rank)), ReduceOp.MEAN, keepdims=True)
    y = g.cast(g.div(xs, g.sqrt(g.add(ms, eps))), dtype)
    return _same_shape(ctx, g.mul(y, ctx.input(1)), x, "scale")


# -- local and Lp normalisation ------------------------------------------------------------------------
@onnx_op("LRN")
def lrn(ctx: NodeContext) -> Result:
    """x / (bias + alpha/size · sum of x² over a window of `size` channels) ^ beta."""
    g = ctx.graph
    x = float_input(ctx)
    if g[x].rank < 3:
        ctx.unsupported(f"expected an input [N, C, *spatial], found {g.shape(x)}")
    size = ctx.attr_int("size")
    alpha = ctx.attr_float("alpha", 1e-4)
    beta = ctx.attr_float("beta", 0.75)
    bias = ctx.attr_float("bias", 1.0)
    if not 1 <= size <= MAX_LRN_SIZE:  # the window is unrolled, one slice per channel offset
        ctx.unsupported(f"size {size} (supported: 1 to {MAX_LRN_SIZE})")
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = g.mul(x, x)
    padded = g.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (g[x].rank - 2))
    c = g.shape(x)[1]
    total = g.slice_raw(padded, 1, 0, 1, c)
    for i in range(1, size):
        total = g.add(total, g.slice_raw(padded, 1, i, 1, c))
    denom = g.pow(g.add(g.mul(total, alpha / size), bias), beta)
    return g.div(x, denom)


@onnx_op("LpNormalization")
def lp_norm(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = float_input(ctx)
    axis = ctx.axis(ctx.attr_int("axis", -1), g[x].rank)
    p = ctx.attr_int("p", 2)
    match p:
        case 1:
            norm = g.reduce(g.unary(UnaryOp.ABS, x), [axis], ReduceOp.SUM, keepdims=True)
        case 2:
            norm = g.sqrt(g.reduce(g.mul(x, x), [axis], ReduceOp.SUM, keepdims=True))
        case _:
            ctx.unsupported(f"p = {p}; ONNX allows 1 or 2")
    zero = g.binary(BinaryOp.EQ, norm, 0.0)
    return g.select(zero, 0.0, g.div(x, norm))  # a zero vector stays zero (0/0 -> 0)


@onnx_op("MeanVarianceNormalization")
def mean_variance_norm(ctx: NodeContext) -> Result:
    """(x - mean) / (std + 1e-9) over `axes`, as the ONNX function body defines it."""
    g = ctx.graph
    x = float_input(ctx)
    rank = g[x].rank
    axes = [ctx.axis(a, rank) for a in ctx.attr_ints("axes", [0, 2, 3]) or []]
    mean = g.reduce(x, axes, ReduceOp.MEAN, keepdims=True)
    d = g.sub(x, mean)
    var = g.reduce(g.mul(d, d), axes, ReduceOp.MEAN, keepdims=True)
    return g.div(d, g.add(g.sqrt(var), 1e-9))
