"""Dense NN ONNX ops against onnxruntime: Conv, ConvTranspose, Gemm, MatMul, the softmax family and
Einsum (against NumPy's einsum)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_graph.ops import Conv
from tests.kn_graph.onnx.nn_helpers import (
    check_numpy,
    check_ort,
    check_reference,
    node_model,
    ours,
    rand,
)


# -- Conv --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"pads": [1, 1, 1, 1]},
        {"pads": [0, 1, 2, 1], "strides": [2, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
        {"auto_pad": "VALID", "strides": [1, 2]},
        {"group": 2, "pads": [1, 1, 1, 1], "dilations": [2, 2]},
    ],
)
def test_conv_2d_geometry(attrs: dict[str, object]) -> None:
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    check_ort(
        "Conv", {"x": rand(2, 4, 9, 8)}, attrs, inits={"w": rand(6, 4 // group, 3, 3), "b": rand(6)}
    )


@pytest.mark.parametrize("nd", [1, 3])
def test_conv_1d_and_3d(nd: int) -> None:
    x = rand(1, 2, *([7] * nd))
    check_ort(
        "Conv",
        {"x": x},
        {"strides": [2] * nd, "pads": [1] * (2 * nd)},
        inits={"w": rand(3, 2, *([3] * nd))},
    )


def test_conv_depthwise_without_bias() -> None:
    check_ort(
        "Conv",
        {"x": rand(1, 4, 6, 6)},
        {"group": 4, "kernel_shape": [3, 3]},
        inits={"w": rand(4, 1, 3, 3)},
    )


def test_conv_symbolic_batch_and_size_keeps_symbols() -> None:
    model = node_model(
        "Conv",
        {"x": rand(2, 3, 8, 8)},
        {"pads": [1, 1, 1, 1]},
        inits={"w": rand(4, 3, 3, 3)},
        dims={"x": ["N", 3, "h", "w"]},
    )
    g = load_onnx(model)
    assert str(g.shape(g.outputs[0])) == "[B,4,h,w]"
    assert any(isinstance(g[v].op, Conv) for v in g.values())


def test_conv_kernel_shape_contradicting_filter_is_refused() -> None:
    model = node_model(
        "Conv", {"x": rand(1, 1, 5, 5)}, {"kernel_shape": [2, 2]}, inits={"w": rand(1, 1, 3, 3)}
    )
    with pytest.raises(UnsupportedOnnxError, match="kernel_shape"):
        load_onnx(model)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"strides": [2, 2]},
        {"strides": [3, 2], "pads": [1, 0, 2, 1], "output_padding": [1, 1]},
        {"strides": [2, 2], "dilations": [2, 1]},
        {"group": 2, "strides": [2, 1]},
        {"strides": [2, 2], "output_shape": [10, 9]},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    ],
)
def test_conv_transpose(attrs: dict[str, object]) -> None:
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    check_ort(
        "ConvTranspose",
        {"x": rand(2, 4, 4, 4)},
        attrs,
        inits={"w": rand(4, 6 // group, 3, 3), "b": rand(6)},
    )


def test_conv_transpose_1d() -> None:
    check_ort("ConvTranspose", {"x": rand(1, 2, 5)}, {"strides": [3]}, inits={"w": rand(2, 3, 4)})


# -- Gemm, MatMul --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attrs", "c_shape"),
    [
        ({}, None),
        ({"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, (4,)),
        ({"transB": 1}, (3, 1)),
        ({"beta": 0.0}, (3, 4)),
        ({}, ()),
    ],
)
def test_gemm(attrs: dict[str, object], c_shape: tuple[int, ...] | None) -> None:
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    a = rand(5, 3) if ta else rand(3, 5)
    b = rand(4, 5) if tb else rand(5, 4)
    inits = {"b": b} if c_shape is None else {"b": b, "c": rand(*c_shape)}
    check_ort("Gemm", {"a": a}, attrs, inits=inits)


@pytest.mark.parametrize(
    ("sa", "sb"), [((3,), (3, 4)), ((2, 1, 3, 4), (5, 4, 2)), ((2, 3, 4), (4,))]
)
def test_matmul_broadcasting(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check_ort("MatMul", {"a": rand(*sa), "b": rand(*sb)})


# -- softmax family ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize(("opset", "axis"), [(11, 1), (11, -1), (11, 0), (13, 1), (13, -1)])
def test_softmax_family(op: str, opset: int, axis: int) -> None:
    x = rand(2, 3, 4) * 5
    if op == "Hardmax":
        x[0, 0, :2] = 7.0  # a tie: the first maximum wins
    check_ort(op, {"x": x}, {"axis": axis}, opset=opset)


def test_log_softmax_large_inputs_stay_finite() -> None:
    x = np.array([[0.0, 1000.0, -1000.0]], np.float32)
    want = x - 1000.0 - np.log(np.sum(np.exp(x - 1000.0)))
    check_numpy("LogSoftmax", {"x": x}, [want.astype(np.float32)])


# -- Einsum ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
        ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]),
        ("ii", [(4, 4)]),
        ("b i i -> b i", [(2, 3, 3)]),
        ("ij,ij->", [(3, 4), (3, 4)]),
        ("i,j->ij", [(3,), (4,)]),
        ("ab,ab->ab", [(2, 3), (2, 3)]),
        ("ij->ji", [(3, 4)]),
        ("iij->j", [(3, 3, 2)]),
    ],
)
def test_einsum_matches_numpy(equation: str, shapes: list[tuple[int, ...]]) -> None:
    xs = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    want = np.einsum(equation.replace(" ", ""), *xs.values())
    check_numpy(
        "Einsum", xs, [np.asarray(want, np.float32)], {"equation": equation}, rtol=1e-4, atol=1e-5
    )


def test_einsum_with_symbolic_batch() -> None:
    a, b = rand(3, 4, 5), rand(5, 2)
    model = node_model(
        "Einsum", {"a": a, "b": b}, {"equation": "nij,jk->nik"}, dims={"a": ["N", 4, 5]}
    )
    (got,) = ours(model, {"a": a, "b": b})
    np.testing.assert_allclose(got, np.einsum("nij,jk->nik", a, b), rtol=1e-5, atol=1e-5)


def test_einsum_bad_equation_is_refused() -> None:
    model = node_model("Einsum", {"a": rand(2, 3)}, {"equation": "ijk->i"})
    with pytest.raises(UnsupportedOnnxError):
        load_onnx(model)


# -- CausalConvWithState ----------------------------------------------------------------------------
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(past: bool, activation: str) -> None:
    feed = {"x": rand(2, 3, 6)}
    inits = {"w": rand(3, 1, 4), "b": rand(3)}
    order = ["x", "w", "b"]
    if past:
        feed["past"] = rand(2, 3, 3)
        order.append("past")
    check_reference(
        "CausalConvWithState",
        feed,
        {"activation": activation},
        inits=inits,
        order=order,
        outputs=("y", "state"),
        opset=27,
    )


# -- Col2Im ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [
        ([5, 5], [2, 3], {}),
        ([6, 7], [3, 2], {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
        ([7, 5], [3, 3], {"strides": [2, 2]}),
    ],
)
def test_col2im(image: list[int], block: list[int], attrs: dict[str, object]) -> None:
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    blocks = [
        (n + pads[i] + pads[i + 2] - dil[i] * (k - 1) - 1) // strides[i] + 1  # type: ignore[index]
        for i, (n, k) in enumerate(zip(image, block, strict=True))
    ]
    x = rand(2, 3 * block[0] * block[1], blocks[0] * blocks[1])
    inits = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    check_ort("Col2Im", {"x": x}, attrs, inits=inits, opset=18)
