"""Elementwise and quantization ONNX handlers (handlers/elementwise.py, handlers/quant.py) against
onnxruntime or NumPy: tiny models through load_onnx and the CPU executor, plus the load-time
(Known) path on shape tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_graph.ops import Binary, BinaryOp, Select, View
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size
from tests.kn_graph.onnx.helpers import check, model, node, ours

RNG = np.random.default_rng(7)


def one(
    op: str, feed: Mapping[str, np.ndarray], opset: int = 18, **attrs: object
) -> onnx.ModelProto:
    return model([node(op, list(feed), **attrs)], feed, opset=opset)


def ints(*shape: int, dtype: type = np.int32, lo: int = -20, hi: int = 20) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def floats(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# -- binary ops ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op", ["Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_binary_broadcasts_like_onnxruntime(op: str, dtype: type) -> None:
    a = (floats(2, 3, 4) * 10).astype(dtype)
    b = (floats(3, 1) * 10).astype(dtype)
    if op == "Div" and np.dtype(dtype).kind == "i":
        b[b == 0] = 3
    check(one(op, {"a": a, "b": b}), {"a": a, "b": b})


def test_integer_div_and_mod_follow_c_and_python_signs() -> None:
    a = np.array([7, -7, 7, -7, 5, -1], np.int64)
    b = np.array([2, 2, -2, -2, 7, 3], np.int64)
    feed = {"a": a, "b": b}
    (q,) = ours(one("Div", feed), feed)
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int64))
    (m,) = ours(one("Mod", feed), feed)
    np.testing.assert_array_equal(m, np.mod(a, b))
    (f,) = ours(one("Mod", feed, fmod=1), feed)
    np.testing.assert_array_equal(f, np.fmod(a, b))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
def test_integer_div_and_mod_of_int_min_folded_at_load_time(dtype: type) -> None:
    """Constants are folded by the loader (`known_binary`) with the IR's own semantics: INT_MIN
    as dividend or divisor truncates like C and onnxruntime (a copy of the loader's own once
    took |INT_MIN|, which overflows: -128 // 3 gave 43, -24 // -128 gave -1)."""
    lo = np.iinfo(dtype).min
    a = np.array([lo, lo, -24, 100, lo, 7], dtype)
    b = np.array([3, -3, lo, lo, 1, -2], dtype)
    for op, attrs in [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})]:
        m = model(
            [node(op, ["a", "b"], ["q"], **attrs), node("Add", ["q", "x"])],
            {"x": np.zeros(6, dtype)},
            inits={"a": a, "b": b},
        )
        check(m, {"x": np.zeros(6, dtype)})


@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.int64),
        (np.int32, np.float32),
        (np.int64, np.int64),
        (np.float32, np.float32),
    ],
)
def test_pow_casts_the_exponent(dtypes: tuple[type, type]) -> None:
    feed = {"a": np.array([1, 2, 3, 4], dtypes[0]), "b": np.array([2, 3, 1, 0], dtypes[1])}
    check(one("Pow", feed, opset=15), feed)


def test_logic_and_bitwise_ops() -> None:
    p, q = RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5
    for op in ("And", "Or", "Xor"):
        check(one(op, {"p": p, "q": q}), {"p": p, "q": q})
    check(one("Not", {"p": p}), {"p": p})
    a, b = ints(3, 4), ints(4)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check(one(op, {"a": a, "b": b}), {"a": a, "b": b})
    check(one("BitwiseNot", {"a": a}), {"a": a})


def test_bitshift_unsigned_matches_onnxruntime() -> None:
    x = np.array([16, 4, 1, 255], np.uint8)
    s = np.array([1, 2, 3, 4], np.uint8)
    for d in ("LEFT", "RIGHT"):
        check(one("BitShift", {"x": x, "s": s}, direction=d), {"x": x, "s": s})


