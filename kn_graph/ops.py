"""The closed set of IR operations: one frozen dataclass per op, sub-kinds as enums.

Every op lists its operand fields in `OPERANDS`; `inputs` and `map_inputs` derive from it, so no
pass ever names operand fields by hand.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kn_graph.dtype import DType
from kn_graph.filemap import release_pages
from kn_graph.shape import Shape, Size

__all__ = [
    "Attention",
    "Binary",
    "BinaryOp",
    "BlockQuantMatMul",
    "Broadcast",
    "Concat",
    "Constant",
    "Conv",
    "ConvDetails",
    "Dynamic",
    "Gather",
    "Input",
    "IntConv",
    "IntMatMul",
    "Iota",
    "Layernorm",
    "MatMul",
    "Op",
    "Permute",
    "Reduce",
    "ReduceOp",
    "Select",
    "Slice",
    "Softmax",
    "Tensor",
    "Unary",
    "UnaryOp",
    "Value",
    "View",
]


@dataclass(frozen=True, slots=True)
class Value:
    """A handle to one node of one graph: its index and the id of the graph that owns it."""

    index: int
    graph_id: int

    def __str__(self) -> str:
        return f"%{self.index}"

    def __repr__(self) -> str:
        return f"Value(%{self.index})"


@dataclass(frozen=True, slots=True, eq=False)
class Tensor:
    """Read-only constant data, hashed and compared by content (dtype, shape, bytes digest)."""

    array: np.ndarray
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.array)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr).reshape(arr.shape)
        if arr.flags.writeable or _aliases_writeable(arr):  # the caller may still write it
            arr = arr.copy()
            arr.flags.writeable = False
        object.__setattr__(self, "array", arr)
        # hashed in place (a mapped initializer is read once, not copied)
        object.__setattr__(self, "digest", content_digest(arr))
        # a mapped initializer's pages go back once hashed: kept, the loader alone would hold
        # the whole file resident, and the executors' packed copies would come on top of it
        # (Qwen2-0.5B: a 3.0 GB peak for 2.5 GB of weights); a later read faults them in again
        release_pages(arr)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and other.digest == self.digest

    def __repr__(self) -> str:
        return f"Tensor({self.array.dtype}{list(self.array.shape)}, {self.digest[:8]})"


try:
    import xxhash

    def _bytes_digest(data: memoryview) -> str:
        return xxhash.xxh3_128(data).hexdigest()

except ImportError:  # a machine without the dependency (the GPU image): slower, same identity

    def _bytes_digest(data: memoryview) -> str:
        return hashlib.blake2b(data, digest_size=16).hexdigest()


def content_digest(arr: np.ndarray) -> str:
    """A constant's identity: a 128-bit hash of its bytes (XXH3, 26 GB/s; blake2b where xxhash
    is missing), with its dtype and shape. Not cryptographic: a model could make two of its own
    constants collide and so merge them — which changes only that model's results, which it
    controls anyway."""
    raw = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    return f"{_bytes_digest(raw)}:{arr.dtype.str}{list(arr.shape)}"


def _aliases_writeable(arr: np.ndarray) -> bool:
    """A read-only view of memory that its owner can still write."""
    base = arr.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return True
        base = base.base
    return False


class UnaryOp(enum.Enum):
    ABS = "abs"
    NEG = "neg"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    ERF = "erf"
    SOFTPLUS = "softplus"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    SIGN = "sign"
    NOT = "not"
    BIT_NOT = "bit_not"
    GELU = "gelu"  # exact, x·Φ(x) with erf
    GELU_TANH = "gelu_tanh"  # the tanh approximation
    SILU = "silu"
    CAST = "cast"
    BITCAST = "bitcast"

    @property
    def float_only(self) -> bool:
        """Transcendental ops defined on floating point only."""
        return self not in _UNARY_ANY_TYPE

    @property
    def changes_dtype(self) -> bool:
        return self in (UnaryOp.CAST, UnaryOp.BITCAST)


_UNARY_ANY_TYPE = frozenset(
    {
        UnaryOp.ABS,
        UnaryOp.NEG,
        UnaryOp.SIGN,
        UnaryOp.NOT,
        UnaryOp.BIT_NOT,
        UnaryOp.CAST,
        UnaryOp.BITCAST,
    }
)


class BinaryOp(enum.Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MIN = "min"
    MAX = "max"
    MOD = "mod"  # sign of the divisor (Python / ONNX fmod=0); FMOD is C fmod
    FMOD = "fmod"
    EQ = "eq"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"
    XOR = "xor"
    BIT_AND = "bit_and"
    BIT_OR = "bit_or"
    BIT_XOR = "bit_xor"
    SHL = "shl"
    SHR = "shr"

    @property
    def is_comparison(self) -> bool:
        return self in _COMPARISONS

    @property
    def is_logical(self) -> bool:
        return self in (BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR)

    @property
    def is_bitwise(self) -> bool:
        return self in (
            BinaryOp.BIT_AND,
            BinaryOp.BIT_OR,
            BinaryOp.BIT_XOR,
            BinaryOp.SHL,
            BinaryOp.SHR,
        )

    @property
    def is_commutative(self) -> bool:
        return self in _COMMUTATIVE

    @property
    def identity(self) -> float | None:
        """The right identity element (x op identity == x), if any."""
        return _IDENTITY.get(self)


_COMPARISONS = frozenset({BinaryOp.EQ, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE})
_COMMUTATIVE = frozenset(
    {
        BinaryOp.ADD,
        BinaryOp.MUL,
        BinaryOp.MIN,
        BinaryOp.MAX,
        BinaryOp.EQ,
        BinaryOp.AND,
        BinaryOp.OR,
        BinaryOp.XOR,
        BinaryOp.BIT_AND,
        BinaryOp.BIT_OR,
        BinaryOp.BIT_XOR,
    }
)
_IDENTITY = {
    BinaryOp.ADD: 0.0,
    BinaryOp.SUB: 0.0,
    BinaryOp.MUL: 1.0,
    BinaryOp.DIV: 1.0,
    BinaryOp.POW: 1.0,
}


class ReduceOp(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    ARGMIN = "argmin"
    ARGMAX = "argmax"

    @property
    def is_arg(self) -> bool:
        return self in (ReduceOp.ARGMIN, ReduceOp.ARGMAX)


@dataclass(frozen=True, slots=True)
class ConvDetails:
    """N-d convolution geometry; `padding` is symmetric per spatial axis."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1

    @property
    def rank(self) -> int:
        return len(self.stride)

    def describe(self) -> str:
        """`s=2 p=1 d=2 g=32`, a tuple as `1x2` where its entries differ."""

        def fmt(t: tuple[int, ...]) -> str:
            return "x".join(map(str, t)) if len(set(t)) > 1 else str(t[0]) if t else "-"

        s = f"s={fmt(self.stride)} p={fmt(self.padding)}"
        if any(x != 1 for x in self.dilation):
            s += f" d={fmt(self.dilation)}"
        if self.groups != 1:
            s += f" g={self.groups}"
        return s


