"""A planned `KernelLaunch` run on the host over a NumPy byte arena: pointers are the arena's base
plus their offsets, integers and floats packed as CUDA packs kernel parameters, and the grid,
block and shared-memory size exactly as the executor would pass them."""

from __future__ import annotations

import ctypes
import math
import re
import struct

import numpy as np

from kn_cuda_eval.cuda.hostcheck.compile import build
from kn_cuda_eval.cuda.kernels.launch import Arg, FloatArg, IntArg, KernelLaunch, PtrArg
from kn_graph.errors import EvaluationError

__all__ = ["pack_args", "run_launch"]


class _LaunchDesc(ctypes.Structure):  # kn_host::LaunchDesc in cuda_host.h
    _fields_ = (
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_ulonglong),
        ("args", ctypes.c_void_p),
        ("args_size", ctypes.c_ulonglong),
        ("codes", ctypes.c_char_p),
        ("error", ctypes.c_void_p),
        ("error_size", ctypes.c_ulonglong),
    )


_SCALARS: dict[tuple[type, int], tuple[str, str]] = {
    (IntArg, 32): ("<i", "i"),
    (IntArg, 64): ("<q", "l"),
    (FloatArg, 32): ("<f", "f"),
    (FloatArg, 64): ("<d", "d"),
}


def pack_args(args: tuple[Arg, ...], base: int) -> tuple[bytes, str]:
    """The parameter buffer (each value at an offset aligned to its size) and one type code per
    parameter ('p' pointer, 'i'/'l' 32/64-bit integer, 'f'/'d' float/double) that the launcher
    checks against the kernel's own parameter types."""
    buf = bytearray()
    codes = []
    for a in args:
        if isinstance(a, PtrArg):
            fmt, code, value = "<Q", "p", base + a.offset
        else:
            spec = _SCALARS.get((type(a), a.bits))
            if spec is None:
                raise EvaluationError(f"{a}: 32 or 64 bits expected")
            (fmt, code), value = spec, a.value
        size = struct.calcsize(fmt)
        buf += bytes(-len(buf) % size)
        buf += struct.pack(fmt, value)
        codes.append(code)
    return bytes(buf), "".join(codes)


_BOUNDS = re.compile(r"__launch_bounds__\((\d+)")


def run_launch(launch: KernelLaunch, arena: np.ndarray) -> None:
    """Run `launch` over `arena` (a contiguous, writable uint8 array laid out as the plan's);
    raises EvaluationError when the launch is illegal (more threads than the kernel's launch
    bounds, a parameter mismatch) or the kernel misbehaves (a deadlock, a warp operation naming
    lanes that have exited)."""
    if arena.dtype != np.uint8 or not arena.flags.c_contiguous or not arena.flags.writeable:
        raise EvaluationError("the arena must be a contiguous, writable uint8 array")
    name = launch.kernel.name
    threads = math.prod(launch.block)
    bound = _BOUNDS.search(launch.kernel.source)
    if bound is not None and threads > int(bound.group(1)):
        raise EvaluationError(
            f"{name}: launched with {threads} threads per block, its launch bounds allow "
            f"{bound.group(1)}"
        )
    hk = build(launch.kernel)
    data, codes = pack_args(launch.args, arena.ctypes.data)
    args = ctypes.create_string_buffer(data, len(data) or 1)
    error = ctypes.create_string_buffer(1024)
    desc = _LaunchDesc(
        (ctypes.c_uint * 3)(*launch.grid),
        (ctypes.c_uint * 3)(*launch.block),
        launch.shared_mem,
        ctypes.addressof(args),
        len(data),
        codes.encode(),
        ctypes.addressof(error),
        len(error),
    )
    if hk.entry(ctypes.byref(desc)) != 0:
        raise EvaluationError(f"{name} on the host: {error.value.decode(errors='replace')}")