def test_bitshift_out_of_range_amounts_give_zero_or_the_sign() -> None:
    """Amounts < 0 or >= the width shift everything out (right shifts keep the sign)."""
    x = np.array([-8, 8, -1, 3], np.int32)
    s = np.array([40, -1, 32, 1], np.int32)
    feed = {"x": x, "s": s}
    (left,) = ours(one("BitShift", feed, direction="LEFT"), feed)
    np.testing.assert_array_equal(left, [0, 0, 0, 6])
    (right,) = ours(one("BitShift", feed, direction="RIGHT"), feed)
    np.testing.assert_array_equal(right, [-1, 0, -1, 1])


# -- Where, Clip, variadic ---------------------------------------------------------------------------
def test_where_broadcasts_all_three() -> None:
    feed = {"c": RNG.random((2, 1, 4)) > 0.5, "a": floats(3, 1), "b": floats(4)}
    check(one("Where", feed), feed)


@pytest.mark.parametrize(
    ("lo", "hi"), [(-0.5, 0.5), (None, 0.2), (-0.2, None), (None, None), (1.0, -1.0)]
)
def test_clip_with_optional_bounds_and_min_above_max(lo: float | None, hi: float | None) -> None:
    x = floats(3, 5)
    inits = {k: np.array(v, np.float32) for k, v in (("lo", lo), ("hi", hi)) if v is not None}
    names = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    m = model([node("Clip", names)], {"x": x}, inits=inits, opset=13)
    check(m, {"x": x})
    want = np.minimum(np.maximum(x, -np.inf if lo is None else lo), np.inf if hi is None else hi)
    np.testing.assert_array_equal(ours(m, {"x": x})[0], want)


def test_clip_attribute_form_and_int8() -> None:
    x = floats(4, 4)
    check(one("Clip", {"x": x}, opset=6, min=-0.3, max=0.4), {"x": x})
    xi = ints(3, 4, dtype=np.int8)
    m = model(
        [node("Clip", ["x", "", "hi"])], {"x": xi}, inits={"hi": np.array(5, np.int8)}, opset=13
    )
    check(m, {"x": xi})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_ops_broadcast_three_inputs(op: str) -> None:
    feed = {"a": floats(2, 3), "b": floats(3), "c": floats(2, 1)}
    check(one(op, feed), feed)
    check(one(op, {"a": feed["a"]}), {"a": feed["a"]})


# -- unary math and activations ------------------------------------------------------------------------
_UNARY = [
    "Abs",
    "Neg",
    "Exp",
    "Sin",
    "Cos",
    "Tan",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Erf",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Softsign",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Relu",
    "Mish",
    "HardSwish",
]


@pytest.mark.parametrize("op", _UNARY)
def test_unary_math_matches_onnxruntime(op: str) -> None:
    x = floats(3, 7) * 2
    check(one(op, {"x": x}, opset=18 if op != "Mish" else 22), {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Reciprocal", "Acosh"])
def test_unary_math_on_its_domain(op: str) -> None:
    x = np.abs(floats(3, 7)) + 1.0
    check(one(op, {"x": x}), {"x": x})


@pytest.mark.parametrize("op", ["Asin", "Acos", "Atanh"])
def test_inverse_trig_inside_the_unit_interval(op: str) -> None:
    x = RNG.uniform(-0.9, 0.9, (2, 5)).astype(np.float32)
    check(one(op, {"x": x}), {"x": x})


@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("LeakyRelu", {"alpha": 0.2}, 16),
        ("Elu", {"alpha": 0.7}, 18),
        ("Selu", {}, 18),
        ("Celu", {"alpha": 1.5}, 18),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 18),
        ("ThresholdedRelu", {"alpha": 0.5}, 18),
        ("Shrink", {"bias": 0.2, "lambd": 0.6}, 18),
        ("Gelu", {}, 20),
        ("Gelu", {"approximate": "tanh"}, 20),
    ],
)
def test_activations_match_onnxruntime(op: str, attrs: dict[str, object], opset: int) -> None:
    x = floats(4, 6) * 2
    check(one(op, {"x": x}, opset=opset, **attrs), {"x": x})


