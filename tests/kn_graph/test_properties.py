"""Property tests: Size/Shape algebra, symbol inference, broadcasting, and random chains of
shape ops evaluated by the CPU executor against the same NumPy operations."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kn_graph import DType, Graph, GraphError, Shape, ShapeMismatchError, Size, Value, infer_symbols
from kn_graph.reference import evaluate
from kn_graph.shape import broadcast_shapes

SYMBOLS = ("B", "S", "T")
FAST = settings(
    max_examples=int(__import__("os").environ.get("KN_HYPOTHESIS_EXAMPLES", 60)), deadline=None
)
SLOW = settings(max_examples=40, deadline=None)


# -- strategies ----------------------------------------------------------------------------------------
@st.composite
def sizes(draw, min_factor=-6, max_factor=6):
    """Monomials factor·Π symbolᵉ (the building block of shapes)."""
    factor = draw(st.integers(min_factor, max_factor))
    exps = draw(st.dictionaries(st.sampled_from(SYMBOLS), st.integers(1, 3), max_size=3))
    out = Size(factor)
    for sym, e in sorted(exps.items()):
        out = out * Size.sym(sym, e)
    return out


positive_sizes = sizes(min_factor=1)
bindings = st.fixed_dictionaries({s: st.integers(0, 7) for s in SYMBOLS})


def ev(size: Size, b: dict[str, int]) -> int:
    return size.eval(b)


def _py_floordiv(a, b):
    return lambda env: a(env) // b(env) if b(env) != 0 else None


@st.composite
def exprs(draw, depth=3):
    """(Size, reference function) pairs over +, -, *, // (by constants and symbols), min, max;
    the reference returns None where the expression divides by zero."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            c = draw(st.integers(-5, 9))
            return Size(c), lambda env, c=c: c
        sym = draw(st.sampled_from(SYMBOLS))
        return Size.sym(sym), lambda env, sym=sym: env[sym]
    op = draw(st.sampled_from(["+", "-", "*", "//c", "//s", "min", "max", "ceil"]))
    a, fa = draw(exprs(depth=depth - 1))
    if op in ("//c", "ceil"):
        c = draw(st.integers(1, 5)) * draw(st.sampled_from([1, 1, -1]))
        if op == "ceil":
            return a.ceildiv(c), lambda env: _opt(fa(env), lambda x: -(-x // c))
        return a // c, lambda env: _opt(fa(env), lambda x: x // c)
    b, fb = draw(exprs(depth=depth - 1))
    if op == "//s":
        b = b * b + 1  # positive divisors
        return a // b, lambda env: _opt2(fa(env), fb(env), lambda x, y: x // (y * y + 1))
    table = {
        "+": (a + b, lambda x, y: x + y),
        "-": (a - b, lambda x, y: x - y),
        "*": (a * b, lambda x, y: x * y),
        "min": (Size.min(a, b), min),
        "max": (Size.max(a, b), max),
    }
    size, f = table[op]
    return size, lambda env: _opt2(fa(env), fb(env), f)


def _opt(x, f):
    return None if x is None else f(x)


def _opt2(x, y, f):
    return None if x is None or y is None else f(x, y)


# -- Size algebra -------------------------------------------------------------------------------------
@FAST
@given(exprs(), bindings)
def test_every_expression_evaluates_as_python_integers_do(pair, env):
    size, ref = pair
    want = ref(env)
    assert want is not None
    assert size.eval(env) == want


@FAST
@given(exprs(), bindings)
def test_bounds_contain_every_value(pair, env):
    size, _ = pair
    lo, hi = size.bounds()
    assert lo <= size.eval(env) <= hi
    if size.provably_nonneg():
        assert size.eval(env) >= 0


@FAST
@given(exprs(), exprs())
def test_arithmetic_is_canonical(p, q):
    a, b = p[0], q[0]
    assert a + b == b + a and hash(a + b) == hash(b + a)
    assert a * b == b * a
    assert (a + b) - b == a
    assert (str(a) == str(b)) or a != b


@FAST
@given(sizes(), sizes(), sizes())
def test_mul_is_commutative_associative_with_unit_and_zero(a, b, c):
    assert a * b == b * a
    assert (a * b) * c == a * (b * c)
    assert a * 1 == a
    assert a * 0 == Size(0)
    assert (a + b) * c == a * c + b * c


@FAST
@given(sizes(), positive_sizes, bindings)
def test_exact_division_undoes_mul(a, b, env):
    q = (a * b) // b
    assert q == a
    assert b.divides(a * b)


@FAST
@given(sizes(), positive_sizes, bindings)
def test_division_and_divides_agree_with_eval(a, b, env):
    q = a // b
    vb = ev(b, env)
    if vb:
        assert ev(q, env) == ev(a, env) // vb
    if b.divides(a) and vb:
        assert ev(a, env) % vb == 0


@FAST
@given(sizes(), st.integers(1, 6), bindings)
def test_mod_agrees_with_eval(a, m, env):
    assert ev(a % m, env) == ev(a, env) % m


@FAST
@given(st.lists(sizes(min_factor=0), max_size=5), bindings)
def test_shape_eval_and_size_commute(dims, env):
    shape = Shape(tuple(dims))
    assert ev(shape.size(), env) == math.prod(shape.eval(env))


# -- infer_symbols ---------------------------------------------------------------------------------
@FAST
@given(
    st.lists(
        st.lists(sizes(min_factor=1, max_factor=3), min_size=0, max_size=3), min_size=1, max_size=3
    ),
    st.fixed_dictionaries({s: st.integers(1, 9) for s in SYMBOLS}),
)
def test_infer_symbols_recovers_the_bindings_or_says_it_cannot(dims, env):
    shapes = [Shape(tuple(d)) for d in dims]
    actual = [s.eval(env) for s in shapes]
    used = frozenset().union(*(s.symbols for s in shapes))
    try:
        got = infer_symbols(shapes, actual)
    except ShapeMismatchError as e:
        assert "cannot determine symbol(s)" in str(e)
        return
    assert got == {k: env[k] for k in used}


@FAST
@given(
    st.lists(
        st.lists(sizes(min_factor=1, max_factor=3), min_size=1, max_size=3), min_size=1, max_size=3
    ),
    st.fixed_dictionaries({s: st.integers(1, 9) for s in SYMBOLS}),
    st.data(),
)
def test_infer_symbols_never_returns_bindings_that_contradict_the_inputs(dims, env, data):
    shapes = [Shape(tuple(d)) for d in dims]
    actual = [list(s.eval(env)) for s in shapes]
    i = data.draw(st.integers(0, len(actual) - 1))
    j = data.draw(st.integers(0, len(actual[i]) - 1))
    actual[i][j] += data.draw(st.sampled_from([-1, 1, 2]))
    assume(actual[i][j] >= 0)
    try:
        got = infer_symbols(shapes, actual)
    except ShapeMismatchError as e:
        assert re.match(r"input \d+, axis \d+: (expected size|cannot determine)", str(e))
        return
    assert [list(s.eval(got)) for s in shapes] == actual


# -- broadcasting -----------------------------------------------------------------------------------
concrete_shapes = st.lists(st.integers(0, 3), max_size=4)


@FAST
@given(st.lists(concrete_shapes, min_size=1, max_size=3))
def test_broadcast_shapes_matches_numpy(shapes):
    try:
        ref = np.broadcast_shapes(*map(tuple, shapes))
    except ValueError:
        with pytest.raises(GraphError, match="cannot broadcast"):
            broadcast_shapes(*(Shape.from_seq(s) for s in shapes))
        return
    assert broadcast_shapes(*(Shape.from_seq(s) for s in shapes)).fixed_dims() == ref


@SLOW
@given(concrete_shapes, concrete_shapes)
def test_binary_broadcasting_matches_numpy_values(sa, sb):
    try:
        np.broadcast_shapes(tuple(sa), tuple(sb))
    except ValueError:
        return
    a = np.arange(math.prod(sa), dtype=np.int32).reshape(sa)
    b = np.arange(math.prod(sb), dtype=np.int32).reshape(sb) * 10
    g = Graph()
    g.add_output(g.sub(g.input(sa, DType.I32), g.input(sb, DType.I32)))
    (out,) = evaluate(g, [a, b])
    np.testing.assert_array_equal(out, a - b)


# -- random chains of shape ops --------------------------------------------------------------------
def _random_view_shape(draw, total: int) -> list[int]:
    if total == 0:
        rank = draw(st.integers(1, 3))
        dims = [draw(st.integers(1, 3)) for _ in range(rank)]
        dims[draw(st.integers(0, rank - 1))] = 0
        return dims
    dims, rest = [], total
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    return [*dims, rest]


@st.composite
def shape_chains(draw):
    """A random start shape and a list of NumPy-checkable shape ops applied to it."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    steps = []
    cur = list(shape)
    for _ in range(draw(st.integers(1, 8))):
        rank = len(cur)
        kinds = ["view", "slice", "flip", "gather", "broadcast", "unsqueeze"]
        if rank >= 2:
            kinds.append("permute")
        kind = draw(st.sampled_from(kinds))
        if kind == "view":
            new = _random_view_shape(draw, math.prod(cur))
            steps.append(("view", new))
            cur = list(new)
        elif kind == "permute":
            perm = draw(st.permutations(range(rank)))
            steps.append(("permute", list(perm)))
            cur = [cur[p] for p in perm]
        elif kind == "slice":
            axis = draw(st.integers(-rank, rank - 1))
            n = cur[axis]
            bound = st.none() | st.integers(-n - 2, n + 2)
            start, end = draw(bound), draw(bound)
            step = draw(st.sampled_from([1, 2, 3, -1, -2, -3]))
            steps.append(("slice", (axis, start, end, step)))
            cur[axis] = len(range(*slice(start, end, step).indices(n)))
        elif kind == "flip":
            axis = draw(st.integers(0, rank - 1))
            steps.append(("flip", axis))
        elif kind == "gather":
            axis = draw(st.integers(0, rank - 1))
            n = cur[axis]
            if n == 0:
                continue
            idx = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=5))
            steps.append(("gather", (axis, idx)))
            cur[axis] = len(idx)
        elif kind == "broadcast":
            lead = draw(st.lists(st.integers(1, 3), max_size=1))
            target = [*lead, *(draw(st.integers(1, 3)) if d == 1 else d for d in cur)]
            steps.append(("broadcast", target))
            cur = list(target)
        else:
            axis = draw(st.integers(0, rank))
            steps.append(("unsqueeze", axis))
            cur.insert(axis, 1)
    return shape, steps


def _apply(g: Graph, x, a: np.ndarray, step):
    kind, arg = step
    match kind:
        case "view":
            return g.view(x, arg), a.reshape(arg)
        case "permute":
            return g.permute(x, arg), a.transpose(arg)
        case "slice":
            axis, start, end, st_ = arg
            index = [slice(None)] * a.ndim
            index[axis] = slice(start, end, st_)
            return g.slice(x, axis, start, end, st_), a[tuple(index)]
        case "flip":
            return g.flip(x, arg), np.flip(a, arg)
        case "gather":
            axis, idx = arg
            return g.gather(x, axis, g.constant(np.array(idx, np.int64))), np.take(
                a, idx, axis=axis
            )
        case "broadcast":
            return g.broadcast(x, arg), np.broadcast_to(a, arg)
        case "unsqueeze":
            return g.unsqueeze(x, [arg]), np.expand_dims(a, arg)
    raise AssertionError(kind)


@SLOW
@given(shape_chains())
def test_random_shape_op_chains_match_numpy_exactly(chain):
    shape, steps = chain
    a = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    g = Graph()
    x = g.input(shape, DType.I64, "x")
    ref = a
    for step in steps:
        x, ref = _apply(g, x, ref, step)
        assert g.shape(x).fixed_dims() == ref.shape
    g.add_output(x)
    (out,) = evaluate(g, [a])
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


@SLOW
@given(shape_chains())
def test_rebuilding_the_same_chain_is_fully_hash_consed(chain):
    shape, steps = chain
    g = Graph()
    x0 = g.input(shape, DType.I64, "x")
    results = []
    for _ in range(2):
        x = x0
        a = np.zeros(shape, np.int64)
        for step in steps:
            x, a = _apply(g, x, a, step)
        results.append((x, len(g)))
    assert results[0] == results[1]


# -- pad and matmul against NumPy on random arguments ---------------------------------------------
@SLOW
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=3).flatmap(
        lambda shape: st.tuples(
            st.just(shape),
            st.tuples(*(st.tuples(st.integers(0, 3), st.integers(0, 3)) for _ in shape)),
        )
    ),
    st.sampled_from(["constant", "edge", "wrap", "reflect"]),
)
def test_pad_matches_np_pad(shape_pads, mode):
    shape, pads = shape_pads
    if mode == "reflect":
        assume(all(b < n and a < n for n, (b, a) in zip(shape, pads, strict=True)))
    arr = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    g = Graph()
    g.add_output(g.pad(g.input(shape, DType.F32), list(pads), mode, value=-1.0))
    kw = {"constant_values": -1.0} if mode == "constant" else {}
    (out,) = evaluate(g, [arr])
    np.testing.assert_array_equal(out, np.pad(arr, pads, mode=mode, **kw))


batch_dims = st.lists(st.integers(1, 3), max_size=3)


@SLOW
@given(
    batch_dims,
    batch_dims,
    st.integers(1, 3),
    st.integers(0, 3),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_matmul_nd_matches_np_matmul(ba, bb, m, k, n, a_vec, b_vec, data):
    # make the batch dims broadcastable by replacing clashes with 1
    r = max(len(ba), len(bb))
    pa, pb = [1] * (r - len(ba)) + ba, [1] * (r - len(bb)) + bb
    for i in range(r):
        if pa[i] != pb[i] and 1 not in (pa[i], pb[i]):
            pb[i] = 1
    ba, bb = pa[r - len(ba) :], pb[r - len(bb) :]
    sa = [k] if a_vec else [*ba, m, k]
    sb = [k] if b_vec else [*bb, k, n]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    g = Graph()
    g.add_output(g.matmul_nd(g.input(sa, DType.F64), g.input(sb, DType.F64)))
    (out,) = evaluate(g, [a, b])
    ref = np.matmul(a, b)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


# -- random elementwise graphs, with constants chosen to trigger the identity rewrites ----------------
ELEMENTWISE = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}


@st.composite
def elementwise_programs(draw):
    """Operands are the input, earlier results or constants (0, 1 and others, any broadcastable
    shape); each step is a NumPy-checkable binary op."""
    shape = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(sorted(ELEMENTWISE)))
        lhs = draw(st.integers(-1, len(steps)))  # -1: a constant, 0: the input, k: step k-1
        rhs = draw(st.integers(-1, len(steps)))
        consts = []
        for _side in range(2):
            value = draw(st.sampled_from([0, 1, 2, -3]))
            cshape = draw(st.sampled_from([(), (1,) * len(shape), tuple(shape[len(shape) // 2 :])]))
            scalar = draw(st.booleans())
            consts.append((value, cshape, scalar))
        steps.append((op, lhs, rhs, consts))
    return shape, steps


@SLOW
@given(elementwise_programs())
def test_random_elementwise_graphs_match_numpy(program):
    shape, steps = program
    a = (np.arange(math.prod(shape), dtype=np.int32).reshape(shape) % 5) - 2
    g = Graph()
    vals = [g.input(shape, DType.I32, "x")]
    refs = [a]
    for op, lhs, rhs, consts in steps:
        operands, ref_operands = [], []
        for which, (value, cshape, scalar) in zip((lhs, rhs), consts, strict=True):
            if which >= 0:
                operands.append(vals[which])
                ref_operands.append(refs[which])
            elif scalar:
                operands.append(value)
                ref_operands.append(np.int32(value))
            else:
                operands.append(g.constant(np.full(cshape, value, np.int32)))
                ref_operands.append(np.full(cshape, value, np.int32))
        if not any(isinstance(o, Value) for o in operands):
            operands[0] = vals[0]
            ref_operands[0] = refs[0]
        vals.append(getattr(g, op)(*operands))
        refs.append(ELEMENTWISE[op](*ref_operands).astype(np.int32))
    for v in vals[1:]:
        g.add_output(v)
    outs = evaluate(g, [a])
    for out, ref in zip(outs, refs[1:], strict=True):
        assert out.shape == ref.shape
        np.testing.assert_array_equal(out, ref)
