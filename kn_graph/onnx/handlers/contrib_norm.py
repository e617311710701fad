"""onnxruntime's fused normalisations: SkipLayerNormalization, SkipSimplifiedLayerNormalization,
GroupNorm and SkipGroupNorm (com.microsoft), and SimplifiedLayerNormalization, which onnxruntime
registers in the default domain. Its transformer optimizer and the genai model builder emit
them; each lowers to the IR's Layernorm or a short reduction chain, as `norm` does for ONNX's.
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.norm import float_input, stash_dtype, stats_input, wants_output
from kn_graph.ops import ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "group_norm_nhwc",
    "simplified_layer_norm",
    "skip_group_norm",
    "skip_layer_norm",
    "skip_simplified_layer_norm",
]

SKIP_LAYER_NORM_EPSILON = 1e-12
"""onnxruntime's default epsilon of the Skip*LayerNormalization ops (not ONNX's 1e-5)."""


def _vector(ctx: NodeContext, i: int, hidden: Size, what: str, dtype: DType) -> Value:
    """A per-feature vector input [hidden] (gamma, beta, bias) in the input's type."""
    g = ctx.graph
    v = ctx.input(i)
    if g.shape(v) != Shape.of(hidden):
        ctx.unsupported(f"{what} (input {i}) must be [{hidden}], found {g.shape(v)}")
    if g.dtype(v) != dtype:
        ctx.unsupported(f"{what} (input {i}) must be {dtype} like the input, found {g.dtype(v)}")
    return v


def _rms_stats(ctx: NodeContext, x: Value, axes: list[int], eps: float) -> Value:
    """1 / sqrt(mean(x²) + eps) over `axes`, kept as size-1 axes."""
    g = ctx.graph
    ms = g.reduce(g.mul(x, x), axes, ReduceOp.MEAN, keepdims=True)
    return g.unary(UnaryOp.RECIPROCAL, g.sqrt(g.add(ms, eps)))


def _mean_inv_std(ctx: NodeContext, x: Value, axes: list[int], eps: float) -> tuple[Value, Value]:
    """The mean and 1 / sqrt(variance + eps) over `axes`, kept as size-1 axes."""
    g = ctx.graph
    mean = g.reduce(x, axes, ReduceOp.MEAN, keepdims=True)
    d = g.sub(x, mean)
    var = g.reduce(g.mul(d, d), axes, ReduceOp.MEAN, keepdims=True)
    return mean, g.unary(UnaryOp.RECIPROCAL, g.sqrt(g.add(var, eps)))


@onnx_op("SimplifiedLayerNormalization")
def simplified_layer_norm(ctx: NodeContext) -> list[Result | None]:
    """RMS normalisation over axes axis..rank-1 (onnxruntime's default-domain op): Y and the
    optional inv_std_var (in the stash type)."""
    g = ctx.graph
    x = float_input(ctx)
    rank = g[x].rank
    axis = ctx.axis(ctx.attr_int("axis", -1), rank)
    eps = ctx.attr_float("epsilon", 1e-5)
    dtype = g.dtype(x)
    stash = stash_dtype(ctx, dtype)
    scale = ctx.input(1)
    if g.dtype(scale) != dtype:
        ctx.unsupported(f"scale of type {g.dtype(scale)} for an input of type {dtype}")
    xs = g.cast(x, stash)
    inv = _rms_stats(ctx, xs, list(range(axis, rank)), eps)
    y = g.mul(g.cast(g.mul(xs, inv), dtype), scale)
    if g.shape(y) != g.shape(x):
        ctx.unsupported(f"scale {g.shape(scale)} does not broadcast to the input {g.shape(x)}")
    return [y, inv if wants_output(ctx, 1) else None]


def _skip_sum(ctx: NodeContext, bias_index: int) -> tuple[Value, Size]:
    """input + skip (+ bias): the skip may be [B, S, H], [1, S, H] or [S, H]."""
    g = ctx.graph
    x = float_input(ctx)
    shape = g.shape(x)
    if shape.rank not in (2, 3):
        ctx.unsupported(
            f"input must be [batch, sequence, hidden] or [tokens, hidden], found {shape}"
        )
    skip = ctx.input(1)
    hidden = shape[-1]
    if g.dtype(skip) != g.dtype(x) or g[skip].rank > shape.rank:
        ctx.unsupported(f"skip {g.dtype(skip)}{g.shape(skip)} does not fit the input {shape}")
    s = g.add(x, skip)
    if g.shape(s) != shape:
        ctx.unsupported(f"skip {g.shape(skip)} does not broadcast to the input {shape}")
    if ctx.has_input(bias_index):
        s = g.add(s, _vector(ctx, bias_index, hidden, "bias", g.dtype(x)))
    return s, hidden


