"""The `ctypes` binding of oneDNN's stable v3 C API (dnnl.h, dnnl_types.h, dnnl_common.h): the
constants and prototypes we use, the status check, and where the library is found — the CPU
counterpart of `kn_cuda_eval.cuda.cudnn.lib`.

Which library: the `onednn-cpu-gomp` wheel (oneDNN 3.2, the `cpu` and `test` extras). It is
CPU-only, threaded with GNU OpenMP and needs nothing but libgomp.so.1 and libstdc++ beside it
(39 MB; it loads with `ctypes` on a fresh Debian, and pip installs it in seconds). The current
`onednn` wheel (2026.1, oneDNN 3.13) was checked too: its libdnnl.so.3 needs libtbb.so.12,
libsycl.so.9, libsvml.so, libimf.so and libintlc.so.5, i.e. the `dpcpp-cpp-rt` and
`intel-opencl-rt` wheels it requires (several hundred MB of SYCL/OpenCL runtime a CPU backend
never uses); without them `ctypes.CDLL` fails. Everything here is in the v3 API both share, so a
newer libdnnl.so.3 found through $DNNL_PATH or the system works as well.

The library is found in `<sys.prefix>/lib` (where the data-files wheel puts it), then
`$DNNL_PATH[/lib]`, then the system soname. `KN_ONEDNN=0` (also `off`, `false`, `no`) hides it:
the process behaves as if oneDNN were not installed (`available()` gives the reason, the runner
factories None, convolutions and GEMMs run with NumPy/the emulator) — how the tests prove the
fallback of the GPU image, which has no `onednn-cpu-gomp` (`KN_ONEDNN=0 bash tests/run_tests.sh`);
it is read at every `available()` and `load_dnnl()` call.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint, c_void_p
from typing import Any

from kn_cuda_eval.planning import steps as st
from kn_graph.dtype import DType
from kn_graph.errors import EvaluationError

__all__ = [
    "DATA_TYPES",
    "HIDE_VARIABLE",
    "INT8_TYPES",
    "PROTOTYPES",
    "SONAME",
    "VNNI_ISAS",
    "DnnlLib",
    "ExecArg",
    "OnednnError",
    "OnednnUnavailableError",
    "available",
    "engine",
    "has_avx512",
    "has_vnni",
    "load_dnnl",
    "search",
]

log = logging.getLogger(__name__)

SONAME = "libdnnl.so.3"

# dnnl_status_t (dnnl_common_types.h)
SUCCESS, UNIMPLEMENTED = 0, 3
_STATUS_NAMES = {
    0: "success",
    1: "out_of_memory",
    2: "invalid_arguments",
    3: "unimplemented",
    4: "last_impl_reached",
    5: "runtime_error",
    6: "not_required",
}
# dnnl_data_type_t
DT_F16, DT_F32, DT_UNDEF = 1, 3, 0
DT_S32, DT_S8, DT_U8 = 4, 5, 6
DATA_TYPES = {DType.F32: DT_F32, DType.F16: DT_F16}
INT8_TYPES = {DType.U8: DT_U8, DType.I8: DT_S8}
ENGINE_CPU = 1  # dnnl_engine_kind_t
STREAM_IN_ORDER = 0x1  # dnnl_stream_flags_t
FORMAT_TAG_ANY = 1  # dnnl_format_tag_t
FORWARD_INFERENCE = 96  # dnnl_prop_kind_t
CONVOLUTION_DIRECT = 0x1  # dnnl_alg_kind_t
FPMATH_STRICT = 0  # dnnl_fpmath_mode_t
SCRATCHPAD_USER = 1  # dnnl_scratchpad_mode_t
# dnnl_query_t
QUERY_IMPL_INFO_STR = 8
QUERY_WEIGHTS_MD = 131
QUERY_SRC_MD, QUERY_DST_MD, QUERY_SCRATCHPAD_MD = 129, 133, 136
# execution argument indices (dnnl_types.h DNNL_ARG_*)
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 17, 33, 41, 80
ARG_FROM, ARG_TO = ARG_SRC, ARG_DST  # a reorder's
ARG_SRC_1 = 2
ARG_ATTR_ZERO_POINTS = 8192  # DNNL_ARG_ATTR_ZERO_POINTS | arg: that argument's zero points
# v3: DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) = DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE * (idx + 1)
ARG_POST_OP_BASE = 32768
MAX_NDIMS = 12
MEMORY_ALLOCATE = c_void_p(2**64 - 1)  # DNNL_MEMORY_ALLOCATE: ((void *)(size_t)-1)
MEMORY_NONE = c_void_p(0)  # DNNL_MEMORY_NONE: no buffer yet (dnnl_memory_set_data_handle later)

Dims = c_int64 * MAX_NDIMS  # dnnl_dims_t


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: {int arg; dnnl_memory_t memory;}."""

    _fields_ = [("arg", c_int), ("memory", c_void_p)]


