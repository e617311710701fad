"""Small helpers the rewrite families share: constants seen through views and broadcasts (in
their compact, un-broadcast form), scalar tests, and an index of each old value's single user.

They exist so that every rewrite asks "is this a constant, and which one?" the same way, and so
that chain rewrites can tell the top of a chain from its inner links without any recursion.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kn_graph.graph import Graph
from kn_graph.ops import (
    Binary,
    BinaryOp,
    Broadcast,
    Constant,
    Input,
    Iota,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.shape import Shape, Size

if TYPE_CHECKING:
    from kn_graph.optimizer.core import Rewriter

__all__ = [
    "MAX_MATERIALISE",
    "OldIndex",
    "approx",
    "compact",
    "emit_compact",
    "feeds_const_binary",
    "feeds_round",
    "old_index",
    "scalar",
    "squeeze_equal",
    "strip_broadcast",
]

MAX_MATERIALISE = 1 << 24
"""The most elements a constant may be expanded to while looking through a view of a broadcast
(beyond that the value is treated as non-constant rather than filling memory)."""


def _reshape_compact(arr: np.ndarray, src: Shape, dst: Shape) -> np.ndarray | None:
    """The compact form of View(src -> dst) given the compact form `arr` of its operand."""
    if arr.size == 1:
        return arr.reshape((1,) * dst.rank)
    one = Size(1)
    src_keep = [i for i, d in enumerate(src) if d != one]
    dst_keep = [j for j, d in enumerate(dst) if d != one]
    if [src[i] for i in src_keep] == [dst[j] for j in dst_keep]:
        # the view only inserts or removes size-1 axes: carry the compact axes over
        shape = [1] * dst.rank
        for i, j in zip(src_keep, dst_keep, strict=True):
            shape[j] = arr.shape[i]
        return arr.reshape(shape)
    if not (src.is_fixed and dst.is_fixed):
        return None
    if src.size().eval({s: 1 for s in src.size().symbols}) > MAX_MATERIALISE:
        return None
    return np.broadcast_to(arr, src.fixed_dims()).reshape(dst.fixed_dims())


def compact(g: Graph, v: Value, casts: bool = False) -> np.ndarray | None:
    """The data of a constant `v` in compact form, looking through View and Broadcast chains: an
    array of v's rank whose every axis is 1 or v's size there, and which broadcasts to v. None
    when `v` is not derived from a Constant by views and broadcasts only.

    Compact forms are what rewrites compute with, so that a per-channel bias broadcast over a
    batch of images costs C elements, not N·C·H·W. With `casts`, Casts are looked through too
    (a zero point or scale as the loader reads it: cast to f32 where it is used)."""
    chain: list[Value] = []
    u = v
    while True:
        match g[u].op:
            case Constant(t):
                arr: np.ndarray | None = t.array
                break
            case View(x) | Broadcast(x):
                chain.append(u)
                u = x
            case Unary(x, UnaryOp.CAST) if casts:
                chain.append(u)
                u = x
            case _:
                return None
    for w in reversed(chain):
        match g[w].op:
            case View(x):
                arr = _reshape_compact(arr, g[x].shape, g[w].shape)
                if arr is None:
                    return None
            case Unary():
                arr = arr.astype(g[w].dtype.np) if arr is not None else None
            case _:  # Broadcast keeps the rank (its builder views to the target rank first)
                pass
    return arr


def scalar(g: Graph, v: Value) -> float | None:
    """The number every element of a constant `v` equals (through views and broadcasts), for
    numeric dtypes; None otherwise (bools are not numbers here)."""
    if g[v].dtype.is_bool:
        return None
    s = g.scalar_value(v)
    return None if s is None else float(s)


def approx(value: float | None, target: float, rel: float = 1e-4) -> bool:
    """Exporters write constants like √2 with a handful of digits: accept a relative error."""
    return value is not None and abs(value - target) <= rel * abs(target)


def squeeze_equal(arr: np.ndarray) -> np.ndarray:
    """An all-equal array as a single element of the same rank (so it prints and hashes as a
    scalar broadcast); other arrays unchanged."""
    if arr.size > 1 and bool(np.all(arr == arr.reshape(-1)[0])):
        return arr.reshape(-1)[:1].reshape((1,) * arr.ndim)
    return arr


def emit_compact(g: Graph, arr: np.ndarray, shape: Shape) -> Value:
    """A constant holding `arr` (compact form) broadcast to `shape`."""
    return g.broadcast(g.constant(arr), shape)


def strip_broadcast(g: Graph, v: Value) -> Value:
    """The operand of a Broadcast, else `v` itself."""
    match g[v].op:
        case Broadcast(x):
            return x
        case _:
            return v


@dataclass(frozen=True, slots=True)
class OldIndex:
    """Facts about an old graph that rewrites need and that the graph does not store:
    `sole_user[i]` is the index of the one op using value i (-1 when it has 0 or several uses),
    `const_like[i]` says whether value i depends on constants only (so that folding will
    normally turn it into a constant before its users are visited)."""

    sole_user: list[int]
    const_like: list[bool]


_INDEX: weakref.WeakKeyDictionary[Graph, tuple[int, OldIndex]] = weakref.WeakKeyDictionary()


def old_index(g: Graph) -> OldIndex:
    """The `OldIndex` of `g`, computed once per graph (and again if the graph has grown)."""
    hit = _INDEX.get(g)
    if hit is not None and hit[0] == len(g):
        return hit[1]
    n = len(g)
    users = [0] * n
    sole = [-1] * n
    const_like = [False] * n
    for v in g.values():
        op = g[v].op
        ins = op.inputs
        for x in ins:
            users[x.index] += 1
            sole[x.index] = v.index
        match op:
            case Constant():
                const_like[v.index] = True
            case Input() | Iota():
                pass
            case _:
                const_like[v.index] = bool(ins) and all(const_like[x.index] for x in ins)
    for i in range(n):
        if users[i] != 1:
            sole[i] = -1
    idx = OldIndex(sole, const_like)
    _INDEX[g] = (n, idx)
    return idx


def feeds_const_binary(
    rw: Rewriter, v: Value, ops: frozenset[BinaryOp], is_const: Callable[[Graph, Value], bool]
) -> bool:
    """Whether `v` is hidden with one use and that use is a Binary in `ops` whose other operand
    is a constant in the sense of `is_const` (with `v` as the numerator of a Div): then `v` is an
    inner link of a chain whose top comes later in index order, and the chain is rewritten there.

    The other operand may not be mapped into the new graph yet: then it is judged in the old
    graph when it is a plain constant there, and otherwise counts as constant when it depends on
    constants only and folding is on (folding will have made it one in time)."""
    g = rw.old
    if not g.is_hidden_with_uses(v, 1):
        return False
    idx = old_index(g)
    u = idx.sole_user[v.index]
    if u < 0:
        return False
    match g[Value(u, g.id)].op:
        case Binary(a, b, op) if op in ops:
            if a == v:
                other = b
            elif op is not BinaryOp.DIV:
                other = a
            else:
                return False
        case _:
            return False
    if other.index < v.index:  # live and already visited: look at what it became
        return is_const(rw.new, rw.get(other))
    if compact(g, other) is not None:
        return is_const(g, other)
    return idx.const_like[other.index] and rw.settings.fold_constants


def feeds_round(rw: Rewriter, v: Value) -> bool:
    """Whether `v`'s only user is a Round: `v` is then the scaled value of a quantization
    (QuantizeLinear's x / scale, a requantization), computed as the model writes it. Rewriting
    its arithmetic (a reciprocal multiply, a collapsed chain) moves values that sit on a rounding
    tie by one unit, and through a deep quantized network such units add up (18 output units on
    a 50-layer QDQ MobileNetV2); onnxruntime computes these ops as written."""
    idx = old_index(rw.old)
    u = idx.sole_user[v.index]
    if u < 0:
        return False
    match rw.old[Value(u, rw.old.id)].op:
        case Unary(_, UnaryOp.ROUND):
            return True
    return False
