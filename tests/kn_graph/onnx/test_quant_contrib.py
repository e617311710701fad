"""onnxruntime's quantized element and data operators (handlers/quant_contrib.py) against
onnxruntime's CPU kernels: one-node com.microsoft models, uint8 and int8, per-tensor parameters,
through the reference executor and the CPU device.

Where onnxruntime's kernel takes a different rounding path than dequantize → f32 op → quantize
(the module docstring of quant_contrib lists them), the bound is one unit of the quantized
output; elsewhere the result is exact."""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.helpers import model, node, on_cpu, ours, reference

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _own_data(request: pytest.FixtureRequest) -> None:
    """Each test draws its data from its own seed (its id), not from where the module's
    generator stands when the test runs: the same data in any order, on any xdist worker."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


MS = "com.microsoft"
DTYPES = [np.uint8, np.int8]


def qdata(dt: type, *shape: int) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dt)


def params(dt: type, scale: float, zp_uint8: int | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A scale and a zero point; int8 zero points are the uint8 ones shifted by -128."""
    zp = np.asarray(zp_uint8) - (0 if dt == np.uint8 else 128)
    return np.array(scale, np.float32), zp.astype(dt)


def qmodel(
    nodes: Sequence[onnx.NodeProto],
    feed: Mapping[str, np.ndarray],
    inits: Mapping[str, np.ndarray],
    opset: int = 13,
) -> onnx.ModelProto:
    return model(nodes, feed, inits=inits, opset=opset, contrib=True)


def check_q(
    m: onnx.ModelProto, feed: Mapping[str, np.ndarray], units: int, share: float = 0.5
) -> None:
    """Ours equal onnxruntime in dtype and shape, and in value within `units` of the quantized
    output (the reference executor) or one unit (the CPU device: its optimizer folds
    (x - zp)·s / s' into x·(s / s') + c and turns the division into a multiplication, which
    moves a value sitting at a rounding tie by one unit). At most `share` of the elements may
    differ: a lost zero point or scale would move most of them (and by more than one unit,
    which the bound catches first); how many ties a tolerated one-unit difference meets depends
    on the data, not on the implementation, so the share is not tuned to it."""
    (want,) = reference(m, feed)
    for (got,), bound in ((ours(m, feed), units), (on_cpu(m, feed), 1)):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert int(diff.max(initial=0)) <= bound, (got, want)
        assert np.count_nonzero(diff) <= share * diff.size, np.count_nonzero(diff)


# -- binary ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("b_shape", [(3, 8), (8,), ()], ids=["same", "row", "scalar"])
def test_qlinear_add_mul(op: str, dt: type, b_shape: tuple[int, ...]) -> None:
    """MLAS adds with folded scale ratios (or fixed point) and multiplies the integer product
    by one combined scale: a different float rounding than ours, so one unit is allowed."""
    feed = {"a": qdata(dt, 3, 8), "b": qdata(dt, *b_shape)}
    (sa, za), (sb, zb) = params(dt, 0.05, 131), params(dt, 0.02, 90)
    sc, zc = params(dt, 0.2 if op == "QLinearMul" else 0.04, 120)
    inits = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
    n = node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], domain=MS)
    check_q(qmodel([n], feed, inits), feed, units=1)


# -- lookup-table activations ----------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
def test_qlinear_leaky_relu_is_exact(dt: type) -> None:
    """onnxruntime's table is dequantize → v >= 0 ? v : alpha v → MlasQuantizeLinear in f32:
    the same arithmetic as ours, so every value agrees."""
    feed = {"x": np.arange(np.iinfo(dt).min, int(np.iinfo(dt).max) + 1).astype(dt)}
    (sx, zx), (sy, zy) = params(dt, 0.1, 140), params(dt, 0.07, 60)
    n = node("QLinearLeakyRelu", ["x", "sx", "zx", "sy", "zy"], domain=MS, alpha=0.3)
    check_q(qmodel([n], feed, {"sx": sx, "zx": zx, "sy": sy, "zy": zy}), feed, units=0)


@pytest.mark.parametrize("dt", DTYPES)
def test_qlinear_sigmoid(dt: type) -> None:
    """onnxruntime's table holds MlasComputeLogistic, a polynomial approximation of the sigmoid
    a few float ulps away: one unit where a value sits at a rounding tie."""
    feed = {"x": np.arange(np.iinfo(dt).min, int(np.iinfo(dt).max) + 1).astype(dt)}
    (sx, zx), (sy, zy) = params(dt, 0.05, 128), params(dt, 1 / 256, 0)
    n = node("QLinearSigmoid", ["x", "sx", "zx", "sy", "zy"], domain=MS)
    check_q(qmodel([n], feed, {"sx": sx, "zx": zx, "sy": sy, "zy": zy}), feed, units=1)