class Version(ctypes.Structure):
    """dnnl_version_t."""

    _fields_ = [
        ("major", c_int),
        ("minor", c_int),
        ("patch", c_int),
        ("hash", c_char_p),
        ("cpu_runtime", c_uint),
        ("gpu_runtime", c_uint),
    ]


_P = c_void_p  # every dnnl_*_t handle is an opaque pointer
_PP = POINTER(c_void_p)
_S = c_int  # dnnl_status_t
_E = c_int  # the enums

# Prototypes as oneDNN 3.x declares them; each comment is the C signature (dnnl.h unless noted).
PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # const dnnl_version_t *dnnl_version(void)  (dnnl_common.h)
    "dnnl_version": (POINTER(Version), ()),
    # dnnl_cpu_isa_t dnnl_get_effective_cpu_isa(void)
    "dnnl_get_effective_cpu_isa": (_E, ()),
    # dnnl_status_t dnnl_engine_create(dnnl_engine_t *engine, dnnl_engine_kind_t kind,
    #     size_t index)  (dnnl_common.h)
    "dnnl_engine_create": (_S, (_PP, _E, c_size_t)),
    # dnnl_status_t dnnl_stream_create(dnnl_stream_t *stream, dnnl_engine_t engine,
    #     unsigned flags)  (dnnl_common.h)
    "dnnl_stream_create": (_S, (_PP, _P, c_uint)),
    # dnnl_status_t dnnl_stream_wait(dnnl_stream_t stream)  (dnnl_common.h)
    "dnnl_stream_wait": (_S, (_P,)),
    # dnnl_status_t dnnl_memory_desc_create_with_strides(dnnl_memory_desc_t *memory_desc,
    #     int ndims, const dnnl_dims_t dims, dnnl_data_type_t data_type,
    #     const dnnl_dims_t strides)
    "dnnl_memory_desc_create_with_strides": (_S, (_PP, c_int, Dims, _E, Dims)),
    # dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *memory_desc,
    #     int ndims, const dnnl_dims_t dims, dnnl_data_type_t data_type, dnnl_format_tag_t tag)
    "dnnl_memory_desc_create_with_tag": (_S, (_PP, c_int, Dims, _E, _E)),
    # dnnl_status_t dnnl_memory_desc_destroy(dnnl_memory_desc_t memory_desc)
    "dnnl_memory_desc_destroy": (_S, (_P,)),
    # size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t memory_desc)
    "dnnl_memory_desc_get_size": (c_size_t, (_P,)),
    # int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs)
    "dnnl_memory_desc_equal": (c_int, (_P, _P)),
    # dnnl_status_t dnnl_memory_create(dnnl_memory_t *memory,
    #     const_dnnl_memory_desc_t memory_desc, dnnl_engine_t engine, void *handle)
    "dnnl_memory_create": (_S, (_PP, _P, _P, _P)),
    # dnnl_status_t dnnl_memory_set_data_handle(dnnl_memory_t memory, void *handle)
    "dnnl_memory_set_data_handle": (_S, (_P, _P)),
    # dnnl_status_t dnnl_memory_get_data_handle(const_dnnl_memory_t memory, void **handle)
    "dnnl_memory_get_data_handle": (_S, (_P, _PP)),
    # dnnl_status_t dnnl_memory_desc_query(const_dnnl_memory_desc_t memory_desc,
    #     dnnl_query_t what, void *result)
    "dnnl_memory_desc_query": (_S, (_P, _E, _P)),
    # dnnl_status_t dnnl_memory_get_memory_desc(const_dnnl_memory_t memory,
    #     const_dnnl_memory_desc_t *memory_desc)
    "dnnl_memory_get_memory_desc": (_S, (_P, _PP)),
    # dnnl_status_t dnnl_memory_destroy(dnnl_memory_t memory)
    "dnnl_memory_destroy": (_S, (_P,)),
    # dnnl_status_t dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr)
    "dnnl_primitive_attr_create": (_S, (_PP,)),
    # dnnl_status_t dnnl_primitive_attr_destroy(dnnl_primitive_attr_t attr)
    "dnnl_primitive_attr_destroy": (_S, (_P,)),
    # dnnl_status_t dnnl_primitive_attr_set_fpmath_mode(dnnl_primitive_attr_t attr,
    #     dnnl_fpmath_mode_t mode)
    "dnnl_primitive_attr_set_fpmath_mode": (_S, (_P, _E)),
    # dnnl_status_t dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t attr,
    #     dnnl_scratchpad_mode_t mode)
    "dnnl_primitive_attr_set_scratchpad_mode": (_S, (_P, _E)),
    # dnnl_status_t dnnl_primitive_attr_set_post_ops(dnnl_primitive_attr_t attr,
    #     const_dnnl_post_ops_t post_ops)
    "dnnl_primitive_attr_set_post_ops": (_S, (_P, _P)),
    # dnnl_status_t dnnl_primitive_attr_set_zero_points_mask(dnnl_primitive_attr_t attr,
    #     int arg, int mask)
    "dnnl_primitive_attr_set_zero_points_mask": (_S, (_P, c_int, c_int)),
    # dnnl_status_t dnnl_post_ops_create(dnnl_post_ops_t *post_ops)
    "dnnl_post_ops_create": (_S, (_PP,)),
    # dnnl_status_t dnnl_post_ops_destroy(dnnl_post_ops_t post_ops)
    "dnnl_post_ops_destroy": (_S, (_P,)),
    # dnnl_status_t dnnl_post_ops_append_sum(dnnl_post_ops_t post_ops, float scale,
    #     int32_t zero_point, dnnl_data_type_t data_type)
    "dnnl_post_ops_append_sum": (_S, (_P, c_float, c_int32, _E)),
    # dnnl_status_t dnnl_post_ops_append_eltwise(dnnl_post_ops_t post_ops,
    #     dnnl_alg_kind_t alg_kind, float alpha, float beta)
    "dnnl_post_ops_append_eltwise": (_S, (_P, _E, c_float, c_float)),
    # dnnl_status_t dnnl_post_ops_append_binary(dnnl_post_ops_t post_ops,
    #     dnnl_alg_kind_t alg_kind, const_dnnl_memory_desc_t src1_desc)
    "dnnl_post_ops_append_binary": (_S, (_P, _E, _P)),
    # dnnl_status_t dnnl_convolution_forward_primitive_desc_create(
    #     dnnl_primitive_desc_t *primitive_desc, dnnl_engine_t engine,
    #     dnnl_prop_kind_t prop_kind, dnnl_alg_kind_t alg_kind,
    #     const_dnnl_memory_desc_t src_desc, const_dnnl_memory_desc_t weights_desc,
    #     const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_desc,
    #     const dnnl_dims_t strides, const dnnl_dims_t dilates, const dnnl_dims_t padding_l,
    #     const dnnl_dims_t padding_r, const_dnnl_primitive_attr_t attr)
    "dnnl_convolution_forward_primitive_desc_create": (
        _S,
        (_PP, _P, _E, _E, _P, _P, _P, _P, Dims, Dims, Dims, Dims, _P),
    ),
    # dnnl_status_t dnnl_matmul_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    #     dnnl_engine_t engine, const_dnnl_memory_desc_t src_desc,
    #     const_dnnl_memory_desc_t weights_desc, const_dnnl_memory_desc_t bias_desc,
    #     const_dnnl_memory_desc_t dst_desc, const_dnnl_primitive_attr_t attr)
    "dnnl_matmul_primitive_desc_create": (_S, (_PP, _P, _P, _P, _P, _P, _P)),
    # dnnl_status_t dnnl_reorder_primitive_desc_create(
    #     dnnl_primitive_desc_t *reorder_primitive_desc, const_dnnl_memory_desc_t src_desc,
    #     dnnl_engine_t src_engine, const_dnnl_memory_desc_t dst_desc,
    #     dnnl_engine_t dst_engine, const_dnnl_primitive_attr_t attr)
    "dnnl_reorder_primitive_desc_create": (_S, (_PP, _P, _P, _P, _P, _P)),
    # const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(
    #     const_dnnl_primitive_desc_t primitive_desc, dnnl_query_t what, int index)
    "dnnl_primitive_desc_query_md": (_P, (_P, _E, c_int)),
    # dnnl_status_t dnnl_primitive_desc_query(const_dnnl_primitive_desc_t primitive_desc,
    #     dnnl_query_t what, int index, void *result)
    "dnnl_primitive_desc_query": (_S, (_P, _E, c_int, _P)),
    # dnnl_status_t dnnl_primitive_desc_destroy(dnnl_primitive_desc_t primitive_desc)
    "dnnl_primitive_desc_destroy": (_S, (_P,)),
    # dnnl_status_t dnnl_primitive_create(dnnl_primitive_t *primitive,
    #     const_dnnl_primitive_desc_t primitive_desc)
    "dnnl_primitive_create": (_S, (_PP, _P)),
    # dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive,
    #     dnnl_stream_t stream, int nargs, const dnnl_exec_arg_t *args)
    "dnnl_primitive_execute": (_S, (_P, _P, c_int, POINTER(ExecArg))),
    # dnnl_status_t dnnl_primitive_destroy(dnnl_primitive_t primitive)
    "dnnl_primitive_destroy": (_S, (_P,)),
    # dnnl_status_t dnnl_sgemm(char transa, char transb, dim_t M, dim_t N, dim_t K, float alpha,
    #     const float* A, dim_t lda, const float* B, dim_t ldb, float beta, float* C, dim_t ldc)
    # (row-major; only its address is taken, for the C kernels that call it)
    "dnnl_sgemm": (
        _S,
        (
            ctypes.c_char,
            ctypes.c_char,
            c_int64,
            c_int64,
            c_int64,
            c_float,
            _P,
            c_int64,
            _P,
            c_int64,
            c_float,
            _P,
            c_int64,
        ),
    ),
}


