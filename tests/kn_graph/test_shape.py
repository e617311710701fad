"""Symbolic sizes and shapes: arithmetic rules, printing, evaluation and symbol inference."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import GraphError, Shape, ShapeMismatchError, Size, infer_symbols

B = Size.sym("B")
S = Size.sym("S")


# -- construction ----------------------------------------------------------------------------------
def test_size_of_accepts_ints_and_numpy_integers():
    assert Size.of(3) == Size(3)
    assert Size.of(np.int64(7)) == Size(7)
    assert Size.of(B) is B


@pytest.mark.parametrize("bad", [1.5, "3", None, True, np.float32(2.0)])
def test_size_of_rejects_non_integers(bad):
    with pytest.raises(GraphError, match="a size must be an int or a Size"):
        Size.of(bad)


def test_sym_and_fixed_queries():
    assert not B.is_fixed
    assert B.symbols == frozenset({"B"})
    assert B.fixed_value() is None
    assert Size(4).is_fixed and Size(4).fixed_value() == 4
    assert Size.sym("B", 2) == B * B


def test_as_int_raises_on_symbolic_size_naming_what():
    assert Size(5).as_int() == 5
    with pytest.raises(
        GraphError, match=r"kernel must be a fixed number, found symbolic size 2\*B"
    ):
        (2 * B).as_int("kernel")


# -- addition and subtraction -------------------------------------------------------------------
def test_add_equal_monomials_adds_factors():
    assert B + B == 2 * B
    assert 3 * B - B == 2 * B
    assert Size(3) + 4 == Size(7)
    assert 4 + Size(3) == Size(7)
    assert 10 - Size(3) == Size(7)


def test_add_zero_is_identity_for_any_monomial():
    assert B + 0 == B
    assert 0 + B == B
    assert B - 0 == B
    assert Size(0) + B * S == B * S


def test_subtracting_equal_sizes_gives_canonical_zero():
    zero = B - B
    assert zero == Size(0)
    assert zero.is_fixed
    assert str(zero) == "0"


H = Size.sym("h")


@pytest.mark.parametrize(
    ("a", "b"),
    [(B, Size(1)), (B, S), (B, B * B), (2 * B, B * S), (Size(3), B)],
    ids=["B+1", "B+S", "B+B^2", "2B+BS", "3+B"],
)
def test_sums_of_any_terms_are_sizes_that_evaluate(a, b):
    env = {"B": 3, "S": 5}
    assert (a + b).eval(env) == a.eval(env) + b.eval(env)
    assert (a - b).eval(env) == a.eval(env) - b.eval(env)
    assert (a + b) - b == a  # canonical: the terms cancel


def test_negation():
    assert -(2 * B) == B * -2
    assert str(-(2 * B)) == "-2*B"
    assert -Size(0) == Size(0)


# -- multiplication ------------------------------------------------------------------------------
def test_mul_always_works_and_merges_exponents():
    assert Size.sym("B", 2) == B * B
    assert 6 * B * S == (2 * B) * (3 * S)
    assert S * B == B * S  # terms are sorted by symbol
    assert str(S * B) == "B*S"
    assert (B + 1) * (B - 1) == B * B - 1
    assert Size(0) == 0 * B
    assert Size(0) == B * 0


# -- division and modulo ------------------------------------------------------------------------
def test_exact_division():
    assert (6 * B * S) // (3 * B) == 2 * S
    assert (B * B) // B == B
    assert (4 * B) // 4 == B
    assert Size(1) == (2 * B) // (2 * B)
    assert Size(7) // 2 == Size(3)  # floor division on plain numbers


def test_zero_divided_by_symbolic_size_is_zero():
    assert Size(0) // B == Size(0)


@pytest.mark.parametrize(
    ("a", "b"),
    [(B, Size(2)), (3 * B, Size(2)), (B, S), (B, B * B), (Size(4), B), (H - 1, Size(-2))],
    ids=["B/2", "3B/2", "B/S", "B/B^2", "4/B", "(h-1)/-2"],
)
def test_inexact_division_is_floor_division_for_every_binding(a, b):
    q = a // b
    for bv in (1, 2, 3, 7):
        for sv in (1, 4, 6):
            env = {"B": bv, "S": sv, "h": sv + bv}
            assert q.eval(env) == a.eval(env) // b.eval(env)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        ((H + 2 - 3) // 2 + 1, "(h+1)//2"),  # conv k3 s2 p1
        (((H + 1) // 2 + 1) // 2, "(h+3)//4"),  # nested floors fold
        ((H - 4) // 4 + 1, "h//4"),  # patchify k4 s4
        (H.ceildiv(4), "(h+3)//4"),
        ((2 * H + 2) // 4, "(h+1)//2"),  # common factors cancel
        (Size.min(H, H + 1), "h"),  # decided when the difference has a sign
        (Size.max(H - 2, 0), "max(0,h-2)"),
        (H % 2, "h-2*(h//2)"),
    ],
)
def test_shape_formulas_print_short_canonical_forms(size, text):
    assert str(size) == text


def test_equal_expressions_compare_and_hash_equal():
    a = (H - 1) // 2 + 1
    b = (H + 1) // 2
    assert a == b and hash(a) == hash(b)
    assert Size.min(H, S) == Size.min(S, H)


def test_division_by_zero_raises():
    with pytest.raises(GraphError, match="by zero"):
        B // 0
    with pytest.raises(GraphError, match="by zero"):
        Size(3) // 0


def test_rfloordiv():
    assert 12 // Size(4) == Size(3)
    assert (12 // B).eval({"B": 5}) == 2


def test_mod():
    assert Size(7) % 3 == Size(1)
    assert Size(0) == (4 * B) % 2
    assert Size(0) == B % 1
    assert Size(0) == ((2 * B) % B)
    assert (B % 2).eval({"B": 7}) == 1
    with pytest.raises(GraphError, match="by zero"):
        Size(4) % 0


@pytest.mark.parametrize(
    ("d", "n", "expected"),
    [
        (Size(3), Size(6), True),
        (Size(3), Size(4), False),
        (Size(2), 4 * B, True),
        (Size(3), 4 * B, False),
        (B, B * S, True),
        (S, 2 * B, False),
        (Size(5), Size(0), True),
    ],
)
def test_divides_is_exact(d, n, expected):
    assert d.divides(n) is expected


# -- printing and evaluation --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "text"),
    [
        (Size(4), "4"),
        (B, "B"),
        (2 * B, "2*B"),
        (B * B, "B^2"),
        (3 * B * B * S, "3*B^2*S"),
        (Size(0), "0"),
        (-B, "-B"),
        (B * S + 1, "B*S+1"),
    ],
)
def test_size_printing(size, text):
    assert str(size) == text
    assert repr(size) == f"Size({text})"


def test_shape_printing():
    assert str(Shape.of(2 * B, 64, B * B)) == "[2*B,64,B^2]"
    assert repr(Shape.of(B, 3)) == "Shape[B,3]"
    assert str(Shape.of()) == "[]"


def test_eval_substitutes_every_symbol():
    assert (3 * B * B * S).eval({"B": 2, "S": 5}) == 60
    assert Size(7).eval({}) == 7
    assert Shape.of(B, 2 * S, 4).eval({"B": 3, "S": 2}) == (3, 4, 4)


def test_eval_without_binding_names_symbol_and_size():
    with pytest.raises(
        ShapeMismatchError, match=r"no value for size symbol 'S' \(in size 2\*B\*S\)"
    ):
        (2 * B * S).eval({"B": 1})


def test_shape_queries_and_editing():
    s = Shape.of(B, 3, 4)
    assert s.rank == len(s) == 3
    assert not s.is_fixed and Shape.of(1, 2).is_fixed
    assert s.symbols == frozenset({"B"})
    assert s.size() == 12 * B
    assert Shape.of().size() == Size(1)
    assert s.replace(1, 5) == Shape.of(B, 5, 4)
    assert s.insert(0, 1) == Shape.of(1, B, 3, 4)
    assert s.remove(0) == Shape.of(3, 4)
    assert s + Shape.of(7) == Shape.of(B, 3, 4, 7)
    assert list(s) == [B, Size(3), Size(4)]
    assert s[0] == B
    assert Shape.from_seq([1, B]) == Shape.of(1, B)
    assert Shape.of(1, 2).fixed_dims() == (1, 2)
    with pytest.raises(GraphError, match="dim must be a fixed number"):
        s.fixed_dims()


def test_sizes_and_shapes_are_hashable_values():
    assert len({B * 2, 2 * B, B + B}) == 1
    assert hash(Shape.of(B, 2)) == hash(Shape.of(B, 2))


# -- infer_symbols --------------------------------------------------------------------------------
def test_infer_single_batch_symbol():
    assert infer_symbols([Shape.of(B, 3)], [(5, 3)]) == {"B": 5}


def test_infer_multiple_symbols_across_inputs():
    shapes = [Shape.of(B, S, 8), Shape.of(2 * B), Shape.of(S, S)]
    assert infer_symbols(shapes, [(3, 7, 8), (6,), (7, 7)]) == {"B": 3, "S": 7}


def test_infer_power_of_a_symbol():
    assert infer_symbols([Shape.of(B * B, 4)], [(49, 4)]) == {"B": 7}
    assert infer_symbols([Shape.of(Size.sym("B", 3))], [(1000,)]) == {"B": 10}


def test_infer_factor_times_symbol():
    assert infer_symbols([Shape.of(2 * B)], [(12,)]) == {"B": 6}


def test_infer_product_solved_once_one_symbol_is_known():
    # B*S alone is ambiguous; the second input pins B, then S follows
    shapes = [Shape.of(B * S), Shape.of(B)]
    assert infer_symbols(shapes, [(12,), (3,)]) == {"B": 3, "S": 4}


def test_infer_zero_sized_batch():
    assert infer_symbols([Shape.of(B, 3)], [(0, 3)]) == {"B": 0}


def test_infer_with_known_binding():
    assert infer_symbols([Shape.of(B, S)], [(2, 9)], known={"B": 2}) == {"B": 2, "S": 9}


def test_infer_known_binding_contradicted_names_input_and_axis():
    with pytest.raises(ShapeMismatchError) as e:
        infer_symbols([Shape.of(B, 3)], [(4, 3)], names=["tokens"], known={"B": 2})
    msg = str(e.value)
    assert "tokens, axis 0" in msg
    assert "expected size B = 2" in msg
    assert "B=2" in msg
    assert "found 4" in msg


def test_infer_fixed_dim_mismatch_names_input_and_axis():
    with pytest.raises(
        ShapeMismatchError, match=r"^image, axis 2: expected size 224 = 224 .*found 225$"
    ):
        infer_symbols([Shape.of(B, 3, 224)], [(1, 3, 225)], names=["image"])


def test_infer_inconsistent_symbol_between_inputs_names_second_input():
    with pytest.raises(ShapeMismatchError) as e:
        infer_symbols([Shape.of(B, 4), Shape.of(B)], [(3, 4), (5,)], names=["a", "b"])
    assert str(e.value).startswith("b, axis 0: expected size B = 3")
    assert "found 5" in str(e.value)


@pytest.mark.parametrize(
    ("dim", "actual"),
    [(2 * B, 7), (B * B, 8), (Size.sym("B", 3), 9), (4 * B * B, 12)],
    ids=["odd-for-2B", "non-square", "non-cube", "4B^2=12"],
)
def test_infer_unsatisfiable_dim_names_input_axis_and_symbol(dim, actual):
    with pytest.raises(ShapeMismatchError) as e:
        infer_symbols([Shape.of(1, dim)], [(1, actual)], names=["x"])
    assert str(e.value) == (
        f"x, axis 1: expected size {dim}, found {actual}, which no value of 'B' satisfies"
    )


def test_infer_rank_mismatch_names_input_and_both_shapes():
    with pytest.raises(ShapeMismatchError) as e:
        infer_symbols([Shape.of(B, 3)], [(2, 3, 1)], names=["x"])
    assert str(e.value) == "x: expected rank 2 (shape [B,3]), found rank 3 (shape (2, 3, 1))"


def test_infer_input_count_mismatch():
    with pytest.raises(ShapeMismatchError, match="expected 2 inputs, found 1"):
        infer_symbols([Shape.of(B), Shape.of(B)], [(2,)])


def test_infer_undeterminable_symbol_names_input_axis_and_symbols():
    with pytest.raises(ShapeMismatchError) as e:
        infer_symbols([Shape.of(B * S)], [(12,)], names=["x"])
    assert str(e.value) == "x, axis 0: cannot determine symbol(s) B, S of size B*S"


def test_infer_default_labels_are_input_indices():
    with pytest.raises(ShapeMismatchError, match=r"^input 1, axis 0"):
        infer_symbols([Shape.of(3), Shape.of(4)], [(3,), (5,)])


def test_infer_large_power_is_exact():
    # float roots are off by one for big values; the solver must correct them
    n = 3037000499  # floor(sqrt(2**63 - 1))
    assert infer_symbols([Shape.of(B * B)], [(n * n,)]) == {"B": n}
    with pytest.raises(ShapeMismatchError):
        infer_symbols([Shape.of(B * B)], [(n * n + 1,)])


def test_infer_zero_batch_defers_products_to_later_inputs():
    # with B = 0 the first input says nothing about S; the second one does
    got = infer_symbols([Shape.of(B, B * S), Shape.of(S)], [(0, 0), (5,)])
    assert got == {"B": 0, "S": 5}


def test_infer_zero_batch_with_nonzero_product_is_a_mismatch():
    with pytest.raises(ShapeMismatchError, match=r"^x, axis 1: expected size B\*S, found 3"):
        infer_symbols([Shape.of(B, B * S), Shape.of(S)], [(0, 3), (5,)], names=["x", "y"])


def test_infer_zero_batch_leaves_a_product_only_symbol_undetermined():
    with pytest.raises(ShapeMismatchError, match=r"cannot determine symbol\(s\) S of size B\*S"):
        infer_symbols([Shape.of(B, B * S)], [(0, 0)], names=["x"])


@pytest.mark.parametrize("bad", [b"\x80atch", "", 3, None])
def test_symbol_names_must_be_non_empty_strings(bad):
    with pytest.raises(GraphError, match="a size symbol must be a non-empty str"):
        Size.sym(bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_symbol_exponents_must_be_positive(bad):
    with pytest.raises(GraphError, match="exponent"):
        Size.sym("B", bad)
