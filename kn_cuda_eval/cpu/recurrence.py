"""The "recurrence" host point (`kn_graph.recurrence`: one direction of an RNN / GRU / LSTM over
all its steps) in compiled C (`recurrence.c`), for the runtime's segmented runner on every
device: the NumPy loop costs ~18 µs of Python a step (DNSMOS PLCMOS: 45 ms of a 103 ms call in
four GRUs over 626 frames), the C loop a matrix-vector product and a few passes over H floats.

Same formulas (the recurrent bias where the NumPy loop folds it, float16 computed in float32),
so the NumPy loop stays the oracle and the C loop differs from it by rounding only: its dot
products sum in another order, and its e^x and tanh are its own (vectorized, within a few ulp).
Arguments are read as the op has them (R's rows as stored), so a call costs no copy of the
weights. Any case it does not take — float64, no C compiler, arguments that do not fit —
returns None and the NumPy loop runs, as it does for the reference executor and the emulator."""

from __future__ import annotations

import ctypes
import functools
import logging

import numpy as np

from kn_cuda_eval.cpu import build
from kn_graph.errors import EvaluationError, KernelCompileError
from kn_graph.ops import Dynamic
from kn_graph.recurrence import ACTIVATIONS, Recurrence, operands

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
    fn.restype = ctypes.c_int
    fn.argtypes = [_P, _P, ctypes.c_longlong, ctypes.c_longlong, *[_P] * 6]
    return lib


@functools.cache
def _settings(spec: Recurrence) -> tuple[int, int, tuple[np.ndarray, ...]]:
    """The addresses of the cell's integer and float settings as `kn_recurrence` reads them
    (`dims`, `params`), and the arrays that hold them (kept alive with the cache entry)."""
    acts = [*spec.acts, *spec.acts[-1:] * (3 - len(spec.acts))]  # unused slots repeat the last
    dims = [
        _KINDS[spec.kind],
        spec.hidden,
        spec.reverse,
        spec.linear_before_reset,
        spec.input_forget,
        spec.clip is not None,
        *(ACTIVATIONS.index(act.name) for act in acts),
    ]
    params = [spec.clip or 0.0, *(v for act in acts for v in (act.alpha, act.beta))]
    held = (np.array(dims, np.int64), np.array(params, np.float32))
    return held[0].ctypes.data, held[1].ctypes.data, held


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)  # no copy for a contiguous f32 array


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def run_recurrence_c(spec: Recurrence, xs: list[np.ndarray]) -> list[np.ndarray] | None:
    """`kn_graph.recurrence.run_recurrence`'s results computed by `recurrence.c`, or None when
    this case is the NumPy loop's: float64, no compiler, or arguments that do not fit the op
    (the NumPy loop then raises its error)."""
    lib = _library()
    if lib is None or spec.kind not in _KINDS:
        return None
    try:
        o = operands(spec, xs)
    except EvaluationError:
        return None  # the NumPy loop raises it
    xw, r, rb, h0, c0, p, running = o.xw, o.r, o.rb, o.h0, o.c0, o.p, o.running
    if xw.dtype not in (np.float32, np.float16) or xw.ndim != 3:
        return None
    steps, batch, gh = xw.shape
    n = spec.hidden
    shapes = [(xw, (steps, batch, spec.gates * n)), (r, (gh, n)), (rb, (gh,)), (h0, (batch, n))]
    shapes += [(c0, (batch, n)), (p, (3 * n,)), (running, (steps, batch, 1))]
    if o.extra or any(a is not None and a.shape != want for a, want in shapes):
        return None
    dims, params, _ = _settings(spec)
    xw32, r32 = _f32(xw), _f32(r)
    rb32, p32 = (None if a is None else _f32(a) for a in (rb, p))
    run = None if running is None else np.ascontiguousarray(running.astype(bool), np.uint8)
    ny, nh = steps * batch * n, batch * n
    out = np.zeros(ny + 2 * nh + 6 * gh, np.float32)  # Y, h, c, scratch: one buffer, one address
    out[ny : ny + nh] = h0.reshape(-1)
    if c0 is not None:
        out[ny + nh : ny + 2 * nh] = c0.reshape(-1)
    lib.kn_recurrence(
        dims,
        params,
        steps,
        batch,
        xw32.ctypes.data,
        r32.ctypes.data,
        _ptr(rb32),
        _ptr(p32),
        _ptr(run),
        out.ctypes.data,
    )
    dt = xw.dtype
    results = [out[:ny].reshape(steps, batch, n), out[ny : ny + nh].reshape(batch, n)]
    if c0 is not None:
        results.append(out[ny + nh : ny + 2 * nh].reshape(batch, n))
    return [a.astype(dt, copy=False) for a in results]


def _host_recurrence(op: Dynamic, args: list[np.ndarray]) -> list[np.ndarray] | None:
    (spec,) = op.params if len(op.params) == 1 else (None,)
    return run_recurrence_c(spec, args) if isinstance(spec, Recurrence) else None


HOST_KINDS = {"recurrence": _host_recurrence}
"""The host points this module computes in C, for `SegmentedRunner(host_kinds=...)`: each takes
the op and its arguments and returns the results, or None for the NumPy implementation."""
