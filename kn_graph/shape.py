"""Symbolic sizes and shapes: a dimension is a monomial factor·Π symbolᵉˣᵖ.

>>> B = Size.sym("B")
>>> str(Shape.of(2 * B, 64, B * B))
'[2*B,64,B^2]'
>>> (2 * B * 3).eval({"B": 5})
30
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kn_graph.errors import GraphError, ShapeMismatchError

__all__ = ["BATCH", "Shape", "Size", "SizeLike", "infer_symbols"]

BATCH = "B"
"""The conventional name of the batch-size symbol."""


@dataclass(frozen=True, slots=True)
class Size:
    """A monomial `factor * prod(symbol ** exp)`; `terms` is sorted by symbol, exps > 0."""

    factor: int
    terms: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        # canonical form, so equal sizes compare and hash equal (hash-consing relies on it)
        if self.factor == 0 and self.terms:
            object.__setattr__(self, "terms", ())
        elif self.terms and (
            any(e <= 0 for _, e in self.terms) or list(self.terms) != sorted(self.terms)
        ):
            merged: dict[str, int] = {}
            for s, e in self.terms:
                merged[s] = merged.get(s, 0) + e
            object.__setattr__(self, "terms", tuple(sorted((s, e) for s, e in merged.items() if e)))

    @staticmethod
    def fixed(n: int) -> Size:
        return Size(int(n))

    @staticmethod
    def sym(name: str, exp: int = 1) -> Size:
        if not isinstance(name, str) or not name:
            raise GraphError(f"a size symbol must be a non-empty str, found {name!r}")
        if isinstance(exp, bool) or not isinstance(exp, int) or exp < 1:
            raise GraphError(
                f"the exponent of size symbol '{name}' must be a positive int, found {exp!r}"
            )
        return Size(1, ((name, exp),))

    @staticmethod
    def of(x: SizeLike) -> Size:
        if isinstance(x, Size):
            return x
        if isinstance(x, bool) or not isinstance(x, int | _np_integer()):
            raise GraphError(f"a size must be an int or a Size, found {x!r} ({type(x).__name__})")
        return Size(int(x))

    # -- queries -------------------------------------------------------------------------------
    @property
    def is_fixed(self) -> bool:
        return not self.terms or self.factor == 0

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for s, _ in self.terms)

    def fixed_value(self) -> int | None:
        """The integer value when the size has no symbols, else None."""
        return self.factor if self.is_fixed else None

    def as_int(self, what: str = "size") -> int:
        if not self.is_fixed:
            raise GraphError(f"{what} must be a fixed number, found symbolic size {self}")
        return self.factor

    def eval(self, bindings: Mapping[str, int]) -> int:
        out = self.factor
        for s, e in self.terms:
            if s not in bindings:
                raise ShapeMismatchError(f"no value for size symbol '{s}' (in size {self})")
            out *= bindings[s] ** e
        return out

    # -- arithmetic ----------------------------------------------------------------------------
    def _norm(self) -> Size:
        return Size(0) if self.factor == 0 else self

    def __add__(self, other: SizeLike) -> Size:
        o = Size.of(other)
        if o.factor == 0:
            return self
        if self.factor == 0:
            return o
        if self.terms != o.terms:
            raise GraphError(f"cannot add sizes {self} and {o}: not the same monomial")
        return Size(self.factor + o.factor, self.terms)._norm()

    __radd__ = __add__

    def __neg__(self) -> Size:
        return Size(-self.factor, self.terms)._norm()

    def __sub__(self, other: SizeLike) -> Size:
        return self + (-Size.of(other))

    def __rsub__(self, other: SizeLike) -> Size:
        return Size.of(other) - self

    def __mul__(self, other: SizeLike) -> Size:
        o = Size.of(other)
        if self.factor == 0 or o.factor == 0:
            return Size(0)
        exps = dict(self.terms)
        for s, e in o.terms:
            exps[s] = exps.get(s, 0) + e
        return Size(self.factor * o.factor, tuple(sorted(exps.items())))

    __rmul__ = __mul__

    def __floordiv__(self, other: SizeLike) -> Size:
        """Exact division for symbolic sizes; floor division when both are fixed numbers."""
        o = Size.of(other)
        if o.factor == 0:
            raise GraphError(f"division of size {self} by zero")
        if self.is_fixed and o.is_fixed:
            return Size(self.factor // o.factor)
        if self.factor == 0:
            return Size(0)
        exps = dict(self.terms)
        for s, e in o.terms:
            if exps.get(s, 0) < e:
                raise GraphError(f"size {self} is not divisible by {o}")
            exps[s] -= e
        if self.factor % o.factor:
            raise GraphError(f"size {self} is not divisible by {o}")
        return Size(self.factor // o.factor, tuple(sorted((s, e) for s, e in exps.items() if e)))

    def __rfloordiv__(self, other: SizeLike) -> Size:
        return Size.of(other) // self

    def __mod__(self, other: SizeLike) -> Size:
        o = Size.of(other)
        if o.is_fixed and o.factor != 0:
            if self.is_fixed:
                return Size(self.factor % o.factor)
            if self.factor % o.factor == 0:
                return Size(0)
        raise GraphError(f"cannot compute {self} mod {o} for every value of its symbols")

    def divides(self, other: Size) -> bool:
        """Whether `other` is an exact multiple of `self` for every value of the symbols."""
        if self.factor == 0:
            return False
        if self.is_fixed and other.is_fixed:
            return other.factor % self.factor == 0
        try:
            other // self
        except GraphError:
            return False
        return True

    # -- printing ------------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.is_fixed:
            return str(self.factor)
        parts = [s if e == 1 else f"{s}^{e}" for s, e in self.terms]
        if self.factor != 1:
            parts.insert(0, str(self.factor))
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"Size({self})"


SizeLike = Size | int


def _np_integer() -> type:
    import numpy as np

    return np.integer


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


def _integer_root(value: int, exp: int) -> int | None:
    if value < 0:
        return None
    r = round(value ** (1.0 / exp)) if exp > 1 else value
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**exp == value:
            return c
    return None


def infer_symbols(
    expected: Sequence[Shape],
    actual: Sequence[Sequence[int]],
    names: Sequence[str] | None = None,
    known: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Solve every size symbol from concrete input shapes and check all dims against the result.

    `names` label the inputs in error messages; `known` pre-binds symbols (e.g. a given batch size).

    >>> B, S = Size.sym("B"), Size.sym("S")
    >>> infer_symbols([Shape.of(B, S, 8), Shape.of(2 * B)], [(3, 7, 8), (6,)])
    {'B': 3, 'S': 7}
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
    ]
    progress = True
    while progress:
        progress = False
        for label, axis, d, a in pending:
            unknown = [(s, e) for s, e in d.terms if s not in bindings]
            if len(unknown) != 1 or d.factor == 0:
                continue
            sym, e = unknown[0]
            rest = d.factor * math.prod(bindings[s] ** x for s, x in d.terms if s != sym)
            if rest == 0 and a == 0:
                continue  # e.g. B*S with B = 0 says nothing about S: another dim may
            if rest == 0 or a % rest != 0 or (root := _integer_root(a // rest, e)) is None:
                raise ShapeMismatchError(
                    f"{label}, axis {axis}: expected size {d}, found {a}, which no value of "
                    f"'{sym}' satisfies"
                )
            bindings[sym] = root
            progress = True
    for label, axis, d, a in pending:
        missing = [s for s in sorted(d.symbols) if s not in bindings]
        if missing:
            raise ShapeMismatchError(
                f"{label}, axis {axis}: cannot determine symbol(s) {', '.join(missing)} of size {d}"
            )
        if d.eval(bindings) != a:
            given = ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
            raise ShapeMismatchError(
                f"{label}, axis {axis}: expected size {d} = {d.eval(bindings)} (with {given}), "
                f"found {a}"
            )
    return bindings
