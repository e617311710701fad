"""The plan's integer steps (`st.IntMatMul`, `st.IntConv`) as oneDNN int8 primitives: source u8
or s8, weights s8, destination s32, the source's zero point a runtime zero point (an s32 argument,
converted from the arena's 8-bit element by a one-element reorder), constant weights shifted by
their zero point once, here (w - w_zero as s8: u8 weights with zero point 128 become s8 that way,
and a per-column or per-filter zero point folds in), then packed into the primitive's layout.

Exactness is the rule; speed comes second. oneDNN's int8 kernels on x86 without VNNI (AVX2,
AVX-512 before Cascade Lake) multiply u8·s8 with `vpmaddubsw`, which adds each *pair* of
products in saturating int16 before the int32 sum (an s8 source is shifted by +128 into u8
first, so it is the same case). With u8 sources up to 255 a pair stays within int16 exactly when
every weight lies in [-64, 64]: 2·255·64 = 32640 <= 32767, while 2·255·65 = 33150 clips (measured
with oneDNN 3.2, `gemm:jit` and the brgemm/jit convolutions, on an AVX2 EPYC:
tests/kn_cuda_eval/cpu/test_int8_steps.py). With VNNI (`vpdpbusd`: avx2_vnni, avx512_core_vnni
and up, AMX) each product is accumulated in int32 and every s8 weight is exact. So a runner is
built only when:

- oneDNN reports a VNNI ISA (`lib.has_vnni`: `dnnl_get_effective_cpu_isa` in `lib.VNNI_ISAS`), or
  the shifted constant weights all lie in [-SAFE_WEIGHT, SAFE_WEIGHT] (7-bit weights, what
  onnxruntime's `reduce_range` quantizers make for this very reason);
- the weights are constants (shifted here) or, computed at run time, s8 with a zero point of 0
  on a VNNI machine (unshifted, unbounded);
- the shifted weights fit s8 (an s8 weight minus a nonzero zero point may not);
- the source's zero point is one value (per tensor; a per-row one has no oneDNN form).

A convolution's s8 source enters as u8 (+128, and +128 on its zero point), shifted in the
arena's plain layout and then reordered into the primitive's (one reorder with a destination
zero point straight into a blocked layout is wrong on 2 threads when the channels do not fill a
block: `conv_enabled`): oneDNN 3.2's s8-source convolutions without VNNI halve
the weights to stay clear of saturation and double the sum back, which loses odd weights'
lowest bit (measured: every output even, and wrong); its u8 ones are exact under the rule
above. The matmul (`gemm:jit`) takes s8 sources exactly as they are.

Otherwise the factory returns None and the executor runs the emulator's exact float64 step
(`kn_cuda_eval.planning.emulator`: BLAS dgemm for the matmul, im2col for the convolution).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kn_cuda_eval.cpu.onednn.conv import right_padding
from kn_cuda_eval.cpu.onednn.gemm import operand_desc
from kn_cuda_eval.cpu.onednn.lib import (
    ARG_ATTR_ZERO_POINTS,
    ARG_DST,
    ARG_FROM,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_TO,
    ARG_WEIGHTS,
    CONVOLUTION_DIRECT,
    DT_S8,
    DT_S32,
    DT_U8,
    FORMAT_TAG_ANY,
    FORWARD_INFERENCE,
    INT8_TYPES,
    MEMORY_ALLOCATE,
    QUERY_DST_MD,
    QUERY_SRC_MD,
    QUERY_WEIGHTS_MD,
    UNIMPLEMENTED,
    DnnlLib,
    OnednnError,
    available,
    engine,
    has_vnni,
)
from kn_cuda_eval.cpu.onednn.memory import Owner, Workspace, dnnl_dims, impl_name, md_strides
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
from kn_cuda_eval.planning.emulator import view_array
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = [
    "INT_CONV_LAYOUTS",
    "SAFE_WEIGHT",
    "ChannelsLast",
    "Constants",
    "IntConvFormats",
    "conv_enabled",
    "exact_weights",
    "int_conv_formats",
    "int_conv_runner",
    "int_matmul_runner",
    "source_shift",
]

log = logging.getLogger(__name__)

SAFE_WEIGHT = 64
"""The largest |weight| oneDNN's int8 products sum exactly without VNNI (module docstring)."""

