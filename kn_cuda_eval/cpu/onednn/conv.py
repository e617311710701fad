"""Convolution steps as oneDNN primitives: the descriptor (`conv_desc`: the activation layouts
oneDNN chooses, which the executor's layout pass compares), and the runner over the arena
(`conv_runner`: weights packed once, activations reordered where they are stored otherwise,
residual, bias and folded activations as post-ops) — the CPU counterpart of
`kn_cuda_eval.cuda.device.conv`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from kn_cuda_eval.cpu.onednn.lib import (
    ARG_BIAS,
    ARG_DST,
    ARG_FROM,
    ARG_POST_OP_BASE,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_SRC_1,
    ARG_TO,
    ARG_WEIGHTS,
    CONVOLUTION_DIRECT,
    DATA_TYPES,
    FORMAT_TAG_ANY,
    FORWARD_INFERENCE,
    MEMORY_ALLOCATE,
    QUERY_DST_MD,
    QUERY_SRC_MD,
    QUERY_WEIGHTS_MD,
    DnnlLib,
    available,
    engine,
)
from kn_cuda_eval.cpu.onednn.memory import (
    Owner,
    Packing,
    Workspace,
    dnnl_dims,
    impl_name,
    md_strides,
)
from kn_cuda_eval.cpu.onednn.postops import (
    ELTWISE_RELU,
    PostOp,
    PostOpCall,
    binary_add,
    eltwise,
    sum_into,
)
from kn_cuda_eval.cpu.onednn.runner import (
    Call,
    Runner,
    arena_base,
    build_owned,
    exec_args,
    pack,
)
from kn_cuda_eval.cpu.onednn.threads import omp_thread_setter, thread_count
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView

__all__ = [
    "ROLES",
    "ConvDesc",
    "Layout",
    "auto_layout",
    "conv_desc",
    "conv_runner",
    "right_padding",
]

log = logging.getLogger(__name__)

# activation layouts by tensor rank (dnnl_format_tag_t values, stable across oneDNN 3.x)
_TAGS = {
    "nhwc": {3: 15, 4: 22, 5: 33},  # dnnl_acb, dnnl_acdb, dnnl_acdeb: channels last
    "c16": {3: 56, 4: 78, 5: 121},  # dnnl_aBc16b, dnnl_aBcd16b (nChw16c), dnnl_aBcde16b
    "c8": {3: 69, 4: 102, 5: 142},  # dnnl_aBc8b, dnnl_aBcd8b (nChw8c), dnnl_aBcde8b
}


def _plain(v: StridedView) -> bool:
    return v.numel > 0 and all(s > 0 or d == 1 for d, s in zip(v.shape, v.strides, strict=True))


class Layout:
    """An activation layout a convolution chose (oneDNN's memory descriptor, e.g. nChw16c), as
    the executor's layout pass compares them: equal layouts (`dnnl_memory_desc_equal`) let one
    convolution's output feed the next as stored, with no reorder. `blocked`: not the plain
    NC(D)HW of the view; `dense`: exactly as many bytes as the plain tensor (no channel padding),
    so it fits the arena region the planner gave the view."""

    def __init__(
        self, lib: DnnlLib, md: int, plain_md: int, view: StridedView, channels_last: bool
    ) -> None:
        self._lib, self.md = lib, md
        self.blocked = not lib.fns["dnnl_memory_desc_equal"](md, plain_md)
        size = int(lib.fns["dnnl_memory_desc_get_size"](md))
        self.dense = view.is_dense() and size == view.nbytes
        rank = len(view.shape)
        self.order: tuple[int, ...] | None = (
            (0, *range(2, rank), 1) if channels_last and self.blocked else None
        )
        """The logical axes outermost first when the layout is channels-last (a permutation
        the other steps can read through strides), else None."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and bool(
            self._lib.fns["dnnl_memory_desc_equal"](self.md, other.md)
        )

    def __hash__(self) -> int:  # equality is oneDNN's; all layouts share one bucket
        return 0


