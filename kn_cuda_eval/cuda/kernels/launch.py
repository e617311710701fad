"""What a generated CUDA kernel is and how it is launched, plus the pieces every CUDA generator
shares: parameter lists, coordinate decomposition, view offsets, the `.cu` templates.

Kernels read sizes and strides from their arguments, so one compiled kernel serves every step
with the same structure (program, dtypes, rank, layout classes, index width): batch 1 and batch 8
of a model, or the twelve layers of a transformer, share their kernels.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter, fill
from kn_cuda_eval.planning.view import StridedView

__all__ = [
    "GRID_CAP",
    "Arg",
    "FloatArg",
    "IntArg",
    "Kernel",
    "KernelLaunch",
    "Layout",
    "Params",
    "PtrArg",
    "blocks_for",
    "classify",
    "decompose",
    "make_kernel",
    "needs_64bit",
    "offset_expr",
]

BLOCK = 256
INT32_LIMIT = 2**31 - 1
GRID_CAP = 2**20
"""The most blocks a generated kernel is launched with; grid-stride and row loops cover the rest.
Read whenever a launch is built (never copied at import), so a test can shrink it —
`monkeypatch.setattr(launch, "GRID_CAP", 8)` — and make those loops run at small sizes."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """A compilable unit: `source` defines `extern "C" __global__ void name(...)`."""

    name: str
    source: str


@dataclass(frozen=True, slots=True)
class PtrArg:
    """A device pointer: arena base + `offset` bytes (bound by the executor)."""

    offset: int


@dataclass(frozen=True, slots=True)
class IntArg:
    value: int
    bits: int  # 32 or 64


@dataclass(frozen=True, slots=True)
class FloatArg:
    value: float
    bits: int = 32  # a C float, or (64) a double


Arg = PtrArg | IntArg | FloatArg


@dataclass(frozen=True, slots=True)
class KernelLaunch:
    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: tuple[Arg, ...]


def needs_64bit(count: int, views: Sequence[StridedView]) -> bool:
    """64-bit indexing when any view's element offsets pass 2^31, or when a loop index over
    `count` items could: a grid-stride loop's index ends one stride (at most GRID_CAP·BLOCK)
    past its last item, so a 32-bit one would wrap negative for counts just below 2^31."""
    last = max(count, 1) - 1 + GRID_CAP * BLOCK
    return last > INT32_LIMIT or any(v.max_index() > INT32_LIMIT for v in views)


def blocks_for(n: int, per_block: int = BLOCK) -> int:
    """Grid size for a grid-stride loop over n items (at most GRID_CAP; the loop covers the
    rest)."""
    return max(1, min((n + per_block - 1) // per_block, GRID_CAP))


class Layout(enum.Enum):
    """How a kernel addresses a view: DENSE reads element i, SCALAR element 0, STRIDED
    computes Σ coordinate·stride (strides are arguments)."""

    DENSE = "d"
    SCALAR = "s"
    STRIDED = "x"


def classify(v: StridedView) -> Layout:
    if v.is_dense():
        return Layout.DENSE
    if all(s == 0 or d == 1 for d, s in zip(v.shape, v.strides, strict=True)):
        return Layout.SCALAR
    return Layout.STRIDED


class Params:
    """The kernel's parameter list and the matching launch arguments, built together."""

    def __init__(self, wide: bool) -> None:
        self.wide = wide
        self.decls: list[str] = []
        self.args: list[Arg] = []

    def idx(self, name: str, value: int) -> str:
        self.decls.append(f"const kn_idx {name}")
        self.args.append(IntArg(int(value), 64 if self.wide else 32))
        return name

    def ptr(self, name: str, v: StridedView, const: bool = True) -> str:
        q = "const " if const else ""
        self.decls.append(f"{q}{exprs.storage_ctype(v.dtype)}* __restrict__ {name}")
        self.args.append(PtrArg(v.offset))
        return name

    def raw_ptr(self, name: str, ctype: str, offset: int) -> str:
        self.decls.append(f"{ctype}* __restrict__ {name}")
        self.args.append(PtrArg(offset))
        return name

    def float_(self, name: str, value: float, bits: int = 32) -> str:
        self.decls.append(f"const {'double' if bits == 64 else 'float'} {name}")
        self.args.append(FloatArg(float(value), bits))
        return name

    def strides(self, prefix: str, strides: Sequence[int]) -> list[str]:
        return [self.idx(f"{prefix}_{a}", s) for a, s in enumerate(strides)]

    def signature(self) -> str:
        return ",\n    ".join(self.decls)


def decompose(w: CodeWriter, index: str, dims: Sequence[str], prefix: str) -> list[str]:
    """Row-major coordinates of linear `index` over `dims` (dims[0] is never read)."""
    r = len(dims)
    if r == 0:
        return []
    if r == 1:
        w.line(f"const kn_idx {prefix}0 = {index};")
        return [f"{prefix}0"]
    w.line(f"kn_idx {prefix}rem = {index};")
    for a in range(r - 1, 0, -1):
        w.line(f"const kn_idx {prefix}{a} = {prefix}rem % {dims[a]}; {prefix}rem /= {dims[a]};")
    w.line(f"const kn_idx {prefix}0 = {prefix}rem;")
    return [f"{prefix}{a}" for a in range(r)]


def offset_expr(coords: Sequence[str], strides: Sequence[str]) -> str:
    terms = [f"{c} * {s}" for c, s in zip(coords, strides, strict=True)]
    return " + ".join(terms) if terms else "0"


@functools.cache
def template(name: str) -> str:
    """The text of `templates/<name>.cu`."""
    return (
        resources.files("kn_cuda_eval.cuda.kernels").joinpath("templates", f"{name}.cu").read_text()
    )


def make_kernel(kind: str, tpl: str, values: dict[str, str | int], wide: bool) -> Kernel:
    """Fill `templates/<tpl>.cu` (and the shared prelude); the name carries a hash of the
    source, so equal structure gives the same kernel and different structure a different one."""
    body_values = dict(values)
    digest = hashlib.sha256(repr(sorted((k, str(v)) for k, v in body_values.items())).encode())
    digest.update(f"{tpl}|{wide}".encode())
    name = f"kn_{kind}_{digest.hexdigest()[:12]}"
    uses_half = any("half" in str(v) for v in body_values.values())
    includes = (
        "#include <cuda_fp16.h>"
        if uses_half
        else "// no f16: cuda_fp16.h not needed (it doubles compile time)"
    )
    prelude = fill(
        template("prelude"),
        {"NAME": name, "IDX": "long long" if wide else "int", "INCLUDES": includes},
    )
    source = fill(template(tpl), {**body_values, "PRELUDE": prelude, "NAME": name})
    return Kernel(name, source)
