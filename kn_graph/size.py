"""Symbolic sizes: a `Size` is an integer expression over named symbols.

A `Size` is a polynomial with integer coefficients over *atoms*: symbols (`B`, `height`) and
the non-polynomial nodes `floordiv`, `min` and `max` (ceil division and mod are expressed with
them). The form is canonical, so equal sizes compare and hash equal (hash-consing relies on it);
bounds (`Size.bounds`, `Size.provably_nonneg`) let builders drop guards that always hold.
`kn_graph.shape` builds shapes, guards and symbol solving on top of it.

>>> B, h = Size.sym("B"), Size.sym("height")
>>> str((h + 2 - 3) // 2 + 1)
'(height+1)//2'
>>> ((h - 1) // 2 + 1) == (h + 1) // 2
True
>>> (2 * B * 3).eval({"B": 5})
30
>>> Size.min(h, h + 1), (h - 1).provably_nonneg()
(Size(height), False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kn_graph.errors import FixedSizeRequiredError, GraphError, ShapeMismatchError

__all__ = ["Size", "SizeLike"]

_INF = math.inf


class _Node:
    """A non-polynomial atom: `floordiv(a, b)` (b > 0 by construction when fixed), `min(...)`,
    `max(...)` over canonical, sorted arguments. `key` orders atoms (symbols first)."""

    __slots__ = ("args", "key", "kind")

    def __init__(self, kind: str, args: tuple[Size, ...]) -> None:
        self.kind = kind
        self.args = args
        self.key = f"\x7f{kind}({','.join(a.key for a in args)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"_Node({self.key[1:]})"


Atom = str | _Node
Mono = tuple[tuple[Atom, int], ...]


def _atom_key(a: Atom) -> str:
    return a if isinstance(a, str) else a.key


_MONO_KEYS: dict[Mono, tuple[tuple[str, int], ...]] = {}


def _mono_key(m: Mono) -> tuple[tuple[str, int], ...]:
    k = _MONO_KEYS.get(m)
    if k is None:
        k = tuple((_atom_key(a), e) for a, e in m)
        if len(_MONO_KEYS) < 100_000:
            _MONO_KEYS[m] = k
    return k


def _mono_mul(a: Mono, b: Mono) -> Mono:
    if not a:
        return b
    if not b:
        return a
    exps: dict[Atom, int] = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted(exps.items(), key=lambda t: _atom_key(t[0])))


def _mono_div(a: Mono, b: Mono) -> Mono | None:
    """a / b as a monomial, or None when b does not divide a."""
    exps: dict[Atom, int] = dict(a)
    for s, e in b:
        if exps.get(s, 0) < e:
            return None
        exps[s] -= e
    return tuple(sorted(((s, e) for s, e in exps.items() if e), key=lambda t: _atom_key(t[0])))


class Size:
    """An integer expression; immutable, hashable, canonical. Build with `Size(3)`,
    `Size.sym("B")` and arithmetic (`+ - * // %`, `Size.ceildiv`, `Size.min`, `Size.max`)."""

    __slots__ = ("_hash", "_hi", "_key", "_lo", "_nonneg", "terms")
    terms: tuple[tuple[Mono, int], ...]

    def __init__(self, value: int = 0, terms: tuple[tuple[Mono, int], ...] | None = None) -> None:
        # the cached fields (_hash, _key, _lo, _hi, _nonneg) are filled on first use
        if terms is None:
            value = int(value)
            terms = (((), value),) if value else ()
        object.__setattr__(self, "terms", terms)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Size is immutable")

    @staticmethod
    def _of_dict(d: Mapping[Mono, int]) -> Size:
        items = [(m, c) for m, c in d.items() if c]
        if len(items) > 1:
            items.sort(key=lambda t: _mono_key(t[0]))
        return Size(0, tuple(items))

    @staticmethod
    def _atom(a: Atom) -> Size:
        return Size(0, ((((a, 1),), 1),))

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
        return Size(0, ((((name, exp),), 1),))

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
        t = self.terms
        return not t or (len(t) == 1 and not t[0][0])

    def fixed_value(self) -> int | None:
        """The integer value when the size has no symbols, else None."""
        t = self.terms
        if not t:
            return 0
        if len(t) == 1 and not t[0][0]:
            return t[0][1]
        return None

    def as_int(self, what: str = "size") -> int:
        v = self.fixed_value()
        if v is None:
            raise FixedSizeRequiredError(
                f"{what} must be a fixed number, found symbolic size {self}"
            )
        return v

    @property
    def symbol(self) -> str | None:
        """The name when the size is one plain symbol (`seq`), else None."""
        t = self.terms
        if len(t) == 1 and t[0][1] == 1 and len(t[0][0]) == 1:
            a, e = t[0][0][0]
            if e == 1 and isinstance(a, str):
                return a
        return None

    @property
    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for m, _ in self.terms:
            for a, _ in m:
                if isinstance(a, str):
                    out.add(a)
                else:
                    for x in a.args:
                        out |= x.symbols
        return frozenset(out)

    @property
    def key(self) -> str:
        """A canonical text used to order atoms (not for display)."""
        try:
            return self._key
        except AttributeError:
            k = "+".join(
                f"{c}*" + "*".join(f"{_atom_key(a)}^{e}" for a, e in m) for m, c in self.terms
            )
            object.__setattr__(self, "_key", k)
            return k

    def eval(self, bindings: Mapping[str, int]) -> int:
        out = 0
        for m, c in self.terms:
            p = c
            for a, e in m:
                p *= _eval_atom(a, bindings, self) ** e
            out += p
        return out

    def subs(self, mapping: Mapping[str, SizeLike]) -> Size:
        """Substitute symbols by sizes (partial binding: the others stay)."""
        if not mapping or not (self.symbols & mapping.keys()):
            return self
        out = Size(0)
        for m, c in self.terms:
            p = Size(c)
            for a, e in m:
                x = _subs_atom(a, mapping)
                for _ in range(e):
                    p = p * x
            out = out + p
        return out

    # -- bounds --------------------------------------------------------------------------------
    def bounds(self) -> tuple[float, float]:
        """An interval [lo, hi] containing every value (symbols are >= 0); ints or ±inf."""
        try:
            return self._lo, self._hi
        except AttributeError:
            lo, hi = _interval(self)
            object.__setattr__(self, "_lo", lo)
            object.__setattr__(self, "_hi", hi)
            return lo, hi

    def provably_nonneg(self) -> bool:
        """True when the size is >= 0 for every binding of its symbols (symbols >= 0)."""
        try:
            return self._nonneg
        except AttributeError:
            ok = self.bounds()[0] >= 0 or _refined_nonneg(self, 2)
            object.__setattr__(self, "_nonneg", ok)
            return ok

    # -- arithmetic ----------------------------------------------------------------------------
    def __add__(self, other: SizeLike) -> Size:
        if type(other) is int:  # the common case: a constant offset
            if not other:
                return self
            t = self.terms
            if t and not t[0][0]:  # the constant term sorts first
                c = t[0][1] + other
                return Size(0, (((), c), *t[1:]) if c else t[1:])
            return Size(0, (((), other), *t))
        o = other if isinstance(other, Size) else Size.of(other)
        if not o.terms:
            return self
        if not self.terms:
            return o
        d = dict(self.terms)
        for m, c in o.terms:
            d[m] = d.get(m, 0) + c
        return Size._of_dict(d)

    __radd__ = __add__

    def __neg__(self) -> Size:
        return Size(0, tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: SizeLike) -> Size:
        o = other if isinstance(other, Size) else Size.of(other)
        return self + (-o)

    def __rsub__(self, other: SizeLike) -> Size:
        return Size.of(other) - self

    def __mul__(self, other: SizeLike) -> Size:
        o = other if isinstance(other, Size) else Size.of(other)
        if not self.terms or not o.terms:
            return Size(0)
        a, b = self.fixed_value(), o.fixed_value()
        if a == 1:
            return o
        if b == 1:
            return self
        if b is not None:
            return Size(0, tuple((m, c * b) for m, c in self.terms))
        if a is not None:
            return Size(0, tuple((m, c * a) for m, c in o.terms))
        d: dict[Mono, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.terms:
                m = _mono_mul(m1, m2)
                d[m] = d.get(m, 0) + c1 * c2
        return Size._of_dict(d)

    __rmul__ = __mul__

    def __floordiv__(self, other: SizeLike) -> Size:
        """Floor division (exact where the algebra can tell; else a `floordiv` atom)."""
        o = other if isinstance(other, Size) else Size.of(other)
        c = o.fixed_value()
        if c == 0:
            raise GraphError(f"division of size {self} by zero")
        if c is not None:
            return _floordiv_const(self, c)
        if not self.terms:
            return Size(0)
        q = _exact_div(self, o)
        if q is not None:
            return q
        return Size._atom(_Node("floordiv", (self, o)))

    def __rfloordiv__(self, other: SizeLike) -> Size:
        return Size.of(other) // self

    def __mod__(self, other: SizeLike) -> Size:
        """Python's mod (the sign of the divisor): `a - b * (a // b)`."""
        o = Size.of(other)
        return self - o * (self // o)

    def ceildiv(self, other: SizeLike) -> Size:
        """Ceiling division, `-(-a // b)`; `(a + c - 1) // c` for a positive constant c."""
        o = Size.of(other)
        c = o.fixed_value()
        if c is not None and c > 0:
            return (self + (c - 1)) // c
        return -((-self) // o)

    @staticmethod
    def min(*xs: SizeLike) -> Size:
        return _minmax("min", [Size.of(x) for x in xs])

    @staticmethod
    def max(*xs: SizeLike) -> Size:
        return _minmax("max", [Size.of(x) for x in xs])

    def divides(self, other: Size) -> bool:
        """Whether `other` is an exact multiple of `self` for every value of the symbols."""
        c = self.fixed_value()
        if c == 0:
            return False
        if c is not None:
            return all(k % c == 0 for _, k in other.terms)
        return _exact_div(other, self) is not None

    # -- identity ------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Size):
            return self is other or self.terms == other.terms
        return NotImplemented

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash(self.terms)
            object.__setattr__(self, "_hash", h)
            return h

    def __reduce__(self) -> tuple[object, ...]:
        return (Size, (0, self.terms))

    # -- printing ------------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.is_fixed:
            return str(self.fixed_value())
        parts: list[str] = []
        const = 0
        for m, c in self.terms:
            if not m:
                const = c
                continue
            body = _fmt_mono(m, with_coef=abs(c) != 1)
            text = body if abs(c) == 1 else f"{abs(c)}*{body}"
            parts.append(("-" if c < 0 else "+") + text)
        if const:
            parts.append(f"{const:+d}")
        s = "".join(parts)
        return s[1:] if s.startswith("+") else s

    def __repr__(self) -> str:
        return f"Size({self})"

    def _is_atomic_text(self) -> bool:
        """Whether str(self) needs no parentheses as an operand of * or //."""
        if self.is_fixed:
            return (self.fixed_value() or 0) >= 0
        if len(self.terms) != 1:
            return False
        m, c = self.terms[0]
        return c == 1 and len(m) == 1 and (isinstance(m[0][0], str) or m[0][0].kind != "floordiv")


SizeLike = Size | int


def _np_integer() -> type:
    import numpy as np

    return np.integer


def _paren(x: Size) -> str:
    return str(x) if x._is_atomic_text() else f"({x})"


def _fmt_atom(a: Atom) -> str:
    if isinstance(a, str):
        return a
    if a.kind == "floordiv":
        return f"{_paren(a.args[0])}//{_paren(a.args[1])}"
    return f"{a.kind}({','.join(str(x) for x in a.args)})"


def _fmt_mono(m: Mono, with_coef: bool) -> str:
    parts = []
    for a, e in m:
        t = _fmt_atom(a)
        if not isinstance(a, str) and a.kind == "floordiv" and (len(m) > 1 or with_coef or e > 1):
            t = f"({t})"
        parts.append(t if e == 1 else f"{t}^{e}")
    return "*".join(parts)


def _eval_atom(a: Atom, bindings: Mapping[str, int], whole: Size) -> int:
    if isinstance(a, str):
        v = bindings.get(a)
        if v is None:
            raise ShapeMismatchError(f"no value for size symbol '{a}' (in size {whole})")
        return int(v)
    vals = [x.eval(bindings) for x in a.args]
    if a.kind == "floordiv":
        if vals[1] == 0:
            raise ShapeMismatchError(f"size {whole}: division by zero (with {dict(bindings)})")
        return vals[0] // vals[1]
    return min(vals) if a.kind == "min" else max(vals)


def _subs_atom(a: Atom, mapping: Mapping[str, SizeLike]) -> Size:
    if isinstance(a, str):
        return Size.of(mapping[a]) if a in mapping else Size._atom(a)
    args = [x.subs(mapping) for x in a.args]
    if a.kind == "floordiv":
        return args[0] // args[1]
    return _minmax(a.kind, args)


# -- division ---------------------------------------------------------------------------------------
_FLOORDIV_MEMO: dict[tuple[Size, int], Size] = {}


def _floordiv_const(a: Size, c: int) -> Size:
    """a // c for a constant c, canonical; memoised (shape formulas repeat through a model)."""
    key = (a, c)
    hit = _FLOORDIV_MEMO.get(key)
    if hit is None:
        hit = _floordiv_const_uncached(a, c)
        if len(_FLOORDIV_MEMO) < 100_000:
            _FLOORDIV_MEMO[key] = hit
    return hit


def _floordiv_const_uncached(a: Size, c: int) -> Size:
    if c < 0:
        a, c = -a, -c
    if c == 1 or not a.terms:
        return a
    v = a.fixed_value()
    if v is not None:
        return Size(v // c)
    # (c·q + r) // c = q + r // c for integer q: keep the multiples of c outside
    quot: dict[Mono, int] = {}
    rem: dict[Mono, int] = {}
    for m, k in a.terms:
        q, r = divmod(k, c)
        if q:
            quot[m] = q
        if r:
            rem[m] = r
    out = Size._of_dict(quot)
    if not rem:
        return out
    r_size = Size._of_dict(rem)
    rv = r_size.fixed_value()
    if rv is not None:
        return out + rv // c
    g = math.gcd(c, *rem.values())
    if g > 1:
        r_size = Size._of_dict({m: k // g for m, k in rem.items()})
        c //= g
    # floor((floor(x / d) + p) / c) = floor((x + d·p) / (d·c)) for a polynomial p
    nested = [
        (m, k)
        for m, k in r_size.terms
        if k == 1
        and len(m) == 1
        and m[0][1] == 1
        and isinstance(m[0][0], _Node)
        and m[0][0].kind == "floordiv"
        and (m[0][0].args[1].fixed_value() or 0) > 0
    ]
    if len(nested) == 1:
        node = nested[0][0][0][0]
        assert isinstance(node, _Node)
        d = node.args[1].as_int()
        p = r_size - Size._atom(node)
        if all(not isinstance(a, _Node) for m, _ in p.terms for a, _ in m):
            return out + _floordiv_const(node.args[0] + p * d, d * c)
    lo, hi = r_size.bounds()
    if lo >= 0 and hi < c:
        return out
    return out + Size._atom(_Node("floordiv", (r_size, Size(c))))


def _leading(x: Size) -> tuple[Mono, int]:
    return max(x.terms, key=lambda t: (sum(e for _, e in t[0]), _mono_key(t[0])))


def _exact_div(a: Size, b: Size) -> Size | None:
    """a / b when b divides a as polynomials (multivariate division by leading terms)."""
    if not b.terms:
        return None
    lm_b, lc_b = _leading(b)
    q = Size(0)
    r = a
    for _ in range(64):
        if not r.terms:
            return q
        lm_r, lc_r = _leading(r)
        m = _mono_div(lm_r, lm_b)
        if m is None or lc_r % lc_b:
            return None
        t = Size(0, ((m, lc_r // lc_b),))
        q = q + t
        r = r - t * b
    return None


# -- min / max --------------------------------------------------------------------------------------
def _minmax(kind: str, xs: list[Size]) -> Size:
    flat: list[Size] = []
    for x in xs:
        t = x.terms
        if len(t) == 1 and t[0][1] == 1 and len(t[0][0]) == 1 and t[0][0][0][1] == 1:
            a = t[0][0][0][0]
            if isinstance(a, _Node) and a.kind == kind:
                flat.extend(a.args)
                continue
        flat.append(x)
    if not flat:
        raise GraphError(f"{kind} of no sizes")
    kept: list[Size] = []
    for x in flat:
        if any(x == y for y in kept):
            continue
        # for min, drop x when some kept y <= x; drop kept ys that are >= x
        sign = 1 if kind == "min" else -1
        if any((sign * (x - y)).provably_nonneg() for y in kept):
            continue
        kept = [y for y in kept if not (sign * (y - x)).provably_nonneg()]
        kept.append(x)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=lambda s: s.key)
    return Size._atom(_Node(kind, tuple(kept)))


# -- bounds -----------------------------------------------------------------------------------------
def _mul_iv(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    def m(x: float, y: float) -> float:
        return 0 if x == 0 or y == 0 else x * y

    ps = [m(a[0], b[0]), m(a[0], b[1]), m(a[1], b[0]), m(a[1], b[1])]
    return min(ps), max(ps)


def _atom_iv(a: Atom) -> tuple[float, float]:
    if isinstance(a, str):
        return (0, _INF)
    ivs = [x.bounds() for x in a.args]
    if a.kind == "min":
        return min(i[0] for i in ivs), min(i[1] for i in ivs)
    if a.kind == "max":
        return max(i[0] for i in ivs), max(i[1] for i in ivs)
    (lo, hi), (dlo, dhi) = ivs
    if dlo >= 1 and dlo == dhi:
        f = lambda v: v if v in (_INF, -_INF) else v // dlo  # noqa: E731
        return f(lo), f(hi)
    if lo >= 0 and dlo >= 1:
        return 0, hi
    return -_INF, _INF


def _interval(x: Size) -> tuple[float, float]:
    lo: float = 0
    hi: float = 0
    for m, c in x.terms:
        iv: tuple[float, float] = (1, 1)
        for a, e in m:
            ai = _atom_iv(a)
            for _ in range(e):
                iv = _mul_iv(iv, ai)
        t = _mul_iv(iv, (c, c))
        lo += t[0]
        hi += t[1]
    return lo, hi


def _refined_nonneg(x: Size, depth: int) -> bool:
    """Prove x >= 0 by replacing each linear `floordiv(r, c)` term by its bound:
    c·(r // c) >= r - c + 1 where the coefficient is positive, <= r where it is negative."""
    if depth == 0:
        return False
    divs = []
    for m, _ in x.terms:
        if len(m) == 1 and m[0][1] == 1 and isinstance(m[0][0], _Node):
            node = m[0][0]
            d = node.args[1].fixed_value() if node.kind == "floordiv" else None
            if d is not None and d > 0:
                divs.append(d)
    for i, (m, c) in enumerate(x.terms):  # min(a, b) <= a, b and max(a, b) >= a, b
        node = m[0][0] if len(m) == 1 and m[0][1] == 1 else None
        if isinstance(node, _Node) and node.kind == ("min" if c < 0 else "max"):
            rest = Size(0, x.terms[:i] + x.terms[i + 1 :])
            if any((rest + arg * c).provably_nonneg() for arg in node.args):
                return True
    if not divs:
        return False
    lcm = math.lcm(*divs)
    out = Size(0)
    for m, c in x.terms:
        node = m[0][0] if len(m) == 1 and m[0][1] == 1 else None
        if isinstance(node, _Node) and node.kind == "floordiv":
            d = node.args[1].fixed_value()
            if d is not None and d > 0:
                r = node.args[0]
                bound = r - d + 1 if c > 0 else r
                out = out + bound * (c * (lcm // d))
                continue
        out = out + Size(0, ((m, c * lcm),))
    if out.bounds()[0] >= 0:
        return True
    return _refined_nonneg(out, depth - 1)