class Op:
    """Base of every op. Subclasses are frozen slotted dataclasses naming operands in OPERANDS."""

    __slots__ = ()
    OPERANDS: ClassVar[tuple[str, ...]] = ()
    NAME: ClassVar[str] = "op"

    @property
    def inputs(self) -> tuple[Value, ...]:
        out: list[Value] = []
        for f in self.OPERANDS:
            v = getattr(self, f)
            if isinstance(v, tuple):
                out.extend(v)
            elif v is not None:  # an optional operand (Attention's mask) may be absent
                out.append(v)
        return tuple(out)

    def map_inputs(self, f: Callable[[Value], Value]) -> Op:
        if not self.OPERANDS:
            return self
        changes = {}
        for name in self.OPERANDS:
            v = getattr(self, name)
            if isinstance(v, tuple):
                changes[name] = tuple(f(x) for x in v)
            elif v is not None:
                changes[name] = f(v)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def attrs(self) -> str:
        """Key attributes, printed after the operands."""
        return ""


@dataclass(frozen=True, slots=True)
class Input(Op):
    index: int
    NAME: ClassVar[str] = "input"

    def attrs(self) -> str:
        return f"#{self.index}"


@dataclass(frozen=True, slots=True)
class Constant(Op):
    tensor: Tensor
    NAME: ClassVar[str] = "const"

    def attrs(self) -> str:
        a = self.tensor.array
        if a.ndim == 0:
            return repr(a.item())
        if a.size <= 4:
            return str(a.reshape(-1).tolist()).replace(" ", "")
        return f"<{a.size} values>"


@dataclass(frozen=True, slots=True)
class View(Op):
    x: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "view"


@dataclass(frozen=True, slots=True)
class Broadcast(Op):
    x: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "broadcast"


@dataclass(frozen=True, slots=True)
class Permute(Op):
    x: Value
    perm: tuple[int, ...]
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "permute"

    def attrs(self) -> str:
        return f"perm={list(self.perm)}"