def test_prelu_broadcasts_the_slope() -> None:
    feed = {"x": floats(2, 3, 4), "s": floats(4)}
    check(one("PRelu", feed, opset=16), feed)


def test_swish_is_x_times_sigmoid_alpha_x() -> None:
    x = floats(3, 4)
    for alpha in (1.0, 0.5):
        (y,) = ours(one("Swish", {"x": x}, opset=24, alpha=alpha), {"x": x})
        np.testing.assert_allclose(y, x / (1 + np.exp(-alpha * x)), rtol=1e-6)


def test_isnan_and_isinf_with_directions() -> None:
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check(one("IsNaN", {"x": x}), {"x": x})
    for pos, neg in ((1, 1), (1, 0), (0, 1)):
        check(one("IsInf", {"x": x}, detect_positive=pos, detect_negative=neg), {"x": x})


# -- casts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (np.float32, TensorProto.INT32),
        (np.float32, TensorProto.FLOAT16),
        (np.int64, TensorProto.FLOAT),
        (np.float32, TensorProto.BOOL),
        (np.bool_, TensorProto.FLOAT),
        (np.int32, TensorProto.UINT8),
    ],
)
def test_cast_matches_onnxruntime(src: type, dst: int) -> None:
    x = (floats(3, 4) * 50).astype(src) if src is not np.bool_ else RNG.random((3, 4)) > 0.5
    check(one("Cast", {"x": x}, to=dst), {"x": x})


def test_castlike_takes_the_type_of_its_second_input() -> None:
    feed = {"x": floats(2, 3), "like": np.zeros(1, np.float64)}
    check(one("CastLike", feed), feed)


def test_cast_to_float8_is_refused_cleanly() -> None:
    x = floats(2, 2)
    with pytest.raises(UnsupportedOnnxError, match="FLOAT8E4M3FN"):
        load_onnx(one("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN))


def test_bitcast_reinterprets_bytes() -> None:
    x = floats(5)
    (y,) = ours(one("BitCast", {"x": x}, opset=26, to=TensorProto.INT32), {"x": x})
    np.testing.assert_array_equal(y, x.view(np.int32))


# -- load-time shape arithmetic --------------------------------------------------------------------------
def _shape_model(
    nodes: Sequence[onnx.NodeProto], inits: Mapping[str, np.ndarray]
) -> onnx.ModelProto:
    x = np.zeros((2, 3, 4), np.float32)
    return model(nodes, {"x": x}, inits=dict(inits), dims={"x": ["batch", "seq", 4]})


def test_equal_shape_minus_one_is_statically_false_and_where_picks_a_branch() -> None:
    """The guard `Where(Equal(shape, -1), 1, shape)` of exports folds to the shape itself."""
    m = _shape_model(
        [
            node("Shape", ["x"], ["s"]),
            node("Equal", ["s", "minus1"], ["is_m1"]),
            node("Where", ["is_m1", "ones", "s"], ["target"]),
            node("Reshape", ["x", "target"], ["y"]),
        ],
        {"minus1": np.array(-1, np.int64), "ones": np.ones(3, np.int64)},
    )
    g = load_onnx(m)
    assert not any(isinstance(g[v].op, Select) for v in g.values())
    assert g[g.outputs[0]].shape == Shape.of(Size.sym("B"), Size.sym("seq"), 4)


def test_shape_arithmetic_stays_symbolic() -> None:
    """Reshape(x, [B, seq*4 / 2, 2]) built with Gather, Mul, Div and Concat on Shape(x)."""
    m = _shape_model(
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "i0"], ["b"], axis=0),
            node("Gather", ["s", "i1"], ["t"], axis=0),
            node("Gather", ["s", "i2"], ["c"], axis=0),
            node("Mul", ["t", "c"], ["tc"]),
            node("Div", ["tc", "two"], ["half"]),
            node("Concat", ["b", "half", "two"], ["target"], axis=0),
            node("Reshape", ["x", "target"], ["y"]),
        ],
        {"i0": np.array([0]), "i1": np.array([1]), "i2": np.array([2]), "two": np.array([2])},
    )
    g = load_onnx(m)
    out = g.outputs[0]
    assert isinstance(g[out].op, View)
    assert g[out].shape == Shape.of(Size.sym("B"), 2 * Size.sym("seq"), 2)
    x = floats(3, 5, 4)
    np.testing.assert_array_equal(evaluate(g, [x])[0], x.reshape(3, 10, 2))


