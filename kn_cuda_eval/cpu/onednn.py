"""Convolutions and GEMMs of a plan on the host through oneDNN — the CPU counterpart of cuDNN: a
small `ctypes` binding of oneDNN's stable v3 C API (dnnl.h, dnnl_types.h, dnnl_common.h) and the
runners the CPU executor calls for `st.Conv` and `st.MatMul` steps over its arena.

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

Threads: oneDNN 3 has no `dnnl_set_num_threads`; with the OpenMP runtime the number is OpenMP's,
so a runner calls `omp_set_num_threads(threads)` of the libgomp the library linked (the one
already loaded) before it creates its primitive and before each run (a no-op after the first).
The BLAS path sets OpenBLAS's threads the same way.

Exactness: F32 math stays F32 (`dnnl_fpmath_mode_strict`, set on every primitive: no implicit
bf16/tf32 on AMX machines), direct convolution (no Winograd), F16 accumulated in F32. A step
oneDNN cannot express — F64 or integer data, a negative or zero stride, an empty tensor, or a
descriptor the library answers with `dnnl_unimplemented` — gets None from the runner factory: the
caller then runs `kn_cuda_eval.planning.emulator.emulate_step(arena, k, step)` for it. Any other status is
an `OnednnError` naming the step.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import mmap
import os
import re
import sys
from collections.abc import Callable, Hashable, Sequence
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import EvaluationError

__all__ = [
    "PROTOTYPES",
    "ROLES",
    "ConvDesc",
    "DnnlLib",
    "Layout",
    "OnednnError",
    "OnednnUnavailableError",
    "PackedWeights",
    "Packing",
    "Runner",
    "Workspace",
    "auto_layout",
    "available",
    "conv_desc",
    "conv_runner",
    "gemm_runner",
    "load_dnnl",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

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
_DATA_TYPES = {DType.F32: DT_F32, DType.F16: DT_F16}
PostOp = tuple[int, float, float]  # an eltwise post-op: dnnl_alg_kind_t, alpha, beta
ENGINE_CPU = 1  # dnnl_engine_kind_t
STREAM_IN_ORDER = 0x1  # dnnl_stream_flags_t
FORMAT_TAG_ANY = 1  # dnnl_format_tag_t
# activation layouts by tensor rank (dnnl_format_tag_t values, stable across oneDNN 3.x)
_TAGS = {
    "nhwc": {3: 15, 4: 22, 5: 33},  # dnnl_acb, dnnl_acdb, dnnl_acdeb: channels last
    "c16": {3: 56, 4: 78, 5: 121},  # dnnl_aBc16b, dnnl_aBcd16b (nChw16c), dnnl_aBcde16b
    "c8": {3: 69, 4: 102, 5: 142},  # dnnl_aBc8b, dnnl_aBcd8b (nChw8c), dnnl_aBcde8b
}
FORWARD_INFERENCE = 96  # dnnl_prop_kind_t
CONVOLUTION_DIRECT = 0x1  # dnnl_alg_kind_t
ELTWISE_RELU = 0x20
ELTWISE_LINEAR = 0x26
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
# v3: DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) = DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE * (idx + 1)
ARG_POST_OP_BASE = 32768
BINARY_ADD = 0x1FFF0  # dnnl_binary_add
MAX_NDIMS = 12
MEMORY_ALLOCATE = c_void_p(2**64 - 1)  # DNNL_MEMORY_ALLOCATE: ((void *)(size_t)-1)
MEMORY_NONE = c_void_p(0)  # DNNL_MEMORY_NONE: no buffer yet (dnnl_memory_set_data_handle later)

_Dims = c_int64 * MAX_NDIMS  # dnnl_dims_t


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
    "dnnl_memory_desc_create_with_strides": (_S, (_PP, c_int, _Dims, _E, _Dims)),
    # dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *memory_desc,
    #     int ndims, const dnnl_dims_t dims, dnnl_data_type_t data_type, dnnl_format_tag_t tag)
    "dnnl_memory_desc_create_with_tag": (_S, (_PP, c_int, _Dims, _E, _E)),
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
        (_PP, _P, _E, _E, _P, _P, _P, _P, _Dims, _Dims, _Dims, _Dims, _P),
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


def _search() -> list[tuple[str, str]]:
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
    """libdnnl.so.3 from the first place of `_search()` that loads; OnednnUnavailableError,
    listing every attempt, when none does (or naming $KN_ONEDNN when that hides it)."""
    places = _search()
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
    if not _search():  # hidden, even when an earlier call loaded the library
        return _HIDDEN.format(os.environ.get(HIDE_VARIABLE, ""))
    try:
        _engine()
    except EvaluationError as e:
        return str(e)
    return None


@functools.cache
def _engine() -> tuple[int, int]:
    """The process's CPU engine and in-order stream (created once)."""
    lib = load_dnnl()
    eng, strm = c_void_p(), c_void_p()
    lib.call("dnnl_engine_create", ctypes.byref(eng), ENGINE_CPU, 0)
    lib.call("dnnl_stream_create", ctypes.byref(strm), eng, STREAM_IN_ORDER)
    return int(eng.value or 0), int(strm.value or 0)


# -- threads -----------------------------------------------------------------------------------


