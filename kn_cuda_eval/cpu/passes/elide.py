"""Copies the host executor does not run: their producer writes straight into the destination.

The planner materialises a padding or a concatenation as a `Copy` of a finished tensor into a
view of a larger buffer (ResNet's max pool pads the stem's output, once per spatial axis; a
UNet concatenates skip connections). When the copied tensor was written by the step that
produced it and nothing else reads it, that producer — a convolution (oneDNN takes a strided
destination), another copy or a single-output elementwise step — can write the destination
view itself, and the copy becomes a no-op: one pass over the tensor less.

    steps = elide_copies(plan.steps, plan.outputs)   # elided copies become fuse.Folded

Sound when: the producer wrote exactly the copy's source (same bytes, both row-major), no step
between them reads that source or touches the destination's elements, the producer reads none
of the destination's elements, and the source is dead after the copy (no later read before it
is written again, no plan output).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from kn_cuda_eval.cpu.passes.fuse import Folded, _dead_after
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView

__all__ = ["elide_copies"]

_MASK_LIMIT = 1 << 24  # elements: beyond this, overlapping ranges count as touching


def elide_copies(
    steps: Sequence[st.Step], outputs: Sequence[StridedView]
) -> list[st.Step | Folded]:
    out: list[st.Step | Folded] = list(steps)
    for j, s in enumerate(out):
        if not isinstance(s, st.Copy) or not s.src.is_dense():
            continue
        k = _producer(out, j, s.src)
        if k is None:
            continue
        p = out[k]
        assert not isinstance(p, Folded)
        written = _written(p)
        if written is None or written.byte_extent() != s.src.byte_extent():
            continue
        if not written.is_dense() or written.dtype is not s.src.dtype:
            continue
        target = s.dst.reshape(written.shape)
        if target is None or (isinstance(p, st.Conv) and any(t <= 0 for t in target.strides)):
            continue
        between = [t for t in out[k + 1 : j] if not isinstance(t, Folded)]
        if any(_touches(r, s.src) for t in between for r in t.reads()):
            continue
        if any(_touches(v, s.dst) for t in between for v in (*t.reads(), *t.writes())):
            continue
        if any(_touches(r, s.dst) for r in p.reads()):
            continue
        if not _dead_after(out, outputs, j, s.src):  # type: ignore[arg-type]
            continue
        out[k] = _rewrite(p, written, target)
        out[j] = Folded(k, s)
    return out


def _producer(steps: Sequence[st.Step | Folded], j: int, v: StridedView) -> int | None:
    """The last step before j that writes any of v's bytes."""
    lo, hi = v.byte_extent()
    for k in range(j - 1, -1, -1):
        for w in steps[k].writes():
            wlo, whi = w.byte_extent()
            if wlo < hi and lo < whi:
                return k
    return None


def _written(s: st.Step) -> StridedView | None:
    """The one view a producer kind we can redirect writes."""
    if isinstance(s, st.Conv):
        return s.out
    if isinstance(s, st.Copy):
        return s.dst
    if isinstance(s, st.Elementwise) and len(s.outputs) == 1:
        return s.outputs[0]
    return None


def _rewrite(s: st.Step, old: StridedView, new: StridedView) -> st.Step:
    if isinstance(s, st.Conv):
        return dataclasses.replace(s, out=new)
    if isinstance(s, st.Copy):
        return dataclasses.replace(s, dst=new)
    assert isinstance(s, st.Elementwise)
    return dataclasses.replace(s, outputs=(new,))


def _touches(a: StridedView, b: StridedView) -> bool:
    """Whether some byte of an element of a is a byte of an element of b (exact for strided
    views whose ranges interleave, like a padded buffer's borders and interior)."""
    alo, ahi = a.byte_extent()
    blo, bhi = b.byte_extent()
    if not (alo < bhi and blo < ahi):
        return False
    if a.is_dense() or b.is_dense() or max(a.numel, b.numel) > _MASK_LIMIT:
        return True
    lo, hi = max(alo, blo), min(ahi, bhi)
    mask = np.zeros(hi - lo, bool)
    _mark(mask, a, lo)
    hit = np.zeros(hi - lo, bool)
    _mark(hit, b, lo)
    return bool((mask & hit).any())


def _mark(mask: np.ndarray, v: StridedView, lo: int) -> None:
    """Set the bytes of v's elements in mask (which starts at byte lo)."""
    offs = np.full(1, v.offset, np.int64)
    for d, t in zip(v.shape, v.strides, strict=True):
        offs = (offs[:, None] + np.arange(d, dtype=np.int64)[None, :] * (t * v.itemsize)).ravel()
    for b in range(v.itemsize):
        at = offs + b - lo
        at = at[(at >= 0) & (at < mask.size)]
        mask[at] = True
    assert math.prod(v.shape) == v.numel