INT_CONV_LAYOUTS = ("auto", "nhwc", "blocked")
"""`int_conv_runner`'s activation layouts, both reordered from and back to the arena's NC(D)HW:
"nhwc" channels last, "blocked" oneDNN's pick; "auto" the measured pick (`_auto_layout`). Not
the plain NC(D)HW: oneDNN 3.2 has only its reference int8 convolution there (measured), exact
but 100-1000x slower than the emulator's."""

_NHWC = {3: 15, 4: 22, 5: 33}  # dnnl_acb, dnnl_acdb, dnnl_acdeb (dnnl_format_tag_t)

Weights = np.ndarray | StridedView
"""Shifted constant weights (s8, dense) or the arena's run-time s8 weights as they are."""


def exact_weights(shifted: np.ndarray) -> bool:
    """Whether oneDNN sums products with these s8 weights exactly on this CPU (VNNI, or every
    weight within `SAFE_WEIGHT`)."""
    return shifted.size == 0 or bool(has_vnni()) or int(np.abs(shifted).max()) <= SAFE_WEIGHT


class Constants:
    """The values of the plan's constants, read from the plan (the arena may not hold them yet
    when a runner is built: the executor copies the constants the planner made for a binding
    in just before it runs)."""

    def __init__(self, constants: Sequence[tuple[int, np.ndarray]], const_size: int) -> None:
        self._spans = sorted((off, data) for off, data in constants)
        self.size = const_size

    def holds(self, v: StridedView) -> bool:
        return v.byte_extent()[1] <= self.size

    def get(self, v: StridedView) -> np.ndarray | None:
        """The values of view `v` when it lies in one constant, else None."""
        lo, hi = v.byte_extent()
        for off, data in self._spans:
            if off <= lo and hi <= off + data.nbytes:
                flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
                return view_array(flat, v.with_offset(v.offset - off))
        return None


def _one_value(v: StridedView, consts: Constants) -> bool:
    """Whether a zero-point view holds one value: one element stretched by zero strides, or a
    constant whose elements are all equal."""
    if all(s == 0 or d == 1 for d, s in zip(v.shape, v.strides, strict=True)):
        return True
    a = consts.get(v)
    return a is not None and bool((a == a.reshape(-1)[0]).all())


def _weights(
    w: StridedView, zero: StridedView, zero_shape: Sequence[int], consts: Constants
) -> Weights | None:
    """What the primitive multiplies by (see `Weights`), or None when no oneDNN product of
    them is exact here (module docstring)."""
    zv = consts.get(zero)
    if zv is None:
        return None
    z = zv.astype(np.int16).reshape(tuple(zero_shape))
    wv = consts.get(w)
    if wv is not None:
        shifted = wv.astype(np.int16) - z
        if shifted.size and (shifted.min() < -128 or shifted.max() > 127):
            return None
        if not exact_weights(shifted):
            return None
        return np.ascontiguousarray(shifted.astype(np.int8))
    if w.dtype is DType.I8 and not consts.holds(w) and not z.any() and has_vnni():
        return w
    return None


def _source_zero(
    o: Owner, arena: np.ndarray, zero: StridedView, consts: Constants, shift: int = 0
) -> tuple[int, list[Call], list[tuple[int, int]]] | None:
    """The source's zero point plus `shift` as oneDNN takes it, an s32 memory: a constant's
    value set once, here (None for 0: no zero point at all), else converted from the arena's
    8-bit element by a reorder call at every run (returned with the arena view it reads)."""
    dst_md = o.md([1], DT_S32, [1])
    value = consts.get(zero)
    if value is not None:
        z = int(value.reshape(-1)[0]) + shift
        return None if z == 0 else (_held(o, z), [], [])
    src_md = o.md([1], INT8_TYPES[zero.dtype], [1])
    src = o.memory(src_md, arena_base(arena) + zero.offset)
    dst = o.memory(dst_md, MEMORY_ALLOCATE)
    prim, extra = _shift_reorder(o, src_md, dst_md, shift)
    call = (prim, exec_args([(ARG_FROM, src), (ARG_TO, dst), *extra]))
    return dst, [call], [(src, zero.offset)]


