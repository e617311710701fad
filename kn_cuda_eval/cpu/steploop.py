"""The host executor's steps as calls of the compiled library's step loop: consecutive steps
that run there (C kernels and oneDNN primitives) become one `kn_run` call (`Segment`), so a plan
of a thousand fused steps costs one ctypes call per evaluation; a step that runs in Python (a
NumPy step, BLAS) is a segment of its own.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kn_cuda_eval.cpu import csource, onednn
from kn_cuda_eval.cpu.library import HostLibrary

__all__ = ["Entry", "Segment", "kernel_entry", "nothing", "runner_entries", "segments"]

Entry = tuple[int, ctypes.Array[ctypes.c_longlong], ctypes.Array[ctypes.c_double]]
"""One call of the step loop: kernel id (-1: a oneDNN primitive, -2: a C function of ours in a
runner, `onednn.HostCall`), its ints, its floats."""


@dataclass(frozen=True, slots=True)
class Segment:
    """Steps [lo, hi) of the plan: one call of the library's step loop (compiled steps and
    oneDNN primitives), or one host callable."""

    lo: int
    hi: int
    run: Callable[[], int]  # 0, or (index within the segment + 1) of a failed entry
    entries: tuple[int, ...] = ()  # the step of each entry of the step loop


def nothing() -> None:
    """A step folded into another (`fuse.Folded`): nothing to run."""


def kernel_entry(library: HostLibrary, c: csource.CCall) -> Entry:
    """The step loop's entry of a C call."""
    p = (ctypes.c_longlong * max(len(c.ints), 1))(*c.ints)
    f = (ctypes.c_double * max(len(c.floats), 1))(*c.floats)
    return library.index[c.kernel.name], p, f


def runner_entries(r: onednn.Runner) -> list[Entry]:
    """The step loop's entries of a oneDNN runner: one per call."""
    none = (ctypes.c_double * 1)()
    return [(kid, p, none) for kid, p in r.c_entries()]


def _returns_zero(f: Callable[[], object]) -> Callable[[], int]:
    def run() -> int:
        f()
        return 0

    return run


def segments(
    library: HostLibrary | None,
    base: int,
    entries: Sequence[list[Entry] | None],
    host: Sequence[Callable[[], None] | None],
    keep: list[object],
) -> list[Segment]:
    """The segments of steps whose step-loop `entries` are given (None: the step runs in Python,
    `host[k]`); the ctypes arrays the library reads are appended to `keep`."""
    out: list[Segment] = []
    n = len(entries)
    k = 0
    while k < n:
        if entries[k] is None:
            out.append(Segment(k, k + 1, _returns_zero(host[k])))  # type: ignore[arg-type]
            k += 1
            continue
        hi, loop, owner = k, [], []
        while hi < n:
            e = entries[hi]
            if e is None:
                break
            loop += e
            owner += [hi] * len(e)
            hi += 1
        if loop:
            assert library is not None
            kid = (ctypes.c_int * len(loop))(*(e[0] for e in loop))
            ps = (ctypes.c_void_p * len(loop))(*(ctypes.addressof(e[1]) for e in loop))
            fs = (ctypes.c_void_p * len(loop))(*(ctypes.addressof(e[2]) for e in loop))
            keep += [kid, ps, fs, loop]
            run = functools.partial(library.run, base, len(loop), kid, ps, fs)
            out.append(Segment(k, hi, run, tuple(owner)))
        k = hi
    return out
