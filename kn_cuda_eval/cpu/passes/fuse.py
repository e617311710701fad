"""Activations after a convolution, folded into its oneDNN primitive as an `eltwise` post-op.

The planner's Conv step carries what cuDNN fuses (bias, residual, ReLU). The activations of
MobileNet (ReLU6), EfficientNet (SiLU) and friends stay separate elementwise steps: one more
pass over the tensor each. oneDNN applies them in the convolution's own epilogue, so the host
executor folds such a step into the convolution right before it:

    conv k: t = conv(x, w) (+ bias, + residual, relu)     step k+1: y = f(t)  (flat)
    →  conv k: y = f(conv(...)), written at y's bytes      step k+1: nothing

when step k+1 is a flat elementwise step (`layouts.is_flat`) whose only operand is exactly t,
t is read by nothing else (it dies there and is no plan output), y has t's dtype and size and
does not overlap what the convolution reads, and f is one oneDNN computes: SiLU (swish), a
clamp (ReLU6, `clip_v2`), ReLU, sigmoid (logistic), tanh, exact and tanh GELU — and computes as
the reference does on this machine, NaN and ±inf included (`agrees`): oneDNN's JIT ReLU and
clamps are max/min instructions, which turn NaN into the bound on x86, while the reference, the
emulator and onnxruntime keep it. Those stay separate steps (one more pass over the tensor).

    steps, posts = fold_activations(plan.steps, plan.outputs, candidates)
    # steps[k]: the convolution writing y; steps[k + 1]: Folded(k); posts[k]: ((alg, alpha, beta), ...)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.onednn import ELTWISE_RELU, PostOp
from kn_cuda_eval.cpu.passes.layouts import is_flat
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator_ops import eval_program
from kn_cuda_eval.planning.program import Bin, Const, Load, Program, Un
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = ["ELTWISE", "Folded", "PostOp", "agrees", "fold_activations", "post_ops", "relu_agrees"]

# dnnl_alg_kind_t (dnnl_types.h; stable across oneDNN 3.x)
ELTWISE = {
    "relu": ELTWISE_RELU,
    "tanh": 0x21,
    "logistic": 0x29,
    "gelu_tanh": 0x2B,
    "swish": 0x2C,
    "clip_v2": 0x2F,
    "gelu_erf": 0x31,
    "hardswish": 0x34,
}

_UNARY = {
    UnaryOp.SILU: ("swish", 1.0, 0.0),
    UnaryOp.SIGMOID: ("logistic", 0.0, 0.0),
    UnaryOp.TANH: ("tanh", 0.0, 0.0),
    UnaryOp.GELU: ("gelu_erf", 0.0, 0.0),
    UnaryOp.GELU_TANH: ("gelu_tanh", 0.0, 0.0),
}


@dataclass(frozen=True, slots=True)
class Folded:
    """An elementwise step computed by convolution `into`'s epilogue: nothing to run."""

    into: int
    original: st.Step

    def reads(self) -> tuple[StridedView, ...]:
        return ()

    def writes(self) -> tuple[StridedView, ...]:
        return ()

    def describe(self) -> str:
        return f"folded into step {self.into}: {self.original.describe()}"


def _const(p: Program, i: int) -> float | None:
    ins = p.instrs[i]
    return float(ins.value) if isinstance(ins, Const) else None


def _other(ins: Bin, i: int) -> int | None:
    """The operand of binary `ins` that is not instruction `i` (None: neither is)."""
    return ins.b if ins.a == i else ins.a if ins.b == i else None


def _scaled_shifted(p: Program, i: int) -> tuple[float, float] | None:
    """(a, b) when instruction i is a·x + b of the loaded x (either operand order)."""
    add = p.instrs[i]
    if not (isinstance(add, Bin) and add.op is BinaryOp.ADD):
        return None
    for mul_i, c_i in ((add.a, add.b), (add.b, add.a)):
        mul, b = p.instrs[mul_i], _const(p, c_i)
        if isinstance(mul, Bin) and mul.op is BinaryOp.MUL and b is not None:
            c = _other(mul, 0)
            a = None if c is None else _const(p, c)
            if a is not None:
                return a, b
    return None


def _hard_swish(p: Program) -> tuple[PostOp, ...] | None:
    """x · clamp(a·x + b, 0, 1) (ONNX HardSwish: a = 1/6, b = 1/2; MobileNetV3, PP-LCNet) as
    oneDNN's hardswish eltwise, or None."""
    root = p.instrs[p.roots[0]]
    if not (isinstance(root, Bin) and root.op is BinaryOp.MUL):
        return None
    cur = _other(root, 0)
    bounds: dict[BinaryOp, float] = {}
    while cur is not None and isinstance(ins := p.instrs[cur], Bin) and ins.op in _CLAMPS:
        if ins.op in bounds:
            return None
        for inner, c_i in ((ins.a, ins.b), (ins.b, ins.a)):
            c = _const(p, c_i)
            if c is not None:
                bounds[ins.op], cur = c, inner
                break
        else:
            return None
    if cur is None or bounds != {BinaryOp.MAX: 0.0, BinaryOp.MIN: 1.0}:
        return None
    ab = _scaled_shifted(p, cur)
    return None if ab is None else ((ELTWISE["hardswish"], ab[0], ab[1]),)


