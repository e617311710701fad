"""oneDNN post-ops: what a primitive applies after its main computation, in order (a residual
added by `binary_add` or `sum`, an activation by `eltwise`, alpha by `eltwise_linear`). Each
is one `dnnl_post_ops_append_*` call that `memory.Owner.attr` makes on the attribute's chain.
"""

from __future__ import annotations

from typing import Any

from kn_cuda_eval.cpu.onednn.lib import DT_UNDEF

__all__ = [
    "BINARY_ADD",
    "ELTWISE_LINEAR",
    "ELTWISE_RELU",
    "PostOp",
    "PostOpCall",
    "binary_add",
    "eltwise",
    "sum_into",
]

# dnnl_alg_kind_t
ELTWISE_RELU = 0x20
ELTWISE_LINEAR = 0x26
BINARY_ADD = 0x1FFF0  # dnnl_binary_add

PostOp = tuple[int, float, float]  # an eltwise post-op: dnnl_alg_kind_t, alpha, beta
PostOpCall = tuple[str, tuple[Any, ...]]
"""A `dnnl_post_ops_append_*` function and its arguments after the post-ops handle."""


def eltwise(alg: int, alpha: float, beta: float) -> PostOpCall:
    """An elementwise function of the result (`PostOp`'s alg kind, alpha, beta)."""
    return ("dnnl_post_ops_append_eltwise", (alg, float(alpha), float(beta)))


def sum_into(scale: float) -> PostOpCall:
    """The result added to `scale` times what the destination holds before the primitive."""
    return ("dnnl_post_ops_append_sum", (float(scale), 0, DT_UNDEF))


def binary_add(src1_md: int) -> PostOpCall:
    """The result plus a second tensor of descriptor `src1_md`, read through the
    `DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1` execution argument."""
    return ("dnnl_post_ops_append_binary", (BINARY_ADD, src1_md))