class ConvDesc:
    """A convolution step's oneDNN primitive descriptor before its runner: `src` and `dst` are
    the activation layouts it chose. `conv_desc` makes it, `conv_runner(desc=...)` consumes it
    (and its oneDNN objects); `close()` frees an unused one."""

    def __init__(
        self,
        step: st.Conv,
        lib: DnnlLib,
        owner: Owner,
        dt: int,
        layout: str,
        parts: tuple[int, int, int, int],
    ) -> None:
        self.step, self.lib, self.owner, self.dt, self.layout = step, lib, owner, dt, layout
        self.pd, self.x_md, self.out_md, self.w_plain = parts
        q = lib.fns["dnnl_primitive_desc_query_md"]
        self.src_md = q(self.pd, QUERY_SRC_MD, 0)
        self.w_md = q(self.pd, QUERY_WEIGHTS_MD, 0)
        self.dst_md = q(self.pd, QUERY_DST_MD, 0)
        nhwc = layout == "nhwc"  # forced: the primitive takes exactly the channels-last tag
        self.src = Layout(lib, self.src_md, self.x_md, step.x, nhwc)
        self.dst = Layout(lib, self.dst_md, self.out_md, step.out, nhwc)
        self.res_md: int | None = None
        """The residual's descriptor when a binary add post-op reads it (else a `sum`)."""

    def close(self) -> None:
        self.owner.close()


def _pointwise(s: st.Conv) -> bool:
    return (
        all(k == 1 for k in s.w.shape[2:])
        and all(x == 1 for x in s.stride)
        and s.groups == 1
        and not any(s.padding)
    )


def auto_layout(step: st.Conv) -> str:
    """The measured pick for a convolution whose activations are plain on both sides
    (benchmarks/onednn_steps.py --layouts, 2 threads, AVX-512): "plain" for a pointwise
    convolution without a residual (1x1, stride 1, no padding, one group) — oneDNN's
    `gemm:jit` on NCHW is one GEMM per image there and beat the blocked path by 1.5-1.8x,
    reorders included — and "blocked" for everything else: 3x3, strided, grouped and depthwise
    convolutions (its brgemm kernels were 1.4-4x faster than plain), and pointwise ones with a
    residual, where `gemm:jit` applies the `sum` post-op 5-14x slower than `brgconv_1x1`
    (ResNet-50's 1x1 64→256 at 56²: 7.4 ms vs 1.4 ms)."""
    return "plain" if _pointwise(step) and step.residual is None else "blocked"


def conv_desc(
    step: st.Conv, threads: int, layout: str = "blocked", post: Sequence[PostOp] = ()
) -> ConvDesc | None:
    """The primitive descriptor of `step` ("blocked": oneDNN chooses the activation layouts;
    "plain": the views' NC(D)HW; "nhwc", "c16", "c8": that layout), or None when oneDNN cannot
    run it exactly (F64, negative or zero strides, empty tensors, an unimplemented case).
    `post`: eltwise post-ops (alg kind, alpha, beta) applied last (an activation folded into
    the convolution, `kn_cuda_eval.cpu.passes.fuse`)."""
    x, w, out = step.x, step.w, step.out
    dt = DATA_TYPES.get(out.dtype)
    views = [v for v in (x, w, step.bias, step.residual, out) if v is not None]
    if dt is None or any(v.dtype is not out.dtype or not _plain(v) for v in views):
        return None
    if layout not in ("blocked", "plain", *_TAGS):
        raise ValueError(f"conv_desc: layout {layout!r} is not 'blocked', 'plain' or in {_TAGS}")
    if layout in _TAGS and len(x.shape) not in _TAGS[layout]:
        return None
    if available() is not None:  # before binding OpenMP: that loads oneDNN's libgomp
        return None
    omp_thread_setter()(thread_count(threads))
    return build_owned(step, lambda lib, o: _conv_desc(lib, o, step, dt, layout, tuple(post)))


ROLES = ("x", "residual", "out")  # the activations a convolution may read or write blocked


