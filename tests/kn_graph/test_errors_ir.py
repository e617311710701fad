"""Bad input at the executor and runtime level: the specific error, naming the input and axis."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import (
    DType,
    EvaluationError,
    Graph,
    GraphError,
    InputMismatchError,
    KnError,
    OnnxImportError,
    ShapeMismatchError,
    Size,
    UnsupportedOnnxError,
)
from kn_graph.binding import bind_inputs
from kn_graph.reference import evaluate
from kn_runtime import Device

B = Size.sym("B")
S = Size.sym("S")


def two_input_graph() -> Graph:
    """tokens i64[B,S] and scale f32[2*B]; output sums the scale and casts the tokens."""
    g = Graph()
    t = g.input([B, S], DType.I64, "tokens")
    s = g.input([2 * B], DType.F32, "scale")
    g.add_output(g.cast(t, DType.F32), "t")
    g.add_output(g.mul(s, 2.0), "s")
    return g


def good_inputs(b: int = 3, s: int = 5) -> list[np.ndarray]:
    return [np.zeros((b, s), np.int64), np.ones(2 * b, np.float32)]


@pytest.fixture(params=["evaluate", "prepared"])
def run(request):
    """Both the executor entry point and the runtime's prepared graph must report the same."""
    if request.param == "evaluate":

        def f(g, inputs, batch_size=None):
            return evaluate(g, inputs, batch_size)
    else:

        def f(g, inputs, batch_size=None):
            return Device.cpu().prepare(g, batch_size).eval(inputs)

    f.device = request.param
    return f


def test_good_inputs_run(run):
    t, s = run(two_input_graph(), good_inputs())
    assert t.shape == (3, 5) and s.tolist() == [2.0] * 6


def test_error_classes_form_one_hierarchy():
    for cls in (
        GraphError,
        ShapeMismatchError,
        InputMismatchError,
        EvaluationError,
        OnnxImportError,
        UnsupportedOnnxError,
    ):
        assert issubclass(cls, KnError)
    assert issubclass(InputMismatchError, ShapeMismatchError)
    assert issubclass(UnsupportedOnnxError, OnnxImportError)
    e = UnsupportedOnnxError("n1", "Foo", "bar")
    assert str(e) == "node 'n1' (Foo): bar" and (e.node_name, e.op_type, e.detail) == (
        "n1",
        "Foo",
        "bar",
    )


@pytest.mark.parametrize("count", [0, 1, 3])
def test_wrong_input_count_names_the_inputs(run, count):
    inputs = [*good_inputs(), np.zeros(1)][:count]
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), inputs)
    assert str(e.value) == f"expected 2 inputs (tokens, scale), found {count}"


def test_inputs_by_name_missing_and_unexpected(run):
    t, s = good_inputs()
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), {"tokens": t, "scales": s})
    assert str(e.value) == (
        "inputs by name: missing ['scale'], unexpected ['scales']; the graph takes ['tokens', 'scale']"
    )
    assert run(two_input_graph(), {"scale": s, "tokens": t})[1].shape == (6,)


@pytest.mark.parametrize(
    ("which", "array", "found"),
    [
        (0, np.zeros((3, 5), np.int32), "int32"),
        (1, np.ones(6, np.float64), "float64"),
        (1, [1.0] * 6, "float64"),  # a Python list becomes float64, not f32
        (0, np.zeros((3, 5), np.float32), "float32"),
    ],
)
def test_wrong_dtype_names_input_expected_and_found(run, which, array, found):
    inputs = good_inputs()
    inputs[which] = array
    name, want = [("tokens", "i64"), ("scale", "f32")][which]
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), inputs)
    assert str(e.value) == f"input '{name}': expected dtype {want}, found {found}"


def test_wrong_rank_names_input_and_both_shapes(run):
    inputs = good_inputs()
    inputs[0] = np.zeros((3, 5, 1), np.int64)
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), inputs)
    assert (
        str(e.value)
        == "input 'tokens': expected rank 2 (shape [B,S]), found rank 3 (shape (3, 5, 1))"
    )


def test_symbol_contradicted_between_inputs_names_input_and_axis(run):
    inputs = [np.zeros((3, 5), np.int64), np.ones(8, np.float32)]
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), inputs)
    assert str(e.value) == "input 'scale', axis 0: expected size 2*B = 6 (with B=3, S=5), found 8"


def test_unsatisfiable_size_names_input_axis_and_symbol(run):
    g = Graph()
    g.add_output(g.exp(g.input([4, 2 * B], DType.F32, "x")))
    with pytest.raises(InputMismatchError) as e:
        run(g, [np.zeros((4, 7), np.float32)])
    assert (
        str(e.value)
        == "input 'x', axis 1: expected size 2*B, found 7, which no value of 'B' satisfies"
    )


def test_fixed_size_mismatch_names_input_and_axis(run):
    g = Graph()
    g.add_output(g.exp(g.input([B, 3, 8], DType.F32, "image")))
    with pytest.raises(InputMismatchError) as e:
        run(g, [np.zeros((2, 3, 9), np.float32)])
    assert str(e.value) == "input 'image', axis 2: expected size 8 = 8 (with B=2), found 9"


