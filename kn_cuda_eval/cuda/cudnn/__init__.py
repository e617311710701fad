"""The host side of the cuDNN binding: `ctypes` prototypes for libcudnn.so.9, descriptors for a
plan's convolutions and the output-shape query (no GPU needed). The library loads on first use."""

from kn_cuda_eval.cuda.cudnn.descriptors import (
    ActivationDescriptor,
    ConvDescriptor,
    ConvGeometry,
    FilterDescriptor,
    TensorDescriptor,
    conv_output_dims,
)
from kn_cuda_eval.cuda.cudnn.lib import PROTOTYPES, CudnnError, CudnnLib, load_cudnn

__all__ = [
    "PROTOTYPES",
    "ActivationDescriptor",
    "ConvDescriptor",
    "ConvGeometry",
    "CudnnError",
    "CudnnLib",
    "FilterDescriptor",
    "TensorDescriptor",
    "conv_output_dims",
    "load_cudnn",
]
