"""Symbolic shapes: a `Shape` is a tuple of `Size`s (`kn_graph.size`: integer expressions over
named symbols, re-exported here), with the rules builders apply to them (NumPy broadcasting,
slice bounds, axis numbering), the `Guard`s that record what a binding of the symbols must
satisfy, and `infer_symbols`, which solves the symbols from concrete input shapes:

>>> B, h = Size.sym("B"), Size.sym("height")
>>> str(Shape.of(2 * B, 64, (h + 2 - 3) // 2 + 1))
'[2*B,64,(height+1)//2]'
>>> str(broadcast_shapes(Shape.of(B, 1, 4), Shape.of(3, 1)))
'[B,3,4]'

Whatever the loader assumes that a symbol binding could break (divisibility, non-negative sizes,
equality of sizes an exporter left distinct) is a `Guard`, checked by `check_guards`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kn_graph.errors import GraphError, ShapeMismatchError
from kn_graph.size import Size, SizeLike

__all__ = [
    "BATCH",
    "Equate",
    "Guard",
    "Shape",
    "Size",
    "SizeLike",
    "broadcast_shapes",
    "check_guards",
    "infer_symbols",
    "norm_axis",
    "slice_bounds",
]

BATCH = "B"
"""The conventional name of the batch-size symbol."""


# -- shapes -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Shape:
    """A tuple of `Size`s. Iterable, indexable, hashable; `str` prints `[B,3,224,224]`."""

    dims: tuple[Size, ...]

    @staticmethod
    def of(*dims: SizeLike) -> Shape:
        return Shape(tuple(Size.of(d) for d in dims))

    @staticmethod
    def from_seq(dims: Iterable[SizeLike]) -> Shape:
        return Shape(tuple(Size.of(d) for d in dims))

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_fixed(self) -> bool:
        return all(d.is_fixed for d in self.dims)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(d.symbols for d in self.dims))

    def size(self) -> Size:
        """The element count, as a Size."""
        out = Size(1)
        for d in self.dims:
            out = out * d
        return out

    def fixed_dims(self, what: str = "shape") -> tuple[int, ...]:
        return tuple(d.as_int(f"{what} dim") for d in self.dims)

    def eval(self, bindings: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(d.eval(bindings) for d in self.dims)

    def subs(self, mapping: Mapping[str, SizeLike]) -> Shape:
        return Shape(tuple(d.subs(mapping) for d in self.dims))

    def replace(self, axis: int, size: SizeLike) -> Shape:
        dims = list(self.dims)
        dims[axis] = Size.of(size)
        return Shape(tuple(dims))

    def insert(self, axis: int, size: SizeLike) -> Shape:
        dims = list(self.dims)
        dims.insert(axis, Size.of(size))
        return Shape(tuple(dims))

    def remove(self, axis: int) -> Shape:
        return Shape(self.dims[:axis] + self.dims[axis + 1 :])

    def __len__(self) -> int:
        return len(self.dims)

    def __iter__(self) -> Iterator[Size]:
        return iter(self.dims)

    def __getitem__(self, i: int) -> Size:
        return self.dims[i]

    def __add__(self, other: Shape) -> Shape:
        return Shape(self.dims + other.dims)

    def __str__(self) -> str:
        return "[" + ",".join(str(d) for d in self.dims) + "]"

    def __repr__(self) -> str:
        return f"Shape{self}"


# -- rules on shapes --------------------------------------------------------------------------------
Equate = Callable[[Size, Size, str], Size]
"""Decides that two sizes that must be equal are (returns the one to use) or raises."""


def broadcast_shapes(*shapes: Shape, equate: Equate | None = None) -> Shape:
    """NumPy broadcasting of symbolic shapes: a size 1 stretches, other sizes must be equal
    (symbolic sizes that differ are passed to `equate`, when given)."""
    rank = max(s.rank for s in shapes)
    out: list[Size] = []
    for i in range(rank):
        dim = Size(1)
        for s in shapes:
            j = i - (rank - s.rank)
            if j < 0:
                continue
            d = s[j]
            if d == dim or d == Size(1):
                continue
            if dim == Size(1):
                dim = d
            elif equate is not None and not (dim.is_fixed and d.is_fixed):
                dim = equate(dim, d, f"broadcasting {', '.join(map(str, shapes))} (axis {i})")
            else:
                raise GraphError(
                    f"cannot broadcast shapes {', '.join(map(str, shapes))}: axis {i} has sizes "
                    f"{dim} and {d}"
                )
        out.append(dim)
    return Shape(tuple(out))


def slice_bounds(
    dim: Size,
    start: Size | None,
    end: Size | None,
    step: int,
    huge: int = 2**24,
    clamp: bool = False,
) -> tuple[Size, Size, list[tuple[Size, Size]]]:
    """(first index, element count, assumptions) of Python/ONNX slicing `[start:end:step]` on
    an axis of `dim` elements. With fixed bounds on a fixed axis, bounds are clamped exactly.
    Otherwise fixed negative bounds count from the end, fixed bounds of `huge` or more mean "to
    the end" (exporters write 1e9, INT32_MAX, INT64_MAX), and the bounds are assumed to lie on
    the axis: the assumptions `(lhs, rhs)` mean lhs >= rhs and become guards. With `clamp`
    (an axis of a run-time size: a detector keeps `[:100]` of however many boxes it found),
    fixed bounds are clamped exactly with min/max instead."""
    n = dim.fixed_value()
    sv = None if start is None else start.fixed_value()
    ev = None if end is None else end.fixed_value()
    if (
        clamp
        and n is None
        and (start is None or sv is not None)
        and (end is None or ev is not None)
    ):
        return _clamped_bounds(dim, sv, ev, step, huge)
    if n is not None and (start is None or sv is not None) and (end is None or ev is not None):
        r = range(*slice(sv, ev, step).indices(n))
        return Size(r.start if len(r) else 0), Size(len(r)), []
    conds: list[tuple[Size, Size]] = []

    def norm(b: Size | None, default: Size, lo: int, hi: Size) -> Size:
        if b is None:
            return default
        v = b.fixed_value()
        if v is not None:
            if v >= huge or (n is not None and v >= n):
                return hi
            if v <= -huge or (n is not None and v < -n):
                return Size(lo)
            if v < 0:
                b = dim + v
        conds.append((b, Size(lo)))
        conds.append((hi, b))
        return b

    if step > 0:
        s = norm(start, Size(0), 0, dim)
        e = norm(end, dim, 0, dim)
        length = (e - s).ceildiv(step)
    else:
        s = norm(start, dim - 1, -1, dim - 1)
        e = norm(end, Size(-1), -1, dim - 1)
        length = (s - e).ceildiv(-step)
    lv = length.fixed_value()
    if lv is not None and lv <= 0:
        return Size(0), Size(0), []
    conds.append((length, Size(0)))
    return s, length, conds


def _clamped_bounds(
    dim: Size, sv: int | None, ev: int | None, step: int, huge: int
) -> tuple[Size, Size, list[tuple[Size, Size]]]:
    """Fixed bounds on a symbolic axis, clamped as Python slicing does (no assumptions)."""

    def clamp(v: int | None, default: Size, lo: int, hi: Size) -> Size:
        if v is None:
            return default
        if v >= huge:
            return hi
        if v <= -huge:
            return Size(lo)
        if v < 0:
            return Size.max(dim + v, lo)
        return Size.min(v, hi)

    if step > 0:
        s = clamp(sv, Size(0), 0, dim)
        e = clamp(ev, dim, 0, dim)
        length = Size.max(e - s, 0).ceildiv(step)
    else:
        s = clamp(sv, dim - 1, -1, dim - 1)
        e = clamp(ev, Size(-1), -1, dim - 1)
        length = Size.max(s - e, 0).ceildiv(-step)
    return Size.max(s, 0), length, []


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` counted from 0 (a negative one counts from the end); GraphError when out of range."""
    if not -rank <= axis < rank:
        raise GraphError(f"{what} {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


# -- guards -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Guard:
    """An assumption about the symbols: `lhs == rhs` or `lhs >= rhs`, made at `where` because
    of `what` (for the error message)."""

    lhs: Size
    rel: str
    rhs: Size
    where: str = ""
    what: str = ""

    def holds(self, bindings: Mapping[str, int]) -> bool:
        a, b = self.lhs.eval(bindings), self.rhs.eval(bindings)
        return a == b if self.rel == "==" else a >= b

    def __str__(self) -> str:
        return f"{self.lhs} {self.rel} {self.rhs}"

    @staticmethod
    def make(lhs: SizeLike, rel: str, rhs: SizeLike, where: str = "", what: str = "") -> Guard:
        """A guard, or GraphError when it is false for every binding."""
        lhs, rhs = Size.of(lhs), Size.of(rhs)
        d = lhs - rhs
        v = d.fixed_value()
        if v is not None and not (v == 0 if rel == "==" else v >= 0):
            raise GraphError(f"{where + ': ' if where else ''}{what} requires {lhs} {rel} {rhs}")
        if rel == ">=" and v is None:
            # canonical and short: c·x + k >= 0 becomes x >= ceil(-k / c) (integers)
            k = sum(c for m, c in d.terms if not m)
            g = math.gcd(*(c for m, c in d.terms if m))
            if all(c < 0 for m, c in d.terms if m):  # -g·x + k >= 0: k // g >= x
                lhs = Size(k // g)
                rhs = Size._of_dict({m: -c // g for m, c in d.terms if m})
            else:
                lhs = Size._of_dict({m: c // g for m, c in d.terms if m})
                rhs = Size(-(k // g))
        return Guard(lhs, rel, rhs, where, what)

    @property
    def trivial(self) -> bool:
        """Provably true for every binding."""
        d = self.lhs - self.rhs
        return not d.terms if self.rel == "==" else d.provably_nonneg()


def check_guards(
    guards: Sequence[Guard],
    bindings: Mapping[str, int],
    origins: Mapping[str, str] | None = None,
) -> None:
    """Raise ShapeMismatchError for the first guard the bindings violate; `origins` says where a
    symbol comes from (`"input 'x', axis 2"`)."""
    for gd in guards:
        try:
            ok = gd.holds(bindings)
        except ShapeMismatchError as e:
            raise ShapeMismatchError(f"{gd.where}: {gd.what}: {e}") from None
        if ok:
            continue
        syms = sorted(gd.lhs.symbols | gd.rhs.symbols)
        given = ", ".join(
            f"{s}={bindings[s]}" + (f" ({origins[s]})" if origins and s in origins else "")
            for s in syms
            if s in bindings
        )
        raise ShapeMismatchError(
            f"{gd.where + ': ' if gd.where else ''}{gd.what or 'shape condition'} requires "
            f"{gd}, but with {given} it is {gd.lhs.eval(bindings)} {gd.rel} "
            f"{gd.rhs.eval(bindings)}"
        )


# -- solving ----------------------------------------------------------------------------------------
def _integer_root(value: int, exp: int) -> int | None:
    if value < 0:
        return None
    r = round(value ** (1.0 / exp)) if exp > 1 else value
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**exp == value:
            return c
    return None


def _solve(d: Size, a: int, bindings: Mapping[str, int]) -> tuple[str, int | None] | None:
    """The one unbound symbol of `d` and its value from d == a, when `d` is linear or a pure
    power in it (None for the value when no integer satisfies it); None when not solvable here."""
    unknown = [s for s in d.symbols if s not in bindings]
    if len(unknown) != 1:
        return None
    sym = unknown[0]
    part = d.subs({s: v for s, v in bindings.items() if s in d.symbols})
    const, coef, exp = 0, 0, 0
    for m, c in part.terms:
        if not m:
            const = c
        elif len(m) == 1 and m[0][0] == sym and (exp in (0, m[0][1])):
            coef, exp = c, m[0][1]
        else:
            return None
    if coef == 0:  # B*S with B = 0 says nothing about S (another dim may), unless a != 0
        return None if a == const else (sym, None)
    rest = a - const
    if rest % coef:
        return sym, None
    return sym, _integer_root(rest // coef, exp)


def infer_symbols(
    expected: Sequence[Shape],
    actual: Sequence[Sequence[int]],
    names: Sequence[str] | None = None,
    known: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Solve every size symbol from concrete input shapes and check all dims against the result.

    `names` label the inputs in error messages; `known` pre-binds symbols (e.g. a given batch size).

    >>> B, S = Size.sym("B"), Size.sym("S")
    >>> infer_symbols([Shape.of(B, S + 1, 8), Shape.of(2 * B)], [(3, 7, 8), (6,)])
    {'B': 3, 'S': 6}
    """
    labels = list(names) if names is not None else [f"input {i}" for i in range(len(expected))]
    if len(expected) != len(actual):
        raise ShapeMismatchError(f"expected {len(expected)} inputs, found {len(actual)}")
    bindings: dict[str, int] = dict(known or {})
    for label, exp, act in zip(labels, expected, actual, strict=True):
        if len(exp) != len(act):
            raise ShapeMismatchError(
                f"{label}: expected rank {len(exp)} (shape {exp}), found rank {len(act)} "
                f"(shape {tuple(act)})"
            )
    pending = [
        (label, axis, d, int(a))
        for label, exp, act in zip(labels, expected, actual, strict=True)
        for axis, (d, a) in enumerate(zip(exp.dims, act, strict=True))
        if not d.is_fixed
    ]
    progress = True
    while progress:
        progress = False
        for label, axis, d, a in pending:
            solved = _solve(d, a, bindings)
            if solved is None:
                continue
            sym, value = solved
            if value is None:
                raise ShapeMismatchError(
                    f"{label}, axis {axis}: expected size {d}, found {a}, which no value of "
                    f"'{sym}' satisfies"
                )
            bindings[sym] = value
            progress = True
    for label, exp, act in zip(labels, expected, actual, strict=True):
        for axis, (d, a) in enumerate(zip(exp.dims, act, strict=True)):
            missing = [s for s in sorted(d.symbols) if s not in bindings]
            if missing:
                raise ShapeMismatchError(
                    f"{label}, axis {axis}: cannot determine symbol(s) {', '.join(missing)} of "
                    f"size {d}"
                )
            v = d.eval(bindings)
            if v != a:
                given = ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
                raise ShapeMismatchError(
                    f"{label}, axis {axis}: expected size {d} = {v} (with {given}), found {a}"
                )
    for s, v in bindings.items():
        if v < 0:
            raise ShapeMismatchError(f"size symbol '{s}' would be {v}, which is negative")
    return bindings
