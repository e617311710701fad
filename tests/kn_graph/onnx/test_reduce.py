"""Reduction, scan and loss ONNX handlers (handlers/reduce.py, handlers/loss.py) against
onnxruntime or NumPy, including axes as attribute or input, noop, empty sets, symbolic scan axes
and load-time reductions of shape tensors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from kn_graph.onnx import load_onnx
from kn_graph.ops import View
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size
from tests.kn_graph.onnx.helpers import check, model, ours

RNG = np.random.default_rng(11)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


_REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
]


# -- reductions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", _REDUCE)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, -1], 0), (None, 1), (None, 0)])
def test_reduce_axes_as_input_opset18(op: str, axes: list[int] | None, keepdims: int) -> None:
    x = floats(2, 3, 4)
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    names = ["x", "axes"] if axes is not None else ["x"]
    m = model([helper.make_node(op, names, ["y"], keepdims=keepdims)], {"x": x}, inits=inits)
    check(m, {"x": x})


@pytest.mark.parametrize("op", _REDUCE)
def test_reduce_axes_as_attribute_opset13(op: str) -> None:
    x = floats(3, 4, 2)
    if op == "ReduceSum":  # ReduceSum took its axes as an input from opset 13
        m = model(
            [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
            {"x": x},
            inits={"axes": np.array([0, 2], np.int64)},
            opset=13,
        )
    else:
        m = model([helper.make_node(op, ["x"], ["y"], axes=[0, 2], keepdims=0)], {"x": x}, opset=13)
    check(m, {"x": x})


def test_reduce_log_sum_positive_input() -> None:
    x = np.abs(floats(3, 4)) + 0.1
    m = model(
        [helper.make_node("ReduceLogSum", ["x", "axes"], ["y"])],
        {"x": x},
        inits={"axes": np.array([1])},
    )
    check(m, {"x": x})


def test_noop_with_empty_axes_keeps_the_elementwise_parts() -> None:
    """No axes + noop: Sum is the identity, SumSquare squares, L1 takes |x|."""
    x = floats(2, 3)
    for op, want in (("ReduceSum", x), ("ReduceSumSquare", x * x), ("ReduceL1", np.abs(x))):
        m = model([helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)], {"x": x})
        np.testing.assert_allclose(ours(m, {"x": x})[0], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "value"),
    [
        ("ReduceSum", 0.0),
        ("ReduceProd", 1.0),
        ("ReduceMax", -np.inf),
        ("ReduceMin", np.inf),
        ("ReduceL2", 0.0),
        ("ReduceLogSum", -np.inf),
        ("ReduceLogSumExp", -np.inf),
    ],
)
def test_empty_set_reductions_give_the_identity(op: str, value: float) -> None:
    x = np.zeros((2, 0, 4), np.float32)
    m = model(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
        {"x": x},
        inits={"axes": np.array([1], np.int64)},
    )
    (y,) = ours(m, {"x": x})
    np.testing.assert_array_equal(y, np.full((2, 1, 4), value, np.float32))


def test_log_sum_exp_does_not_overflow() -> None:
    x = np.array([[1000.0, 1000.0], [-1000.0, -np.inf]], np.float32)
    m = model(
        [helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)],
        {"x": x},
        inits={"axes": np.array([1], np.int64)},
    )
    np.testing.assert_allclose(ours(m, {"x": x})[0], [1000 + np.log(2), -1000], rtol=1e-6)


def test_reduce_of_integers_and_bools() -> None:
    xi = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    check(
        model(
            [helper.make_node("ReduceSum", ["x", "axes"], ["y"])],
            {"x": xi},
            inits={"axes": np.array([1])},
        ),
        {"x": xi},
    )
    xb = RNG.random((3, 4)) > 0.5
    for op in ("ReduceMax", "ReduceMin"):
        m = model(
            [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
            {"x": xb},
            inits={"axes": np.array([1])},
            opset=20,
        )
        np.testing.assert_array_equal(
            ours(m, {"x": xb})[0], getattr(np, op[6:].lower())(xb, axis=1)
        )


def test_reduce_prod_of_a_shape_is_a_load_time_size() -> None:
    """Reshape(x, [B, ReduceProd(Shape(x)[1:])]) is a View of symbolic shape."""
    x = floats(2, 3, 4)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
        helper.make_node("Concat", ["b", "n"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    m = model(
        nodes, {"x": x}, inits={"b": np.array([-1], np.int64)}, dims={"x": ["batch", "seq", 4]}
    )
    g = load_onnx(m)
    out = g.outputs[0]
    assert isinstance(g[out].op, View)
    assert g[out].shape == Shape.of(Size.sym("B"), 4 * Size.sym("seq"))


# -- ArgMax / ArgMin -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize(("axis", "keepdims"), [(0, 1), (-1, 0), (1, 1)])
def test_arg_reductions_with_ties(op: str, last: int, axis: int, keepdims: int) -> None:
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    m = model(
        [helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
        {"x": x},
        opset=13,
    )
    check(m, {"x": x})


# -- CumSum / CumProd ------------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("n", [1, 5, 8])
def test_cumsum_fixed_axis(exclusive: int, reverse: int, n: int) -> None:
    x = floats(3, n)
    m = model(
        [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        {"x": x},
        inits={"axis": np.array(1, np.int32)},
        opset=14,
    )
    check(m, {"x": x})


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_symbolic_axis(exclusive: int, reverse: int) -> None:
    """A dynamic sequence length (position ids from an attention mask) needs no fixed size."""
    x = RNG.integers(0, 3, (2, 7)).astype(np.int64)
    m = model(
        [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        {"x": x},
        inits={"axis": np.array(-1, np.int64)},
        dims={"x": [2, "seq"]},
        opset=14,
    )
    check(m, {"x": x})


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("symbolic", [False, True])
def test_cumprod(exclusive: int, reverse: int, symbolic: bool) -> None:
    x = RNG.integers(1, 4, (6, 2)).astype(np.int32)
    dims = {"x": ["n", 2]} if symbolic else None
    m = model(
        [helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        {"x": x},
        inits={"axis": np.array(0, np.int32)},
        dims=dims,
        opset=26,
    )
    src = x[::-1] if reverse else x
    want = np.cumprod(src, axis=0, dtype=np.int32)
    if exclusive:
        want = np.concatenate([np.ones((1, 2), np.int32), want[:-1]])
    np.testing.assert_array_equal(ours(m, {"x": x})[0], want[::-1] if reverse else want)


# -- losses ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -1])
def test_nll_loss(reduction: str, weighted: bool, ignore: int | None) -> None:
    logp = floats(3, 4, 2)
    target = RNG.integers(0, 4, (3, 2)).astype(np.int64)
    if ignore is not None:
        target[0, 0] = ignore
    feed = {"x": logp, "t": target}
    attrs: dict[str, object] = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    inits = {"w": np.abs(floats(4)) + 0.1} if weighted else {}
    names = ["x", "t", "w"] if weighted else ["x", "t"]
    m = model(
        [helper.make_node("NegativeLogLikelihoodLoss", names, ["y"], **attrs)],
        feed,
        inits=inits,
        opset=13,
    )
    check(m, feed)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy_with_log_prob(reduction: str, weighted: bool) -> None:
    scores = floats(3, 5, 2, 2) * 3
    labels = RNG.integers(0, 5, (3, 2, 2)).astype(np.int64)
    labels[1, 0, 1] = 2
    feed = {"x": scores, "t": labels}
    inits = {"w": np.abs(floats(5)) + 0.1} if weighted else {}
    names = ["x", "t", "w"] if weighted else ["x", "t"]
    node = helper.make_node(
        "SoftmaxCrossEntropyLoss", names, ["y", "logp"], reduction=reduction, ignore_index=2
    )
    check(model([node], feed, ["y", "logp"], inits=inits, opset=13), feed)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"])
def test_reduce_of_an_integer_constant_folds_at_load_time(op: str) -> None:
    c = RNG.integers(-4, 5, (3, 4)).astype(np.int64)
    x = np.zeros(1, np.float32)  # a graph input, unused by the reduction
    nodes = [helper.make_node(op, ["c", "axes"], ["y"], keepdims=0)]
    m = model(nodes, {"x": x}, inits={"c": c, "axes": np.array([1], np.int64)})
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    g = load_onnx(m)
    assert all(not g[v].op.inputs for v in g.values())  # constants only: computed here
    np.testing.assert_array_equal(evaluate(g, [x])[0], sess.run(None, {"x": x})[0])
