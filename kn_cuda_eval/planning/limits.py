"""Memory guards of the host backends: a plan's arena, its outputs and the values its reduce
steps compute without storing are compared with the memory available (`kn_graph.binding.
available_bytes`, the reference executor's budget) before anything is allocated, so that work
no machine can hold is an `EvaluationError` naming the step and the bytes, never a raw `OSError`
from the arena's `mmap`, a `MemoryError` or an hour-long loop.

`plan()` itself stays device-neutral (a plan may be for a GPU with more memory than the host,
and a 32 TiB plan is still a valid plan); the executor that runs a plan on the host calls
`check_plan` before it maps its arena.

>>> check_allocation("the arena", 2**70)
Traceback (most recent call last):
...
kn_graph.errors.EvaluationError: the arena needs 1 ZiB (1,180,591,620,717,411,303,424 bytes), ...
"""

from __future__ import annotations

import math

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.memory import Buffer, BufferKind, human_bytes
from kn_cuda_eval.planning.plan import Plan
from kn_graph.binding import available_bytes
from kn_graph.errors import EvaluationError

__all__ = ["check_allocation", "check_plan", "step_value_bytes"]


def _have(have: int) -> str:
    return f"have {human_bytes(have)} ({have:,} bytes) of memory available"


def check_allocation(what: str, nbytes: int) -> None:
    """Raise EvaluationError unless `nbytes` fit in the memory this process may still allocate;
    `what` names the allocation (and the step it is for)."""
    have = available_bytes()
    if nbytes > have:
        raise EvaluationError(
            f"{what} needs {human_bytes(nbytes)} ({nbytes:,} bytes), {_have(have)}"
        )


def step_value_bytes(s: st.Step) -> int:
    """Bytes of the value a step computes without storing it: a reduction's input (its fused
    prologue, which the reference executor would hold as an array); 0 for other steps, whose
    values are stored in the arena."""
    if isinstance(s, st.Reduce):
        return math.prod(s.x.shape) * s.x.dtype.size
    return 0


def check_plan(plan: Plan, arena_bytes: int | None = None, who: str = "Device.cpu()") -> None:
    """Refuse (EvaluationError) to run `plan` on the host when what it needs cannot fit in the
    memory available: the arena (`arena_bytes`, default `plan.arena_size`; pass what the
    executor maps, scratch included) plus a fresh copy of every output, or a reduce step's input
    (which the fused kernel computes element by element, as many elements as the reference
    executor would hold). Names the step and the bytes. O(steps)."""
    arena = plan.arena_size if arena_bytes is None else arena_bytes
    outputs = sum(v.nbytes for v in plan.outputs)
    have = available_bytes()
    if arena + outputs > have:
        raise EvaluationError(f"{who}: {_largest(plan, arena, outputs)}, {_have(have)}")
    budget = have - arena
    for k, s in enumerate(plan.steps):
        need = step_value_bytes(s)
        if need > budget:
            raise EvaluationError(
                f"{who}: step {k} ({s.describe()[:200]}) computes a value of {human_bytes(need)} "
                f"({need:,} bytes) that the reference executor would hold; {_have(budget)} "
                "beside the arena"
            )


def _largest(plan: Plan, arena: int, outputs: int) -> str:
    """What needs the memory: the totals, and the largest output or arena buffer with the step
    that writes it."""
    total = arena + outputs
    head = (
        f"the plan needs {human_bytes(total)} ({total:,} bytes: arena {arena:,}, outputs "
        f"{outputs:,})"
    )
    out = max(
        zip(plan.output_names, plan.outputs, strict=True),
        key=lambda nv: nv[1].nbytes,
        default=None,
    )
    buf = max(plan.buffers, key=lambda b: b.size, default=None)
    if out is not None and (buf is None or out[1].nbytes >= buf.size):
        name, v = out
        end = max(len(plan.steps) - 1, 0)
        home = next(
            (b for b in plan.buffers if b.offset <= v.offset < b.end and b.last >= end), None
        )
        where = "" if home is None else f" ({_source(plan, home)})"
        return (
            f"{head}; output '{name}' {v.dtype}{list(v.shape)} alone is {v.nbytes:,} bytes{where}"
        )
    assert buf is not None
    return f"{head}; buffer {buf.name} alone is {buf.size:,} bytes ({_source(plan, buf)})"


def _source(plan: Plan, buf: Buffer) -> str:
    """The step that writes a buffer first, or what kind of buffer it is."""
    if buf.kind is BufferKind.TEMP and buf.first < len(plan.steps):
        s = plan.steps[buf.first]
        if any(buf.offset <= w.offset < buf.end for w in s.writes()):
            return f"written by step {buf.first}: {s.describe()[:200]}"
    return f"a view of {buf.kind.value} {buf.name}"
