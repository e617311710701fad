"""Integer GEMM and convolution handlers (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv,
com.microsoft QGemm / MatMulIntegerToFloat / DynamicQuantizeMatMul) against onnxruntime, on the
reference executor and on Device.cpu(); the int32 results must be identical.

onnxruntime's u8 x s8 kernels on x86 CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply with
`vpmaddubsw`, which adds adjacent u8·s8 products in saturating int16: with weights using all of
int8 (|w| > 64) and large activations the sum of two products passes 32767 and onnxruntime's
result is off by what was clipped. That is why its quantizer has `reduce_range` (7-bit weights).
We compute the exact sum the ONNX spec defines on every CPU. Tests that compare with
onnxruntime on u8 x s8 therefore use 7-bit weights, and one test checks full-range weights against
the exact sum computed with NumPy integers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import helper

from kn_graph.errors import KnError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import model, node, ours, reference

RNG = np.random.default_rng(20261202)


def _q(shape: tuple[int, ...], dtype: type, full: bool = False) -> np.ndarray:
    """Random 8-bit data; int8 stays within 7 bits unless `full` (see the module docstring)."""
    if dtype is np.uint8:
        return RNG.integers(0, 256, shape, dtype=np.uint8)
    lo, hi = (-128, 128) if full else (-64, 64)
    return RNG.integers(lo, hi, shape, dtype=np.int8)


def _com(m: onnx.ModelProto) -> onnx.ModelProto:
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m


def _same(m: onnx.ModelProto, feed: Mapping[str, np.ndarray], ulp: int = 0) -> None:
    """Reference executor and Device.cpu() against onnxruntime: equal dtypes and shapes; values
    equal, or within `ulp` units of a quantized output (float: 1e-5 relative)."""
    want = reference(m, feed)
    g = load_onnx(m)
    got_cpu = Device.cpu().prepare(g).eval({n: feed[n] for n in g.input_names})
    for got in (ours(m, feed), got_cpu):
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
            if a.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
            else:
                assert np.abs(a.astype(np.int64) - b).max(initial=0) <= ulp


def _exact(m: onnx.ModelProto, feed: Mapping[str, np.ndarray], want: np.ndarray) -> None:
    """Reference executor and Device.cpu() equal to an exact int32 result computed here."""
    g = load_onnx(m)
    got_cpu = Device.cpu().prepare(g).eval({n: feed[n] for n in g.input_names})[0]
    for got in (ours(m, feed)[0], got_cpu):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


# -- MatMulInteger ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ta", "tb"), [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]
)
@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3))]
)
def test_matmul_integer_matches_onnxruntime(
    ta: type, tb: type, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    a, b = _q(a_shape, ta), _q(b_shape, tb)
    za, zb = np.array(3, ta), np.array(1, tb)
    m = model(
        [node("MatMulInteger", ["a", "b", "za", "zb"])],
        {"a": a},
        inits={"b": b, "za": za, "zb": zb},
    )
    _same(m, {"a": a})


def test_matmul_integer_zero_points_per_row_and_column() -> None:
    a, b = _q((4, 6), np.uint8), _q((6, 5), np.uint8)
    za = RNG.integers(0, 256, 4, dtype=np.uint8)
    zb = RNG.integers(0, 256, 5, dtype=np.uint8)
    m = model(
        [node("MatMulInteger", ["a", "b", "za", "zb"])],
        {"a": a, "b": b},
        inits={"za": za, "zb": zb},
    )
    exact = (a.astype(np.int64) - za[:, None]) @ (b.astype(np.int64) - zb[None, :])
    _exact(m, {"a": a, "b": b}, exact)  # onnxruntime refuses a per-row a_zero_point


def test_matmul_integer_without_zero_points_and_symbolic_rows() -> None:
    a, b = _q((3, 9, 16), np.uint8), _q((16, 4), np.int8)
    m = model(
        [node("MatMulInteger", ["a", "b"])], {"a": a}, inits={"b": b}, dims={"a": ["n", "s", 16]}
    )
    _same(m, {"a": a})
    _same(m, {"a": a[:1, :5]})


def test_full_range_int8_weights_give_the_exact_sum() -> None:
    """u8 activations near 255 against int8 weights near ±127: the exact int32 sum (which
    onnxruntime's non-VNNI kernels clip; see the module docstring)."""
    a = RNG.integers(200, 256, (8, 64), dtype=np.uint8)
    b = RNG.integers(100, 128, (64, 8), dtype=np.int8) * np.where(
        RNG.random((64, 8)) < 0.5, -1, 1
    ).astype(np.int8)
    m = model([node("MatMulInteger", ["a", "b"])], {"a": a}, inits={"b": b})
    _exact(m, {"a": a}, a.astype(np.int64) @ b.astype(np.int64))


# -- ConvInteger -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"pads": [1, 1, 1, 1]},
        {"pads": [1, 0, 2, 1], "strides": [2, 1]},
        {"dilations": [2, 2], "pads": [2, 2, 2, 2]},
        {"group": 2, "pads": [1, 1, 1, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ],
)
def test_conv_integer_matches_onnxruntime(attrs: dict[str, object]) -> None:
    x = _q((2, 4, 9, 8), np.uint8)
    groups = int(attrs.get("group", 1))  # type: ignore[call-overload]
    w = _q((6, 4 // groups, 3, 3), np.uint8)
    zx, zw = np.array(7, np.uint8), np.array(130, np.uint8)
    m = model(
        [node("ConvInteger", ["x", "w", "zx", "zw"], **attrs)],
        {"x": x},
        inits={"w": w, "zx": zx, "zw": zw},
    )
    _same(m, {"x": x})


def test_conv_integer_1d_pads_with_the_zero_point() -> None:
    """Padding is zero after the shift: pad values equal to x's zero point add nothing."""
    x = _q((1, 3, 10), np.uint8)
    w = _q((2, 3, 4), np.uint8)
    m = model(
        [node("ConvInteger", ["x", "w", "zx"], pads=[3, 1])],
        {"x": x},
        inits={"w": w, "zx": np.array(200, np.uint8)},
    )
    _same(m, {"x": x})


def test_conv_integer_per_filter_weight_zero_points_are_exact() -> None:
    """A per-filter w_zero_point (which onnxruntime's ConvInteger refuses) against NumPy."""
    x, w = _q((1, 2, 5, 5), np.uint8), _q((3, 2, 3, 3), np.uint8)
    zw = np.array([0, 128, 255], np.uint8)
    m = model(
        [node("ConvInteger", ["x", "w", "zx", "zw"])],
        {"x": x},
        inits={"w": w, "zx": np.array(1, np.uint8), "zw": zw},
    )
    xs = x.astype(np.int64) - 1
    ws = w.astype(np.int64) - zw[:, None, None, None]
    exact = np.zeros((1, 3, 3, 3), np.int64)
    for i in range(3):
        for j in range(3):
            exact[0, :, i, j] = np.tensordot(ws, xs[0, :, i : i + 3, j : j + 3], axes=3)
    _exact(m, {"x": x}, exact)


# -- QLinearMatMul / QLinearConv ---------------------------------------------------------------
def _qparams(prefix: str, dtype: type, scale: float, zero: int) -> dict[str, np.ndarray]:
    return {f"{prefix}s": np.array(scale, np.float32), f"{prefix}z": np.array(zero, dtype)}


@pytest.mark.parametrize(
    ("ta", "tb", "ty"),
    [(np.uint8, np.int8, np.uint8), (np.int8, np.int8, np.int8), (np.uint8, np.uint8, np.uint8)],
)
def test_qlinear_matmul_matches_onnxruntime(ta: type, tb: type, ty: type) -> None:
    a, b = _q((2, 6, 32), ta), _q((32, 5), tb)
    inits = {
        "b": b,
        **_qparams("a", ta, 0.05, 3),
        **_qparams("b", tb, 0.01, 0),
        **_qparams("y", ty, 0.2, 2),
    }
    m = model(
        [node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"])],
        {"a": a},
        inits=inits,
    )
    _same(m, {"a": a}, ulp=1)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv_matches_onnxruntime(per_channel: bool, bias: bool) -> None:
    x, w = _q((1, 4, 9, 9), np.uint8), _q((6, 4, 3, 3), np.int8)
    ws = (
        RNG.uniform(0.001, 0.01, 6).astype(np.float32)
        if per_channel
        else np.array(0.004, np.float32)
    )
    inits = {
        "w": w,
        "ws": ws,
        "wz": np.zeros(ws.shape, np.int8),
        **_qparams("x", np.uint8, 0.02, 7),
        **_qparams("y", np.uint8, 0.25, 128),
    }
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits["B"] = RNG.integers(-500, 500, 6).astype(np.int32)
        ins.append("B")
    m = model([node("QLinearConv", ins, pads=[1, 0, 1, 2], strides=[2, 1])], {"x": x}, inits=inits)
    _same(m, {"x": x}, ulp=1)


# -- onnxruntime's contrib ops ------------------------------------------------------------------
@pytest.mark.parametrize("quantized_output", [False, True])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_qgemm_matches_onnxruntime(quantized_output: bool, trans_b: int) -> None:
    a = _q((5, 16), np.uint8)
    b = _q((8, 16) if trans_b else (16, 8), np.int8)
    inits = {
        "b": b,
        "c": RNG.integers(-300, 300, 8).astype(np.int32),
        **_qparams("a", np.uint8, 0.03, 9),
        **_qparams("b", np.int8, 0.02, 0),
    }
    ins = ["a", "as", "az", "b", "bs", "bz", "c"]
    if quantized_output:
        inits.update(_qparams("y", np.uint8, 0.1, 100))
        ins += ["ys", "yz"]
    n = helper.make_node("QGemm", ins, ["y"], domain="com.microsoft", transB=trans_b, alpha=0.5)
    m = _com(model([n], {"a": a}, inits=inits))
    _same(m, {"a": a}, ulp=1 if quantized_output else 0)


def test_matmul_integer_to_float_matches_onnxruntime() -> None:
    a, b = _q((3, 4, 16), np.uint8), _q((16, 6), np.int8)
    inits = {
        "b": b,
        "as": np.array(0.02, np.float32),
        "bs": RNG.uniform(0.01, 0.03, 6).astype(np.float32),
        "az": np.array(5, np.uint8),
        "bz": np.zeros(6, np.int8),
        "bias": RNG.standard_normal(6).astype(np.float32),
    }
    n = helper.make_node(
        "MatMulIntegerToFloat",
        ["a", "b", "as", "bs", "az", "bz", "bias"],
        ["y"],
        domain="com.microsoft",
    )
    _same(_com(model([n], {"a": a}, inits=inits)), {"a": a})


def test_dynamic_quantize_matmul_matches_onnxruntime() -> None:
    a = RNG.standard_normal((2, 5, 16)).astype(np.float32)
    b = _q((16, 6), np.int8)
    inits = {
        "b": b,
        "bs": np.array(0.02, np.float32),
        "bias": RNG.standard_normal(6).astype(np.float32),
    }
    n = helper.make_node(
        "DynamicQuantizeMatMul", ["a", "b", "bs", "", "bias"], ["y"], domain="com.microsoft"
    )
    _same(_com(model([n], {"a": a}, inits=inits)), {"a": a})


# -- bad input -------------------------------------------------------------------------------
def test_zero_point_of_the_wrong_type_names_the_node() -> None:
    a, b = _q((4, 6), np.uint8), _q((6, 5), np.int8)
    n = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"], name="mm0")
    m = model([n], {"a": a}, inits={"b": b, "za": np.array(1, np.int8)})
    with pytest.raises(KnError, match=r"mm0.*a_zero_point.*uint8|mm0.*a_zero_point.*u8"):
        load_onnx(m)


def test_per_channel_scale_of_the_wrong_length_names_the_node() -> None:
    x, w = _q((1, 4, 5, 5), np.uint8), _q((6, 4, 3, 3), np.int8)
    inits = {
        "w": w,
        "ws": np.ones(5, np.float32),
        "wz": np.zeros(5, np.int8),
        **_qparams("x", np.uint8, 0.1, 0),
        **_qparams("y", np.uint8, 0.1, 0),
    }
    n = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="qc7"
    )
    with pytest.raises(KnError, match=r"qc7.*w_zero_point.*6"):
        load_onnx(model([n], {"x": x}, inits=inits))


def test_float_operands_are_refused_with_our_error() -> None:
    a = RNG.standard_normal((4, 6)).astype(np.float32)
    n = helper.make_node("MatMulInteger", ["a", "a2"], ["y"], name="mmf")
    m = model([n], {"a": a}, inits={"a2": np.ones((6, 2), np.int8)})
    with pytest.raises(KnError, match=r"mmf.*uint8 or int8"):
        load_onnx(m)