class OnednnError(EvaluationError):
    """A oneDNN call returned a status other than success; names the call, the status and (once
    a runner re-raises it) the step."""

    def __init__(self, function: str, status: int, where: str = "") -> None:
        self.function = function
        self.status = status
        self.where = where
        text = f"{function} failed with status {status} ({_STATUS_NAMES.get(status, '?')})"
        super().__init__(f"oneDNN: {where}: {text}" if where else f"oneDNN: {text}")

    def at(self, step: st.Step) -> OnednnError:
        return OnednnError(self.function, self.status, step.describe())


class OnednnUnavailableError(EvaluationError):
    """oneDNN could not be loaded; the message lists every place tried."""


class DnnlLib:
    """A loaded (or stand-in) libdnnl with every prototype declared. `call(name, *args)` raises
    OnednnError on a status other than success; `fn(name)` is the raw function."""

    def __init__(self, lib: Any, path: str = "") -> None:
        self.lib = lib
        self.path = path
        self.fns: dict[str, Any] = {}
        for name, (restype, argtypes) in PROTOTYPES.items():
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)
            self.fns[name] = f

    def fn(self, name: str) -> Any:
        return self.fns[name]

    def call(self, name: str, *args: Any) -> None:
        status = self.fns[name](*args)
        if status != SUCCESS:
            raise OnednnError(name, int(status))

    def version(self) -> str:
        v = self.fns["dnnl_version"]().contents
        return f"{v.major}.{v.minor}.{v.patch}"