def _held(o: Owner, value: int) -> int:
    """An s32 memory holding `value` (its host array kept by the owner)."""
    held = np.array([value], np.int32)
    o.keep.append(held)
    return o.memory(o.md([1], DT_S32, [1]), int(held.ctypes.data))


def _shift_reorder(
    o: Owner, src_md: int, dst_md: int, shift: int
) -> tuple[int, list[tuple[int, int | None]]]:
    """A reorder adding `shift` to every element (a destination zero point: s8 into u8 by +128,
    exactly) and its extra argument; a plain reorder for 0."""
    if not shift:
        return o.reorder(src_md, dst_md), []
    a = ctypes.c_void_p()
    o.lib.call("dnnl_primitive_attr_create", ctypes.byref(a))
    attr = o.own("dnnl_primitive_attr_destroy", a)
    o.lib.call("dnnl_primitive_attr_set_zero_points_mask", attr, ARG_DST, 0)
    eng = engine()[0]
    pd = o.pd("dnnl_reorder_primitive_desc_create", src_md, eng, dst_md, eng, attr)
    if pd is None:
        raise OnednnError("dnnl_reorder_primitive_desc_create", UNIMPLEMENTED)
    return o.primitive(pd)[0], [(ARG_ATTR_ZERO_POINTS | ARG_DST, _held(o, shift))]


def _zero_attr(o: Owner, zero: tuple[int, list[Call], list[tuple[int, int]]] | None) -> int:
    """Attributes with a common (mask 0) runtime source zero point when there is one."""
    attr = o.attr([])
    if zero is not None:
        o.lib.call("dnnl_primitive_attr_set_zero_points_mask", attr, ARG_SRC, 0)
    return attr


# -- matmul -----------------------------------------------------------------------------------
def int_matmul_runner(
    step: st.IntMatMul,
    arena: np.ndarray,
    threads: int,
    *,
    constants: Constants,
    workspace: Workspace | None = None,
) -> Runner | None:
    """oneDNN's int8 matmul for `step` over `arena` (the plan's `constants`), or None when it would not be exact or oneDNN refuses it (module docstring):
    the caller then runs the emulator's step."""
    s = step
    batch, m, k = s.a.shape
    if batch * m * k * s.b.shape[2] == 0 or available() is not None:
        return None
    if not _one_value(s.a_zero, constants):
        return None
    wei = _weights(s.b, s.b_zero, s.b_zero.shape, constants)
    if wei is None:
        return None
    n = thread_count(threads)
    return build_owned(s, lambda lib, o: _matmul(lib, o, s, arena, n, wei, constants, workspace))


