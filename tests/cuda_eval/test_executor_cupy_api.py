"""`CupyApi` — the thin layer the fake device replaces in the other tests — checked on the CPU:
every CuPy runtime, driver and cuBLAS call it makes goes through a proxy that compares the
argument count with the signature CuPy documents, and every CuPy object it touches exists with
the parameters it passes. (Calls that need a GPU to *run* are checked on one by -m cuda.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kn_cuda_eval.device.api import D2D, D2H, H2D, CupyApi, _find_set_workspace
from kn_graph.errors import CudaUnavailableError


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
    api.blas = Checked(api.blas, {"create": 7})
    assert api.problem(0) is None
    assert api.problem(2) == "there is no CUDA device 2 (1 found)"
    assert api.device_name(0) == "H200"
    s = _Stream(0x77)
    api.memcpy(1, 2, 3, H2D)
    api.memcpy_async(1, 2, 3, D2H, s)  # type: ignore[arg-type]
    api.memcpy_async(1, 2, 3, D2D, s)  # type: ignore[arg-type]
    api.memset_async(1, 0xFF, 3, s)  # type: ignore[arg-type]
    api.launch(9, (4, 1, 1), (256, 1, 1), 0, s, 1234)  # type: ignore[arg-type]
    assert api.blas_handle(0) == 7 and api.blas_handle(0) == 7  # one per device and thread
    names = [n for n, _ in api.rt.calls + api.driver.calls + api.blas.calls]  # type: ignore[attr-defined]
    assert names.count("memcpyAsync") == 2 and "memsetAsync" in names and "memcpy" in names
    assert ("launchKernel", (9, 4, 1, 1, 256, 1, 1, 0, 0x77, 1234, 0)) in api.driver.calls  # type: ignore[attr-defined]
    assert api.blas.calls == [("create", ()), ("setMathMode", (7, 0))]  # type: ignore[attr-defined]


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
    for f in ("gemmEx", "gemmStridedBatchedEx", "getVersion"):
        assert hasattr(api.blas, f), f
    for f in ("driverGetVersion", "runtimeGetVersion", "memGetInfo"):
        assert hasattr(api.rt, f), f


@pytest.mark.cuda  # needs CuPy's CUDA libraries (cuBLAS), which CI does not install
def test_cublas_set_workspace_is_found_on_cupys_own_library() -> None:
    _api()  # CupyApi imports cupy.cuda.cublas, which loads libcublas
    fn = _find_set_workspace()
    if fn is None:
        pytest.skip("libcublas is not loaded here")
    assert [t.__name__ for t in fn.argtypes] == ["c_void_p", "c_void_p", "c_ulong"]