def test_undecidable_comparison_is_computed_at_run_time() -> None:
    """Equal(seq, 3) depends on the input: the graph computes it (no silent guess)."""
    m = _shape_model(
        [node("Shape", ["x"], ["s"]), node("Equal", ["s", "three"], ["y"])],
        {"three": np.array(3, np.int64)},
    )
    g = load_onnx(m)
    for seq in (3, 5):
        (y,) = evaluate(g, [np.zeros((2, seq, 4), np.float32)])
        np.testing.assert_array_equal(y, [False, seq == 3, False])


def test_max_with_zero_and_cast_of_sizes_fold_at_load_time() -> None:
    """Max(shape, 0) is the shape (a size is never negative); Cast keeps the sizes."""
    m = _shape_model(
        [
            node("Shape", ["x"], ["s"]),
            node("Max", ["s", "zero"], ["m"]),
            node("Cast", ["m"], ["y"], to=TensorProto.INT32),
        ],
        {"zero": np.array(0, np.int64)},
    )
    g = load_onnx(m)
    assert not any(isinstance(g[v].op, Binary) and g[v].op.op is BinaryOp.MAX for v in g.values())
    (y,) = evaluate(g, [np.zeros((2, 6, 4), np.float32)])
    np.testing.assert_array_equal(y, np.array([2, 6, 4], np.int32))


# -- quantization ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_dequantize_per_tensor(zp_dtype: type) -> None:
    x = floats(3, 4) * 3
    inits = {"s": np.array(0.05, np.float32), "z": np.array(3, zp_dtype)}
    q = model([node("QuantizeLinear", ["x", "s", "z"])], {"x": x}, inits=inits, opset=21)
    check(q, {"x": x})
    xi = RNG.integers(np.iinfo(zp_dtype).min, np.iinfo(zp_dtype).max, (3, 4)).astype(zp_dtype)
    d = model([node("DequantizeLinear", ["x", "s", "z"])], {"x": xi}, inits=inits, opset=21)
    check(d, {"x": xi})


def test_quantize_per_axis_and_blocked() -> None:
    x = floats(2, 3, 4) * 4
    per_axis = {"s": np.array([0.1, 0.2, 0.05], np.float32), "z": np.array([0, 10, 250], np.uint8)}
    check(
        model(
            [node("QuantizeLinear", ["x", "s", "z"], axis=1)], {"x": x}, inits=per_axis, opset=21
        ),
        {"x": x},
    )
    blocked = {"s": np.abs(floats(2, 3, 2)) + 0.05, "z": ints(2, 3, 2, dtype=np.int8)}
    check(
        model(
            [node("QuantizeLinear", ["x", "s", "z"], axis=2, block_size=2)],
            {"x": x},
            inits=blocked,
            opset=21,
        ),
        {"x": x},
    )
    xi = ints(2, 3, 4, dtype=np.int8)
    check(
        model(
            [node("DequantizeLinear", ["x", "s", "z"], axis=2, block_size=2)],
            {"x": xi},
            inits=blocked,
            opset=21,
        ),
        {"x": xi},
    )


def test_dynamic_quantize_linear() -> None:
    x = floats(3, 5) * 2 + 0.5
    check(
        model(
            [node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
            {"x": x},
            ["y", "s", "z"],
            opset=11,
        ),
        {"x": x},
    )


def test_quantize_to_int4_is_refused_cleanly() -> None:
    x = floats(4)
    with pytest.raises(UnsupportedOnnxError):
        load_onnx(
            one(
                "QuantizeLinear",
                {"x": x, "s": np.array(0.1, np.float32)},
                opset=21,
                output_dtype=TensorProto.INT4,
            )
        )
