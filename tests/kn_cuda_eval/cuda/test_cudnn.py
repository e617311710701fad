"""The cuDNN binding's host side. The marshalling tests run everywhere against a stand-in library
object; the real-library tests (marked `cuda`) need the cuDNN wheel (`.[cuda13]` or `.[cuda12]`,
about 1 GB, so CI does not install it) but no GPU: they skip, saying so, where it is absent."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cuda.cudnn import (
    PROTOTYPES,
    ConvGeometry,
    CudnnError,
    CudnnLib,
    TensorDescriptor,
    conv_output_dims,
    load_cudnn,
)
from kn_cuda_eval.cuda.cudnn.lib import DataType
from kn_cuda_eval.planning import steps
from kn_graph import DType, Graph, Shape
from kn_graph.errors import CudaUnavailableError
from tests.kn_cuda_eval.corpus import FIXTURES, datasets, load


class _FakeFn:
    def __init__(self, name: str, log: list, status: int) -> None:
        self.name, self.log, self.status = name, log, status
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        self.log.append((self.name, args))
        if self.name == "cudnnGetErrorString":
            return b"CUDNN_STATUS_BAD_PARAM"
        if self.name.startswith("cudnnCreate") and args:
            args[0]._obj.value = 0x1234  # byref(c_void_p): hand out a fake descriptor
        return self.status


class FakeCudnn:
    """Stands in for the CDLL: every function records its arguments and returns `status`."""

    def __init__(self, status: int = 0) -> None:
        self.log: list[tuple[str, tuple]] = []
        self.status = status
        self.fns: dict[str, _FakeFn] = {}

    def __getattr__(self, name: str) -> _FakeFn:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.fns.setdefault(name, _FakeFn(name, self.log, self.status))


def test_every_prototype_is_declared() -> None:
    fake = FakeCudnn()
    CudnnLib(fake)
    assert set(fake.fns) == set(PROTOTYPES)
    for name, fn in fake.fns.items():
        assert fn.restype is not None and fn.argtypes is not None, name
    # pointers are never passed as plain ints (which ctypes would truncate to 32 bits)
    bias_act = fake.fns["cudnnConvolutionBiasActivationForward"].argtypes
    assert len(bias_act) == 18 and bias_act[3] is ctypes.c_void_p


def test_descriptor_marshalling() -> None:
    fake = FakeCudnn()
    lib = CudnnLib(fake)
    with TensorDescriptor(lib, DataType.HALF, (2, 3, 4, 5), (60, 20, 5, 1)):
        pass
    names = [n for n, _ in fake.log]
    assert names == [
        "cudnnCreateTensorDescriptor",
        "cudnnSetTensorNdDescriptor",
        "cudnnDestroyTensorDescriptor",
    ]
    _, (ptr, dt, nb, dims, strides) = fake.log[1]
    assert ptr.value == 0x1234 and dt == DataType.HALF and nb == 4
    assert list(dims) == [2, 3, 4, 5] and list(strides) == [60, 20, 5, 1]


def test_failed_status_raises_with_the_error_string() -> None:
    lib = CudnnLib(FakeCudnn(status=2000))
    with pytest.raises(
        CudnnError,
        match=r"cudnnCreateTensorDescriptor failed with status 2000 \(CUDNN_STATUS_BAD_PARAM\)",
    ):
        TensorDescriptor(lib, DataType.FLOAT, (1, 1, 1, 1), (1, 1, 1, 1))


def _conv_plans() -> list:
    rng = np.random.default_rng(7)
    plans = []
    for nd, groups, dil, stride in [(1, 1, 1, 2), (2, 2, 2, 1), (3, 1, 1, 2), (2, 4, 1, 3)]:
        g = Graph()
        x = g.input(Shape.of(2, 4, *(11,) * nd), DType.F32, "x")
        w = g.constant(rng.standard_normal((8, 4 // groups, *(3,) * nd)).astype(np.float32))
        g.add_output(g.conv(x, w, (stride,) * nd, (1,) * nd, (dil,) * nd, groups), "y")
        plans.append(plan(g))
    return plans


def test_geometry_lifts_1d_convolutions_to_2d() -> None:
    conv = next(s for s in _conv_plans()[0].steps if isinstance(s, steps.Conv))
    geo = ConvGeometry.of(conv)
    assert geo.x_dims == (2, 4, 1, 11) and geo.w_dims == (8, 4, 1, 3) and geo.y_dims == (2, 8, 1, 6)
    assert geo.pads == (0, 1) and geo.strides == (1, 2) and geo.dilations == (1, 1)
    assert geo.x_strides == (44, 11, 11, 1)


# -- finding the library ---------------------------------------------------------------------------------
class _Loader:
    """Stands in for ctypes.CDLL: only the paths in `files` load (as a FakeCudnn)."""

    def __init__(self, *files: str) -> None:
        self.files = set(files)
        self.tried: list[str] = []

    def __call__(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self.tried.append(str(path))
        if str(path) not in self.files:
            raise OSError(f"{path}: cannot open shared object file")
        return FakeCudnn()


@pytest.fixture
def finder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A fresh lookup with a cuda.pathfinder that behaves like 1.3.4-1.6 (it does not know
    cuDNN), an `nvidia.cudnn` package without the library (lib/ empty) first on sys.path, and
    no CUDNN_PATH; the test adds what it needs."""
    import cuda.pathfinder as pf

    def old_pathfinder(name: str) -> Any:
        raise pf.DynamicLibUnknownError(f"Unknown library name: '{name}'")

    monkeypatch.setattr(pf, "load_nvidia_dynamic_lib", old_pathfinder)
    (tmp_path / "site" / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    (tmp_path / "site" / "nvidia" / "cudnn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delenv("CUDNN_PATH", raising=False)
    load_cudnn.cache_clear()
    yield tmp_path
    load_cudnn.cache_clear()


def test_an_old_pathfinder_falls_back_to_the_wheel(
    finder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = finder / "site" / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9"
    wheel.write_bytes(b"")
    loader = _Loader(str(wheel))
    monkeypatch.setattr(ctypes, "CDLL", loader)
    assert isinstance(load_cudnn().lib, FakeCudnn)
    assert loader.tried == [str(wheel)]  # the pathfinder's refusal cost nothing else


def test_then_cudnn_path_then_the_system_soname(
    finder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = finder / "cudnn-9"
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.setenv("CUDNN_PATH", str(root))
    loader = _Loader(str(root / "lib64" / "libcudnn.so.9"))
    monkeypatch.setattr(ctypes, "CDLL", loader)
    load_cudnn()
    assert loader.tried == [str(root / "lib64" / "libcudnn.so.9")]
    load_cudnn.cache_clear()
    monkeypatch.delenv("CUDNN_PATH")
    loader = _Loader("libcudnn.so.9")
    monkeypatch.setattr(ctypes, "CDLL", loader)
    load_cudnn()
    assert loader.tried == ["libcudnn.so.9"]


def test_a_missing_cudnn_names_every_place_searched(
    finder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ctypes, "CDLL", _Loader())
    with pytest.raises(CudaUnavailableError) as err:
        load_cudnn()
    msg = str(err.value)
    for part in (
        "cuda.pathfinder: DynamicLibUnknownError: Unknown library name: 'cudnn'",
        "the nvidia.cudnn wheel: FileNotFoundError: no lib/libcudnn.so.9 in",
        "$CUDNN_PATH: FileNotFoundError: CUDNN_PATH is not set",
        "the system: OSError: libcudnn.so.9: cannot open shared object file",
    ):
        assert part in msg, msg


def test_a_pathfinder_that_knows_cudnn_is_asked_first(
    finder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cuda.pathfinder as pf

    found = pf.LoadedDL("/opt/wheels/nvidia/cudnn/lib/libcudnn.so.9", False, 0, "site-packages")
    monkeypatch.setattr(pf, "load_nvidia_dynamic_lib", lambda name: found)
    loader = _Loader(str(found.abs_path))
    monkeypatch.setattr(ctypes, "CDLL", loader)
    load_cudnn()
    assert loader.tried == [found.abs_path]


# -- the real library (host side only) ----------------------------------------------------------------
def _real() -> CudnnLib:
    from kn_cuda_eval.cuda.cudnn import load_cudnn
    from kn_graph.errors import CudaUnavailableError

    try:
        return load_cudnn()
    except CudaUnavailableError as e:
        pytest.skip(
            f"the cuDNN wheel is not installed (CI installs NVRTC only; `pip install .[cuda13]`): {e}"
        )


@pytest.mark.cuda
def test_real_cudnn_version_matches_cupy_runtime() -> None:
    lib = _real()
    assert lib.version() >= 90000
    import cupy

    assert lib.cudart_version() // 1000 == cupy.cuda.runtime.runtimeGetVersion() // 1000


@pytest.mark.cuda
def test_real_cudnn_exports_every_prototype() -> None:
    lib = _real()
    for name in PROTOTYPES:
        assert hasattr(lib.lib, name), name
    with TensorDescriptor(lib, DataType.FLOAT, (2, 3, 4, 5), (60, 20, 5, 1)) as t:
        assert t.get() == (DataType.FLOAT, (2, 3, 4, 5), (60, 20, 5, 1))
    with pytest.raises(CudnnError):
        TensorDescriptor(lib, DataType.FLOAT, (2, -3, 4, 5), (60, 20, 5, 1))


@pytest.mark.cuda
def test_real_cudnn_output_dims_agree_with_the_planner() -> None:
    lib = _real()
    checked = 0
    plans = _conv_plans()
    for f in FIXTURES:
        try:
            g = load(f["name"])
        except Exception:
            continue
        if g.has_dynamic:  # data-dependent sizes: planned per segment and binding at run time
            continue  # (corpus.fixture_plans); the static fixtures hold every kind of conv
        for _, binds in datasets(f["name"]):
            plans.append(plan(g, bindings=binds))
    for p in plans:
        for s in p.steps:
            if isinstance(s, steps.Conv):
                geo = ConvGeometry.of(s)
                assert conv_output_dims(lib, geo) == geo.y_dims, geo
                checked += 1
    assert checked > 100