def _matmul(
    lib: DnnlLib,
    o: Owner,
    s: st.IntMatMul,
    arena: np.ndarray,
    threads: int,
    wei: Weights,
    consts: Constants,
    ws: Workspace | None,
) -> Runner | None:
    base = arena_base(arena)
    omp_thread_setter()(threads)
    batch = s.a.shape[0]
    a, out = view_array(arena, s.a), view_array(arena, s.out)
    src_md = operand_desc(o, a, batch, INT8_TYPES[s.a.dtype])
    dst_md = operand_desc(o, out, batch, DT_S32)
    if isinstance(wei, np.ndarray):
        if batch > 1 and s.b.strides[0] == 0 and s.b_zero.strides[0] == 0:
            wei = wei[:1]  # one matrix for every batch (oneDNN broadcasts it)
        dims = list(wei.shape if batch > 1 else wei.shape[1:])
        wei_md: int | None = o.md(dims, DT_S8, md_strides(dims, list(wei.strides[-len(dims) :])))
        wei_q = o.md(dims, DT_S8, None)
    else:
        wei_md = wei_q = operand_desc(o, view_array(arena, wei), batch, DT_S8)
    if src_md is None or dst_md is None or wei_md is None:
        o.close()
        return None
    zero = _source_zero(o, arena, s.a_zero, consts)
    attr = _zero_attr(o, zero)
    pd = o.pd("dnnl_matmul_primitive_desc_create", engine()[0], src_md, wei_q, None, dst_md, attr)
    if pd is None:
        log.debug("oneDNN has no int8 matmul for %s", s.describe())
        o.close()
        return None
    if ws is not None:
        ws.begin()
    prim, spad = o.primitive(pd, ws)
    src_mem, dst_mem = o.memory(src_md, a.ctypes.data), o.memory(dst_md, out.ctypes.data)
    views = [(src_mem, a.ctypes.data - base), (dst_mem, out.ctypes.data - base)]
    if isinstance(wei, np.ndarray):  # packed once into the layout the matmul chose
        packed_md = lib.fns["dnnl_primitive_desc_query_md"](pd, QUERY_WEIGHTS_MD, 0)
        wei_mem = pack(o, wei_md, packed_md, o.memory(wei_md, wei.ctypes.data), s, None)
    else:
        wei_mem = o.memory(wei_md, base + wei.offset)
        views.append((wei_mem, wei.offset))
    calls, zp = _with_zero(zero, views)
    args = [(ARG_SRC, src_mem), (ARG_WEIGHTS, wei_mem), (ARG_DST, dst_mem), (ARG_SCRATCHPAD, spad)]
    calls.append((prim, exec_args([*args, *zp])))
    return Runner(s, arena, o, calls, views, threads, impl_name(lib, pd))


def _with_zero(
    zero: tuple[int, list[Call], list[tuple[int, int]]] | None, views: list[tuple[int, int]]
) -> tuple[list[Call], list[tuple[int, int | None]]]:
    """The calls before the primitive (the zero point's conversion) and its zero-point
    argument; the arena view the conversion reads joins `views`."""
    if zero is None:
        return [], []
    mem, calls, zviews = zero
    views.extend(zviews)
    return list(calls), [(ARG_ATTR_ZERO_POINTS | ARG_SRC, mem)]


# -- convolution ------------------------------------------------------------------------------
def conv_enabled() -> bool:
    """Whether integer convolutions run on oneDNN: yes unless `KN_INT8_CONV=0`. They were opt-in
    for one session: with 2 threads a convolution's output was now and then (AVX2), or always
    (AVX-512 VNNI, 8 channels at 32x32), wrong. The cause was oneDNN 3.2's multi-threaded reorder
    of an s8 NC(D)HW source into a blocked u8 layout with a destination zero point (the +128
    shift) when the channels do not fill the block (8 of 16): `_conv` now shifts in the plain
    layout and reorders into the blocked one without a zero point
    (tests/kn_cuda_eval/cpu/test_int8_steps.py, case "partial block")."""
    return os.environ.get("KN_INT8_CONV", "") != "0"


