"""What a row kernel computes — softmax, layernorm, reduction — as one device-neutral description
that both backends print: the CUDA generator (`cuda/kernels/rows.py`) into its warp/block-parallel
template (`templates/row.cu`), the C generator (`cpu/csource/rows.py` and, for reductions down
columns, `cpu/csource/columns.py`) into its loops. The description says *what*: the accumulator
type, each pass's identity, per-element value and fold, the row scalars computed between passes
(the finalize and normalize expressions) and the stored value with its scaling. The backends say
*how*: a strided lane loop and a group reduction per pass (CUDA), a counted loop under
`#pragma omp simd reduction(...)` (C).

A fold is spelled by each backend in the idiom of its schedule, with the same result:

- SUM, PROD: `a += v` / `a *= v` on both; the CUDA combine is `KnAdd` / `KnMul`, the C one the
  OpenMP reduction operator `+` / `*`.
- MAX, MIN: CUDA folds with `kn_fmax` / `kn_fmin`, which propagate NaN through the tree combine.
  C folds with the compare-select `v > a ? v : a` that `omp simd reduction(max : a)` vectorizes;
  it drops NaN, so where a NaN must reach the result (`Pass.nan`: reductions of floats) C ORs a
  flag `nan |= v != v` alongside and makes the result NaN at the end. Softmax's max needs no flag:
  a NaN element makes the sum, hence every output, NaN whatever the max is.
- ARGMAX, ARGMIN (the first extreme index, a NaN counting as the extreme, as np.argmax): CUDA
  compares (value, index) pairs with `kn_arg_better` (ties to the smaller index), which is
  associative, so the lanes' partial answers combine in any order; its index starts at INT64_MAX.
  C walks the row in order on one thread, so a later element never wins a tie and the test drops
  to `a == a && (v != v || v > a)` (a NaN, once taken, stays); its index starts at -1. An empty
  row stores index 0 on both, and so does a row of the identity value (C: no element beats it;
  CUDA: the first one ties with it and wins).

Two other differences are the backends' own, not the description's: ε of a layernorm is a
literal in the CUDA source and a kernel parameter in C (one compiled function serves every ε);
and the C softmax stores the exponentials of its last pass into an output of the accumulator's
compute type and divides them in place, one exp per element fewer (`cpu/csource/rows.py`).

Expressions are C over the expression table's vocabulary (`exprs`), with two holes: `$X$`, the
row's element converted to the accumulator type, and `$A$`, a pass's result.

>>> k = softmax(DType.F32)
>>> [type(s).__name__ for s in k.steps], k.acc
(['Pass', 'Scalar', 'Pass'], 'float')
>>> k.store.value.value, k.store.scale
('expf($X$ - mx)', 'sum')
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter
from kn_graph.dtype import DType
from kn_graph.ops import ReduceOp

__all__ = [
    "Elem",
    "Fold",
    "Pass",
    "RowKernel",
    "Scalar",
    "StoreEach",
    "StoreRow",
    "layernorm",
    "reduce",
    "reduce_acc",
    "softmax",
]

X = "$X$"
"""The hole for the row's element, converted to the accumulator type."""
A = "$A$"
"""The hole for a pass's result (`StoreRow`)."""


def _at(template: str, hole: str, value: str) -> str:
    """`template` with every `hole` replaced by `value`, parenthesized unless it is a name, an
    element reference or a cast of one (those bind tighter than any operator around them)."""
    simple = re.fullmatch(r"(\(\w+( \w+)?\))?[\w.]+(\[[^\[\]]*\])?", value) is not None
    return template.replace(hole, value if simple or template == hole else f"({value})")


class Fold(enum.Enum):
    """How a pass folds the values of a row into one: NumPy's sum, prod, max, min (NaN
    propagates where `Pass.nan` says so), argmax, argmin (see the module docstring for each
    backend's spelling)."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"
    ARGMIN = "argmin"

    @property
    def is_arg(self) -> bool:
        return self in (Fold.ARGMAX, Fold.ARGMIN)

    @property
    def low(self) -> bool:
        """The smaller value wins (MIN, ARGMIN)."""
        return self in (Fold.MIN, Fold.ARGMIN)


@dataclass(frozen=True, slots=True)
class Elem:
    """A value computed at each element of the row from `$X$`: temporaries `lets`, each
    `(name, expression)` printed as `const acc name = expression;`, then `value`."""

    value: str
    lets: tuple[tuple[str, str], ...] = ()

    def print(self, w: CodeWriter, acc: str, x: str) -> str:
        """The lets as lines of `w`, with `x` for `$X$`; returns the value's expression."""
        for name, expr in self.lets:
            w.line(f"const {acc} {name} = {_at(expr, X, x)};")
        return _at(self.value, X, x)


@dataclass(frozen=True, slots=True)
class Pass:
    """A loop over the row folding `value` of every element into the accumulator `acc`,
    which starts at `identity` (a C literal of the accumulator type). `nan`: MAX and MIN
    only — a NaN among the values must reach the result."""

    acc: str
    fold: Fold
    identity: str
    value: Elem
    nan: bool = False


@dataclass(frozen=True, slots=True)
class Scalar:
    """A row scalar computed after the passes before it: `const acc name = value;`, or, when
    `name` is a pass's accumulator, `name = value;` (the accumulator after its combine), only
    `when` that C condition holds if one is given."""

    name: str
    value: str
    comment: str = ""
    when: str = ""