def conv_runner(
    step: st.Conv,
    arena: np.ndarray,
    threads: int,
    *,
    layout: str = "auto",
    constant_weights: bool = True,
    desc: ConvDesc | None = None,
    blocked: frozenset[str] = frozenset(),
    post: Sequence[PostOp] = (),
    workspace: Workspace | None = None,
    packing: Packing | None = None,
) -> Runner | None:
    """A oneDNN convolution for `step` over `arena`, or None when oneDNN cannot run it exactly
    (see `conv_desc`): then the caller runs `emulate_step` for it.

    out = relu?(conv(x, w) + bias + residual): bias is the convolution's bias argument, the
    residual a `sum` post-op (it is first copied into the destination), relu an `eltwise`
    post-op. Groups make the weights 5-d/6-d [g, K/g, C/g, *k]; oneDNN's dilation is ours - 1.
    `constant_weights` (the default): the weights are read **once, here**, into oneDNN's
    preferred layout, as for plan constants — `arena` must then hold the constants already (as
    `load_arena` and the executor do); False reorders them at every run (weights computed by an
    earlier step).
    `layout`: "blocked" lets oneDNN choose the activation layouts, "plain" runs on the arena's
    NC(D)HW views directly, "auto" (the default) is `auto_layout`'s measured pick. `desc`: a
    descriptor from `conv_desc` to use (and own) instead of making one.
    `blocked` (roles of `ROLES`, with a "blocked" descriptor): those activations are stored in
    the arena in the descriptor's own layout (`desc.src` for x, `desc.dst` for the residual and
    out) at the views' offsets — the executor's layout pass keeps a chain of convolutions in
    oneDNN's layout that way. The others are plain views: x (and the residual) are reordered
    into the chosen layout through buffers allocated here, and the result back.
    `post`: eltwise post-ops after everything else (see `conv_desc`; a `desc` has its own).
    `workspace`: where its scratchpad and reorder buffers live (shared with the executor's
    other runners; `Workspace.bind` before the first run), else allocated for it alone.
    `packing`: with constant weights, where packed weights are shared (`PackedWeights`)."""
    if desc is None:
        lay = auto_layout(step) if layout == "auto" else layout
        desc = conv_desc(step, threads, lay, post)
        if desc is None:
            return None
    if not set(blocked) <= set(ROLES):
        raise ValueError(f"conv_runner: blocked roles {sorted(blocked)} are not among {ROLES}")
    if blocked and desc.layout == "plain":
        raise ValueError("conv_runner: blocked activations need a descriptor that is not plain")
    if "residual" in blocked and step.residual is None:
        raise ValueError("conv_runner: a blocked residual on a convolution without one")
    n = thread_count(threads)
    d = desc
    return build_owned(
        step,
        lambda lib, o: _conv_runner(d, arena, n, constant_weights, blocked, workspace, packing),
        d.owner,
    )