# -- softmax ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(("opset", "axis"), [(13, -1), (13, 1), (12, 1), (12, None)])
def test_qlinear_softmax(dt: type, opset: int, axis: int | None) -> None:
    """onnxruntime sums a table of exponentials in float and multiplies by floor(1 / y_scale)
    where quantizing divides by y_scale: one unit. y_scale = 1/256 (what onnxruntime's
    quantizer gives softmax outputs) makes the two equal; with 1/255 a third of the values
    move by one. The input scale keeps rows from having one dominant element, whose int8
    output onnxruntime wraps from 128 to -128."""
    feed = {"x": qdata(dt, 2, 3, 6)}
    (sx, zx), (sy, zy) = params(dt, 0.02, 100), params(dt, 1 / 256, 0)
    attrs: dict[str, object] = {"opset": opset} | ({} if axis is None else {"axis": axis})
    n = node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], domain=MS, **attrs)
    check_q(qmodel([n], feed, {"sx": sx, "zx": zx, "sy": sy, "zy": zy}), feed, units=1)


# -- concat, where ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
def test_qlinear_concat_is_exact(dt: type) -> None:
    """A table of dequantize → MlasQuantizeLinear per input (a copy when the parameters equal
    the output's): our arithmetic exactly. The second input shares the output's parameters."""
    feed = {"a": qdata(dt, 2, 3, 4), "b": qdata(dt, 2, 1, 4), "c": qdata(dt, 2, 2, 4)}
    (sy, zy), (sa, za), (sc, zc) = (
        params(dt, 0.1, 128),
        params(dt, 0.03, 10),
        params(dt, 0.25, 200),
    )
    inits = {"sy": sy, "zy": zy, "sa": sa, "za": za, "sc": sc, "zc": zc}
    names = ["sy", "zy", "a", "sa", "za", "b", "sy", "zy", "c", "sc", "zc"]
    n = node("QLinearConcat", names, domain=MS, axis=1)
    check_q(qmodel([n], feed, inits), feed, units=0)


@pytest.mark.parametrize("dt", DTYPES)
def test_qlinear_where_is_exact(dt: type) -> None:
    feed = {
        "c": RNG.integers(0, 2, (3, 1)).astype(bool),
        "a": qdata(dt, 3, 5),
        "b": qdata(dt, 5),
    }
    (sx, zx), (sy, zy), (sz, zz) = (
        params(dt, 0.05, 100),
        params(dt, 0.3, 7),
        params(dt, 0.2, 128),
    )
    inits = {"sx": sx, "zx": zx, "sy": sy, "zy": zy, "sz": sz, "zz": zz}
    n = node("QLinearWhere", ["c", "a", "sx", "zx", "b", "sy", "zy", "sz", "zz"], domain=MS)
    check_q(qmodel([n], feed, inits), feed, units=0)


# -- pooling, reduction ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"},
    ],
    ids=["stride", "pad_count", "pad_exclude", "ceil", "same"],
)
def test_qlinear_average_pool(dt: type, channels_last: int, attrs: dict[str, object]) -> None:
    """onnxruntime rounds y / scale + zp, so a tie rounds to even after adding the odd zero
    point instead of before: one unit. With equal scales the mean of 2 integers is a tie half
    of the time (of 4, a quarter), so up to half of the values may move."""
    x = qdata(dt, 2, 3, 7, 6)
    feed = {"x": x.transpose(0, 2, 3, 1).copy() if channels_last else x}
    (sx, zx), (sy, zy) = params(dt, 0.1, 127), params(dt, 0.1, 131)
    n = node(
        "QLinearAveragePool",
        ["x", "sx", "zx", "sy", "zy"],
        domain=MS,
        channels_last=channels_last,
        **attrs,
    )
    check_q(qmodel([n], feed, {"sx": sx, "zx": zx, "sy": sy, "zy": zy}), feed, units=1)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(2, 16, 5, 3), (1, 32, 10)])
