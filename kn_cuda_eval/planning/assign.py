"""Memory assignment: the planner names every byte in a planning address space (a buffer id in
the high bits, the offset inside the buffer below); once the steps are known, each buffer gets
its live range, the arena offset the packer (`memory.pack`) finds for it, and every view is
rebased onto the arena: [constants | status word | workspace].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.memory import ALIGN, Buffer, BufferKind, align, lower_bound, pack
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError
from kn_graph.filemap import check_unchanged

__all__ = [
    "MAX_BUFFER_BYTES",
    "Layout",
    "PlannedBuffer",
    "assign_memory",
    "buffer_address",
    "buffer_of",
]

_ID_SHIFT = 48  # planning address = buffer id << 48 | byte offset inside the buffer
_OFF_MASK = (1 << _ID_SHIFT) - 1
MAX_BUFFER_BYTES = 1 << _ID_SHIFT
"""The largest tensor a plan can hold (256 TiB): offsets inside a buffer must stay below the
buffer id's bits. No device has that much memory; a larger tensor is a PlanError, not a wrapped
offset."""


def buffer_address(buffer_id: int) -> int:
    """The planning address of the first byte of buffer `buffer_id`."""
    return buffer_id << _ID_SHIFT


def buffer_of(address: int) -> int:
    """The id of the buffer a planning address lies in."""
    return address >> _ID_SHIFT


@dataclass(slots=True)
class PlannedBuffer:
    """A buffer as the planner makes it: no offset or live range yet (`assign_memory` gives
    them); `data` is a constant's contents."""

    name: str
    kind: BufferKind
    size: int
    data: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """The planner's steps and views rebased onto arena offsets, and the arena's layout: what
    `Plan` records (offsets are bytes from the arena start)."""

    steps: tuple[st.Step, ...]
    inputs: tuple[StridedView, ...]
    outputs: tuple[StridedView, ...]
    constants: tuple[tuple[int, np.ndarray], ...]
    buffers: tuple[Buffer, ...]
    status: StridedView
    arena_size: int
    const_size: int
    workspace_offset: int
    lower_bound: int
    graph_constants: int
    """How many of `constants` (the first ones) are the graph's own (ids in `graph_arrays`)."""


def live_ranges(
    steps: Sequence[st.Step],
    bufs: Sequence[PlannedBuffer],
    outputs: Sequence[StridedView],
) -> tuple[list[int], list[int]]:
    """Each buffer's first and last step (inclusive; -1 when no step touches it): inputs are
    live from step 0, outputs to the last step. PlanError (a planner bug) when a step reads a
    temporary before any step writes it."""
    nb = len(bufs)
    first = [-1] * nb
    last = [-1] * nb
    for k, s in enumerate(steps):
        for v in s.writes():
            b = buffer_of(v.offset)
            if first[b] < 0:
                first[b] = k
            last[b] = max(last[b], k)
        for v in s.reads():
            b = buffer_of(v.offset)
            last[b] = max(last[b], k)
            if first[b] < 0 and bufs[b].kind is BufferKind.TEMP and bufs[b].size:
                raise PlanError(
                    f"internal: step {k} reads buffer {bufs[b].name} before anything writes it"
                )
    end = max(len(steps) - 1, 0)
    for b, buf in enumerate(bufs):
        if buf.kind is BufferKind.INPUT:
            first[b] = 0
            last[b] = max(last[b], 0)
        elif first[b] < 0 and last[b] >= 0:  # read, never written: only empty buffers
            first[b] = last[b]
    for ov in outputs:
        b = buffer_of(ov.offset)
        first[b] = max(first[b], 0) if first[b] >= 0 else end
        last[b] = end
    return first, last


