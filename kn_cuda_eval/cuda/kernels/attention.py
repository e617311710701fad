"""Generator of the fused attention kernel: f32 math for f32 and f16 storage, f64 math (scale,
scores, softmax and accumulators in double) for f64, as the emulator computes it — the arithmetic
of `codegen/attention.py`, shared with the C kernel, in the online-softmax warp-per-row template
`templates/attention.cu` (why the loops differ: `codegen/attention.py`)."""

from __future__ import annotations

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.attention import attention
from kn_cuda_eval.cuda.kernels.launch import (
    BLOCK,
    KernelLaunch,
    Params,
    blocks_for,
    make_kernel,
    needs_64bit,
)
from kn_cuda_eval.planning import steps as st

__all__ = ["MAX_FUSED_DV", "attention_launch"]

MAX_FUSED_DV = st.ATTENTION_MAX_DV
"""Head sizes up to this fit the per-lane accumulators (the planner's limit for the step)."""


def attention_launch(s: st.Attention) -> KernelLaunch:
    b1, b2, m, d = s.q.shape
    b = b1 * b2
    n = s.k.shape[2]
    dv = s.v.shape[3]
    views = [s.q, s.k, s.v, s.out] + ([s.mask] if s.mask is not None else [])
    wide = needs_64bit(b * m * max(n, dv, d), views)
    p = Params(wide)
    p.idx("batch", b)
    p.idx("heads", b2)
    p.idx("m", m)
    p.idx("n", n)
    p.idx("d", d)
    p.idx("dv", dv)
    dt = s.q.dtype
    arith = attention(dt)
    acc = arith.acc
    p.float_("scale", s.scale, 64 if acc == "double" else 32)
    p.ptr("q", s.q)
    p.strides("sq", s.q.strides)
    p.ptr("k", s.k)
    p.strides("sk", s.k.strides)
    p.ptr("v", s.v)
    p.strides("sv", s.v.strides)
    p.ptr("out", s.out, const=False)
    p.strides("so", s.out.strides)
    mask = ""
    if s.mask is not None:
        p.ptr("mask", s.mask)
        p.strides("sm", s.mask.strides)
        ref = "mask[b1 * sm_0 + b2 * sm_1 + i * sm_2 + j * sm_3]"
        mask = f"        s += {arith.mask(s.mask.dtype, ref)};"
    causal = (
        f"        if (j > {arith.causal_last}) break;  // keys are visited in order: the rest are masked too"
        if s.causal
        else ""
    )
    values: dict[str, str | int] = {
        "PARAMS": p.signature(),
        "DVL": max(1, (dv + 31) // 32),
        "T": exprs.storage_ctype(dt),
        "ACC": acc,
        "EXP": arith.exp,
        "CAUSAL": causal,
        "MASK": mask,
        "LOADQ": f"({acc}){exprs.load(dt, 'qrow[e * sq_3]')}",
        "LOADK": f"({acc}){exprs.load(dt, 'krow[e * sk_3]')}",
        "LOADV": f"({acc}){exprs.load(dt, 'vrow[c * sv_3]')}",
        "STORE": arith.output(s.out.dtype, "acc[t]", "l"),
    }
    kernel = make_kernel("attention", "attention", values, wide)
    return KernelLaunch(
        kernel, (blocks_for(b * m, BLOCK // 32), 1, 1), (BLOCK, 1, 1), 0, tuple(p.args)
    )