HIDE_VARIABLE = "KN_ONEDNN"  # "0", "off", "false", "no": behave as if oneDNN were not installed
_HIDDEN = "oneDNN is hidden by KN_ONEDNN={!r} (behaving as if it were not installed)"


def search() -> list[tuple[str, str]]:
    """Where libdnnl is looked for, in order: (what the place is, path or soname); nothing when
    $KN_ONEDNN hides the library."""
    if os.environ.get(HIDE_VARIABLE, "").strip().lower() in ("0", "off", "false", "no"):
        return []
    places = [("the onednn-cpu-gomp wheel", os.path.join(sys.prefix, "lib", SONAME))]
    root = os.environ.get("DNNL_PATH")
    if root:
        places += [("$DNNL_PATH", os.path.join(root, "lib", SONAME))]
        places += [("$DNNL_PATH", os.path.join(root, SONAME))]
    return [*places, ("the system", SONAME)]


@functools.cache
def load_dnnl() -> DnnlLib:
    """libdnnl.so.3 from the first place of `search()` that loads; OnednnUnavailableError,
    listing every attempt, when none does (or naming $KN_ONEDNN when that hides it)."""
    places = search()
    if not places:
        raise OnednnUnavailableError(_HIDDEN.format(os.environ.get(HIDE_VARIABLE, "")))
    tried: list[str] = []
    for where, path in places:
        if os.sep in path and not os.path.isfile(path):
            tried.append(f"{where}: no {path}")
            continue
        try:
            lib = DnnlLib(ctypes.CDLL(path), path)
        except (OSError, AttributeError) as e:  # absent, unloadable, or too old an API
            tried.append(f"{where}: {type(e).__name__}: {e}")
            continue
        log.info("oneDNN %s: %s", lib.version(), path)
        return lib
    raise OnednnUnavailableError(
        f"oneDNN ({SONAME}) could not be loaded: " + "; ".join(tried) + "; install the 'cpu' extra"
    )