def _loaded(pattern: str) -> str | None:
    """The path of the first shared object mapped into this process matching `pattern`."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            m = re.search(r"\s(/\S*/" + pattern + r")$", line)
            if m:
                return m.group(1)
    return None


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None]:
    load_dnnl()  # its libgomp is then loaded: bind that copy, not another
    path = _loaded(r"libgomp[^/]*\.so[.\d]*") or "libgomp.so.1"
    try:
        f = ctypes.CDLL(path).omp_set_num_threads
    except (OSError, AttributeError) as e:
        log.warning("oneDNN: no omp_set_num_threads (%s); threads stay OpenMP's default", e)
        return lambda n: None
    f.restype, f.argtypes = None, [c_int]
    return f


@functools.cache
def _blas_set_num_threads() -> Callable[[int], None]:
    """OpenBLAS's thread setter of the library NumPy loaded (numpy's wheels: scipy_openblas)."""
    np.matmul(np.ones((2, 2)), np.ones((2, 2)))  # make sure the BLAS is mapped
    path = _loaded(r"lib\S*openblas\S*\.so[.\d]*")
    if path is not None:
        lib = ctypes.CDLL(path)
        for name in (
            "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_",
            "openblas_set_num_threads",
        ):
            f = getattr(lib, name, None)
            if f is not None:
                f.restype, f.argtypes = None, [c_int]
                return f
    log.info("no OpenBLAS thread setter found; BLAS GEMMs use its default threads")
    return lambda n: None


# -- descriptors and owned objects ----------------------------------------------------------------


def _dims(values: Sequence[int]) -> ctypes.Array[c_int64]:
    return _Dims(*(int(v) for v in values))


class _Owner:
    """oneDNN objects a runner created, destroyed with it (in reverse order)."""

    def __init__(self, lib: DnnlLib) -> None:
        self.lib = lib
        self.objects: list[tuple[str, int]] = []
        self.closed = False

    def own(self, destroy: str, handle: c_void_p) -> int:
        h = int(handle.value or 0)
        self.objects.append((destroy, h))
        return h

    def close(self) -> None:
        self.closed = True
        while self.objects:
            destroy, h = self.objects.pop()
            with contextlib.suppress(Exception):  # at interpreter exit the library may be gone
                self.lib.fns[destroy](h)

    def md(self, dims: Sequence[int], dt: int, strides: Sequence[int] | None) -> int:
        """A memory descriptor: plain with explicit element strides, or `any` (strides None)."""
        if strides is None:
            return self.tag(dims, dt, FORMAT_TAG_ANY)
        out = c_void_p()
        self.lib.call(
            "dnnl_memory_desc_create_with_strides",
            ctypes.byref(out),
            len(dims),
            _dims(dims),
            dt,
            _dims(strides),
        )
        return self.own("dnnl_memory_desc_destroy", out)

    def tag(self, dims: Sequence[int], dt: int, tag: int) -> int:
        """A memory descriptor of format tag `tag` (`FORMAT_TAG_ANY`: the primitive chooses)."""
        out = c_void_p()
        self.lib.call(
            "dnnl_memory_desc_create_with_tag", ctypes.byref(out), len(dims), _dims(dims), dt, tag
        )
        return self.own("dnnl_memory_desc_destroy", out)

    def memory(self, md: int, handle: c_void_p | int) -> int:
        out = c_void_p()
        h = handle if isinstance(handle, c_void_p) else c_void_p(handle)
        self.lib.call("dnnl_memory_create", ctypes.byref(out), md, _engine()[0], h)
        return self.own("dnnl_memory_destroy", out)

    def attr(self, post_ops: Sequence[tuple[str, tuple[Any, ...]]]) -> int:
        """Primitive attributes: strict F32 math, a user scratchpad, the post-ops in order."""
        a = c_void_p()
        self.lib.call("dnnl_primitive_attr_create", ctypes.byref(a))
        h = self.own("dnnl_primitive_attr_destroy", a)
        self.lib.call("dnnl_primitive_attr_set_fpmath_mode", h, FPMATH_STRICT)
        self.lib.call("dnnl_primitive_attr_set_scratchpad_mode", h, SCRATCHPAD_USER)
        if post_ops:
            po = c_void_p()
            self.lib.call("dnnl_post_ops_create", ctypes.byref(po))
            p = self.own("dnnl_post_ops_destroy", po)
            for name, args in post_ops:
                self.lib.call(name, p, *args)
            self.lib.call("dnnl_primitive_attr_set_post_ops", h, p)
        return h

    def primitive(self, pd: int, ws: Workspace | None = None) -> tuple[int, int | None]:
        """The primitive of `pd` and its scratchpad memory (in `ws`, else allocated here, once)
        or None."""
        prim = c_void_p()
        self.lib.call("dnnl_primitive_create", ctypes.byref(prim), pd)
        p = self.own("dnnl_primitive_destroy", prim)
        spad = self.lib.fns["dnnl_primitive_desc_query_md"](pd, QUERY_SCRATCHPAD_MD, 0)
        if not spad or self.lib.fns["dnnl_memory_desc_get_size"](spad) == 0:
            return p, None
        return p, self.scratch(spad, ws)

    def scratch(self, md: int, ws: Workspace | None) -> int:
        """A buffer that lives for one run of the runner: in `ws`, else allocated here."""
        return ws.memory(self, md) if ws is not None else self.memory(md, MEMORY_ALLOCATE)

    def pd(self, create: str, *args: Any) -> int | None:
        """A primitive descriptor, or None when oneDNN has no implementation for it."""
        out = c_void_p()
        status = self.lib.fns[create](ctypes.byref(out), *args)
        if status == UNIMPLEMENTED:
            return None
        if status != SUCCESS:
            raise OnednnError(create, int(status))
        return self.own("dnnl_primitive_desc_destroy", out)

    def reorder(self, src: int, dst: int) -> int:
        eng = _engine()[0]
        pd = self.pd("dnnl_reorder_primitive_desc_create", src, eng, dst, eng, None)
        if pd is None:
            raise OnednnError("dnnl_reorder_primitive_desc_create", UNIMPLEMENTED)
        return self.primitive(pd)[0]


def impl_name(lib: DnnlLib, pd: int) -> str:
    """The implementation oneDNN chose for a primitive descriptor (e.g. 'brg:avx512_core')."""
    s = c_char_p()
    lib.call("dnnl_primitive_desc_query", pd, QUERY_IMPL_INFO_STR, 0, ctypes.byref(s))
    return (s.value or b"").decode()


class Workspace:
    """Scratch memory oneDNN runners share. They run one at a time and keep nothing in their
    scratchpads and reorder buffers between calls, so every runner's buffers take the same
    bytes: one block sized for the largest runner, mapped and touched by `bind` when an executor
    is built (oneDNN's own allocations, one per primitive, were first touched by the first
    evaluation: ResNet-50 3.7 MB over 111 buffers, the 24 GEMMs of BERT-base's split attention
    5.5 MB). One workspace may serve every executor of a prepared graph (one per binding of the
    sizes, run one at a time): `bind` after each executor's runners are built grows the block to
    the largest runner of all and points every live runner's buffers at it."""

    def __init__(self) -> None:
        self._mems: list[tuple[_Owner, int, int]] = []  # owner, memory, offset in the block
        self._used = 0  # bytes the runner being built has taken
        self.size = 0  # needed: the largest runner's share
        self.requested = 0  # bytes of every buffer: what separate allocations would hold
        self._block: tuple[mmap.mmap, np.ndarray] | None = None

    def begin(self) -> None:
        """A new runner: its buffers start at the block's beginning."""
        self._used = 0

    def memory(self, o: _Owner, md: int) -> int:
        """A memory object of descriptor `md` in this runner's share of the block (its data
        handle set by `bind`)."""
        off = -(-self._used // 64) * 64
        n = int(o.lib.fns["dnnl_memory_desc_get_size"](md))
        self._used = off + n
        self.size = max(self.size, self._used)
        self.requested += n
        mem = o.memory(md, MEMORY_NONE)
        self._mems.append((o, mem, off))
        return mem

    @property
    def mapped(self) -> int:
        """Bytes of the block mapped now."""
        return 0 if self._block is None else len(self._block[1])

    def bind(self) -> None:
        """Map the block (again, larger, when a runner built since needs more) and point every
        live runner's memory at its bytes."""
        self._mems = [m for m in self._mems if not m[0].closed]  # runners closed since
        if self._block is None or len(self._block[1]) < self.size:
            # private: pages given back are freed, not moved to shared memory
            mm = mmap.mmap(-1, max(self.size, 1), flags=mmap.MAP_PRIVATE)
            block = np.frombuffer(mm, np.uint8)
            block.fill(0)  # resident now, not during the first evaluation
            self._block = (mm, block)
        base = int(self._block[1].ctypes.data)
        for o, mem, off in self._mems:
            o.lib.call("dnnl_memory_set_data_handle", mem, c_void_p(base + off))


@dataclass(frozen=True, slots=True)
class Packing:
    """How a runner gets its constant weights packed: from `store` when an executor of the same
    prepared graph packed the same weights (`key`) into the same layout, else packed here after
    `load()` has copied the plain weights into the arena."""

    store: PackedWeights
    key: Hashable
    load: Callable[[], None]
    keep: object = None  # the constant keyed by its address: alive while its entry is


class PackedWeights:
    """Constant weights in the layouts oneDNN's primitives chose, held once for every executor
    of a prepared graph: a packed weight depends on the weights and on the layout, not on the
    binding of the sizes, so the executor of a new sequence length or image size finds its
    weights here (onnxruntime's prepacked-weights container does the same across sessions).
    Entries live until `close()` (one per distinct weight and layout: a new binding whose
    primitive picks another blocking adds one)."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, list[int]] = {}  # key -> memories (each knows its md)
        self._keep: list[object] = []
        self._owner: _Owner | None = None
        self.nbytes = 0

    def find(self, lib: DnnlLib, key: Hashable, md: int) -> int | None:
        """The packed memory of `key` in layout `md`, or None."""
        for mem in self._entries.get(key, ()):
            have = c_void_p()
            lib.call("dnnl_memory_get_memory_desc", mem, ctypes.byref(have))
            if lib.fns["dnnl_memory_desc_equal"](have, md):
                return mem
        return None

    def new(self, lib: DnnlLib, key: Hashable, md: int, keep: object = None) -> int:
        """A memory of layout `md` for `key`, owned by the store (the caller packs into it);
        `keep` (what the key names) stays alive with it."""
        if self._owner is None:
            self._owner = _Owner(lib)
        mem = self._owner.memory(md, MEMORY_ALLOCATE)
        self._entries.setdefault(key, []).append(mem)
        self._keep.append(keep)
        self.nbytes += int(lib.fns["dnnl_memory_desc_get_size"](md))
        return mem

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
        self._entries.clear()
        self._keep.clear()
        self.nbytes = 0

    def __del__(self) -> None:
        self.close()


def _pack(
    o: _Owner, plain_md: int, packed_md: int, src: int, step: st.Step, packing: Packing | None
) -> int:
    """The constant weights of memory `src` (layout `plain_md`) in layout `packed_md`: taken
    from the store, or loaded, packed once here and kept there."""
    if packing is not None:
        hit = packing.store.find(o.lib, packing.key, packed_md)
        if hit is not None:
            return hit
        packing.load()
        mem = packing.store.new(o.lib, packing.key, packed_md, packing.keep)
    else:
        mem = o.memory(packed_md, MEMORY_ALLOCATE)
    _run(o.lib, [(o.reorder(plain_md, packed_md), _args([(ARG_FROM, src), (ARG_TO, mem)]))], step)
    return mem


# -- runners ------------------------------------------------------------------------------------

_Call = tuple[int, ctypes.Array[ExecArg]]  # primitive, its argument list


class Runner:
    """A step prebuilt for one arena: `runner()` executes it (oneDNN primitives in order, then
    `dnnl_stream_wait`), with no allocation. `rebind(arena)` points it at another arena of the
    same size (`dnnl_memory_set_data_handle`). `impl` names oneDNN's implementations."""

    def __init__(
        self,
        step: st.Step,
        arena: np.ndarray,
        owner: _Owner,
        calls: list[_Call],
        views: list[tuple[int, int]],
        threads: int,
        impl: str,
    ) -> None:
        self.step = step
        self.impl = impl
        self._arena = arena  # kept alive: the primitives hold raw pointers into it
        self._owner = owner
        self._calls = [(p, len(args), args) for p, args in calls]
        self._views = views  # (memory, byte offset into the arena)
        self._threads = threads
        lib = owner.lib
        self._execute = lib.fns["dnnl_primitive_execute"]
        self._wait = lib.fns["dnnl_stream_wait"]
        self._set_handle = lib.fns["dnnl_memory_set_data_handle"]
        self._set_threads = _omp_set_num_threads()
        self._stream = _engine()[1]

    def c_entries(self) -> list[tuple[int, int, int, int]]:
        """(primitive, stream, nargs, address of the argument array) of each primitive call,
        for the executor's compiled step loop (the arrays stay alive with this runner)."""
        return [(p, self._stream, n, ctypes.addressof(a)) for p, n, a in self._calls]

    def rebind(self, arena: np.ndarray) -> None:
        """Run over `arena` from now on (same plan, e.g. a new arena for the same binding)."""
        base = _base(arena)
        if arena.size < self._arena.size:
            raise EvaluationError(
                f"oneDNN: rebind to an arena of {arena.size} bytes, the step's plan needs "
                f"{self._arena.size}"
            )
        for mem, off in self._views:
            status = self._set_handle(mem, base + off)
            if status != SUCCESS:
                raise OnednnError("dnnl_memory_set_data_handle", int(status)).at(self.step)
        self._arena = arena

    def __call__(self) -> None:
        self._set_threads(self._threads)
        for prim, n, args in self._calls:
            status = self._execute(prim, self._stream, n, args)
            if status != SUCCESS:
                raise OnednnError("dnnl_primitive_execute", int(status)).at(self.step)
        status = self._wait(self._stream)
        if status != SUCCESS:
            raise OnednnError("dnnl_stream_wait", int(status)).at(self.step)

    def close(self) -> None:
        self._owner.close()

    def __del__(self) -> None:
        self.close()


def _base(arena: np.ndarray) -> int:
    if arena.dtype != np.uint8 or arena.ndim != 1 or not arena.flags.c_contiguous:
        raise EvaluationError(f"oneDNN: the arena must be a 1-d uint8 array, not {arena.dtype}")
    return int(arena.ctypes.data)


def _args(pairs: Sequence[tuple[int, int | None]]) -> ctypes.Array[ExecArg]:
    kept = [(a, m) for a, m in pairs if m is not None]
    return (ExecArg * len(kept))(*(ExecArg(a, m) for a, m in kept))


def _plain(v: StridedView) -> bool:
    return v.numel > 0 and all(s > 0 or d == 1 for d, s in zip(v.shape, v.strides, strict=True))


def _strides(shape: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Strides for a descriptor: a size-1 axis gets the dense stride (any value is legal there,
    and a canonical one keeps oneDNN on its plain fast paths)."""
    out, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = strides[i] if shape[i] != 1 else acc
        acc = max(acc, out[i] * shape[i])
    return out


def _threads(threads: int) -> int:
    n = int(threads)
    return n if n > 0 else max(1, len(os.sched_getaffinity(0)))


class Layout:
    """An activation layout a convolution chose (oneDNN's memory descriptor, e.g. nChw16c), as
    the executor's layout pass compares them: equal layouts (`dnnl_memory_desc_equal`) let one
    convolution's output feed the next as stored, with no reorder. `blocked`: not the plain
    NC(D)HW of the view; `dense`: exactly as many bytes as the plain tensor (no channel padding),
    so it fits the arena region the planner gave the view."""

    def __init__(
        self, lib: DnnlLib, md: int, plain_md: int, view: StridedView, channels_last: bool
    ) -> None:
        self._lib, self.md = lib, md
        self.blocked = not lib.fns["dnnl_memory_desc_equal"](md, plain_md)
        size = int(lib.fns["dnnl_memory_desc_get_size"](md))
        self.dense = view.is_dense() and size == view.nbytes
        rank = len(view.shape)
        self.order: tuple[int, ...] | None = (
            (0, *range(2, rank), 1) if channels_last and self.blocked else None
        )
        """The logical axes outermost first when the layout is channels-last (a permutation
        the other steps can read through strides), else None."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and bool(
            self._lib.fns["dnnl_memory_desc_equal"](self.md, other.md)
        )

    def __hash__(self) -> int:  # equality is oneDNN's; all layouts share one bucket
        return 0


class ConvDesc:
    """A convolution step's oneDNN primitive descriptor before its runner: `src` and `dst` are
    the activation layouts it chose. `conv_desc` makes it, `conv_runner(desc=...)` consumes it
    (and its oneDNN objects); `close()` frees an unused one."""

    def __init__(
        self, step: st.Conv, lib: DnnlLib, owner: _Owner, dt: int, layout: str, parts: Any
    ) -> None:
        self.step, self.lib, self.owner, self.dt, self.layout = step, lib, owner, dt, layout
        self.pd, self.x_md, self.out_md, self.w_plain = parts
        q = lib.fns["dnnl_primitive_desc_query_md"]
        self.src_md = q(self.pd, QUERY_SRC_MD, 0)
        self.w_md = q(self.pd, QUERY_WEIGHTS_MD, 0)
        self.dst_md = q(self.pd, QUERY_DST_MD, 0)
        nhwc = layout == "nhwc"  # forced: the primitive takes exactly the channels-last tag
        self.src = Layout(lib, self.src_md, self.x_md, step.x, nhwc)
        self.dst = Layout(lib, self.dst_md, self.out_md, step.out, nhwc)
        self.res_md: int | None = None
        """The residual's descriptor when a binary add post-op reads it (else a `sum`)."""

    def close(self) -> None:
        self.owner.close()


def _pointwise(s: st.Conv) -> bool:
    return (
        all(k == 1 for k in s.w.shape[2:])
        and all(x == 1 for x in s.stride)
        and s.groups == 1
        and not any(s.padding)
    )


def auto_layout(step: st.Conv) -> str:
    """The measured pick for a convolution whose activations are plain on both sides
    (benchmarks/onednn_steps.py --layouts, 2 threads, AVX-512): "plain" for a pointwise
    convolution without a residual (1x1, stride 1, no padding, one group) — oneDNN's
    `gemm:jit` on NCHW is one GEMM per image there and beat the blocked path by 1.5-1.8x,
    reorders included — and "blocked" for everything else: 3x3, strided, grouped and depthwise
    convolutions (its brgemm kernels were 1.4-4x faster than plain), and pointwise ones with a
    residual, where `gemm:jit` applies the `sum` post-op 5-14x slower than `brgconv_1x1`
    (ResNet-50's 1x1 64→256 at 56²: 7.4 ms vs 1.4 ms)."""
    return "plain" if _pointwise(step) and step.residual is None else "blocked"


def conv_desc(
    step: st.Conv, threads: int, layout: str = "blocked", post: Sequence[PostOp] = ()
) -> ConvDesc | None:
    """The primitive descriptor of `step` ("blocked": oneDNN chooses the activation layouts;
    "plain": the views' NC(D)HW; "nhwc", "c16", "c8": that layout), or None when oneDNN cannot
    run it exactly (F64, negative or zero strides, empty tensors, an unimplemented case).
    `post`: eltwise post-ops (alg kind, alpha, beta) applied last (an activation folded into
    the convolution, `kn_cuda_eval.cpu.passes.fuse`)."""
    x, w, out = step.x, step.w, step.out
    dt = _DATA_TYPES.get(out.dtype)
    views = [v for v in (x, w, step.bias, step.residual, out) if v is not None]
    if dt is None or any(v.dtype is not out.dtype or not _plain(v) for v in views):
        return None
    if layout not in ("blocked", "plain", *_TAGS):
        raise ValueError(f"conv_desc: layout {layout!r} is not 'blocked', 'plain' or in {_TAGS}")
    if layout in _TAGS and len(x.shape) not in _TAGS[layout]:
        return None
    if available() is not None:  # before binding OpenMP: that loads oneDNN's libgomp
        return None
    _omp_set_num_threads()(_threads(threads))
    return _build(step, lambda lib, o: _conv_desc(lib, o, step, dt, layout, tuple(post)))


ROLES = ("x", "residual", "out")  # the activations a convolution may read or write blocked


def conv_runner(
    step: st.Conv,
    arena: np.ndarray,
    threads: int,
    *,
    layout: str = "auto",
    constant_weights: bool = True,
    desc: ConvDesc | None = None,
    blocked: frozenset[str] = frozenset(),
    post: Sequence[PostOp] = (),
    workspace: Workspace | None = None,
    packing: Packing | None = None,
) -> Runner | None:
    """A oneDNN convolution for `step` over `arena`, or None when oneDNN cannot run it exactly
    (see `conv_desc`): then the caller runs `emulate_step` for it.

    out = relu?(conv(x, w) + bias + residual): bias is the convolution's bias argument, the
    residual a `sum` post-op (it is first copied into the destination), relu an `eltwise`
    post-op. Groups make the weights 5-d/6-d [g, K/g, C/g, *k]; oneDNN's dilation is ours - 1.
    `constant_weights` (the default): the weights are read **once, here**, into oneDNN's
    preferred layout, as for plan constants — `arena` must then hold the constants already (as
    `load_arena` and the executor do); False reorders them at every run (weights computed by an
    earlier step).
    `layout`: "blocked" lets oneDNN choose the activation layouts, "plain" runs on the arena's
    NC(D)HW views directly, "auto" (the default) is `auto_layout`'s measured pick. `desc`: a
    descriptor from `conv_desc` to use (and own) instead of making one.
    `blocked` (roles of `ROLES`, with a "blocked" descriptor): those activations are stored in
    the arena in the descriptor's own layout (`desc.src` for x, `desc.dst` for the residual and
    out) at the views' offsets — the executor's layout pass keeps a chain of convolutions in
    oneDNN's layout that way. The others are plain views: x (and the residual) are reordered
    into the chosen layout through buffers allocated here, and the result back.
    `post`: eltwise post-ops after everything else (see `conv_desc`; a `desc` has its own).
    `workspace`: where its scratchpad and reorder buffers live (shared with the executor's
    other runners; `Workspace.bind` before the first run), else allocated for it alone.
    `packing`: with constant weights, where packed weights are shared (`PackedWeights`)."""
    if desc is None:
        lay = auto_layout(step) if layout == "auto" else layout
        desc = conv_desc(step, threads, lay, post)
        if desc is None:
            return None
    if not set(blocked) <= set(ROLES):
        raise ValueError(f"conv_runner: blocked roles {sorted(blocked)} are not among {ROLES}")
    if blocked and desc.layout == "plain":
        raise ValueError("conv_runner: blocked activations need a descriptor that is not plain")
    if "residual" in blocked and step.residual is None:
        raise ValueError("conv_runner: a blocked residual on a convolution without one")
    n = _threads(threads)
    d = desc
    return _build(
        step,
        lambda lib, o: _conv_runner(d, arena, n, constant_weights, blocked, workspace, packing),
        d.owner,
    )


def _build(
    step: st.Step, build: Callable[[DnnlLib, _Owner], _T | None], owner: _Owner | None = None
) -> _T | None:
    """`build` with a fresh owner of oneDNN objects (or `owner`), closed when it fails or
    declines; None without oneDNN; a oneDNN error re-raised naming the step."""
    if available() is not None:
        return None
    lib = load_dnnl()
    o = _Owner(lib) if owner is None else owner
    try:
        return build(lib, o)
    except OnednnError as e:
        o.close()
        raise e.at(step) from None
    except BaseException:
        o.close()
        raise


def _conv_desc(
    lib: DnnlLib, o: _Owner, s: st.Conv, dt: int, layout: str, eltwise: tuple[PostOp, ...]
) -> ConvDesc | None:
    g = s.groups
    k_out = s.w.shape[0]
    ks = s.w.shape[2:]
    if g == 1:
        wdims, wstr = list(s.w.shape), list(s.w.strides)
    else:
        wdims = [g, k_out // g, *s.w.shape[1:]]
        wstr = [k_out // g * s.w.strides[0], *s.w.strides]
    x_md = o.md(s.x.shape, dt, _strides(s.x.shape, s.x.strides))
    out_md = o.md(s.out.shape, dt, _strides(s.out.shape, s.out.strides))
    w_plain = o.md(wdims, dt, _strides(wdims, wstr))
    bias_md = None if s.bias is None else o.md(s.bias.shape, dt, _strides(s.bias.shape, [1]))
    post: list[tuple[str, tuple[Any, ...]]] = []
    res_md = None
    if s.residual is not None and layout != "blocked" and not _overlaps(s.residual, s.out):
        # the residual read by a binary add post-op, in the destination's layout: a `sum`
        # needs it copied into the destination first, one more pass over it (ResNet-50's
        # 1x1 convolutions with a residual ran 1.15-1.5x onnxruntime's)
        res_md = (
            o.tag(s.residual.shape, dt, _TAGS[layout][len(s.x.shape)])
            if layout in _TAGS
            else o.md(s.residual.shape, dt, _strides(s.residual.shape, s.residual.strides))
        )
        post.append(("dnnl_post_ops_append_binary", (BINARY_ADD, res_md)))
    elif s.residual is not None:
        post.append(("dnnl_post_ops_append_sum", (1.0, 0, DT_UNDEF)))
    if s.relu:
        post.append(("dnnl_post_ops_append_eltwise", (ELTWISE_RELU, 0.0, 0.0)))
    post += [("dnnl_post_ops_append_eltwise", (a, float(al), float(be))) for a, al, be in eltwise]
    attr = o.attr(post)
    if layout == "plain":
        src_q, dst_q = x_md, out_md
    else:
        tag = FORMAT_TAG_ANY if layout == "blocked" else _TAGS[layout][len(s.x.shape)]
        src_q, dst_q = o.tag(s.x.shape, dt, tag), o.tag(s.out.shape, dt, tag)
    w_any = o.md(wdims, dt, None)
    spatial_in, spatial_out = s.x.shape[2:], s.out.shape[2:]
    pad_r = [
        (so - 1) * st_ + (k - 1) * d + 1 - si - p
        for si, so, k, st_, d, p in zip(
            spatial_in, spatial_out, ks, s.stride, s.dilation, s.padding, strict=True
        )
    ]
    pd = o.pd(
        "dnnl_convolution_forward_primitive_desc_create",
        _engine()[0],
        FORWARD_INFERENCE,
        CONVOLUTION_DIRECT,
        src_q,
        w_any,
        bias_md,
        dst_q,
        _dims(s.stride),
        _dims([d - 1 for d in s.dilation]),
        _dims(s.padding),
        _dims(pad_r),
        attr,
    )
    if pd is None:
        log.debug("oneDNN has no convolution for %s", s.describe())
        o.close()
        return None
    if layout in _TAGS and impl_name(lib, pd).startswith("ref"):
        log.debug("oneDNN has only its reference convolution in %s for %s", layout, s.describe())
        o.close()  # a forced layout the fast kernels do not take: 100-1000x slower
        return None
    d = ConvDesc(s, lib, o, dt, layout, (pd, x_md, out_md, w_plain))
    d.res_md = res_md
    return d


def _overlaps(a: StridedView, b: StridedView) -> bool:
    alo, ahi = a.byte_extent()
    blo, bhi = b.byte_extent()
    return alo < bhi and blo < ahi


def _conv_runner(
    d: ConvDesc,
    arena: np.ndarray,
    threads: int,
    constant_weights: bool,
    blocked: frozenset[str],
    ws: Workspace | None,
    packing: Packing | None = None,
) -> Runner:
    """The runner of descriptor `d` (its objects move to the runner's owner)."""
    lib, s, dt = d.lib, d.step, d.dt
    o = d.owner
    base = _base(arena)
    _omp_set_num_threads()(threads)
    if ws is not None:
        ws.begin()
    conv, spad = o.primitive(d.pd, ws)
    x_md = d.src_md if "x" in blocked else d.x_md
    out_md = d.dst_md if "out" in blocked else d.out_md
    x_mem = o.memory(x_md, base + s.x.offset)
    out_mem = o.memory(out_md, base + s.out.offset)
    views = [(x_mem, s.x.offset), (out_mem, s.out.offset)]
    # the weights into the layout the convolution chose: once, or at every run
    w_src = o.memory(d.w_plain, base + s.w.offset)
    calls: list[_Call] = []
    if constant_weights:
        w_mem = _pack(o, d.w_plain, d.w_md, w_src, s, packing)
    else:
        w_mem = o.memory(d.w_md, MEMORY_ALLOCATE)
        calls.append((o.reorder(d.w_plain, d.w_md), _args([(ARG_FROM, w_src), (ARG_TO, w_mem)])))
        views.append((w_src, s.w.offset))
    equal = lib.fns["dnnl_memory_desc_equal"]
    post_args: list[tuple[int, int | None]] = []
    src_mem, dst_mem = x_mem, out_mem
    if not equal(d.src_md, x_md):
        src_mem = o.scratch(d.src_md, ws)
        calls.append((o.reorder(x_md, d.src_md), _args([(ARG_FROM, x_mem), (ARG_TO, src_mem)])))
    if not equal(d.dst_md, out_md):
        dst_mem = o.scratch(d.dst_md, ws)
    if s.residual is not None:
        res_md = (
            d.dst_md
            if "residual" in blocked
            else o.md(s.residual.shape, dt, _strides(s.residual.shape, s.residual.strides))
        )
        res_mem = o.memory(res_md, base + s.residual.offset)
        views.append((res_mem, s.residual.offset))
        if d.res_md is None:  # `sum`: the residual is first copied into the destination
            fill = o.reorder(res_md, d.dst_md)
            calls.append((fill, _args([(ARG_FROM, res_mem), (ARG_TO, dst_mem)])))
        else:  # the binary post-op reads it, reordered first when it is not stored so
            if not equal(res_md, d.res_md):
                src1 = o.scratch(d.res_md, ws)
                into = o.reorder(res_md, d.res_md)
                calls.append((into, _args([(ARG_FROM, res_mem), (ARG_TO, src1)])))
                res_mem = src1
            post_args = [(ARG_POST_OP_BASE | ARG_SRC_1, res_mem)]  # post-op 0: the add
    bias_mem = None
    if s.bias is not None:
        bias_md = o.md(s.bias.shape, dt, _strides(s.bias.shape, [1]))
        bias_mem = o.memory(bias_md, base + s.bias.offset)
        views.append((bias_mem, s.bias.offset))
    conv_args = [
        (ARG_SRC, src_mem),
        (ARG_WEIGHTS, w_mem),
        (ARG_BIAS, bias_mem),
        (ARG_DST, dst_mem),
        (ARG_SCRATCHPAD, spad),
        *post_args,
    ]
    calls.append((conv, _args(conv_args)))
    if dst_mem != out_mem:
        back = o.reorder(d.dst_md, out_md)
        calls.append((back, _args([(ARG_FROM, dst_mem), (ARG_TO, out_mem)])))
    return Runner(s, arena, o, calls, views, threads, impl_name(lib, d.pd))


def _run(lib: DnnlLib, calls: list[_Call], step: st.Step) -> None:
    _, strm = _engine()
    for prim, args in calls:
        status = lib.fns["dnnl_primitive_execute"](prim, strm, len(args), args)
        if status != SUCCESS:
            raise OnednnError("dnnl_primitive_execute", int(status)).at(step)
    lib.call("dnnl_stream_wait", strm)


# -- GEMMs --------------------------------------------------------------------------------------


def _operands(arena: np.ndarray, s: st.MatMul) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step in row-major terms over arena views: dst [batch, n, m] = src [batch, n, k] @
    wei [batch, k, m] (cuBLAS's Cᵀ = op(B)ᵀ·op(A)ᵀ; the graph's own product)."""
    from kn_cuda_eval.planning.emulator import view_array

    a, b, c = view_array(arena, s.a), view_array(arena, s.b), view_array(arena, s.c)
    wei = a.transpose(0, 2, 1) if s.transa else a  # op(A)ᵀ: [batch, k, m]
    src = b.transpose(0, 2, 1) if s.transb else b  # op(B)ᵀ: [batch, n, k]
    return src, wei, c


def _blas_wins(s: st.MatMul) -> bool:
    """The measured pick of `gemm_runner` (benchmarks/onednn_steps.py)."""
    return s.dtype is DType.F64


def gemm_runner(
    step: st.MatMul,
    arena: np.ndarray,
    threads: int,
    *,
    backend: str = "auto",
    constant_weights: bool = False,
    workspace: Workspace | None = None,
    packing: Packing | None = None,
) -> Callable[[], None] | None:
    """A runner for a GEMM step over `arena`, or None (the caller then runs `emulate_step`).

    The step is cuBLAS's column-major Cᵀ = op(B)ᵀ·op(A)ᵀ; in row-major terms it is dst [b, n, m]
    = src [b, n, k] @ wei [b, k, m] on views of the arena, transposes being strides, a batch
    stride of 0 a broadcast batch of 1, alpha an `eltwise_linear` post-op and beta a `sum`.

    `constant_weights`: the graph's right operand (cuBLAS's A, `step.a`) is a plan constant
    (the caller checks `plan.constants`): it is then packed once, here, into the layout oneDNN's
    matmul prefers, as onnxruntime prepacks its weights; the arena must hold the constants.

    Pick rule (`backend="auto"`; measured by benchmarks/onednn_steps.py, 2 threads, AVX-512):
    oneDNN matmul for F32 and F16, NumPy matmul (OpenBLAS dgemm) on the arena views only for
    F64, which oneDNN has no CPU matmul for. OpenBLAS tied oneDNN on BERT's 128x768x768, lost
    on the batched attention products (1.6-2x), and won 128x768x3072 against plain weights —
    which prepacked weights take back; and its workers spin for about 0.1 s after each call,
    which makes the next OpenMP region (a oneDNN primitive, a compiled fused step) on the same
    cores 10-30x slower: one thread pool, not two, is the rule. F16 accumulates in F32 in
    oneDNN, while NumPy's F16 matmul has no BLAS. `backend="onednn"` / `"blas"` force a side
    (the benchmark's comparison). A layout oneDNN refuses (`dnnl_unimplemented`) or a zero or
    negative inner stride gives None."""
    s = step
    if s.batch * s.m * s.n == 0 or s.k == 0:
        return None
    if backend == "blas" or (backend == "auto" and _blas_wins(s)):
        return _blas(s, arena, _threads(threads))
    dt = _DATA_TYPES.get(s.dtype)
    if dt is None or s.a.dtype is not s.dtype or s.b.dtype is not s.dtype:
        return None
    n = _threads(threads)
    return _build(
        s, lambda lib, o: _matmul(lib, o, s, dt, arena, n, constant_weights, workspace, packing)
    )


def _desc(o: _Owner, v: np.ndarray, batch: int, dt: int) -> int | None:
    """The descriptor of a 3-d operand view, or None for strides oneDNN cannot take; a broadcast
    batch (stride 0) becomes a batch of 1, and a product of batch 1 is 2-d."""
    shape, es = list(v.shape), [x // v.itemsize for x in v.strides]
    if any(x < 0 for x in es) or any(
        x == 0 and d > 1 for x, d in zip(es[1:], shape[1:], strict=True)
    ):
        return None
    if batch == 1:
        shape, es = shape[1:], es[1:]
    elif es[0] == 0:
        shape[0] = 1
    return o.md(shape, dt, _strides(shape, es))


def _matmul(
    lib: DnnlLib,
    o: _Owner,
    s: st.MatMul,
    dt: int,
    arena: np.ndarray,
    threads: int,
    constant_weights: bool,
    ws: Workspace | None = None,
    packing: Packing | None = None,
) -> Runner | None:
    base = _base(arena)
    _omp_set_num_threads()(threads)
    src, wei, dst = _operands(arena, s)
    descs = [_desc(o, v, s.batch, dt) for v in (src, wei, dst)]
    if any(d is None for d in descs):
        o.close()
        return None
    src_md, wei_md, dst_md = (d for d in descs if d is not None)
    post: list[tuple[str, tuple[Any, ...]]] = []
    if s.alpha != 1.0:
        post.append(("dnnl_post_ops_append_eltwise", (ELTWISE_LINEAR, float(s.alpha), 0.0)))
    if s.beta != 0.0:
        post.append(("dnnl_post_ops_append_sum", (float(s.beta), 0, DT_UNDEF)))
    attr = o.attr(post)
    wei_q = (
        o.md(wei.shape[1:] if s.batch == 1 else _batch1(wei), dt, None)
        if constant_weights
        else wei_md
    )
    pd = o.pd("dnnl_matmul_primitive_desc_create", _engine()[0], src_md, wei_q, None, dst_md, attr)
    if pd is None:
        log.debug("oneDNN has no matmul for %s", s.describe())
        o.close()
        return None
    if ws is not None:
        ws.begin()
    prim, spad = o.primitive(pd, ws)
    offs = [v.ctypes.data - base for v in (src, wei, dst)]
    mems = [
        o.memory(md, base + off) for md, off in zip((src_md, wei_md, dst_md), offs, strict=True)
    ]
    views = list(zip(mems, offs, strict=True))
    wei_mem = mems[1]
    if constant_weights:  # prepacked once into the layout the matmul chose
        packed_md = lib.fns["dnnl_primitive_desc_query_md"](pd, QUERY_WEIGHTS_MD, 0)
        wei_mem = _pack(o, wei_md, packed_md, mems[1], s, packing)
        views = [views[0], views[2]]
    args = _args(
        [(ARG_SRC, mems[0]), (ARG_WEIGHTS, wei_mem), (ARG_DST, mems[2]), (ARG_SCRATCHPAD, spad)]
    )
    return Runner(s, arena, o, [(prim, args)], views, threads, impl_name(lib, pd))


def _batch1(v: np.ndarray) -> list[int]:
    """The dims a 3-d operand's descriptor has (batch 1 when it is broadcast)."""
    return [1 if v.strides[0] == 0 else v.shape[0], *v.shape[1:]]


def _blas(s: st.MatMul, arena: np.ndarray, threads: int) -> Callable[[], None] | None:
    """NumPy matmul (BLAS where the views allow) straight into the arena's output view."""
    if s.beta != 0.0:
        return None
    src, wei, dst = _operands(arena, s)
    alpha = dst.dtype.type(s.alpha)
    set_threads = _blas_set_num_threads()
    matmul, multiply = np.matmul, np.multiply

    def run() -> None:
        set_threads(threads)
        matmul(src, wei, out=dst)
        if alpha != 1:
            multiply(dst, alpha, out=dst)

    return run


# -- special values through eltwise post-ops ----------------------------------------------------

PROBE_VALUES = (
    *(float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0),
    *(6.0, -6.0, 7.5, -7.5, 20.0, -20.0, 100.0, -100.0, 1e-30, -1e-30, 6e4, -6e4, 3e38, -3e38),
)
"""What the probe convolutions' outputs hold: NaN, ±inf, ±0, values around common clamp bounds,
tiny and huge ones (f16 rounds the huge ones to ±inf)."""

PROBE_CONVS = (("blocked", 3, 1), ("nhwc", 3, 1), ("blocked", 3, 16), ("plain", 1, 1))
"""(layout, kernel size, groups) of the probe convolutions: the implementation families the
executor's convolutions run in (`auto_layout`'s blocked and plain picks, the layout pass's
channels-last chains, depthwise), each with its own post-op code."""


@functools.cache
def probe_post_ops(
    post: tuple[PostOp, ...], dtype: DType
) -> tuple[tuple[np.ndarray, np.ndarray], ...] | None:
    """What oneDNN's convolutions write without and with the eltwise post-ops `post`, over
    outputs that hold `PROBE_VALUES`: (t, y) for each of the `PROBE_CONVS` oneDNN runs (16
    channels, 6x6, identity weights at the centre tap); None when it runs none of them (no
    oneDNN, no `dtype` convolution on this CPU).

    Post-ops are JIT code generated per ISA (SSE4.1, AVX2, AVX-512) and implementation, and
    their max/min instructions return the second operand when the first is NaN, so whether an
    activation keeps NaN (and agrees on ±inf) is asked of the library on this machine: once
    per process, chain and dtype, a few milliseconds. `kn_cuda_eval.cpu.passes.fuse` folds only
    chains whose output agrees with the reference's."""
    if _DATA_TYPES.get(dtype) is None or available() is not None:
        return None
    c, side = 16, 6
    x = np.resize(np.array(PROBE_VALUES[3:], np.float64), (1, c, side, side))
    # the non-finite values apart (a zero weight times inf is NaN: they spread to their window)
    x[0, 0, 0, 0], x[0, 1, side - 1, side - 1], x[0, 2, 0, side - 1] = PROBE_VALUES[:3]
    out = []
    for layout, k, groups in PROBE_CONVS:
        w = np.zeros((c, c // groups, k, k))
        w[np.arange(c), np.arange(c) % (c // groups), k // 2, k // 2] = 1.0  # identity
        end = 0
        views = []
        for shape in (x.shape, w.shape, x.shape):
            views.append(StridedView.dense(end, shape, dtype))
            end += -(-views[-1].nbytes // 256) * 256
        xv, wv, ov = views
        step = st.Conv(xv, wv, None, None, ov, (1, 1), (k // 2,) * 2, (1, 1), groups, False)
        got = []
        for chain in ((), post):
            arena = np.zeros(end, np.uint8)
            with np.errstate(over="ignore"):  # f16: the huge values become ±inf
                for v, a in ((xv, x), (wv, w)):
                    arena[v.offset : v.offset + v.nbytes].view(dtype.np)[...] = a.ravel()
            runner = conv_runner(step, arena, 1, layout=layout, post=chain)
            if runner is None:
                break
            try:
                runner()
            finally:
                runner.close()
            got.append(arena[ov.offset : ov.offset + ov.nbytes].view(dtype.np).copy())
        if len(got) == 2:
            out.append((got[0], got[1]))
    return tuple(out) if out else None
