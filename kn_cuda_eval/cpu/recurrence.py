"""The "recurrence" host point (`kn_graph.recurrence`: one direction of an RNN / GRU / LSTM over
all its steps) in compiled C (`recurrence.c`), for the runtime's segmented runner on every
device: the NumPy loop costs ~18 µs of Python a step (DNSMOS PLCMOS: 45 ms of a 103 ms call in
four GRUs over 626 frames), the C loop a matrix-vector product and a few passes over H floats.

Same formulas, same argument preparation (`recurrence_args`: the recurrent bias folded into the
input projection, R transposed, float16 computed in float32), so the NumPy loop stays the oracle
and the C loop differs from it by rounding only (its dot products sum in another order). Any
case it does not take — another compute dtype (float64), no C compiler — returns None and the
NumPy loop runs, as it does for the reference executor and the plan emulator."""

from __future__ import annotations

import ctypes
import functools
import logging

import numpy as np

from kn_cuda_eval.cpu import build
from kn_graph.errors import KernelCompileError
from kn_graph.ops import Dynamic
from kn_graph.recurrence import ACTIVATIONS, Recurrence, recurrence_args

__all__ = ["HOST_KINDS", "run_recurrence_c"]

log = logging.getLogger(__name__)

_KINDS = {"RNN": 0, "GRU": 1, "LSTM": 2}
_P = ctypes.c_void_p


@functools.cache
def _library() -> ctypes.CDLL | None:
    """recurrence.c compiled once (cached on disk like the kernels); None without a compiler or
    when it does not build (logged: the NumPy loop then runs)."""
    if build.compiler() is None:
        return None
    try:
        lib = build.load_source("recurrence.c")
    except KernelCompileError as e:
        log.warning("recurrence.c does not build: recurrences run in NumPy (%s)", e)
        return None
    fn = lib.kn_recurrence
    fn.restype, fn.argtypes = ctypes.c_int, [_P] * 11
    return lib


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def run_recurrence_c(spec: Recurrence, xs: list[np.ndarray]) -> list[np.ndarray] | None:
    """`kn_graph.recurrence.run_recurrence`'s results computed by `recurrence.c`, or None when
    this case is the NumPy loop's (see the module docstring)."""
    lib = _library()
    if lib is None or spec.kind not in _KINDS:
        return None
    a = recurrence_args(spec, xs)  # checks the shapes; copies what the loop writes
    if a.xw.dtype != np.float32:
        return None
    f32 = np.float32
    xw = np.ascontiguousarray(a.xw, f32)
    steps, batch, n = xw.shape[0], a.h0.shape[0], spec.hidden
    h = np.ascontiguousarray(a.h0.reshape(batch, n), f32)
    c = None if a.c0 is None else np.ascontiguousarray(a.c0.reshape(batch, n), f32)
    rb_h = None if a.rb_h is None else np.ascontiguousarray(a.rb_h, f32)
    p = None if a.p is None else np.ascontiguousarray(a.p, f32)
    running = (
        None
        if a.running is None
        else np.ascontiguousarray(a.running.reshape(steps, batch), np.uint8)
    )
    acts = [*spec.acts, *spec.acts[-1:] * (3 - len(spec.acts))]  # unused slots repeat the last
    dims = np.array(
        [
            _KINDS[spec.kind],
            steps,
            batch,
            n,
            spec.reverse,
            spec.linear_before_reset,
            spec.input_forget,
            spec.clip is not None,
            *(ACTIVATIONS.index(act.name) for act in acts),
        ],
        np.int64,
    )
    params = np.array(
        [spec.clip or 0.0, *(v for act in acts for v in (act.alpha, act.beta))], np.float32
    )
    y = np.zeros((steps, batch, n), f32)
    work = np.empty(5 * spec.gates * n, f32)
    lib.kn_recurrence(
        dims.ctypes.data,
        params.ctypes.data,
        xw.ctypes.data,
        np.ascontiguousarray(a.rt, f32).ctypes.data,
        _ptr(rb_h),
        h.ctypes.data,
        _ptr(c),
        _ptr(p),
        _ptr(running),
        y.ctypes.data,
        work.ctypes.data,
    )
    dt = xs[0].dtype
    states = [h] if c is None else [h, c]
    return [y.astype(dt, copy=False), *(s.reshape(a.h0.shape).astype(dt) for s in states)]


def _host_recurrence(op: Dynamic, args: list[np.ndarray]) -> list[np.ndarray] | None:
    (spec,) = op.params if len(op.params) == 1 else (None,)
    return run_recurrence_c(spec, args) if isinstance(spec, Recurrence) else None


HOST_KINDS = {"recurrence": _host_recurrence}
"""The host points this module computes in C, for `SegmentedRunner(host_kinds=...)`: each takes
the op and its arguments and returns the results, or None for the NumPy implementation."""
