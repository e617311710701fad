"""Is CUDA usable here, and with which versions? Answers without ever crashing: CuPy, the
driver, a GPU, NVRTC, cuBLAS or cuDNN may each be missing. cuDNN is reported on its own
(`cudnn_problem`): only plans with convolutions need it, so its absence never makes the device
unusable."""

from __future__ import annotations

from typing import Any

from kn_graph.errors import CudaUnavailableError

__all__ = ["cudnn_problem", "device_count", "probe", "versions"]


def _api() -> Any:
    from kn_cuda_eval.cuda.device.api import default_api

    return default_api()


def device_count() -> int:
    """How many CUDA devices the driver shows (0 when CuPy or the driver is missing)."""
    try:
        return int(_api().rt.getDeviceCount())
    except Exception:
        return 0


def _usable_api() -> tuple[Any, str | None]:
    try:
        return _api(), None
    except CudaUnavailableError as e:
        return None, str(e)
    except Exception as e:
        return None, f"CuPy failed to initialise ({type(e).__name__}: {e})"


def probe(index: int = 0) -> str | None:
    """Why CUDA device `index` cannot run plans, or None when it can: the device answers, NVRTC
    compiles for its architecture, memory can be allocated on it and cuBLAS loads. (cuDNN is
    not asked for: see `cudnn_problem`; an executor whose plan has convolutions fails without
    it, naming the convolution.)"""
    api, reason = _usable_api()
    if api is None:
        return reason
    reason = api.problem(index)
    if reason is not None:
        return str(reason)
    step = "NVRTC"
    try:
        from kn_cuda_eval.cuda.kernels.compile import clamp_arch, nvrtc_version

        clamp_arch(api.compute_capability(index))
        nvrtc_version()
        step = "device memory"
        with api.use(index):
            api.alloc(256)
            step = "cuBLAS"
            api.blas_handle(index)
    except Exception as e:
        return f"{step} is not usable: {type(e).__name__}: {e}"
    return None


def cudnn_problem() -> str | None:
    """Why convolutions cannot run here (cuDNN missing, or built for another CUDA major version
    than CuPy's runtime), or None when cuDNN is usable."""
    api, reason = _usable_api()
    if api is None:
        return reason
    try:
        api.cudnn()
    except Exception as e:
        return f"cuDNN is not usable: {type(e).__name__}: {e}"
    return None


def versions(index: int = 0) -> dict[str, str]:
    """Versions of every piece of the GPU stack, each 'unavailable: why' when it cannot be read."""
    out: dict[str, str] = {}

    def read(key: str, f: Any) -> None:
        try:
            out[key] = str(f())
        except Exception as e:
            out[key] = f"unavailable: {type(e).__name__}: {e}"

    def fmt(v: int) -> str:
        return f"{v // 1000}.{v % 1000 // 10}"

    try:
        import cupy

        out["cupy"] = cupy.__version__
    except Exception as e:
        out["cupy"] = f"unavailable: {type(e).__name__}: {e}"
        return out
    api = None
    try:
        api = _api()
    except Exception as e:
        out["cuda"] = f"unavailable: {e}"
    if api is not None:
        read("driver (CUDA)", lambda: fmt(int(api.rt.driverGetVersion())))
        read("runtime (CUDA)", lambda: fmt(int(api.rt.runtimeGetVersion())))
        read("gpu", lambda: api.device_name(index))
        read("compute capability", lambda: api.compute_capability(index))
        read("gpu memory GiB", lambda: f"{api.rt.memGetInfo()[1] / 2**30:.1f}")
        read("cublas", lambda: api.cublas().version(api.blas_handle(index)))

    def nvrtc() -> str:
        from kn_cuda_eval.cuda.kernels.compile import nvrtc_version, supported_archs

        major, minor = nvrtc_version()
        return f"{major}.{minor} (sm_{min(supported_archs())}..sm_{max(supported_archs())})"

    def cudnn() -> str:
        from kn_cuda_eval.cuda.cudnn.lib import load_cudnn

        lib = load_cudnn()
        v = lib.version()
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100} (built for CUDA {fmt(lib.cudart_version())})"

    read("nvrtc", nvrtc)
    read("cudnn", cudnn)
    return out
