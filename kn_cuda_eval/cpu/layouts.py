"""The host executor's layout pass: which convolution activations stay in oneDNN's own layout.

oneDNN's fast convolutions run on channel-blocked activations (nChw16c on AVX-512), while a plan
stores every tensor as a strided view of its logical NC(D)HW shape. Reordering into the blocked
layout and back around every convolution cost ResNet-50 12.7 ms of 50 (2 threads). This pass
finds the tensors that never need to be plain: a convolution's output whose every reader is a
convolution taking it in the layout it was written in (as input `x`: the reader's source layout;
as `residual`: the reader's destination layout), or a *flat* elementwise step — one over a single
contiguous axis, no index views, one dtype, which maps bytes to bytes and so computes the same on
any layout — whose own outputs obey the same rule (ReLU6 or SiLU between two convolutions).

Those tensors are stored blocked in the very bytes the planner gave them: the pass keeps only
layouts that are *dense* (no channel padding: as many bytes as the plain tensor) over dense
views, so lifetimes, offsets and the arena size stay the planner's. Plan inputs, outputs and
constants, anything read through another view (a slice, a reshape, a pooling window, a GEMM),
and anything partly overwritten stay plain.

    roles = blocked_roles(plan.steps, plan.outputs, formats)
    # {conv step index: frozenset of "x" / "residual" / "out" stored blocked}

`formats` maps each convolution step the executor will run through oneDNN to its chosen
(`src`, `dst`) layouts (`onednn.ConvDesc`); anything with `==`, `.blocked` and `.dense` works,
which is how the tests drive the pass without oneDNN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kn_cuda_eval import steps as st
from kn_cuda_eval.view import StridedView

__all__ = ["Formats", "LayoutLike", "blocked_roles", "is_flat"]


class LayoutLike(Protocol):
    blocked: bool
    dense: bool

    def __eq__(self, other: object) -> bool: ...


class Formats(Protocol):
    src: LayoutLike
    dst: LayoutLike


def is_flat(s: st.Step) -> bool:
    """An elementwise step over one contiguous axis with no index views and one dtype: it maps
    element i of every operand to element i of every result, whatever order they are stored in."""
    if not isinstance(s, st.Elementwise) or len(s.shape) != 1 or s.indices:
        return False
    views = (*s.inputs, *s.outputs)
    dt = s.outputs[0].dtype if s.outputs else None
    return all(v.strides == (1,) and v.dtype is dt for v in views)


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


def _roles(s: st.Step) -> list[tuple[StridedView, str]]:
    if isinstance(s, st.Conv):
        out = [(s.x, "x"), (s.w, "w")]
        out += [(s.bias, "bias")] if s.bias is not None else []
        out += [(s.residual, "residual")] if s.residual is not None else []
        return out
    return [(v, "flat" if is_flat(s) else "other") for v in s.reads()]


def _same_region(r: StridedView, v: _Value) -> bool:
    """`r` reads exactly the tensor `v` (same bytes, each element where it was written)."""
    if r.byte_extent() != v.extent or r.dtype is not v.view.dtype or r.numel != v.view.numel:
        return False
    return r.is_dense() and v.view.is_dense()


def blocked_roles(
    steps: Sequence[st.Step], outputs: Sequence[StridedView], formats: Mapping[int, Formats]
) -> dict[int, frozenset[str]]:
    """For every convolution of `formats`: the roles of `onednn.ROLES` it reads or writes in its
    own blocked layout (absent: all plain)."""
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
            conv_out = k in formats and isinstance(s, st.Conv) and w == s.out
            v.plain = not (conv_out or is_flat(s)) or not w.is_dense()
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
    for group in groups.values():
        fmt = _group_layout(group, steps, formats)
        if fmt is None:
            continue
        for v in group:
            if v.step in formats:
                roles.setdefault(v.step, set()).add("out")
            for j, role in v.uses:
                if role != "flat":
                    roles.setdefault(j, set()).add(role)
    return {k: frozenset(r) for k, r in roles.items()}


def _group_layout(
    group: Sequence[_Value], steps: Sequence[st.Step], formats: Mapping[int, Formats]
) -> LayoutLike | None:
    """The blocked layout every tensor of `group` can share, or None when one must be plain."""
    if any(v.plain for v in group):
        return None
    producers = [formats[v.step].dst for v in group if v.step in formats]
    if not producers:
        return None
    fmt = producers[0]
    if not (fmt.blocked and fmt.dense) or any(p != fmt for p in producers[1:]):
        return None
    for v in group:
        for j, role in v.uses:
            if role == "flat":
                continue
            if j not in formats:
                return None
            want = formats[j].src if role == "x" else formats[j].dst
            if want != fmt or not want.dense:
                return None
    return fmt
