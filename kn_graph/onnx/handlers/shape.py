"""Shape and data-movement ONNX ops: Shape, Reshape, Constant, Identity, …"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import Known, NodeContext, Result, onnx_op
from kn_graph.shape import Shape, Size


@onnx_op("Shape")
def shape(ctx: NodeContext) -> Result:
    dims = list(ctx.input_shape(0).dims)
    start = ctx.attr_int("start", 0)
    end = ctx.attr_int("end", len(dims))
    return Known.of(dims[slice(start, end)], DType.I64)


@onnx_op("Identity")
def identity(ctx: NodeContext) -> Result:
    return ctx.raw_input(0)


@onnx_op("Constant")
def constant(ctx: NodeContext) -> Result:
    t = ctx.attr_tensor("value")
    if t is None:
        ctx.unsupported("only the 'value' attribute form is supported so far")
    return ctx.loader.result_of_array(t)


@onnx_op("Reshape")
def reshape(ctx: NodeContext) -> Result:
    in_shape = ctx.input_shape(0)
    target = ctx.input_sizes(1, "the target shape")
    allowzero = ctx.attr_int("allowzero", 0)
    dims: list[Size | None] = []
    for i, d in enumerate(target):
        if d == Size(0) and not allowzero:
            if i >= in_shape.rank:
                ctx.unsupported(f"target dim {i} is 0 (copy) but the input has rank {in_shape.rank}")
            dims.append(in_shape[i])
        elif d == Size(-1):
            dims.append(None)
        else:
            dims.append(d)
    if dims.count(None) > 1:
        ctx.unsupported("more than one -1 in the target shape")
    if None in dims:
        known = Size(1)
        for d in dims:
            if d is not None:
                known = known * d
        dims[dims.index(None)] = in_shape.size() // known
    out = Shape(tuple(d for d in dims if d is not None))
    r = ctx.raw_input(0)
    if isinstance(r, Known):
        return Known.of(r.data.reshape(-1).reshape(out.fixed_dims()), r.dtype)
    return ctx.graph.view(r, out)