@dataclass(frozen=True, slots=True)
class StoreEach:
    """Every element's output: `value / scale`, `scale` a row scalar (softmax, layernorm)."""

    value: Elem
    scale: str

    def scaled(self, v: str) -> str:
        return f"{v} / {self.scale}"


@dataclass(frozen=True, slots=True)
class StoreRow:
    """The row's one output: `value` over `$A$`, the last pass's result (reductions)."""

    value: str

    def of(self, result: str) -> str:
        """The value with `result` (the backend's spelling of the last pass's result) for `$A$`."""
        return _at(self.value, A, result)


@dataclass(frozen=True, slots=True)
class RowKernel:
    """A row kernel: `steps` in order, then `store`; `acc` is the C type of every accumulator,
    row scalar and element value."""

    kind: str
    acc: str
    steps: tuple[Pass | Scalar, ...]
    store: StoreEach | StoreRow

    def __post_init__(self) -> None:
        # a pass whose result is not its accumulator (an index, a NaN flag) is read by the store
        # only: it comes last, before a StoreRow
        for k, s in enumerate(self.steps):
            if isinstance(s, Pass) and (s.nan or s.fold.is_arg):
                assert k == len(self.steps) - 1 and isinstance(self.store, StoreRow), self

    @property
    def last(self) -> Pass:
        """The last pass."""
        return [s for s in self.steps if isinstance(s, Pass)][-1]

    def scalar_line(self, s: Scalar) -> str:
        if s.name in {p.acc for p in self.steps if isinstance(p, Pass)}:
            line = f"{s.name} = {s.value};"
            line = f"if ({s.when}) {line}" if s.when else line
        else:
            assert not s.when, s
            line = f"const {self.acc} {s.name} = {s.value};"
        return f"{line}  // {s.comment}" if s.comment else line


# -- the kernels -----------------------------------------------------------------------------------
def softmax(x: DType) -> RowKernel:
    """exp(x - max) / Σ exp(x - max) along the row; a row without a finite max (all -inf)
    shifts by 0, giving 0 / 0 = NaN as the reference does."""
    acc = exprs.acc_ctype(x)
    shifted = Elem(f"{'exp' if acc == 'double' else 'expf'}({X} - mx)")
    steps = (
        Pass("mx", Fold.MAX, "-KN_INF", Elem(X)),
        Scalar("mx", "0", "as the reference: a row of -inf gives NaN", when="!isfinite(mx)"),
        Pass("sum", Fold.SUM, "0", shifted),
    )
    return RowKernel("softmax", acc, steps, StoreEach(shifted, "sum"))


def layernorm(x: DType, eps: str) -> RowKernel:
    """(x - mean) / sqrt(var + eps) along the row, the variance from a second pass over the
    row (not E[x²] - mean²); `eps` is the backend's spelling of ε (a literal or a parameter)."""
    acc = exprs.acc_ctype(x)
    f = "" if acc == "double" else "f"
    steps = (
        Pass("sum", Fold.SUM, "0", Elem(X)),
        Scalar("mean", f"sum / ({acc})ncols"),
        Pass("sq", Fold.SUM, "0", Elem("dv * dv", (("dv", f"{X} - mean"),))),
        Scalar("den", f"sqrt{f}(sq / ({acc})ncols + {eps})"),
    )
    return RowKernel("layernorm", acc, steps, StoreEach(Elem(f"({X} - mean)"), "den"))


def reduce_acc(x: DType) -> str:
    """The accumulator of a reduction over `x`: float for f16 and f32, double for f64, the type
    itself for integers of 32 bits or more, int (unsigned int) for bool and narrower integers
    (a CUDA shuffle moves 32 bits at least; C promotes them to int anyway)."""
    if x.is_float:
        return exprs.acc_ctype(x)
    if x is DType.BOOL or (x.is_int and x.size < 4):
        return "int" if x.is_signed or x is DType.BOOL else "unsigned int"
    return exprs.compute_ctype(x)


_FOLDS = {
    ReduceOp.SUM: Fold.SUM,
    ReduceOp.MEAN: Fold.SUM,
    ReduceOp.PROD: Fold.PROD,
    ReduceOp.MIN: Fold.MIN,
    ReduceOp.MAX: Fold.MAX,
    ReduceOp.ARGMIN: Fold.ARGMIN,
    ReduceOp.ARGMAX: Fold.ARGMAX,
}


def reduce(op: ReduceOp, x: DType) -> RowKernel:
    """`op` over the row into one value. MEAN divides the sum by the row's length (an integer
    mean of an empty row is 0, not a division by zero); MIN and MAX of floats are NaN when any
    element is."""
    acc = reduce_acc(x)
    fold = _FOLDS[op]
    match fold:
        case Fold.SUM:
            identity = "0"
        case Fold.PROD:
            identity = "1"
        case Fold.MIN | Fold.MAX | Fold.ARGMIN | Fold.ARGMAX:
            identity = exprs.extreme(x, acc, fold.low)
    if op is ReduceOp.MEAN:
        value = f"{A} / ({acc})ncols" if x.is_float else f"(ncols ? {A} / ({acc})ncols : 0)"
    else:
        value = A
    nan = x.is_float and fold in (Fold.MIN, Fold.MAX)
    return RowKernel("reduce", acc, (Pass("a", fold, identity, Elem(X), nan),), StoreRow(value))
