"""A throwaway device runner for the `cuda` tests (not the executor of the next issue): it runs
a plan's generated kernels with CuPy on a real GPU — GEMMs through CuPy's matmul on strided views,
mirroring the emulator — so a GPU session can check every kernel against the emulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kn_cuda_eval import Plan, StridedView, steps
from kn_cuda_eval.kernels import FloatArg, IntArg, PtrArg, launch_for
from kn_cuda_eval.kernels.launch import Arg

__all__ = ["device_arch", "marshal", "run_on_device"]


def marshal(args: Sequence[Arg], base: int) -> tuple[Any, ...]:
    """Launch arguments as CuPy wants them: pointers as uint64, ints as int32/int64, floats f32."""
    out: list[Any] = []
    for a in args:
        match a:
            case PtrArg(offset):
                out.append(np.uint64(base + offset))
            case IntArg(value, bits):
                out.append(np.int32(value) if bits == 32 else np.int64(value))
            case FloatArg(value):
                out.append(np.float32(value))
    return tuple(out)


def device_arch() -> int:
    import cupy as cp

    from kn_cuda_eval.kernels.compile import clamp_arch

    return clamp_arch(int(cp.cuda.Device().compute_capability))


def _view(cp: Any, arena: Any, v: StridedView) -> Any:
    mem = cp.cuda.MemoryPointer(arena.data.mem, v.offset)
    return cp.ndarray(v.shape, v.dtype.np, mem, strides=tuple(s * v.itemsize for s in v.strides))


def run_on_device(p: Plan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    import cupy as cp

    from kn_cuda_eval.kernels.compile import compile_kernel

    arch = device_arch()
    arena = cp.full(p.arena_size, 0xFF, dtype=cp.uint8)
    base = int(arena.data.ptr)
    for off, data in p.constants:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        arena[off : off + raw.size] = cp.asarray(raw)
    for v, a in zip(p.inputs, inputs, strict=True):
        if v.numel:
            _view(cp, arena, v)[...] = cp.asarray(np.ascontiguousarray(a))
    _view(cp, arena, p.status)[...] = 0
    modules: dict[str, Any] = {}
    for s in p.steps:
        launch = launch_for(s, p.status)
        if launch is not None:
            k = launch.kernel
            if k.name not in modules:
                m = cp.cuda.function.Module()
                m.load(compile_kernel(k, arch).cubin)
                modules[k.name] = (m, m.get_function(k.name))
            modules[k.name][1](
                launch.grid, launch.block, marshal(launch.args, base), shared_mem=launch.shared_mem
            )
        elif isinstance(s, steps.MatMul):
            ct = cp.float64 if s.dtype.np == np.float64 else cp.float32
            a = _view(cp, arena, s.a).transpose(0, 2, 1).astype(ct)
            b = _view(cp, arena, s.b).transpose(0, 2, 1).astype(ct)
            a = a.transpose(0, 2, 1) if s.transa else a
            b = b.transpose(0, 2, 1) if s.transb else b
            c = ct(s.alpha) * cp.matmul(a, b)
            _view(cp, arena, s.c)[...] = c.transpose(0, 2, 1).astype(s.dtype.np)
        else:
            raise NotImplementedError(
                f"the test runner has no {type(s).__name__} (cuDNN lands with the executor)"
            )
    cp.cuda.Device().synchronize()
    status = int(_view(cp, arena, p.status).get())
    if status:
        raise RuntimeError(f"kernel status word {status:#x} (a gather index out of range)")
    return [
        cp.asnumpy(_view(cp, arena, v)) if v.numel else np.zeros(v.shape, v.dtype.np)
        for v in p.outputs
    ]
