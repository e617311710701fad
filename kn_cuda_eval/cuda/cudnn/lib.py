"""The `ctypes` binding of `libcudnn.so.9` (host side): every prototype we call is declared
(an undeclared Python int would be passed as a 32-bit C int and truncate device pointers), every
status is checked. Loaded lazily, on first use, from the first of: `cuda.pathfinder` (>= 1.7;
older versions do not know cuDNN), the `nvidia.cudnn` wheel's `lib/libcudnn.so.9`,
`$CUDNN_PATH/lib[64]`, the system soname.

Descriptor creation and the output-shape query work without a GPU; `cudnnCreate` (a handle) and
everything that runs needs one.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import importlib.util
import os
from ctypes import POINTER, c_double, c_float, c_int, c_size_t, c_void_p
from typing import Any

from kn_graph.errors import CudaUnavailableError, KnError

__all__ = [
    "PROTOTYPES",
    "ActivationMode",
    "AlgoPerf",
    "ConvFwdAlgo",
    "CudnnError",
    "CudnnLib",
    "DataType",
    "MathType",
    "TensorFormat",
    "load_cudnn",
]


class CudnnError(KnError):
    """A cuDNN call returned an error status; the message names the call and the status."""

    def __init__(self, function: str, status: int, text: str) -> None:
        self.function = function
        self.status = status
        super().__init__(f"{function} failed with status {status} ({text})")


class DataType(enum.IntEnum):
    FLOAT = 0
    DOUBLE = 1
    HALF = 2


class TensorFormat(enum.IntEnum):
    NCHW = 0
    NHWC = 1


class MathType(enum.IntEnum):
    DEFAULT = 0
    TENSOR_OP = 1
    FMA = 3  # F32 stays F32: no silent TF32 on Ampere and newer


class ActivationMode(enum.IntEnum):
    RELU = 1
    IDENTITY = 5  # with ConvolutionBiasActivationForward only with IMPLICIT_PRECOMP_GEMM


class ConvFwdAlgo(enum.IntEnum):
    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7


CONVOLUTION = 0
CROSS_CORRELATION = 1
NOT_PROPAGATE_NAN = 0
PROPAGATE_NAN = 1


class AlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t."""

    _fields_ = [
        ("algo", c_int),
        ("status", c_int),
        ("time", c_float),
        ("memory", c_size_t),
        ("determinism", c_int),
        ("mathType", c_int),
        ("reserved", c_int * 3),
    ]


_P = c_void_p  # every handle and descriptor is an opaque pointer
_PP = POINTER(c_void_p)
_IA = POINTER(c_int)
_STATUS = c_int

PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # version and errors
    "cudnnGetVersion": (c_size_t, ()),
    "cudnnGetCudartVersion": (c_size_t, ()),
    "cudnnGetErrorString": (ctypes.c_char_p, (c_int,)),
    # handle
    "cudnnCreate": (_STATUS, (_PP,)),
    "cudnnDestroy": (_STATUS, (_P,)),
    "cudnnSetStream": (_STATUS, (_P, _P)),
    # tensors
    "cudnnCreateTensorDescriptor": (_STATUS, (_PP,)),
    "cudnnSetTensorNdDescriptor": (_STATUS, (_P, c_int, c_int, _IA, _IA)),
    "cudnnGetTensorNdDescriptor": (_STATUS, (_P, c_int, _IA, _IA, _IA, _IA)),
    "cudnnDestroyTensorDescriptor": (_STATUS, (_P,)),
    # filters
    "cudnnCreateFilterDescriptor": (_STATUS, (_PP,)),
    "cudnnSetFilterNdDescriptor": (_STATUS, (_P, c_int, c_int, c_int, _IA)),
    "cudnnGetFilterNdDescriptor": (_STATUS, (_P, c_int, _IA, _IA, _IA, _IA)),
    "cudnnDestroyFilterDescriptor": (_STATUS, (_P,)),
    # convolutions
    "cudnnCreateConvolutionDescriptor": (_STATUS, (_PP,)),
    "cudnnSetConvolutionNdDescriptor": (_STATUS, (_P, c_int, _IA, _IA, _IA, c_int, c_int)),
    "cudnnGetConvolutionNdDescriptor": (_STATUS, (_P, c_int, _IA, _IA, _IA, _IA, _IA, _IA)),
    "cudnnSetConvolutionGroupCount": (_STATUS, (_P, c_int)),
    "cudnnSetConvolutionMathType": (_STATUS, (_P, c_int)),
    "cudnnDestroyConvolutionDescriptor": (_STATUS, (_P,)),
    "cudnnGetConvolutionNdForwardOutputDim": (_STATUS, (_P, _P, _P, c_int, _IA)),
    # activations
    "cudnnCreateActivationDescriptor": (_STATUS, (_PP,)),
    "cudnnSetActivationDescriptor": (_STATUS, (_P, c_int, c_int, c_double)),
    "cudnnDestroyActivationDescriptor": (_STATUS, (_P,)),
    # algorithms and execution (need a handle, i.e. a GPU)
    "cudnnGetConvolutionForwardAlgorithm_v7": (
        _STATUS,
        (_P, _P, _P, _P, _P, c_int, _IA, POINTER(AlgoPerf)),
    ),
    "cudnnGetConvolutionForwardWorkspaceSize": (
        _STATUS,
        (_P, _P, _P, _P, _P, c_int, POINTER(c_size_t)),
    ),
    "cudnnConvolutionForward": (
        _STATUS,
        (_P, _P, _P, _P, _P, _P, _P, c_int, _P, c_size_t, _P, _P, _P),
    ),
    "cudnnConvolutionBiasActivationForward": (
        _STATUS,
        (_P, _P, _P, _P, _P, _P, _P, c_int, _P, c_size_t, _P, _P, _P, _P, _P, _P, _P, _P),
    ),
}