def _conv_desc(
    lib: DnnlLib, o: Owner, s: st.Conv, dt: int, layout: str, acts: tuple[PostOp, ...]
) -> ConvDesc | None:
    g = s.groups
    k_out = s.w.shape[0]
    if g == 1:
        wdims, wstr = list(s.w.shape), list(s.w.strides)
    else:
        wdims = [g, k_out // g, *s.w.shape[1:]]
        wstr = [k_out // g * s.w.strides[0], *s.w.strides]
    x_md = o.md(s.x.shape, dt, md_strides(s.x.shape, s.x.strides))
    out_md = o.md(s.out.shape, dt, md_strides(s.out.shape, s.out.strides))
    w_plain = o.md(wdims, dt, md_strides(wdims, wstr))
    bias_md = None if s.bias is None else o.md(s.bias.shape, dt, md_strides(s.bias.shape, [1]))
    post: list[PostOpCall] = []
    res_md = None
    if s.residual is not None and layout != "blocked" and not _overlaps(s.residual, s.out):
        # the residual read by a binary add post-op, in the destination's layout: a `sum`
        # needs it copied into the destination first, one more pass over it (ResNet-50's
        # 1x1 convolutions with a residual ran 1.15-1.5x onnxruntime's)
        res_md = (
            o.tag(s.residual.shape, dt, _TAGS[layout][len(s.x.shape)])
            if layout in _TAGS
            else o.md(s.residual.shape, dt, md_strides(s.residual.shape, s.residual.strides))
        )
        post.append(binary_add(res_md))
    elif s.residual is not None:
        post.append(sum_into(1.0))
    if s.relu:
        post.append(eltwise(ELTWISE_RELU, 0.0, 0.0))
    post += [eltwise(a, al, be) for a, al, be in acts]
    attr = o.attr(post)
    if layout == "plain":
        src_q, dst_q = x_md, out_md
    else:
        tag = FORMAT_TAG_ANY if layout == "blocked" else _TAGS[layout][len(s.x.shape)]
        src_q, dst_q = o.tag(s.x.shape, dt, tag), o.tag(s.out.shape, dt, tag)
    w_any = o.md(wdims, dt, None)
    pad_r = right_padding(s)
    pd = o.pd(
        "dnnl_convolution_forward_primitive_desc_create",
        engine()[0],
        FORWARD_INFERENCE,
        CONVOLUTION_DIRECT,
        src_q,
        w_any,
        bias_md,
        dst_q,
        dnnl_dims(s.stride),
        dnnl_dims([d - 1 for d in s.dilation]),
        dnnl_dims(s.padding),
        dnnl_dims(pad_r),
        attr,
    )
    if pd is None:
        log.debug("oneDNN has no convolution for %s", s.describe())
        o.close()
        return None
    if layout in _TAGS and impl_name(lib, pd).startswith("ref"):
        log.debug("oneDNN has only its reference convolution in %s for %s", layout, s.describe())
        o.close()  # a forced layout the fast kernels do not take: 100-1000x slower
        return None
    d = ConvDesc(s, lib, o, dt, layout, (pd, x_md, out_md, w_plain))
    d.res_md = res_md
    return d


def right_padding(s: st.Conv | st.IntConv) -> list[int]:
    """oneDNN's padding_r: what the output size implies past the input's right end (our steps
    pad symmetrically; a window the stride skips leaves less)."""
    spatial_in, spatial_out, ks = s.x.shape[2:], s.out.shape[2:], s.w.shape[2:]
    return [
        (so - 1) * st_ + (k - 1) * d + 1 - si - p
        for si, so, k, st_, d, p in zip(
            spatial_in, spatial_out, ks, s.stride, s.dilation, s.padding, strict=True
        )
    ]


def _overlaps(a: StridedView, b: StridedView) -> bool:
    alo, ahi = a.byte_extent()
    blo, bhi = b.byte_extent()
    return alo < bhi and blo < ahi


def _conv_runner(
    d: ConvDesc,
    arena: np.ndarray,
    threads: int,
    constant_weights: bool,
    blocked: frozenset[str],
    ws: Workspace | None,
    packing: Packing | None = None,
) -> Runner:
    """The runner of descriptor `d` (its objects move to the runner's owner)."""
    lib, s, dt = d.lib, d.step, d.dt
    o = d.owner
    base = arena_base(arena)
    omp_thread_setter()(threads)
    if ws is not None:
        ws.begin()
    conv, spad = o.primitive(d.pd, ws)
    x_md = d.src_md if "x" in blocked else d.x_md
    out_md = d.dst_md if "out" in blocked else d.out_md
    x_mem = o.memory(x_md, base + s.x.offset)
    out_mem = o.memory(out_md, base + s.out.offset)
    views = [(x_mem, s.x.offset), (out_mem, s.out.offset)]
    # the weights into the layout the convolution chose: once, or at every run
    w_src = o.memory(d.w_plain, base + s.w.offset)
    calls: list[Call] = []
    if constant_weights:
        w_mem = pack(o, d.w_plain, d.w_md, w_src, s, packing)
    else:
        w_mem = o.memory(d.w_md, MEMORY_ALLOCATE)
        calls.append(
            (o.reorder(d.w_plain, d.w_md), exec_args([(ARG_FROM, w_src), (ARG_TO, w_mem)]))
        )
        views.append((w_src, s.w.offset))
    equal = lib.fns["dnnl_memory_desc_equal"]
    post_args: list[tuple[int, int | None]] = []
    src_mem, dst_mem = x_mem, out_mem
    if not equal(d.src_md, x_md):
        src_mem = o.scratch(d.src_md, ws)
        calls.append((o.reorder(x_md, d.src_md), exec_args([(ARG_FROM, x_mem), (ARG_TO, src_mem)])))
    if not equal(d.dst_md, out_md):
        dst_mem = o.scratch(d.dst_md, ws)
    if s.residual is not None:
        res_md = (
            d.dst_md
            if "residual" in blocked
            else o.md(s.residual.shape, dt, md_strides(s.residual.shape, s.residual.strides))
        )
        res_mem = o.memory(res_md, base + s.residual.offset)
        views.append((res_mem, s.residual.offset))
        if d.res_md is None:  # `sum`: the residual is first copied into the destination
            fill = o.reorder(res_md, d.dst_md)
            calls.append((fill, exec_args([(ARG_FROM, res_mem), (ARG_TO, dst_mem)])))
        else:  # the binary post-op reads it, reordered first when it is not stored so
            if not equal(res_md, d.res_md):
                src1 = o.scratch(d.res_md, ws)
                into = o.reorder(res_md, d.res_md)
                calls.append((into, exec_args([(ARG_FROM, res_mem), (ARG_TO, src1)])))
                res_mem = src1
            post_args = [(ARG_POST_OP_BASE | ARG_SRC_1, res_mem)]  # post-op 0: the add
    bias_mem = None
    if s.bias is not None:
        bias_md = o.md(s.bias.shape, dt, md_strides(s.bias.shape, [1]))
        bias_mem = o.memory(bias_md, base + s.bias.offset)
        views.append((bias_mem, s.bias.offset))
    conv_args = [
        (ARG_SRC, src_mem),
        (ARG_WEIGHTS, w_mem),
        (ARG_BIAS, bias_mem),
        (ARG_DST, dst_mem),
        (ARG_SCRATCHPAD, spad),
        *post_args,
    ]
    calls.append((conv, exec_args(conv_args)))
    if dst_mem != out_mem:
        back = o.reorder(d.dst_md, out_md)
        calls.append((back, exec_args([(ARG_FROM, dst_mem), (ARG_TO, out_mem)])))
    return Runner(s, arena, o, calls, views, threads, impl_name(lib, d.pd))