def test_qlinear_global_average_pool(dt: type, channels_last: int, shape: tuple[int, ...]) -> None:
    """MLAS sums the integers and requantizes the sum with one combined scale: one unit. With
    these scales the mean of 10 values is sum / 2 units (a tie half of the time) and of 15,
    sum / 3 (never one): up to half of the values may move."""
    feed = {"x": qdata(dt, *shape)}
    (sx, zx), (sy, zy) = params(dt, 0.05, 120), params(dt, 0.01, 128)
    n = node(
        "QLinearGlobalAveragePool",
        ["x", "sx", "zx", "sy", "zy"],
        domain=MS,
        channels_last=channels_last,
    )
    check_q(qmodel([n], feed, {"sx": sx, "zx": zx, "sy": sy, "zy": zy}), feed, units=1)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_qlinear_reduce_mean_matches_its_specification(dt: type, keepdims: int) -> None:
    """onnxruntime has no CPU kernel for QLinearReduceMean: its specification (dequantize →
    ReduceMean in f32 → quantize) runs in onnxruntime as the three standard ops instead."""
    feed = {"x": qdata(dt, 2, 5, 4)}
    (sx, zx), (sy, zy) = params(dt, 0.05, 120), params(dt, 0.01, 128)
    inits = {"sx": sx, "zx": zx, "sy": sy, "zy": zy}
    contrib = node(
        "QLinearReduceMean", ["x", "sx", "zx", "sy", "zy"], domain=MS, axes=[1], keepdims=keepdims
    )
    spec = model(
        [
            node("DequantizeLinear", ["x", "sx", "zx"], ["d"]),
            node("ReduceMean", ["d"], ["m"], axes=[1], keepdims=keepdims),
            node("QuantizeLinear", ["m", "sy", "zy"]),
        ],
        feed,
        inits=inits,
        opset=13,
    )
    (want,) = reference(spec, feed)
    m = qmodel([contrib], feed, inits)
    for (got,) in (ours(m, feed), on_cpu(m, feed)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


# -- contrib QuantizeLinear / DequantizeLinear -----------------------------------------------------
@pytest.mark.parametrize("dt", DTYPES)
def test_contrib_quantize_dequantize_per_tensor_and_axis(dt: type) -> None:
    x = (RNG.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    per_axis = {"s": np.array([0.05, 0.1, 0.02], np.float32), "z": params(dt, 0, [3, 128, 250])[1]}
    per_tensor = {"s": np.array(0.04, np.float32), "z": params(dt, 0, 77)[1]}
    for inits, attrs in ((per_tensor, {}), (per_axis, {"axis": 1})):
        q = qmodel([node("QuantizeLinear", ["x", "s", "z"], domain=MS, **attrs)], {"x": x}, inits)
        check_q(q, {"x": x}, units=0)
        xi = {"x": qdata(dt, 2, 3, 4)}
        d = qmodel([node("DequantizeLinear", ["x", "s", "z"], domain=MS, **attrs)], xi, inits)
        (want,) = reference(d, xi)
        # the CPU device folds (x - zp)·s into x·s - zp·s: a few f32 ulps of zp·s
        for (got,) in (ours(d, xi), on_cpu(d, xi)):
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-5)


# -- bad input -------------------------------------------------------------------------------------
def _add_model(za: np.ndarray, sa: np.ndarray) -> onnx.ModelProto:
    feed = {"a": qdata(np.uint8, 2, 3), "b": qdata(np.uint8, 2, 3)}
    s, z = params(np.uint8, 0.1, 3)
    inits = {"sa": sa, "za": za, "s": s, "z": z}
    n = onnx.helper.make_node(
        "QLinearAdd", ["a", "sa", "za", "b", "s", "z", "s", "z"], ["y"], "qadd7", domain=MS
    )
    return qmodel([n], feed, inits)


@pytest.mark.parametrize(
    ("za", "sa", "message"),
    [
        (np.array(3, np.int8), np.array(0.1, np.float32), "zero point (input 2) of type i8"),
        (np.array(3, np.uint8), np.array([0.1, 0.2], np.float32), "scale (input 1) must be"),
        (np.array([3, 4], np.uint8), np.array(0.1, np.float32), "zero point (input 2) must be"),
        (np.array(3, np.uint8), np.array(0.1, np.float64), "must be f32"),
    ],
    ids=["zero_point_type", "scale_shape", "zero_point_shape", "scale_type"],
)
def test_bad_parameters_are_refused_naming_the_node(
    za: np.ndarray, sa: np.ndarray, message: str
) -> None:
    with pytest.raises(UnsupportedOnnxError, match=re.escape(message)) as e:
        load_onnx(_add_model(za, sa))
    assert "qadd7" in str(e.value) and "QLinearAdd" in str(e.value)


def test_mixed_data_types_are_refused() -> None:
    feed = {"a": qdata(np.uint8, 4), "b": qdata(np.int8, 4)}
    s = np.array(0.1, np.float32)
    n = node("QLinearMul", ["a", "s", "", "b", "s", "", "s"], domain=MS, name="mul3")
    with pytest.raises(UnsupportedOnnxError, match="input 3 must be u8") as e:
        load_onnx(qmodel([n], feed, {"s": s}))
    assert "mul3" in str(e.value)
