"""Helpers shared by the handler families: load-time arithmetic on `Known` tensors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import Known, NodeContext

__all__ = ["all_known", "known_elementwise"]


def all_known(ctx: NodeContext, indices: range | list[int] | None = None) -> list[Known] | None:
    """Every (present) input as a Known, or None when any of them is a runtime value."""
    idx = (
        list(indices)
        if indices is not None
        else [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    )
    out = []
    for i in idx:
        k = ctx.input_known(i)
        if k is None:
            return None
        out.append(k)
    return out


def known_elementwise(
    ks: list[Known], f: Callable[..., object], out_dtype: DType | None = None
) -> Known:
    """Apply f elementwise with NumPy broadcasting; symbolic elements go through Size arithmetic
    (which raises GraphError when the result is not a monomial)."""
    dtype = out_dtype or ks[0].dtype
    if not any(k.is_symbolic for k in ks):
        with np.errstate(all="ignore"):
            res = np.asarray(f(*[k.data for k in ks]))
        return Known(res.astype(dtype.np, copy=False), dtype)
    arrays = np.broadcast_arrays(*[k.data.astype(object) for k in ks])
    flat = [f(*xs) for xs in zip(*[a.reshape(-1) for a in arrays], strict=True)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return Known.of(out.reshape(arrays[0].shape if arrays else ()), dtype)
