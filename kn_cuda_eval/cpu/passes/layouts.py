"""The host executor's layout pass: which convolution activations stay in oneDNN's own layout.

oneDNN's fast convolutions run on channel-blocked activations (nChw16c on AVX-512), while a plan
stores every tensor as a strided view of its logical NC(D)HW shape. Reordering into the blocked
layout and back around every convolution cost ResNet-50 12.7 ms of 50 (2 threads). This pass
finds the tensors that never need to be plain: a convolution's output whose every reader is a
convolution taking it in the layout it was written in (as input `x`: the reader's source layout;
as `residual`: the reader's destination layout), or a *flat* elementwise step — one over a single
contiguous axis, no index views, which maps element i to element i and so computes the same on
any layout — whose own outputs obey the same rule (ReLU6 or SiLU between two convolutions, a
requantization between two integer ones).

Those tensors are stored blocked in the very bytes the planner gave them: the pass keeps only
layouts that are *dense* (no channel padding: as many bytes as the plain tensor) over dense
views, so lifetimes, offsets and the arena size stay the planner's. Plan inputs, outputs and
constants, anything read through another view (a slice, a reshape, a pooling window, a GEMM),
and anything partly overwritten stay plain.

When the layout is a permutation of the logical axes (channels-last: `order`, the logical axes
outermost first), the other elementwise steps and reductions may take part too (*strided*
readers and writers): their views of such a tensor are rewritten with the permuted strides —
the squeeze-and-excitation of EfficientNet (a mean over H and W, a per-channel scale) then
reads the depthwise convolution's channels-last output as stored, instead of oneDNN reordering
it to NCHW and back around every block. (The host kernels walk such steps in memory order:
`csource.memory_order`, and reductions down columns.)

    roles = blocked_roles(plan.steps, plan.outputs, formats)
    # {conv step index: frozenset of "x" / "residual" / "out" stored blocked}
    choice = choose_layouts(plan.steps, plan.outputs, formats)
    # choice.roles as above; choice.views: {step index: {view: rewritten view}}

`formats` maps each convolution step the executor will run through oneDNN to its chosen
(`src`, `dst`) layouts (`onednn.ConvDesc`); anything with `==`, `.blocked` and `.dense` works,
which is how the tests drive the pass without oneDNN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView

__all__ = [
    "Formats",
    "LayoutChoice",
    "LayoutLike",
    "blocked_roles",
    "choose_layouts",
    "is_flat",
    "permuted",
]


class LayoutLike(Protocol):
    blocked: bool
    dense: bool
    # (optional) `order`: the logical axes outermost first when the layout is a permutation

    def __eq__(self, other: object) -> bool: ...


class Formats(Protocol):
    src: LayoutLike
    dst: LayoutLike


def is_flat(s: st.Step) -> bool:
    """An elementwise step over one contiguous axis with no index views: it maps element i of
    every operand to element i of every result, whatever order they are stored in (the same
    order for all: a requantization reads int32 and writes int8 element by element)."""
    if not isinstance(s, st.Elementwise) or len(s.shape) != 1 or s.indices:
        return False
    # a broadcast operand (stride 0) is one element whatever the layout
    return all(v.strides == (1,) for v in s.outputs) and all(
        v.strides in ((1,), (0,)) for v in s.inputs
    )


@dataclass(eq=False)
class _Value:
    """A tensor some step wrote: its view, producer, readers (step, role) and group."""

    view: StridedView
    step: int
    extent: tuple[int, int]
    parts: list[tuple[int, int]] = field(default_factory=list)  # bytes still holding it
    uses: list[tuple[int, str]] = field(default_factory=list)
    plain: bool = False  # must be stored plain
    parent: _Value | None = None
    logical: tuple[int, ...] | None = None  # a convolution's view of it: N, C, spatial

    def overlaps(self, lo: int, hi: int) -> bool:
        return any(a < hi and lo < b for a, b in self.parts)

    def cut(self, lo: int, hi: int) -> None:
        """Bytes [lo, hi) were written by a later step."""
        keep = [(a, min(b, lo)) for a, b in self.parts if a < lo]
        self.parts = keep + [(max(a, hi), b) for a, b in self.parts if b > hi]

    def root(self) -> _Value:
        v = self
        while v.parent is not None:
            v = v.parent
        return v


def _union(a: _Value, b: _Value) -> None:
    ra, rb = a.root(), b.root()
    if ra is not rb:
        rb.parent = ra


def _strided(s: st.Step) -> bool:
    """A step whose views may take any strides at the same cost once walked in memory order."""
    return (isinstance(s, st.Elementwise) and not is_flat(s)) or isinstance(s, st.Reduce)


def _roles(s: st.Step) -> list[tuple[StridedView, str]]:
    # weights, biases and zero points are read plain (a weight computed at run time stays so)
    if isinstance(s, st.IntConv):
        return [(s.x, "x"), (s.w, "other"), (s.x_zero, "other"), (s.w_zero, "other")]
    if isinstance(s, st.Conv):
        out = [(s.x, "x"), (s.w, "other")]
        out += [(s.bias, "other")] if s.bias is not None else []
        out += [(s.residual, "residual")] if s.residual is not None else []
        return out
    role = "flat" if is_flat(s) else "strided" if _strided(s) else "other"
    # a flat step's broadcast operand is read as one element: "other" (its tensor stays plain)
    return [(v, "other" if role == "flat" and v.strides == (0,) else role) for v in s.reads()]


def permuted(view: StridedView, logical: Sequence[int], order: Sequence[int]) -> StridedView | None:
    """`view`, a row-major view of the whole dense tensor of shape `logical` (its axes possibly
    merged), with the strides the tensor has when stored with its axes in `order` (outermost
    first); None when a merged axis is not contiguous in that order or the view is not such a
    view."""
    if sorted(order) != list(range(len(logical))) or math.prod(view.shape) != math.prod(logical):
        return None
    if not view.is_dense():  # row-major contiguous
        return None
    mem = [0] * len(logical)
    step = 1
    for d in reversed(order):
        mem[d] = step
        step *= logical[d]
    dims = [(n, t) for n, t in zip(logical, mem, strict=True) if n != 1]
    strides: list[int] = []
    i = 0
    for size in view.shape:
        if size == 1:
            strides.append(0)
            continue
        prod, inner = 1, None
        while prod < size and i < len(dims):
            n, t = dims[i]
            if inner is not None and inner != t * n:
                return None  # merged axes that are not adjacent in memory
            prod *= n
            inner = t
            i += 1
        if prod != size or inner is None:
            return None
        strides.append(inner)
    return StridedView(view.offset, view.shape, tuple(strides), view.dtype)


def _same_layout(a: LayoutLike, b: LayoutLike) -> bool:
    """Equal layouts, or the same permutation of the logical axes whatever the element types
    (an int32 sum and the int8 it requantizes to, both channels last)."""
    order = getattr(a, "order", None)
    return a == b or (order is not None and order == getattr(b, "order", None))


def _same_region(r: StridedView, v: _Value) -> bool:
    """`r` reads exactly the tensor `v` (same bytes, each element where it was written)."""
    if r.byte_extent() != v.extent or r.dtype is not v.view.dtype or r.numel != v.view.numel:
        return False
    return r.is_dense() and v.view.is_dense()


@dataclass(frozen=True)
class LayoutChoice:
    """What the pass decided: the roles each convolution reads or writes blocked, and the
    rewritten views of the strided steps that take part (step index → {view: new view})."""

    roles: dict[int, frozenset[str]]
    views: dict[int, dict[StridedView, StridedView]]


def blocked_roles(
    steps: Sequence[st.Step], outputs: Sequence[StridedView], formats: Mapping[int, Formats]
) -> dict[int, frozenset[str]]:
    """For every convolution of `formats`: the roles of `onednn.ROLES` it reads or writes in its
    own blocked layout (absent: all plain)."""
    return choose_layouts(steps, outputs, formats).roles


def choose_layouts(
    steps: Sequence[st.Step], outputs: Sequence[StridedView], formats: Mapping[int, Formats]
) -> LayoutChoice:
    """The layout pass (see the module's text)."""
    live: list[_Value] = []
    values: list[_Value] = []
    flat_io: list[tuple[list[_Value | None], list[_Value]]] = []
    for k, s in enumerate(steps):
        flat_ins: list[_Value | None] = []
        for r, role in _roles(s):
            lo, hi = r.byte_extent()
            hits = [v for v in live if v.overlaps(lo, hi)]
            exact = len(hits) == 1 and _same_region(r, hits[0]) and role != "other"
            exact = exact and hits[0].parts == [hits[0].extent]
            if exact:
                hits[0].uses.append((k, role))
                if role in ("x", "residual") and hits[0].logical is None:
                    hits[0].logical = r.shape
            else:
                for v in hits:
                    v.plain = True
            if role == "flat":  # None: a plan input, a constant, or part of a tensor: plain
                flat_ins.append(hits[0] if exact else None)
        outs: list[_Value] = []
        for w in s.writes():
            lo, hi = w.byte_extent()
            if lo == hi:
                continue
            for v in [v for v in live if v.overlaps(lo, hi)]:
                v.cut(lo, hi)  # what is left of it is still read as it was stored
                if not v.parts:
                    live.remove(v)
            v = _Value(w, k, (lo, hi), [(lo, hi)])
            # (a validated plan never writes over an operand of the same step)
            conv_out = k in formats and isinstance(s, st.Conv | st.IntConv) and w == s.out
            strided_out = isinstance(s, st.Elementwise) and _strided(s)
            v.plain = not (conv_out or is_flat(s) or strided_out) or not w.is_dense()
            v.logical = w.shape if conv_out else None
            live.append(v)
            values.append(v)
            outs.append(v)
        if is_flat(s):
            flat_io.append((flat_ins, outs))
    for v in live:  # plan outputs are read plain by the caller
        if any(v.overlaps(*o.byte_extent()) for o in outputs):
            v.plain = True
    for ins, outs in flat_io:
        members = [*ins, *outs]
        if any(m is None for m in members):
            for m in outs:
                m.plain = True
        real = [m for m in members if m is not None]
        for m in real[1:]:
            _union(real[0], m)

    groups: dict[int, list[_Value]] = {}
    for v in values:
        groups.setdefault(id(v.root()), []).append(v)
    roles: dict[int, set[str]] = {}
    views: dict[int, dict[StridedView, StridedView]] = {}
    for group in groups.values():
        got = _group_layout(group, steps, formats)
        if got is None:
            continue
        for v in group:
            if v.step in formats:
                roles.setdefault(v.step, set()).add("out")
            for j, role in v.uses:
                if role not in ("flat", "strided"):
                    roles.setdefault(j, set()).add(role)
        for k, old, new in got[1]:
            views.setdefault(k, {})[old] = new
    return LayoutChoice({k: frozenset(r) for k, r in roles.items()}, views)


def _group_layout(
    group: Sequence[_Value], steps: Sequence[st.Step], formats: Mapping[int, Formats]
) -> tuple[LayoutLike, list[tuple[int, StridedView, StridedView]]] | None:
    """The blocked layout every tensor of `group` can share and the views of its strided
    steps rewritten for it, or None when one must be plain."""
    if any(v.plain for v in group):
        return None
    wants = [formats[v.step].dst for v in group if v.step in formats]
    for v in group:
        for j, role in v.uses:
            if role in ("flat", "strided"):
                continue
            if j not in formats:
                return None
            wants.append(formats[j].src if role == "x" else formats[j].dst)
    if not wants:
        return None
    fmt = wants[0]
    if not all(p.blocked and p.dense for p in wants) or any(
        not _same_layout(p, fmt) for p in wants[1:]
    ):
        return None
    strided = [(v.step, v.view) for v in group if v.step not in formats]
    strided = [(k, w) for k, w in strided if _strided(steps[k])]
    strided += [(j, v.view) for v in group for j, role in v.uses if role == "strided"]
    # integer convolutions take their activations through their views' strides
    strided += [(v.step, v.view) for v in group if isinstance(steps[v.step], st.IntConv)]
    strided += [(j, v.view) for v in group for j, _ in v.uses if isinstance(steps[j], st.IntConv)]
    if not strided:
        return fmt, []
    order = getattr(fmt, "order", None)
    logical = next((v.logical for v in group if v.logical is not None), None)
    if order is None or logical is None:
        return None
    rewrites = []
    for k, view in strided:
        for r in steps[k].reads() + steps[k].writes():
            if r.byte_extent() != view.byte_extent():
                continue
            new = permuted(r, logical, order)
            if new is None:
                return None
            rewrites.append((k, r, new))
    return fmt, rewrites