def _place_constants(
    bufs: Sequence[PlannedBuffer],
    first: Sequence[int],
    last: Sequence[int],
    graph_arrays: frozenset[int],
    end: int,
) -> tuple[dict[int, int], list[Buffer], list[tuple[int, np.ndarray]], int]:
    """Arena offsets of the constants any step uses, their `Buffer`s and data, and the size of
    the constant region. The graph's own come first (in value order: the same offsets at every
    binding, so a CPU backend's executors of several bindings share one arena), then those the
    planner made (uniform values materialised at a binding's shape)."""
    base: dict[int, int] = {}
    buffers: list[Buffer] = []
    constants: list[tuple[int, np.ndarray]] = []
    pos = 0
    checked: set[int] = set()  # mapped model files found unchanged
    const_bufs = [
        b
        for b, buf in enumerate(bufs)
        if buf.kind is BufferKind.CONST and (last[b] >= 0 or first[b] >= 0)
    ]
    const_bufs.sort(key=lambda b: id(bufs[b].data) not in graph_arrays)  # stable
    for b in const_bufs:
        buf = bufs[b]
        base[b] = pos
        assert buf.data is not None
        check_unchanged(buf.data, checked)  # every backend copies them from the plan
        constants.append((pos, buf.data))
        buffers.append(Buffer(buf.name, buf.kind, pos, buf.size, 0, end))
        pos += align(buf.size)
    return base, buffers, constants, pos


def _place_workspace(
    bufs: Sequence[PlannedBuffer],
    first: Sequence[int],
    last: Sequence[int],
    work_off: int,
    n_steps: int,
    const_size: int,
) -> tuple[dict[int, int], list[Buffer], int, int]:
    """Arena offsets of the inputs and temporaries (packed by live range from `work_off`),
    their `Buffer`s, the workspace size and its lower bound."""
    ws = [
        b
        for b, buf in enumerate(bufs)
        if buf.kind in (BufferKind.TEMP, BufferKind.INPUT) and first[b] >= 0
    ]
    sizes = [bufs[b].size for b in ws]
    ranges = [(first[b], last[b]) for b in ws]
    offsets, peak = pack(sizes, ranges)
    if work_off + peak >= MAX_BUFFER_BYTES:
        raise PlanError(
            f"plan: the arena needs {work_off + peak:,} bytes (constants {const_size:,}, "
            f"workspace {peak:,}), more than a plan can address (below 2^48 bytes = 256 TiB)"
        )
    base: dict[int, int] = {}
    buffers: list[Buffer] = []
    for b, o in zip(ws, offsets, strict=True):
        base[b] = work_off + o
        buf = bufs[b]
        buffers.append(Buffer(buf.name, buf.kind, base[b], buf.size, first[b], last[b]))
    return base, buffers, peak, lower_bound(sizes, ranges, n_steps)


def assign_memory(
    steps: Sequence[st.Step],
    bufs: Sequence[PlannedBuffer],
    inputs: Sequence[StridedView],
    outputs: Sequence[StridedView],
    graph_arrays: frozenset[int],
    resident: Sequence[StridedView] = (),
) -> Layout:
    """Give every buffer its arena offset and rebase the steps and the input and output views
    (all in planning addresses) onto them. `graph_arrays`: the ids of the graph's own constant
    arrays, placed first; `resident`: views whose buffers stay live to the end, as outputs do
    (inputs a caller keeps in the arena between evaluations)."""
    n = len(steps)
    end = max(n - 1, 0)
    first, last = live_ranges(steps, bufs, [*outputs, *resident])
    base, buffers, constants, const_size = _place_constants(bufs, first, last, graph_arrays, end)
    status_off = const_size
    buffers.append(Buffer("status", BufferKind.STATUS, status_off, 4, 0, end))
    work_off = const_size + ALIGN
    work_base, work_bufs, peak, lb = _place_workspace(bufs, first, last, work_off, n, const_size)
    base.update(work_base)
    buffers.extend(work_bufs)

    def rebase(v: StridedView) -> StridedView:
        return v.with_offset(base[buffer_of(v.offset)] + (v.offset & _OFF_MASK))

    return Layout(
        steps=tuple(st.map_views(s, rebase) for s in steps),  # type: ignore[misc]
        inputs=tuple(rebase(v) for v in inputs),
        outputs=tuple(rebase(v) for v in outputs),
        constants=tuple(constants),
        buffers=tuple(buffers),
        status=StridedView(status_off, (), (), DType.U32),
        arena_size=max(work_off + peak, work_off),
        const_size=const_size,
        workspace_offset=work_off,
        lower_bound=lb,
        graph_constants=sum(id(d) in graph_arrays for _, d in constants),
    )
