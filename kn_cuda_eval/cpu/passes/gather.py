"""Large gather tables read where the constant lies: graph constants of `TABLE_BYTES` or more
that only gathers read (an LLM's embedding table) are not copied into the arena; the gathers'
views are rebased onto the constant's own memory, a mapped model file's pages, so only the rows
gathered become resident, as with onnxruntime's memory-mapped initializers (Qwen2-0.5B: 544 MB
of which a generation touches a few). For C steps only: the NumPy fallback indexes the arena.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.plan import Plan

__all__ = ["TABLE_BYTES", "read_in_place", "tables"]

TABLE_BYTES = 1 << 20
"""Gather tables from this size on are read where the constant lies."""


def tables(plan: Plan, steps: Sequence[object]) -> dict[int, np.ndarray]:
    """Arena offset -> data of the graph constants of `TABLE_BYTES` or more that no step but a
    gather (as its table) reads."""
    found = {
        off: data
        for off, data in plan.constants[: plan.graph_constants]
        if data.nbytes >= TABLE_BYTES and data.flags.c_contiguous
    }
    for s in steps:
        reads = getattr(s, "reads", None)
        for v in reads() if reads is not None else ():
            for off in [o for o, d in found.items() if o <= v.offset < o + d.nbytes]:
                if not (isinstance(s, st.Gather) and v == s.x):
                    del found[off]
    return found


def read_in_place(steps: list, tables: Mapping[int, np.ndarray], base: int) -> None:  # type: ignore[type-arg]
    """The gathers of `tables` read the constants where they are: their table view's offset
    rebased from the arena's `base` to the constant's own address (the arena stays where it is
    for the executor's life: a remapped arena makes the executor stale)."""
    for k, s in enumerate(steps):
        if not isinstance(s, st.Gather):
            continue
        for off, data in tables.items():
            if off <= s.x.offset < off + data.nbytes:
                at = int(data.ctypes.data) - base + (s.x.offset - off)
                steps[k] = dataclasses.replace(s, x=s.x.with_offset(at))