@dataclass(frozen=True, slots=True)
class Slice(Op):
    """Elements start, start+step, … along `axis` (step ≠ 0, may be negative); the count is the
    output's size on that axis, so a negative step needs no end sentinel. `start` is a Size."""

    x: Value
    axis: int
    start: Size
    step: int
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "slice"

    def attrs(self) -> str:
        return f"axis={self.axis} start={self.start} step={self.step}"


@dataclass(frozen=True, slots=True)
class Gather(Op):
    """out = x.take(indices, axis); `indices` is a rank-1 integer value; out-of-range raises."""

    x: Value
    axis: int
    indices: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("x", "indices")
    NAME: ClassVar[str] = "gather"

    def attrs(self) -> str:
        return f"axis={self.axis}"


@dataclass(frozen=True, slots=True)
class Concat(Op):
    xs: tuple[Value, ...]
    axis: int
    OPERANDS: ClassVar[tuple[str, ...]] = ("xs",)
    NAME: ClassVar[str] = "concat"

    def attrs(self) -> str:
        return f"axis={self.axis}"


@dataclass(frozen=True, slots=True)
class Conv(Op):
    """Cross-correlation of x [N, C, *spatial] with w [K, C/groups, *kernel]; no bias."""

    x: Value
    w: Value
    details: ConvDetails
    OPERANDS: ClassVar[tuple[str, ...]] = ("x", "w")
    NAME: ClassVar[str] = "conv"

    def attrs(self) -> str:
        return self.details.describe()


@dataclass(frozen=True, slots=True)
class MatMul(Op):
    """Batched matrix product [b, m, k] @ [b, k, n] -> [b, m, n] (rank exactly 3)."""

    a: Value
    b: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("a", "b")
    NAME: ClassVar[str] = "matmul"


@dataclass(frozen=True, slots=True)
class IntMatMul(Op):
    """Integer product with int32 accumulation, [b, m, k] @ [b, k, n] -> i32 [b, m, n]:
    out = Σ_k (a - a_zero)·(b - b_zero). a and b are 8-bit integers (u8 or i8, each its own);
    the zero points have their operand's dtype and explicit shapes a_zero [b, m, 1] (per row)
    and b_zero [b, 1, n] (per column): a per-tensor zero point is a broadcast scalar. Sums past
    int32 wrap, as an int32 accumulator does."""

    a: Value
    b: Value
    a_zero: Value
    b_zero: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("a", "b", "a_zero", "b_zero")
    NAME: ClassVar[str] = "int_matmul"


@dataclass(frozen=True, slots=True)
class IntConv(Op):
    """Integer cross-correlation with int32 accumulation of (x - x_zero) with (w - w_zero):
    x [N, C, *spatial] and w [K, C/groups, *kernel] are 8-bit integers (u8 or i8), x_zero is a
    scalar [] of x's dtype, w_zero [K] of w's dtype (one per filter). Padding is with x_zero,
    i.e. zero after the shift, as ONNX ConvInteger and QLinearConv pad."""

    x: Value
    w: Value
    x_zero: Value
    w_zero: Value
    details: ConvDetails
    OPERANDS: ClassVar[tuple[str, ...]] = ("x", "w", "x_zero", "w_zero")
    NAME: ClassVar[str] = "int_conv"

    def attrs(self) -> str:
        return self.details.describe()


@dataclass(frozen=True, slots=True)
class BlockQuantMatMul(Op):
    """a [m, k] @ Wᵀ -> [m, n] in a's type (f32 or f16), W [n, k] block-quantized along k (onnxruntime's
    MatMulNBits): W[j, i] = (q[j, i] - zeros[j, i // block]) · scales[j, i // block] in float32,
    q the `bits`-bit unsigned values packed low-order bits first in uint8 `packed`
    [n, ceil(k / block), block · bits / 8]; scales float32 and zeros uint8 (integer zero points:
    a quarter of the memory) or float32, [n, ceil(k / block)]. The
    weights stay packed: a device without a step for it dequantizes them once
    (`kn_graph.blockquant.lower_block_products`)."""

    a: Value
    packed: Value
    scales: Value
    zeros: Value
    bits: int
    block: int
    OPERANDS: ClassVar[tuple[str, ...]] = ("a", "packed", "scales", "zeros")
    NAME: ClassVar[str] = "block_quant_matmul"

    def attrs(self) -> str:
        return f"bits={self.bits} block={self.block}"


@dataclass(frozen=True, slots=True)
class Unary(Op):
    """Elementwise unary; CAST/BITCAST take their target type from the output dtype."""

    x: Value
    op: UnaryOp
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "unary"


