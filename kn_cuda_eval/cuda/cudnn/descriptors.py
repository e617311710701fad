"""cuDNN descriptors for a plan's `Conv` step, as context-managed objects, and the output-shape
query — all host side, no GPU needed. 1-d convolutions become 2-d with a height of 1 (cuDNN
wants at least 4-d tensors)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from kn_cuda_eval.cuda.cudnn.lib import (
    CROSS_CORRELATION,
    NOT_PROPAGATE_NAN,
    ActivationMode,
    CudnnLib,
    DataType,
    MathType,
    TensorFormat,
)
from kn_cuda_eval.planning import steps as st
from kn_graph.dtype import DType
from kn_graph.errors import PlanError

__all__ = [
    "ActivationDescriptor",
    "ConvDescriptor",
    "ConvGeometry",
    "FilterDescriptor",
    "TensorDescriptor",
    "conv_output_dims",
]

_DTYPES = {DType.F32: DataType.FLOAT, DType.F16: DataType.HALF, DType.F64: DataType.DOUBLE}


def data_type(dt: DType) -> DataType:
    try:
        return _DTYPES[dt]
    except KeyError:
        raise PlanError(f"cuDNN convolutions take f32, f16 or f64, not {dt}") from None


def compute_type(dt: DType) -> DataType:
    """Accumulate f16 in f32; f32 and f64 in themselves."""
    return DataType.FLOAT if dt is DType.F16 else data_type(dt)


def _ints(values: Sequence[int]) -> ctypes.Array[ctypes.c_int]:
    for v in values:
        if not -(2**31) <= v < 2**31:
            raise PlanError(f"cuDNN takes 32-bit sizes and strides; {v} does not fit")
    return (ctypes.c_int * len(values))(*values)


class _Descriptor:
    KIND = ""

    def __init__(self, lib: CudnnLib) -> None:
        self.lib = lib
        self.ptr = ctypes.c_void_p()
        lib.call(f"cudnnCreate{self.KIND}Descriptor", ctypes.byref(self.ptr))

    def close(self) -> None:
        if self.ptr:
            self.lib.call(f"cudnnDestroy{self.KIND}Descriptor", self.ptr)
            self.ptr = ctypes.c_void_p()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class TensorDescriptor(_Descriptor):
    KIND = "Tensor"

    def __init__(
        self, lib: CudnnLib, dtype: DataType, dims: Sequence[int], strides: Sequence[int]
    ) -> None:
        super().__init__(lib)
        lib.call(
            "cudnnSetTensorNdDescriptor",
            self.ptr,
            int(dtype),
            len(dims),
            _ints(dims),
            _ints(strides),
        )

    def get(self) -> tuple[DataType, tuple[int, ...], tuple[int, ...]]:
        n = 8
        dt, nb = ctypes.c_int(), ctypes.c_int()
        dims, strides = (ctypes.c_int * n)(), (ctypes.c_int * n)()
        self.lib.call(
            "cudnnGetTensorNdDescriptor",
            self.ptr,
            n,
            ctypes.byref(dt),
            ctypes.byref(nb),
            dims,
            strides,
        )
        return DataType(dt.value), tuple(dims[: nb.value]), tuple(strides[: nb.value])


class FilterDescriptor(_Descriptor):
    KIND = "Filter"

    def __init__(self, lib: CudnnLib, dtype: DataType, dims: Sequence[int]) -> None:
        super().__init__(lib)
        lib.call(
            "cudnnSetFilterNdDescriptor",
            self.ptr,
            int(dtype),
            int(TensorFormat.NCHW),
            len(dims),
            _ints(dims),
        )


class ConvDescriptor(_Descriptor):
    KIND = "Convolution"

    def __init__(
        self,
        lib: CudnnLib,
        pads: Sequence[int],
        strides: Sequence[int],
        dilations: Sequence[int],
        groups: int,
        compute: DataType,
        math: MathType = MathType.FMA,
    ) -> None:
        super().__init__(lib)
        lib.call(
            "cudnnSetConvolutionNdDescriptor",
            self.ptr,
            len(pads),
            _ints(pads),
            _ints(strides),
            _ints(dilations),
            CROSS_CORRELATION,
            int(compute),
        )
        lib.call("cudnnSetConvolutionGroupCount", self.ptr, int(groups))
        lib.call("cudnnSetConvolutionMathType", self.ptr, int(math))


class ActivationDescriptor(_Descriptor):
    KIND = "Activation"

    def __init__(self, lib: CudnnLib, mode: ActivationMode) -> None:
        super().__init__(lib)
        lib.call("cudnnSetActivationDescriptor", self.ptr, int(mode), NOT_PROPAGATE_NAN, 0.0)


@dataclass(frozen=True, slots=True)
class ConvGeometry:
    """A Conv step in cuDNN's terms (rank ≥ 4, strides in elements)."""

    dtype: DType
    x_dims: tuple[int, ...]
    x_strides: tuple[int, ...]
    w_dims: tuple[int, ...]
    y_dims: tuple[int, ...]
    y_strides: tuple[int, ...]
    pads: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    groups: int

    @staticmethod
    def of(step: st.Conv) -> ConvGeometry:
        def lift(dims: tuple[int, ...], fill: int) -> tuple[int, ...]:
            return (*dims[:2], fill, *dims[2:]) if len(dims) == 3 else dims

        one_d = len(step.stride) == 1
        pads, strides, dil = step.padding, step.stride, step.dilation
        if one_d:
            pads, strides, dil = (0, *pads), (1, *strides), (1, *dil)
        xs, ys = step.x.strides, step.out.strides
        return ConvGeometry(
            dtype=step.x.dtype,
            x_dims=lift(step.x.shape, 1),
            x_strides=lift(xs, xs[2] * step.x.shape[2] if one_d else 0),
            w_dims=lift(step.w.shape, 1),
            y_dims=lift(step.out.shape, 1),
            y_strides=lift(ys, ys[2] * step.out.shape[2] if one_d else 0),
            pads=tuple(pads),
            strides=tuple(strides),
            dilations=tuple(dil),
            groups=step.groups,
        )


def conv_output_dims(lib: CudnnLib, g: ConvGeometry) -> tuple[int, ...]:
    """cuDNN's own idea of the output shape (cudnnGetConvolutionNdForwardOutputDim)."""
    dt = data_type(g.dtype)
    with (
        TensorDescriptor(lib, dt, g.x_dims, g.x_strides) as x,
        FilterDescriptor(lib, dt, g.w_dims) as w,
        ConvDescriptor(lib, g.pads, g.strides, g.dilations, g.groups, compute_type(g.dtype)) as c,
    ):
        out = (ctypes.c_int * len(g.x_dims))()
        lib.call("cudnnGetConvolutionNdForwardOutputDim", c.ptr, x.ptr, w.ptr, len(g.x_dims), out)
        return tuple(out)