_CLAMPS = (BinaryOp.MAX, BinaryOp.MIN)


def post_ops(p: Program) -> tuple[PostOp, ...] | None:
    """The program as oneDNN eltwise post-ops, or None: one Load, then a chain of recognised
    unary ops and clamps (max/min against constants) ending at the single root, or a
    hard-swish."""
    if len(p.roots) != 1 or not isinstance(p.instrs[0], Load) or p.instrs[0].arg != 0:
        return None
    if any(isinstance(ins, Load) for ins in p.instrs[1:]):
        return None
    swish = _hard_swish(p)
    if swish is not None:
        return swish
    out: list[PostOp] = []
    cur = 0
    lo, hi = -math.inf, math.inf
    clamp_open = False

    def close_clamp() -> None:
        nonlocal lo, hi, clamp_open
        if clamp_open:
            if lo == 0.0 and hi == math.inf:
                out.append((ELTWISE["relu"], 0.0, 0.0))
            else:
                out.append((ELTWISE["clip_v2"], lo, hi))
        lo, hi, clamp_open = -math.inf, math.inf, False

    for k, ins in enumerate(p.instrs[1:], start=1):
        if isinstance(ins, Const):
            continue
        if isinstance(ins, Un) and ins.x == cur and ins.op in _UNARY:
            close_clamp()
            name, a, b = _UNARY[ins.op]
            out.append((ELTWISE[name], a, b))
        elif isinstance(ins, Bin) and ins.op in (BinaryOp.MAX, BinaryOp.MIN):
            other = ins.b if ins.a == cur else ins.a if ins.b == cur else None
            c = None if other is None else _const(p, other)
            if c is None or math.isnan(c):
                return None
            clamp_open = True
            if ins.op is BinaryOp.MAX:
                lo = max(lo, c)
                hi = max(hi, c)
            else:
                hi = min(hi, c)
                lo = min(lo, c)
        else:
            return None
        cur = k
    close_clamp()
    if cur != p.roots[0] or not out:
        return None
    return tuple(out)


_AGREES: dict[tuple[tuple[PostOp, ...], DType], bool] = {}
_TOLERANCE = {DType.F32: (1e-5, 1e-6), DType.F16: (2e-3, 1e-3)}  # rtol, atol


def agrees(program: Program, ops: tuple[PostOp, ...], dtype: DType) -> bool:
    """Whether oneDNN's eltwise post-ops `ops` compute what `program` (the activation step they
    would replace) computes, on this machine: NaN where the reference has NaN, the same
    infinities, finite values within the kernels' accuracy, over the special values of
    `onednn.probe_post_ops`. Asked once per process, chain and dtype (a few milliseconds); False
    when the probe cannot run. Equal chains are equal functions (`post_ops`), so the first
    program seen answers for all."""
    key = (ops, dtype)
    hit = _AGREES.get(key)
    if hit is None:
        hit = _AGREES[key] = _probe_agrees(program, ops, dtype)
    return hit


def relu_agrees(dtype: DType) -> bool:
    """Whether the convolution's own ReLU (`st.Conv.relu`, the planner's conv fusion, which
    `onednn` runs as an eltwise relu post-op) keeps NaN here, as `agrees` asks it of a folded
    one."""
    relu = Program((Load(0, dtype), Const(0.0, dtype), Bin(BinaryOp.MAX, 0, 1, dtype)), (2,))
    return agrees(relu, ((ELTWISE["relu"], 0.0, 0.0),), dtype)


def _probe_agrees(program: Program, ops: tuple[PostOp, ...], dtype: DType) -> bool:
    probes = onednn.probe_post_ops(ops, dtype)
    if probes is None or dtype not in _TOLERANCE:
        return False
    rtol, atol = _TOLERANCE[dtype]
    for t, y in probes:
        want = eval_program(program, [t], [])[program.roots[0]].astype(dtype.np)
        nan = np.isnan(want)
        if (nan != np.isnan(y)).any():
            return False
        with np.errstate(all="ignore"):
            if not np.isclose(y[~nan], want[~nan], rtol=rtol, atol=atol).all():
                return False  # np.isclose: infinities must be equal
    return True


def _overlap(a: StridedView, b: StridedView) -> bool:
    (alo, ahi), (blo, bhi) = a.byte_extent(), b.byte_extent()
    return alo < bhi and blo < ahi