def available() -> str | None:
    """None when oneDNN is usable here, else a one-line reason (the runners then return None).
    $KN_ONEDNN is honoured even after the library was loaded (a test may set it mid-process)."""
    if not search():  # hidden, even when an earlier call loaded the library
        return _HIDDEN.format(os.environ.get(HIDE_VARIABLE, ""))
    try:
        engine()
    except EvaluationError as e:
        return str(e)
    return None


ISA_AVX512_BIT = 0x20
"""Set in every `dnnl_cpu_isa_t` from `dnnl_cpu_isa_avx512_core` (0x27) up; clear in the AVX2
ones (avx2 0x7, avx2_vnni 0xf, avx2_vnni_2 0x1f)."""


VNNI_ISAS = frozenset({0xF, 0x1F, 0x67, 0xE7, 0x1EF, 0xFEF, 0x1FEF})
"""The `dnnl_cpu_isa_t` values (oneDNN 3.2's dnnl_types.h) whose int8 products accumulate
u8·s8 pairs straight into int32 (VNNI's vpdpbusd, or AMX): avx2_vnni 0xf, avx2_vnni_2 0x1f,
avx512_core_vnni 0x67, avx512_core_bf16 0xe7, avx512_core_fp16 0x1ef, avx512_core_amx 0xfef,
avx512_core_amx_fp16 0x1fef. Not avx2 0x7 nor avx512_core 0x27: there pairs of products are
added in saturating int16 first (`kn_cuda_eval.cpu.onednn.int8`). A value a newer library
adds counts as no VNNI (the safe side)."""


def has_vnni() -> bool | None:
    """Whether oneDNN's int8 kernels accumulate in int32 here (`VNNI_ISAS`); None when oneDNN
    is not usable."""
    if available() is not None:
        return None
    return int(load_dnnl().fn("dnnl_get_effective_cpu_isa")()) in VNNI_ISAS


def has_avx512() -> bool | None:
    """Whether oneDNN runs AVX-512 kernels here (`dnnl_get_effective_cpu_isa`: the CPU's ISA
    as `ONEDNN_MAX_CPU_ISA` caps it); None when oneDNN is not usable."""
    if available() is not None:
        return None
    return bool(int(load_dnnl().fn("dnnl_get_effective_cpu_isa")()) & ISA_AVX512_BIT)


@functools.cache
def engine() -> tuple[int, int]:
    """The process's CPU engine and in-order stream (created once)."""
    lib = load_dnnl()
    eng, strm = c_void_p(), c_void_p()
    lib.call("dnnl_engine_create", ctypes.byref(eng), ENGINE_CPU, 0)
    lib.call("dnnl_stream_create", ctypes.byref(strm), eng, STREAM_IN_ORDER)
    return int(eng.value or 0), int(strm.value or 0)
