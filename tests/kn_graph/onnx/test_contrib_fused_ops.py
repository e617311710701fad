"""com.microsoft FusedMatMul, FusedGemm and FusedConv (what onnxruntime's extended graph
optimizations save) against onnxruntime, on the reference executor and Device.cpu()."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from kn_graph.errors import KnError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import model, ours, reference

RNG = np.random.default_rng(11)


def _com(
    nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], **kw: object
) -> onnx.ModelProto:
    m = model(nodes, inputs, **kw)  # type: ignore[arg-type]
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m


def _check(m: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    want = reference(m, feed)
    g = load_onnx(m)
    cpu = Device.cpu().prepare(g).eval({n: feed[n] for n in g.input_names})
    for got in (ours(m, feed), cpu):
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_fused_matmul(ta: int, tb: int) -> None:
    a = RNG.standard_normal((2, 3, 6, 5) if ta else (2, 3, 5, 6)).astype(np.float32)
    b = RNG.standard_normal((4, 6) if tb else (6, 4)).astype(np.float32)
    n = helper.make_node(
        "FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=ta, transB=tb, alpha=0.25
    )
    _check(_com([n], {"a": a}, inits={"b": b}), {"a": a})


@pytest.mark.parametrize(
    ("activation", "attrs"),
    [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {})],
)
def test_fused_gemm(activation: str, attrs: dict[str, float]) -> None:
    a = RNG.standard_normal((5, 8)).astype(np.float32)
    inits = {
        "b": RNG.standard_normal((3, 8)).astype(np.float32),
        "c": RNG.standard_normal(3).astype(np.float32),
    }
    n = helper.make_node(
        "FusedGemm",
        ["a", "b", "c"],
        ["y"],
        domain="com.microsoft",
        transB=1,
        alpha=0.5,
        activation=activation,
        **attrs,
    )
    _check(_com([n], {"a": a}, inits=inits), {"a": a})


@pytest.mark.parametrize(
    ("activation", "params"),
    [("Relu", []), ("Clip", [-0.5, 0.5]), ("HardSigmoid", [0.3, 0.4]), ("LeakyRelu", [0.1])],
)
def test_fused_conv(activation: str, params: list[float]) -> None:
    x = RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)
    inits = {
        "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(4).astype(np.float32),
    }
    n = helper.make_node(
        "FusedConv",
        ["x", "w", "b"],
        ["y"],
        domain="com.microsoft",
        pads=[1, 1, 1, 1],
        activation=activation,
        **({"activation_params": params} if params else {}),
    )
    _check(_com([n], {"x": x}, inits=inits), {"x": x})


def test_fused_conv_adds_the_residual_before_the_activation() -> None:
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    z = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    n = helper.make_node(
        "FusedConv",
        ["x", "w", "", "z"],
        ["y"],
        domain="com.microsoft",
        pads=[1, 1, 1, 1],
        activation="Relu",
    )
    m = _com([n], {"x": x, "z": z}, inits={"w": w})
    plain = model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "z"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        {"x": x, "z": z},
        inits={"w": w},
    )
    np.testing.assert_allclose(
        ours(m, {"x": x, "z": z})[0], reference(plain, {"x": x, "z": z})[0], rtol=1e-5, atol=1e-5
    )


def test_unknown_activation_names_the_node() -> None:
    a = RNG.standard_normal((2, 4)).astype(np.float32)
    n = helper.make_node(
        "FusedGemm", ["a", "b"], ["y"], domain="com.microsoft", name="fg", activation="Swish"
    )
    with pytest.raises(KnError, match=r"fg.*Swish"):
        load_onnx(_com([n], {"a": a}, inits={"b": np.ones((4, 2), np.float32)}))