def fold_activations(
    steps: Sequence[st.Step],
    outputs: Sequence[StridedView],
    candidates: Collection[int],
    scratch: int | None = None,
) -> tuple[list[st.Step | Folded], dict[int, tuple[PostOp, ...]], int]:
    """The steps with every foldable activation folded into the convolution before it
    (`candidates`: the conv steps oneDNN will run), the post-ops of each such convolution, and
    the scratch bytes used past offset `scratch` (64-byte aligned; None: use none).

    Where y takes the bytes of the convolution's own input (the planner's ping-pong of two
    buffers), the result goes to a scratch slot instead and the steps that read y while it
    lives read it there; slots are reused once their tensor is dead."""
    out: list[st.Step | Folded] = list(steps)
    posts: dict[int, tuple[PostOp, ...]] = {}
    slots: list[tuple[int, int, int]] = []  # (offset, bytes, last step reading it)
    top = 0
    for k in sorted(candidates):
        conv, nxt = out[k], out[k + 1] if k + 1 < len(out) else None
        if not isinstance(conv, st.Conv) or not isinstance(nxt, st.Elementwise):
            continue
        if not is_flat(nxt) or len(nxt.inputs) != 1 or len(nxt.outputs) != 1:
            continue
        t, y = conv.out, nxt.outputs[0]
        if not t.is_dense() or nxt.inputs[0].byte_extent() != t.byte_extent():
            continue
        if y.dtype is not t.dtype or y.numel != t.numel:
            continue
        ops = post_ops(nxt.program)
        if ops is None or not _dead_after(out, outputs, k + 1, t):
            continue
        if not agrees(nxt.program, ops, t.dtype):  # last: the first ask runs oneDNN
            continue
        if y.byte_extent() == t.byte_extent() or not any(_overlap(y, r) for r in conv.reads()):
            out[k] = dataclasses.replace(conv, out=StridedView.dense(y.offset, t.shape, t.dtype))
        else:  # y takes the bytes of the conv's input: it lives in a scratch slot instead
            if scratch is None:
                continue
            size = -(-t.nbytes // 64) * 64
            free = [o for o, b, last in slots if last < k and b >= size]
            off = free[0] if free else scratch + top
            moved = _moved(out, outputs, k + 1, y, off)
            if moved is None:
                continue
            later, last = moved
            out[k + 2 :] = later
            out[k] = dataclasses.replace(conv, out=StridedView.dense(off, t.shape, t.dtype))
            if free:
                slots = [(o, b, last if o == off else e) for o, b, e in slots]
            else:
                slots.append((off, size, last))
                top += size
        out[k + 1] = Folded(k, nxt)
        posts[k] = ops
    return out, posts, top


def _moved(
    steps: Sequence[st.Step | Folded],
    outputs: Sequence[StridedView],
    j: int,
    y: StridedView,
    offset: int,
) -> tuple[list[st.Step | Folded], int] | None:
    """The steps after j with every read of y moved to `offset` (a scratch slot no plan step
    touches), and the last step that reads it there; None when that is not sound: y is a plan
    output, a step reads y through a view not inside it, updates it in place or overwrites
    part of it while it lives."""
    ylo, yhi = y.byte_extent()
    shift = offset - y.offset

    def inside(v: StridedView) -> bool:
        lo, hi = v.byte_extent()
        return ylo <= lo and hi <= yhi

    out: list[st.Step | Folded] = []
    alive, last = True, j
    for i, s in enumerate(steps[j + 1 :], start=j + 1):
        if not alive or isinstance(s, Folded):
            out.append(s)
            continue
        reads = [r for r in s.reads() if _overlap(r, y)]
        if any(not inside(r) for r in reads):
            return None
        writes = s.writes()
        ends = any(w.byte_extent()[0] <= ylo and yhi <= w.byte_extent()[1] for w in writes)
        if any(_overlap(w, y) for w in writes) and not ends and not reads:
            # partly overwritten: fine once nothing reads the rest of y (it is dead here)
            ends = _dead_after(steps, outputs, i - 1, y)  # type: ignore[arg-type]
        if any(_overlap(w, y) for w in writes) and (reads or not ends):
            return None  # y updated in place, or partly overwritten while it lives
        if reads:
            moved = {r: r.with_offset(r.offset + shift) for r in reads}
            s = st.map_views(s, lambda v, m=moved: m.get(v, v))  # type: ignore[arg-type,assignment,misc]
            last = i
        out.append(s)
        alive = not ends
    if alive and any(_overlap(o, y) for o in outputs):
        return None
    return out, last


def _dead_after(
    steps: Sequence[st.Step], outputs: Sequence[StridedView], j: int, t: StridedView
) -> bool:
    """Nothing after step j reads t's bytes before they are written again, and t is no plan
    output."""
    left = [t.byte_extent()]  # bytes of t not yet written again
    for s in steps[j + 1 :]:
        for r in s.reads():
            rlo, rhi = r.byte_extent()
            if any(a < rhi and rlo < b for a, b in left):
                return False
        for w in s.writes():
            wlo, whi = w.byte_extent()
            left = [q for a, b in left for q in ((a, min(b, wlo)), (max(a, whi), b)) if q[0] < q[1]]
        if not left:
            return True
    return not any(
        a < o.byte_extent()[1] and o.byte_extent()[0] < b for o in outputs for a, b in left
    )