def test_batch_size_contradicting_the_inputs(run):
    with pytest.raises(InputMismatchError) as e:
        run(two_input_graph(), good_inputs(b=3), batch_size=4)
    assert str(e.value).startswith("input 'tokens', axis 0: expected size B = 4 (with B=4")
    assert str(e.value).endswith("found 3")


def test_batch_size_that_agrees_is_accepted(run):
    t, _ = run(two_input_graph(), good_inputs(b=2), batch_size=2)
    assert t.shape == (2, 5)


def test_negative_batch_size_is_refused_by_the_runtime():
    with pytest.raises(ValueError, match="batch_size must be >= 0, found -1"):
        Device.cpu().prepare(two_input_graph(), -1)


def test_undeterminable_symbol_names_input_and_symbols(run):
    g = Graph()
    g.add_output(g.exp(g.input([B * S], DType.F32, "flat")))
    with pytest.raises(InputMismatchError) as e:
        run(g, [np.zeros(6, np.float32)])
    assert str(e.value) == "input 'flat', axis 0: cannot determine symbol(s) B, S of size B*S"


def test_symbol_known_only_from_batch_size(run):
    g = Graph()
    g.add_output(g.exp(g.input([B * S], DType.F32, "flat")))
    (out,) = run(g, [np.zeros(6, np.float32)], batch_size=2)
    assert out.shape == (6,)


def test_symbol_used_by_no_input_fails_naming_it(run):
    g = Graph()
    x = g.input([3], DType.F32, "x")
    g.add_output(x)
    g.add_output(g.iota([S], 0, DType.I32))
    with pytest.raises(ShapeMismatchError) as e:
        run(g, [np.zeros(3, np.float32)])
    assert (
        str(e.value)
        == "while computing %1: i32[S] = iota() axis=0: no value for size symbol 'S' (in size S)"
    )


def test_check_inputs_reports_bindings_without_evaluating():
    prepared = Device.cpu().prepare(two_input_graph())
    assert prepared.check_inputs(good_inputs(b=4, s=7)) == {"B": 4, "S": 7}
    arrays, bindings = bind_inputs(two_input_graph(), good_inputs(b=1, s=2))
    assert bindings == {"B": 1, "S": 2} and [a.shape for a in arrays] == [(1, 2), (2,)]


def test_rank_zero_input_accepts_a_numpy_scalar(run):
    g = Graph()
    g.add_output(g.mul(g.input([], DType.F32, "x"), 3.0))
    (out,) = run(g, [np.float32(2.0)])
    assert out.shape == () and out == 6.0
    with pytest.raises(InputMismatchError, match="input 'x': expected dtype f32, found float64"):
        run(g, [2.0])


def test_runtime_error_inside_an_op_names_the_value(run):
    g = Graph()
    x = g.input([3], DType.F32, "x")
    i = g.input([2], DType.I32, "i")
    g.add_output(g.gather(x, 0, i))
    with pytest.raises(EvaluationError) as e:
        run(g, [np.zeros(3, np.float32), np.array([0, 3], np.int32)])
    if run.device == "evaluate":
        assert (
            str(e.value)
            == "while computing %2: f32[2] = gather(%0, %1) axis=0: gather: index 3 out of range [0, 3) on axis 0"
        )
    else:  # the CPU backend runs the plan: it names the step (plans carry no graph values)
        assert str(e.value).startswith("step 0 (gather ")
        assert str(e.value).endswith("): gather: index out of range [0, 3)")


def test_remembered_bindings_never_skip_a_check_that_failed():
    """bind_shapes remembers what NumPy inputs of given shapes and dtypes bound; a call that
    would fail (another dtype, a contradicting or non-int batch size, a guard) still fails
    after a good call with the same shapes, and the memo holds only what passed."""
    from kn_graph import ArgumentTypeError
    from kn_graph.binding import bind_shapes

    g = two_input_graph()
    g.add_guard(Size(4), ">=", B, "at most 4 rows")
    ok = good_inputs(b=2)
    for _ in range(2):
        assert bind_shapes(g, ok) == {"B": 2, "S": 5}
        assert bind_shapes(g, ok, 2) == {"B": 2, "S": 5}
        with pytest.raises(ArgumentTypeError):
            bind_shapes(g, ok, 2.0)  # 2.0 == 2 as a key, but not a batch size
        with pytest.raises(InputMismatchError, match="expected size B = 3"):
            bind_shapes(g, ok, 3)
        with pytest.raises(InputMismatchError, match="expected dtype f32"):
            bind_shapes(g, [ok[0], ok[1].astype(np.float64)])
        with pytest.raises(InputMismatchError, match="at most 4 rows"):
            bind_shapes(g, good_inputs(b=5))
    cpu = Device.cpu().prepare(g)
    for _ in range(2):
        np.testing.assert_array_equal(cpu.eval(ok)[1], ok[1] * 2)
        with pytest.raises(InputMismatchError, match="at most 4 rows"):
            cpu.eval(good_inputs(b=5))