def _skip_norm(ctx: NodeContext, simplified: bool) -> list[Result | None]:
    """Both Skip*LayerNormalization ops: outputs Y, mean, inv_std_var, input_skip_bias_sum."""
    g = ctx.graph
    eps = ctx.attr_float("epsilon", SKIP_LAYER_NORM_EPSILON)
    s, hidden = _skip_sum(ctx, 3 if simplified else 4)
    dtype = g.dtype(s)
    gamma = _vector(ctx, 2, hidden, "gamma", dtype)
    last = g[s].rank - 1
    f32 = g.cast(s, DType.F32)
    stats = wants_output(ctx, 1) or wants_output(ctx, 2)
    mean: Value | None = None
    inv: Value | None = None
    if simplified:
        if wants_output(ctx, 1):
            ctx.unsupported("output 1 (mean): the RMS normalisation computes no mean")
        inv = _rms_stats(ctx, f32, [last], eps)
        y = g.mul(g.cast(g.mul(f32, inv), dtype), gamma)
    else:
        y = g.mul(g.cast(g.layer_norm(stats_input(ctx, s, DType.F32), last, eps), dtype), gamma)
        if ctx.has_input(3):
            y = g.add(y, _vector(ctx, 3, hidden, "beta", dtype))
        if stats:
            mean, inv = _mean_inv_std(ctx, f32, [last], eps)
    return [
        y,
        mean if stats else None,
        inv if stats else None,
        s if wants_output(ctx, 3) else None,
    ]


@onnx_op("SkipLayerNormalization", domain="com.microsoft")
def skip_layer_norm(ctx: NodeContext) -> list[Result | None]:
    """LayerNorm(input + skip + bias) · gamma + beta over the hidden axis."""
    return _skip_norm(ctx, simplified=False)


@onnx_op("SkipSimplifiedLayerNormalization", domain="com.microsoft")
def skip_simplified_layer_norm(ctx: NodeContext) -> list[Result | None]:
    """RMSNorm(input + skip + bias) · gamma over the hidden axis."""
    return _skip_norm(ctx, simplified=True)


# -- group normalisation (channels last by default) --------------------------------------------------
def _group_norm(ctx: NodeContext, x: Value, channels_last: bool) -> Value:
    """GroupNorm of x ([N, H, W, C] channels last, else [N, C, H, W]) with its activation."""
    g = ctx.graph
    groups = ctx.attr_int("groups")
    activation = ctx.attr_int("activation")
    eps = ctx.attr_float("epsilon", 1e-5)
    if activation not in (0, 1):
        ctx.unsupported(f"activation {activation} (0: none, 1: SiLU)")
    rank = g[x].rank
    if rank < 3:
        ctx.unsupported(f"expected an input of rank 3 or more, found {g.shape(x)}")
    nchw = g.permute(x, [0, rank - 1, *range(1, rank - 1)]) if channels_last else x
    c = g.shape(nchw)[1]
    if groups < 1 or not Size(groups).divides(c):
        ctx.unsupported(f"{c} channels not divisible into {groups} groups")
    dtype = g.dtype(x)
    gamma, beta = (g.cast(ctx.input(i), dtype) for i in (1, 2))
    for i, v in ((1, gamma), (2, beta)):
        if g.shape(v) != Shape.of(c):
            ctx.unsupported(f"input {i} must be [{c}] (one value per channel), found {g.shape(v)}")
    y = g.group_norm(stats_input(ctx, nchw, DType.F32), groups, eps)
    per_channel = Shape.of(c, *([1] * (rank - 2)))
    y = g.add(g.mul(g.cast(y, dtype), g.view(gamma, per_channel)), g.view(beta, per_channel))
    if activation == 1:
        y = g.silu(y)
    return g.permute(y, [0, *range(2, rank), 1]) if channels_last else y


@onnx_op("GroupNorm", domain="com.microsoft")
def group_norm_nhwc(ctx: NodeContext) -> Result:
    """onnxruntime's GroupNorm: NHWC unless channels_last=0, optional SiLU after it."""
    channels_last = ctx.attr_bool("channels_last", True)
    return _group_norm(ctx, float_input(ctx), channels_last)


@onnx_op("SkipGroupNorm", domain="com.microsoft")
def skip_group_norm(ctx: NodeContext) -> list[Result | None]:
    """GroupNorm(x + skip + bias) in NHWC; the skip is [N, H, W, C], [N, 1, 1, C] or [N, C]."""
    g = ctx.graph
    if not ctx.attr_bool("channels_last", True):
        ctx.unsupported("channels_last=0 (onnxruntime implements SkipGroupNorm in NHWC only)")
    x = float_input(ctx)
    shape = g.shape(x)
    skip = ctx.input(3)
    if g[skip].rank == 2 and shape.rank > 2:
        skip = g.view(skip, Shape.of(g.shape(skip)[0], *([1] * (shape.rank - 2)), shape[-1]))
    s = g.add(x, skip)
    if g.shape(s) != shape:
        ctx.unsupported(f"skip {g.shape(ctx.input(3))} does not fit the input {shape}")
    if ctx.has_input(4):
        s = g.add(s, _vector(ctx, 4, shape[-1], "bias", g.dtype(x)))
    return [_group_norm(ctx, s, True), s if wants_output(ctx, 1) else None]