@dataclass(frozen=True, slots=True)
class Binary(Op):
    """Elementwise binary on equal shapes (broadcasting is explicit in the graph)."""

    a: Value
    b: Value
    op: BinaryOp
    OPERANDS: ClassVar[tuple[str, ...]] = ("a", "b")
    NAME: ClassVar[str] = "binary"


@dataclass(frozen=True, slots=True)
class Select(Op):
    """Elementwise `cond ? a : b` on equal shapes."""

    cond: Value
    a: Value
    b: Value
    OPERANDS: ClassVar[tuple[str, ...]] = ("cond", "a", "b")
    NAME: ClassVar[str] = "select"


@dataclass(frozen=True, slots=True)
class Iota(Op):
    """The index along `axis`, broadcast over the output shape (shape and dtype in the info)."""

    axis: int
    NAME: ClassVar[str] = "iota"

    def attrs(self) -> str:
        return f"axis={self.axis}"


@dataclass(frozen=True, slots=True)
class Softmax(Op):
    x: Value
    axis: int
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "softmax"

    def attrs(self) -> str:
        return f"axis={self.axis}"


@dataclass(frozen=True, slots=True)
class Layernorm(Op):
    """(x - mean) / sqrt(var + eps) along `axis`, without scale and bias."""

    x: Value
    axis: int
    eps: float
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "layernorm"

    def attrs(self) -> str:
        return f"axis={self.axis} eps={self.eps:g}"


@dataclass(frozen=True, slots=True)
class Reduce(Op):
    """Reduction over `axes` (sorted, removed from the shape); ARGMIN/ARGMAX take one axis."""

    x: Value
    axes: tuple[int, ...]
    op: ReduceOp
    OPERANDS: ClassVar[tuple[str, ...]] = ("x",)
    NAME: ClassVar[str] = "reduce"

    def attrs(self) -> str:
        return f"axes={list(self.axes)}"


@dataclass(frozen=True, slots=True)
class Attention(Op):
    """softmax(q·kᵀ·scale + mask [+ causal]) · v over rank-3 operands (batch and heads merged):
    q [b, m, d], k [b, n, d], v [b, n, dv], optional additive float mask [b, m, n] (explicit,
    like every elementwise operand) -> [b, m, dv]. `causal` masks key j for query i when
    j > i + (n - m) (bottom-right aligned, as when decoding with a cache). One op so a device can
    hand it to a fused kernel; `kn_graph.attention.decompose_attention` lowers it again."""

    q: Value
    k: Value
    v: Value
    mask: Value | None
    scale: float
    causal: bool
    OPERANDS: ClassVar[tuple[str, ...]] = ("q", "k", "v", "mask")
    NAME: ClassVar[str] = "attention"

    def attrs(self) -> str:
        return f"scale={self.scale:g}" + (" causal" if self.causal else "")


@dataclass(frozen=True, slots=True)
class Dynamic(Op):
    """An op whose result sizes or control flow depend on data: NonZero, TopK, NMS, Unique, and
    If / Loop / Scan over subgraphs (`kn_graph.dynamic` has one entry per `kind`). Executors run
    it on whole arrays and bind the run-time size symbols of its declared result `shapes` from
    what it returns. All results are computed at once; each result is one graph value, the node
    whose `output` names it (the nodes of one op share every other field)."""

    kind: str
    args: tuple[Value, ...]
    params: tuple[object, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[DType, ...]
    output: int = 0
    OPERANDS: ClassVar[tuple[str, ...]] = ("args",)
    NAME: ClassVar[str] = "dynamic"

    def attrs(self) -> str:
        out = f" -> {self.output}/{len(self.shapes)}" if len(self.shapes) > 1 else ""
        return f"{self.kind}{_describe_params(self.params)}{out}"

    @property
    def key(self) -> Dynamic:
        """The op with `output` 0: equal for every result of one op (an executor's memo key)."""
        return self if self.output == 0 else dataclasses.replace(self, output=0)


def _describe_params(params: tuple[object, ...]) -> str:
    """A Dynamic op's parameters for printing: numbers and flags; subgraphs by their size (a
    subgraph is told by what it has, so this module needs no graph class)."""
    parts = []
    for p in params:
        if hasattr(p, "value_infos"):
            parts.append(f"<graph of {len(p)} values>")  # type: ignore[arg-type]
        elif p is not None and not isinstance(p, tuple | bool):
            parts.append(repr(p))
    return f"({', '.join(parts)})" if parts else ""
