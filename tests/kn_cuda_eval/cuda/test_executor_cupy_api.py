"""`CupyApi` — the thin layer the fake device replaces in the other tests — checked on the CPU:
every CuPy runtime and driver call it makes goes through a proxy that compares the argument
count with the signature CuPy documents, every CuPy object it touches exists with the parameters
it passes, and cuBLAS is bound through ctypes on the library CuPy loaded (never CuPy's GEMM
wrappers). (Calls that need a GPU to *run* are checked on one by -m cuda.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kn_cuda_eval.cuda.device.api import D2D, D2H, H2D, CupyApi
from kn_cuda_eval.cuda.device.cublas import PROTOTYPES, CublasLib, _loaded_paths
from kn_graph.errors import CudaUnavailableError
from tests.kn_cuda_eval.cuda.fake_cublas import FakeCublasC
from tests.kn_cuda_eval.cuda.fake_device import FakeApi


def _api() -> CupyApi:
    try:
        return CupyApi()
    except CudaUnavailableError as e:
        pytest.skip(f"CuPy is not usable here: {e}")


def _params(fn: Callable[..., Any]) -> list[str]:
    """Parameter names from the first docstring line, e.g. `memcpy(intptr_t dst, ...)`."""
    head = (fn.__doc__ or "").strip().splitlines()[0]
    inner = re.search(r"\((.*)\)", head)
    assert inner is not None, head
    out = []
    for p in inner.group(1).split(","):
        p = p.strip()
        if not p or p == "self":
            continue
        if p == "*":
            break
        out.append(p)
    return out


class Checked:
    """Stands for a CuPy module: calls are checked against the real function's signature,
    recorded and answered from `returns`."""

    def __init__(self, real: Any, returns: dict[str, Any] | None = None) -> None:
        self.real = real
        self.returns = returns or {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.real, name)
        if not callable(real):
            return real
        params = _params(real)
        required = [p for p in params if "=" not in p]

        def call(*args: Any) -> Any:
            assert len(required) <= len(args) <= len(params), (name, params, args)
            for a in args:
                assert isinstance(a, int | float | bytes), (name, a)  # Cython int/size_t params
            self.calls.append((name, args))
            return self.returns.get(name)

        return call


@dataclass
class _Stream:
    ptr: int


@pytest.mark.cuda  # needs CuPy's CUDA libraries (cuBLAS), which CI does not install
def test_runtime_driver_and_cublas_calls_match_cupys_signatures() -> None:
    api = _api()
    api.rt = Checked(api.rt, {"getDeviceCount": 1, "getDeviceProperties": {"name": b"H200"}})
    api.driver = Checked(api.driver)
    blas = FakeCublasC(FakeApi())
    api.cublas = lambda: CublasLib(blas)  # type: ignore[method-assign]
    assert api.problem(0) is None
    assert api.problem(2) == "there is no CUDA device 2 (1 found)"
    assert api.device_name(0) == "H200"
    s = _Stream(0x77)
    api.memcpy(1, 2, 3, H2D)
    api.memcpy_async(1, 2, 3, D2H, s)  # type: ignore[arg-type]
    api.memcpy_async(1, 2, 3, D2D, s)  # type: ignore[arg-type]
    api.memset_async(1, 0xFF, 3, s)  # type: ignore[arg-type]
    api.launch(9, (4, 1, 1), (256, 1, 1), 0, s, 1234)  # type: ignore[arg-type]
    assert api.blas_handle(0) == 0x5001 and api.blas_handle(0) == 0x5001  # one per device+thread
    assert blas.math == {0x5001: 0}  # created once, default math (F32 stays F32)
    lock = api.handle_lock(0x5001)  # one per handle: every executor sharing it holds this one
    assert api.handle_lock(0x5001) is lock and api.handle_lock(0x5002) is not lock
    names = [n for n, _ in api.rt.calls + api.driver.calls]  # type: ignore[attr-defined]
    assert names.count("memcpyAsync") == 2 and "memsetAsync" in names and "memcpy" in names
    assert ("launchKernel", (9, 4, 1, 1, 256, 1, 1, 0, 0x77, 1234, 0)) in api.driver.calls  # type: ignore[attr-defined]


@pytest.mark.cuda  # needs CuPy's CUDA libraries (cuBLAS), which CI does not install
def test_the_cupy_objects_the_api_uses_exist() -> None:
    api = _api()
    cp = api.cp
    for name in ("Device", "Stream", "Event", "alloc", "alloc_pinned_memory", "get_elapsed_time"):
        assert hasattr(cp.cuda, name), name
    assert "non_blocking" in cp.cuda.Stream.__init__.__doc__
    assert "disable_timing" in cp.cuda.Event.__init__.__doc__
    for m in ("begin_capture", "end_capture", "wait_event", "synchronize", "record"):
        assert hasattr(cp.cuda.Stream, m) or hasattr(cp.cuda.Event, m), m
    assert _params(cp.cuda.get_current_stream) == ["int device_id=-1"]
    assert _params(cp.cuda.function.Module.load) == ["bytes cubin"]
    assert _params(cp.cuda.function.Module.get_function) == ["name"]
    import cupy.cuda.graph as graph

    assert _params(graph.Graph.launch) == ["stream=None"] and _params(graph.Graph.upload)
    assert hasattr(cp.cuda.Device, "compute_capability")
    for f in ("asarray", "from_dlpack", "ascontiguousarray", "empty", "ndarray"):
        assert hasattr(cp, f), f
    for f in ("driverGetVersion", "runtimeGetVersion", "memGetInfo"):
        assert hasattr(api.rt, f), f


@pytest.mark.cuda  # needs CuPy's CUDA libraries (cuBLAS), which CI does not install
def test_cublas_is_bound_on_cupys_own_library() -> None:
    api = _api()
    try:
        lib = api.cublas()  # imports cupy.cuda.cublas first: CuPy loads libcublas
    except CudaUnavailableError as e:
        pytest.skip(f"libcublas is not loadable here: {e}")
    from pathlib import Path

    assert lib.path in _loaded_paths(Path("/proc/self/maps").read_text())
    for name in PROTOTYPES:  # every declared prototype is exported (CublasLib looked them up)
        assert getattr(lib.lib, name).argtypes is not None, name
    assert "CUBLAS_STATUS_INVALID_VALUE" in lib.status_text(7)


def test_only_libcublas_itself_counts_as_loaded() -> None:
    maps = "\n".join(
        [
            "7f00-7f10 r-xp 00000000 08:01 12 /sp/nvidia/cu13/lib/libcublasLt.so.13",
            "7f10-7f20 r-xp 00000000 08:01 13 /sp/nvidia/cu13/lib/libcublas.so.13",
            "7f20-7f30 r--p 00010000 08:01 13 /sp/nvidia/cu13/lib/libcublas.so.13",
            "7f30-7f40 rw-p 00000000 00:00 0 [heap]",
            "7f40-7f50 r-xp 00000000 08:01 14 /usr/lib/libcublas.so",
        ]
    )
    assert _loaded_paths(maps) == ["/sp/nvidia/cu13/lib/libcublas.so.13", "/usr/lib/libcublas.so"]
