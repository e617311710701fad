"""Element types of the IR, with their NumPy and C counterparts."""

from __future__ import annotations

import enum

import numpy as np

from kn_graph.errors import GraphError

__all__ = ["DType", "float_to_int"]


class DType(enum.Enum):
    """An element type. `DType.F32.np` is the NumPy dtype, `.c` the C type, `.size` the bytes."""

    F32 = "f32"
    F64 = "f64"
    F16 = "f16"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    BOOL = "bool"

    @property
    def np(self) -> np.dtype:
        return _NP[self]

    @property
    def c(self) -> str:
        return _C[self]

    @property
    def size(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.F16)

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.BOOL

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.I8, DType.I16, DType.I32, DType.I64)

    @property
    def is_bool(self) -> bool:
        return self is DType.BOOL

    @staticmethod
    def from_np(dtype: np.dtype | type) -> DType:
        d = np.dtype(dtype)
        for k, v in _NP.items():
            if v == d:
                return k
        raise GraphError(
            f"unsupported element type {d}; supported: {', '.join(t.value for t in DType)}"
        )

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"DType.{self.name}"


_NP: dict[DType, np.dtype] = {
    DType.F32: np.dtype(np.float32),
    DType.F64: np.dtype(np.float64),
    DType.F16: np.dtype(np.float16),
    DType.I8: np.dtype(np.int8),
    DType.I16: np.dtype(np.int16),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.U8: np.dtype(np.uint8),
    DType.U16: np.dtype(np.uint16),
    DType.U32: np.dtype(np.uint32),
    DType.U64: np.dtype(np.uint64),
    DType.BOOL: np.dtype(np.bool_),
}

_C: dict[DType, str] = {
    DType.F32: "float",
    DType.F64: "double",
    DType.F16: "half",
    DType.I8: "signed char",
    DType.I16: "short",
    DType.I32: "int",
    DType.I64: "long long",
    DType.U8: "unsigned char",
    DType.U16: "unsigned short",
    DType.U32: "unsigned int",
    DType.U64: "unsigned long long",
    DType.BOOL: "bool",
}


def float_to_int(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float to integer conversion as every executor does it (the reference, the plan emulator,
    the CPU backend's C and the CUDA kernels: `kn_cuda_eval.codegen.exprs.cast`): toward zero,
    saturating at the bounds of `dtype`, NaN to 0. C leaves an out-of-range conversion undefined
    and machines differ (x86 gives INT_MIN, or 0xFFFFFFFF with AVX-512's unsigned converts; ARM
    and CUDA saturate; NumPy's loops inherit whichever they compile to); ONNX's Cast leaves it
    undefined too. Saturation is the one rule that every machine can give bit for bit."""
    info = np.iinfo(dtype)
    x = np.asarray(a, dtype=np.float64)  # f16 and f32 exactly; the bounds below are exact too
    nan = np.isnan(x)
    low = x <= float(info.min)
    high = x >= 2.0 ** (info.bits - (1 if info.min < 0 else 0))  # max + 1, a power of two
    out = np.where(nan | low | high, 0.0, np.trunc(x)).astype(dtype)
    out[low] = info.min
    out[high] = info.max
    return out
