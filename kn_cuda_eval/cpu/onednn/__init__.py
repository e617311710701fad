"""Convolutions and GEMMs of a plan on the host through oneDNN — the CPU counterpart of cuDNN: a
small `ctypes` binding of oneDNN's stable v3 C API and the runners the CPU executor calls for
`st.Conv` and `st.MatMul` steps over its arena.

    lib       the binding: constants, prototypes, status errors, finding the library (KN_ONEDNN)
    threads   OpenMP's and OpenBLAS's thread counts
    memory    descriptors, owned objects, the shared workspace, packed weights
    postops   post-op chains (residual, activation, alpha/beta)
    runner    a step prebuilt as primitives over an arena
    conv      convolution descriptors and runners          gemm   GEMM runners (oneDNN or BLAS)
    int8      int8 matmul and convolution runners of the plan's integer steps (exact only)
    probe     special values through eltwise post-ops (NaN, ±inf)

Exactness: F32 math stays F32 (`dnnl_fpmath_mode_strict`, set on every primitive: no implicit
bf16/tf32 on AMX machines), direct convolution (no Winograd), F16 accumulated in F32; int8 products only where oneDNN sums them exactly (`int8`). A step
oneDNN cannot express — F64 or integer data, a negative or zero stride, an empty tensor, or a
descriptor the library answers with `dnnl_unimplemented` — gets None from the runner factory: the
caller then runs `kn_cuda_eval.planning.emulator.emulate_step(arena, k, step)` for it. Any other
status is an `OnednnError` naming the step.
"""

from kn_cuda_eval.cpu.onednn.conv import (
    ROLES,
    ConvDesc,
    Layout,
    auto_layout,
    conv_desc,
    conv_runner,
)
from kn_cuda_eval.cpu.onednn.gemm import gemm_runner
from kn_cuda_eval.cpu.onednn.int8 import (
    INT_CONV_LAYOUTS,
    SAFE_WEIGHT,
    Constants,
    conv_enabled,
    exact_weights,
    int_conv_formats,
    int_conv_runner,
    int_matmul_runner,
)
from kn_cuda_eval.cpu.onednn.lib import (
    HIDE_VARIABLE,
    PROTOTYPES,
    DnnlLib,
    OnednnError,
    OnednnUnavailableError,
    available,
    has_avx512,
    has_vnni,
    load_dnnl,
)
from kn_cuda_eval.cpu.onednn.memory import PackedWeights, Packing, Workspace
from kn_cuda_eval.cpu.onednn.postops import ELTWISE_LINEAR, ELTWISE_RELU, PostOp
from kn_cuda_eval.cpu.onednn.probe import probe_post_ops
from kn_cuda_eval.cpu.onednn.runner import Runner
from kn_cuda_eval.cpu.onednn.threads import blas_thread_setter, omp_thread_setter

__all__ = [
    "ELTWISE_LINEAR",
    "ELTWISE_RELU",
    "HIDE_VARIABLE",
    "INT_CONV_LAYOUTS",
    "PROTOTYPES",
    "ROLES",
    "SAFE_WEIGHT",
    "Constants",
    "ConvDesc",
    "DnnlLib",
    "Layout",
    "OnednnError",
    "OnednnUnavailableError",
    "PackedWeights",
    "Packing",
    "PostOp",
    "Runner",
    "Workspace",
    "auto_layout",
    "available",
    "blas_thread_setter",
    "conv_desc",
    "conv_enabled",
    "conv_runner",
    "exact_weights",
    "gemm_runner",
    "has_avx512",
    "has_vnni",
    "int_conv_formats",
    "int_conv_runner",
    "int_matmul_runner",
    "load_dnnl",
    "omp_thread_setter",
    "probe_post_ops",
]