class CudnnLib:
    """A loaded (or stand-in) cuDNN library with every prototype declared. `call(name, *args)`
    raises CudnnError on a non-zero status."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)

    def fn(self, name: str) -> Any:
        if name not in PROTOTYPES:
            raise KeyError(f"{name} has no declared prototype")
        return getattr(self.lib, name)

    def call(self, name: str, *args: Any) -> None:
        status = self.fn(name)(*args)
        if status != 0:
            raise CudnnError(name, int(status), self.error_string(int(status)))

    def error_string(self, status: int) -> str:
        raw = self.fn("cudnnGetErrorString")(status)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def version(self) -> int:
        return int(self.fn("cudnnGetVersion")())

    def cudart_version(self) -> int:
        return int(self.fn("cudnnGetCudartVersion")())


SONAME = "libcudnn.so.9"


def _via_pathfinder() -> str:
    import cuda.pathfinder as pf

    path = pf.load_nvidia_dynamic_lib("cudnn").abs_path  # DynamicLibUnknownError before 1.7
    if not path:
        raise FileNotFoundError("no path")
    return str(path)


def _via_wheel() -> str:
    spec = importlib.util.find_spec("nvidia.cudnn")
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        path = os.path.join(d, "lib", SONAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"no lib/{SONAME} in {dirs or 'an installed nvidia.cudnn'}")


def _via_cudnn_path() -> str:
    root = os.environ.get("CUDNN_PATH")
    if not root:
        raise FileNotFoundError("CUDNN_PATH is not set")
    for sub in ("lib", "lib64"):
        path = os.path.join(root, sub, SONAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"no lib/{SONAME} or lib64/{SONAME} under {root}")


_SEARCH = (
    ("cuda.pathfinder", _via_pathfinder),
    ("the nvidia.cudnn wheel", _via_wheel),
    ("$CUDNN_PATH", _via_cudnn_path),
    ("the system", lambda: SONAME),
)


@functools.cache
def load_cudnn() -> CudnnLib:
    """libcudnn.so.9 from the first place of `_SEARCH` that has one that loads;
    CudaUnavailableError, listing every attempt, when none has."""
    tried: list[str] = []
    for where, locate in _SEARCH:
        try:
            lib = ctypes.CDLL(locate())
        except Exception as e:  # not there, or there but not loadable: try the next place
            tried.append(f"{where}: {type(e).__name__}: {e}")
            continue
        return CudnnLib(lib)
    raise CudaUnavailableError(
        f"cuDNN ({SONAME}) could not be loaded: " + "; ".join(tried) + "; install the 'cuda12' "
        "or 'cuda13' extra"
    )
