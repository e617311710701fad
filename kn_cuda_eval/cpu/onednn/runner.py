"""A step prebuilt as oneDNN primitives over an arena (`Runner`), and what building one shares:
the owner of its objects, its argument lists, running a list of primitive calls, packing
constant weights once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from kn_cuda_eval.cpu.onednn.gemv import HostCall
from kn_cuda_eval.cpu.onednn.lib import (
    ARG_FROM,
    ARG_TO,
    MEMORY_ALLOCATE,
    SUCCESS,
    DnnlLib,
    ExecArg,
    OnednnError,
    available,
    engine,
    load_dnnl,
)
from kn_cuda_eval.cpu.onednn.memory import Owner, Packing
from kn_cuda_eval.cpu.onednn.threads import omp_thread_setter
from kn_cuda_eval.planning import steps as st
from kn_graph.errors import EvaluationError
from kn_graph.filemap import release_pages

__all__ = ["Call", "Runner", "arena_base", "build_owned", "exec_args", "pack", "run_calls"]

_T = TypeVar("_T")

Call = tuple[int, ctypes.Array[ExecArg]]  # primitive, its argument list


class Runner:
    """A step prebuilt for one arena: `runner()` executes it (oneDNN primitives in order, then
    `dnnl_stream_wait`), with no allocation. `rebind(arena)` points it at another arena of the
    same size (`dnnl_memory_set_data_handle`). `impl` names oneDNN's implementations. A call may
    be a `HostCall` of ours instead of a primitive (`gemv.gemv_call`)."""

    def __init__(
        self,
        step: st.Step,
        arena: np.ndarray,
        owner: Owner,
        calls: list[Call | HostCall],
        views: list[tuple[int, int]],
        threads: int,
        impl: str,
    ) -> None:
        self.step = step
        self.impl = impl
        self._arena = arena  # kept alive: the primitives hold raw pointers into it
        self._owner = owner
        self._calls: list[tuple[int, int, ctypes.Array[ExecArg]] | HostCall] = [
            c if isinstance(c, HostCall) else (c[0], len(c[1]), c[1]) for c in calls
        ]
        self._views = views  # (memory, byte offset into the arena)
        self._threads = threads
        lib = owner.lib
        self._execute = lib.fns["dnnl_primitive_execute"]
        self._wait = lib.fns["dnnl_stream_wait"]
        self._set_handle = lib.fns["dnnl_memory_set_data_handle"]
        self._set_threads = omp_thread_setter()
        self._stream = engine()[1]

    @property
    def primitives(self) -> int:
        """How many oneDNN primitives one run executes: the step's own plus its reorders (of
        activations stored in another layout, of a zero point read from the arena)."""
        return len(self._calls)

    def c_entries(self) -> list[tuple[int, ctypes.Array[ctypes.c_longlong]]]:
        """(kernel id, ints) of each call for the executor's compiled step loop: -1 and
        (primitive, stream, nargs, address of the argument array) for a primitive, -2 and the
        call's own `q` for a `HostCall` (the arrays stay alive with this runner)."""
        out: list[tuple[int, ctypes.Array[ctypes.c_longlong]]] = []
        for c in self._calls:
            if isinstance(c, HostCall):
                out.append((-2, c.q))
            else:
                p, n, a = c
                out.append((-1, (ctypes.c_longlong * 4)(p, self._stream, n, ctypes.addressof(a))))
        return out

    def rebind(self, arena: np.ndarray) -> None:
        """Run over `arena` from now on (same plan, e.g. a new arena for the same binding)."""
        base = arena_base(arena)
        if arena.size < self._arena.size:
            raise EvaluationError(
                f"oneDNN: rebind to an arena of {arena.size} bytes, the step's plan needs "
                f"{self._arena.size}"
            )
        for mem, off in self._views:
            status = self._set_handle(mem, base + off)
            if status != SUCCESS:
                raise OnednnError("dnnl_memory_set_data_handle", int(status)).at(self.step)
        for c in self._calls:
            if isinstance(c, HostCall):
                c.rebase(base)
        self._arena = arena

    def __call__(self) -> None:
        self._set_threads(self._threads)
        for c in self._calls:
            if isinstance(c, HostCall):
                if c():
                    raise EvaluationError(
                        f"kn_gemv refused its arguments in {self.step.describe()}"
                    )
                continue
            prim, n, args = c
            status = self._execute(prim, self._stream, n, args)
            if status != SUCCESS:
                raise OnednnError("dnnl_primitive_execute", int(status)).at(self.step)
        status = self._wait(self._stream)
        if status != SUCCESS:
            raise OnednnError("dnnl_stream_wait", int(status)).at(self.step)

    def close(self) -> None:
        self._owner.close()

    def __del__(self) -> None:
        self.close()


def arena_base(arena: np.ndarray) -> int:
    """The address of the arena, which must be a 1-d contiguous uint8 array."""
    if arena.dtype != np.uint8 or arena.ndim != 1 or not arena.flags.c_contiguous:
        raise EvaluationError(f"oneDNN: the arena must be a 1-d uint8 array, not {arena.dtype}")
    return int(arena.ctypes.data)


def exec_args(pairs: Sequence[tuple[int, int | None]]) -> ctypes.Array[ExecArg]:
    """The `dnnl_exec_arg_t` array of the (argument index, memory) pairs that have a memory."""
    kept = [(a, m) for a, m in pairs if m is not None]
    return (ExecArg * len(kept))(*(ExecArg(a, m) for a, m in kept))


def run_calls(lib: DnnlLib, calls: list[Call], step: st.Step) -> None:
    """Run primitive calls in order on the process's stream and wait; a failure names `step`."""
    _, strm = engine()
    for prim, args in calls:
        status = lib.fns["dnnl_primitive_execute"](prim, strm, len(args), args)
        if status != SUCCESS:
            raise OnednnError("dnnl_primitive_execute", int(status)).at(step)
    lib.call("dnnl_stream_wait", strm)


def pack(
    o: Owner, plain_md: int, packed_md: int, src: int, step: st.Step, packing: Packing | None
) -> int:
    """The constant weights of memory `src` (layout `plain_md`) in layout `packed_md`: taken
    from the store, or loaded, packed once here and kept there."""
    if packing is not None:
        hit = packing.store.find(o.lib, packing.key, packed_md)
        if hit is not None:
            return hit
        if packing.source_at is not None:  # from the constant itself: the arena never holds it
            src = o.memory(plain_md, packing.source_at)
        else:
            packing.load()
        mem = packing.store.new(o.lib, packing.key, packed_md, packing.keep)
    else:
        mem = o.memory(packed_md, MEMORY_ALLOCATE)
    reorder = o.reorder(plain_md, packed_md)
    run_calls(o.lib, [(reorder, exec_args([(ARG_FROM, src), (ARG_TO, mem)]))], step)
    if packing is not None and packing.source_at is not None and packing.keep is not None:
        release_pages(packing.keep)  # a mapped model file's pages: read once, packed, given back
    return mem


def build_owned(
    step: st.Step, make: Callable[[DnnlLib, Owner], _T | None], owner: Owner | None = None
) -> _T | None:
    """`make` with a fresh owner of oneDNN objects (or `owner`), closed when it fails or
    declines; None without oneDNN; a oneDNN error re-raised naming the step."""
    if available() is not None:
        return None
    lib = load_dnnl()
    o = Owner(lib) if owner is None else owner
    try:
        return make(lib, o)
    except OnednnError as e:
        o.close()
        raise e.at(step) from None
    except BaseException:
        o.close()
        raise