def _dense(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of `shape`."""
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return out[::-1]


def source_shift(dtype: DType) -> int:
    """What a convolution adds to an 8-bit source before oneDNN takes it: 128 for s8 without
    VNNI (oneDNN's s8-source kernels there halve the weights: inexact, module docstring), else
    0 (u8 sources, and s8 ones where `vpdpbusd` sums every product exactly)."""
    return 128 if dtype is DType.I8 and not has_vnni() else 0


@dataclass(frozen=True)
class ChannelsLast:
    """The activation layout of integer convolutions that chain (`int_conv_formats`): channels
    last, a plain permutation of the logical axes, so the executor's layout pass stores the
    tensors between them that way and rewrites the views of every step that reads or writes
    them (the convolution's own included), with no reorder left for the runner to make."""

    rank: int
    blocked: bool = True
    dense: bool = True

    @property
    def order(self) -> tuple[int, ...]:
        return (0, *range(2, self.rank), 1)


@dataclass(frozen=True)
class IntConvFormats:
    src: ChannelsLast
    dst: ChannelsLast


def int_conv_formats(step: st.IntConv, constants: Constants) -> IntConvFormats | None:
    """Channels-last source and destination for `step` where oneDNN will run it as stored
    (weights exact here, no source shift), else None: the step then reads and writes NC(D)HW.
    oneDNN's fast int8 convolutions (brgconv, jit) take channels last on AVX2 and AVX-512
    alike; where one refuses anyway, the emulator's step reads the same rewritten views."""
    s = step
    if not conv_enabled() or available() is not None or s.x.rank not in _NHWC:
        return None
    if s.out.numel == 0 or source_shift(s.x.dtype):
        return None
    zshape = (s.w.shape[0],) + (1,) * (s.w.rank - 1)
    if _weights(s.w, s.w_zero, zshape, constants) is None:
        return None
    layout = ChannelsLast(s.x.rank)
    return IntConvFormats(layout, layout)


def _channels_last(v: StridedView) -> bool:
    """Whether view `v` (N, C, spatial) is stored densely channels last."""
    order = (0, *range(2, v.rank), 1)
    dense = _dense([v.shape[d] for d in order])
    nhwc = [0] * v.rank
    for d, t in zip(order, dense, strict=True):
        nhwc[d] = t
    return md_strides(v.shape, v.strides) == md_strides(v.shape, nhwc)


def _auto_layout(s: st.IntConv) -> str:
    """oneDNN's own layout (benchmarks/int8_steps.py, AVX2, on a shared 2-core machine, so
    tentative): on its quietest run 2.7x faster than channels last on a 1x1 256->64 at 56x56
    (1.8 vs 4.9 ms, 2 threads) and as fast on 3x3 ones; under load the two were within noise
    of each other (both run the same `jit_uni_int8` kernels). Re-measure on a quiet machine."""
    return "blocked"


def int_conv_runner(
    step: st.IntConv,
    arena: np.ndarray,
    threads: int,
    *,
    constants: Constants,
    workspace: Workspace | None = None,
    layout: str = "auto",
) -> Runner | None:
    """oneDNN's int8 convolution for `step` over `arena` (the plan's `constants`), or
    None when it would not be exact or oneDNN refuses it (module docstring). `layout`: one of
    `INT_CONV_LAYOUTS`; the arena's activations stay NC(D)HW, reordered into and out of the
    primitive's layout through `workspace` when it is not plain."""
    s = step
    if layout not in INT_CONV_LAYOUTS:
        raise ValueError(f"int_conv_runner: layout {layout!r} is not one of {INT_CONV_LAYOUTS}")
    if not conv_enabled():
        return None
    if s.out.numel == 0 or s.x.rank not in _NHWC or available() is not None:
        return None
    zshape = (s.w.shape[0],) + (1,) * (s.w.rank - 1)
    wei = _weights(s.w, s.w_zero, zshape, constants)
    if wei is None:
        return None
    lay = _auto_layout(s) if layout == "auto" else layout
    n = thread_count(threads)
    return build_owned(s, lambda lib, o: _conv(lib, o, s, arena, n, wei, constants, workspace, lay))


def _conv_weights(o: Owner, s: st.IntConv, wei: Weights) -> tuple[list[int], int]:
    """The weights' dims ([g, K/g, C/g, *k] with groups) and plain descriptor."""
    g, k_out = s.groups, s.w.shape[0]
    strides = (
        [x // wei.itemsize for x in wei.strides] if isinstance(wei, np.ndarray) else wei.strides
    )
    dims, wstr = list(s.w.shape), list(strides)
    if g > 1:
        dims = [g, k_out // g, *s.w.shape[1:]]
        wstr = [k_out // g * wstr[0], *wstr]
    return dims, o.md(dims, DT_S8, md_strides(dims, wstr))


def _conv(
    lib: DnnlLib,
    o: Owner,
    s: st.IntConv,
    arena: np.ndarray,
    threads: int,
    wei: Weights,
    consts: Constants,
    ws: Workspace | None,
    layout: str,
) -> Runner | None:
    base = arena_base(arena)
    omp_thread_setter()(threads)
    x_md = o.md(s.x.shape, INT8_TYPES[s.x.dtype], md_strides(s.x.shape, s.x.strides))
    out_md = o.md(s.out.shape, DT_S32, md_strides(s.out.shape, s.out.strides))
    wdims, w_plain = _conv_weights(o, s, wei)
    tag = FORMAT_TAG_ANY if layout == "blocked" else _NHWC[s.x.rank]
    if _channels_last(s.x) or _channels_last(s.out):
        tag = _NHWC[s.x.rank]  # the layout pass stored them channels last: take them so
    # without VNNI an s8 source enters as u8 (+128, in the layout reorder it needs anyway):
    # oneDNN's s8 convolutions there halve the weights (inexact, measured), its u8 ones are exact
    shift = source_shift(s.x.dtype)
    src_q = o.tag(s.x.shape, DT_U8 if shift else INT8_TYPES[s.x.dtype], tag)
    dst_q = o.tag(s.out.shape, DT_S32, tag)
    zero = _source_zero(o, arena, s.x_zero, consts, shift)
    pd = o.pd(
        "dnnl_convolution_forward_primitive_desc_create",
        engine()[0],
        FORWARD_INFERENCE,
        CONVOLUTION_DIRECT,
        src_q,
        o.md(wdims, DT_S8, None),
        None,
        dst_q,
        dnnl_dims(s.stride),
        dnnl_dims([d - 1 for d in s.dilation]),
        dnnl_dims(s.padding),
        dnnl_dims(right_padding(s)),
        _zero_attr(o, zero),
    )
    if pd is None or impl_name(lib, pd).startswith("ref"):
        log.debug("oneDNN has no fast int8 convolution in %s for %s", layout, s.describe())
        o.close()  # its reference convolution is exact but 100-1000x slower than ours
        return None
    if ws is not None:
        ws.begin()
    prim, spad = o.primitive(pd, ws)
    q = lib.fns["dnnl_primitive_desc_query_md"]
    src_md, dst_md = q(pd, QUERY_SRC_MD, 0), q(pd, QUERY_DST_MD, 0)
    x_mem, out_mem = o.memory(x_md, base + s.x.offset), o.memory(out_md, base + s.out.offset)
    views = [(x_mem, s.x.offset), (out_mem, s.out.offset)]
    if isinstance(wei, np.ndarray):  # packed once into the layout the convolution chose
        w_mem = pack(
            o, w_plain, q(pd, QUERY_WEIGHTS_MD, 0), o.memory(w_plain, wei.ctypes.data), s, None
        )
    else:
        w_mem = o.memory(w_plain, base + wei.offset)
        views.append((w_mem, wei.offset))
    calls, zp = _with_zero(zero, views)
    equal = lib.fns["dnnl_memory_desc_equal"]
    src_mem, dst_mem = x_mem, out_mem
    if not equal(src_md, x_md):
        src_mem = o.scratch(src_md, ws)
        if shift:  # +128 in the arena's own layout first, then a plain reorder (docstring)
            dense = o.md(s.x.shape, DT_U8, md_strides(s.x.shape, _dense(s.x.shape)))
            shifted = o.scratch(dense, ws)
            into, extra = _shift_reorder(o, x_md, dense, shift)
            calls.append((into, exec_args([(ARG_FROM, x_mem), (ARG_TO, shifted), *extra])))
            x_mem, x_md = shifted, dense
        calls.append((o.reorder(x_md, src_md), exec_args([(ARG_FROM, x_mem), (ARG_TO, src_mem)])))
    if not equal(dst_md, out_md):
        dst_mem = o.scratch(dst_md, ws)
    args = [(ARG_SRC, src_mem), (ARG_WEIGHTS, w_mem), (ARG_DST, dst_mem), (ARG_SCRATCHPAD, spad)]
    calls.append((prim, exec_args([*args, *zp])))
    if dst_mem != out_mem:
        back = o.reorder(dst_md, out_md)
        calls.append((back, exec_args([(ARG_FROM, dst_mem), (ARG_TO, out_mem)])))
    return Runner(s, arena, o, calls, views, threads, impl_name(lib, pd))
