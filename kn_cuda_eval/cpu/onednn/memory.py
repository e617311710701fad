"""oneDNN's memory on the host: descriptors and the objects a runner owns (`Owner`), the
scratch block runners share (`Workspace`) and constant weights packed once for every executor of
a prepared graph (`PackedWeights`) — the CPU counterpart of `kn_cuda_eval.cuda.cudnn.descriptors`.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Callable, Hashable, Sequence
from ctypes import c_char_p, c_int64, c_void_p
from dataclasses import dataclass
from typing import Any

import numpy as np

from kn_cuda_eval.cpu.onednn.lib import (
    FORMAT_TAG_ANY,
    FPMATH_STRICT,
    MEMORY_ALLOCATE,
    MEMORY_NONE,
    QUERY_IMPL_INFO_STR,
    QUERY_SCRATCHPAD_MD,
    SCRATCHPAD_USER,
    SUCCESS,
    UNIMPLEMENTED,
    Dims,
    DnnlLib,
    OnednnError,
    engine,
)
from kn_cuda_eval.cpu.onednn.postops import PostOpCall

__all__ = [
    "Owner",
    "PackedWeights",
    "Packing",
    "Workspace",
    "dnnl_dims",
    "impl_name",
    "md_strides",
]


def dnnl_dims(values: Sequence[int]) -> ctypes.Array[c_int64]:
    """A `dnnl_dims_t` holding `values`."""
    return Dims(*(int(v) for v in values))


def md_strides(shape: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Strides for a descriptor: a size-1 axis gets the dense stride (any value is legal there,
    and a canonical one keeps oneDNN on its plain fast paths)."""
    out, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = strides[i] if shape[i] != 1 else acc
        acc = max(acc, out[i] * shape[i])
    return out


class Owner:
    """oneDNN objects a runner created, destroyed with it (in reverse order)."""

    def __init__(self, lib: DnnlLib) -> None:
        self.lib = lib
        self.objects: list[tuple[str, int]] = []
        self.closed = False
        self.keep: list[object] = []  # host arrays its memories point into

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
        self.keep.clear()

    def md(self, dims: Sequence[int], dt: int, strides: Sequence[int] | None) -> int:
        """A memory descriptor: plain with explicit element strides, or `any` (strides None)."""
        if strides is None:
            return self.tag(dims, dt, FORMAT_TAG_ANY)
        out = c_void_p()
        self.lib.call(
            "dnnl_memory_desc_create_with_strides",
            ctypes.byref(out),
            len(dims),
            dnnl_dims(dims),
            dt,
            dnnl_dims(strides),
        )
        return self.own("dnnl_memory_desc_destroy", out)

    def tag(self, dims: Sequence[int], dt: int, tag: int) -> int:
        """A memory descriptor of format tag `tag` (`FORMAT_TAG_ANY`: the primitive chooses)."""
        out = c_void_p()
        self.lib.call(
            "dnnl_memory_desc_create_with_tag",
            ctypes.byref(out),
            len(dims),
            dnnl_dims(dims),
            dt,
            tag,
        )
        return self.own("dnnl_memory_desc_destroy", out)

    def memory(self, md: int, handle: c_void_p | int) -> int:
        out = c_void_p()
        h = handle if isinstance(handle, c_void_p) else c_void_p(handle)
        self.lib.call("dnnl_memory_create", ctypes.byref(out), md, engine()[0], h)
        return self.own("dnnl_memory_destroy", out)

    def attr(self, post_ops: Sequence[PostOpCall]) -> int:
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
        eng = engine()[0]
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
        self._mems: list[tuple[Owner, int, int]] = []  # owner, memory, offset in the block
        self._used = 0  # bytes the runner being built has taken
        self.size = 0  # needed: the largest runner's share
        self.requested = 0  # bytes of every buffer: what separate allocations would hold
        self._block: tuple[mmap.mmap, np.ndarray] | None = None

    def begin(self) -> None:
        """A new runner: its buffers start at the block's beginning."""
        self._used = 0

    def memory(self, o: Owner, md: int) -> int:
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
    prepared graph packed the same weights (`key`) into the same layout, else packed here —
    straight from the constant `keep` when `source_at` is given (the address of the operand's
    first byte in it, laid out as in the arena), or after `load()` has copied the plain weights
    into the arena."""

    store: PackedWeights
    key: Hashable
    load: Callable[[], None]
    keep: np.ndarray | None = None  # the constant keyed by its address: alive while its entry is
    source_at: int | None = None


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
        self._owner: Owner | None = None
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
            self._owner = Owner(lib)
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
