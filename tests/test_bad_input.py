"""Bad input gets a specific exception from our hierarchy naming what and where."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from kn_graph.cpu import evaluate
from kn_graph.errors import (
    InputMismatchError,
    KnError,
    OnnxImportError,
    ShapeMismatchError,
    StaticInputRequiredError,
    UnsupportedOnnxError,
)
from kn_graph.onnx import load_onnx
from kn_runtime import Device


def _mlp_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    shape = numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape"),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w1, b1, shape],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_mlp_loads_and_matches_numpy() -> None:
    m = _mlp_model()
    g = load_onnx(m.SerializeToString())
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    w1 = numpy_helper.to_array(m.graph.initializer[0])
    b1 = numpy_helper.to_array(m.graph.initializer[1])
    want = np.maximum(x @ w1 + b1, 0).reshape(-1, 2, 4)
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-6)


def test_missing_file() -> None:
    with pytest.raises(OnnxImportError, match=r"cannot read ONNX model '.*nope.onnx'"):
        load_onnx("/nonexistent/nope.onnx")


def test_truncated_model() -> None:
    data = _mlp_model().SerializeToString()
    with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
        load_onnx(data[: len(data) // 2])


def test_garbage_bytes() -> None:
    with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
        load_onnx(b"\xff\xfe this is not protobuf \x00\x01")


def test_empty_bytes() -> None:
    with pytest.raises(OnnxImportError, match="no graph"):
        load_onnx(b"")


def test_unsupported_op_names_node_and_op() -> None:
    n = helper.make_node("NoSuchOp", ["x"], ["y"], name="weird")
    g = helper.make_graph(
        [n],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedOnnxError) as e:
        load_onnx(helper.make_model(g))
    assert e.value.node_name == "weird" and e.value.op_type == "NoSuchOp"
    assert "node 'weird' (NoSuchOp)" in str(e.value)


def test_unknown_attribute_is_refused() -> None:
    n = helper.make_node("Relu", ["x"], ["y"], name="r", flavour=3)
    g = helper.make_graph(
        [n],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedOnnxError, match="attribute 'flavour'"):
        load_onnx(helper.make_model(g))


def test_undefined_name() -> None:
    n = helper.make_node("Relu", ["ghost"], ["y"], name="r")
    g = helper.make_graph(
        [n],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(OnnxImportError, match="uses 'ghost', which is not defined"):
        load_onnx(helper.make_model(g))


def test_missing_external_data(tmp_path) -> None:
    m = _mlp_model()
    onnx.save_model(
        m,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    g = load_onnx(tmp_path / "m.onnx")  # loads with the data file present
    assert len(g.inputs) == 1
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(OnnxImportError, match=r"cannot read external data file '.*weights.bin'"):
        load_onnx(tmp_path / "m.onnx")


def test_external_data_outside_model_folder_is_refused(tmp_path) -> None:
    m = _mlp_model()
    t = m.graph.initializer[0]
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value="../../etc/passwd")
    t.ClearField("raw_data")
    t.ClearField("float_data")
    with pytest.raises(OnnxImportError, match="leaves the model folder"):
        load_onnx(m, base_dir=tmp_path)


def test_static_input_required_names_the_input() -> None:
    n = helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")
    g = helper.make_graph(
        [n],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g)
    with pytest.raises(StaticInputRequiredError) as e:
        load_onnx(m, static=True)
    assert e.value.input_name == "s" and "input_values" in str(e.value)
    graph = load_onnx(m, input_values={"s": np.array([6], np.int64)})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(evaluate(graph, [x])[0], x.reshape(6))


@pytest.fixture
def mlp_prepared():
    return Device.cpu().prepare(load_onnx(_mlp_model()))


def test_wrong_input_count(mlp_prepared) -> None:
    with pytest.raises(InputMismatchError, match="expected 1 inputs \\(x\\), found 2"):
        mlp_prepared.eval([np.zeros((1, 4), np.float32)] * 2)


def test_wrong_input_dtype(mlp_prepared) -> None:
    with pytest.raises(InputMismatchError, match="input 'x': expected dtype f32, found float64"):
        mlp_prepared.eval([np.zeros((1, 4))])


def test_wrong_input_shape(mlp_prepared) -> None:
    with pytest.raises(ShapeMismatchError, match=r"input 'x', axis 1: expected size 4.*found 5"):
        mlp_prepared.eval([np.zeros((2, 5), np.float32)])


def test_wrong_input_rank(mlp_prepared) -> None:
    with pytest.raises(ShapeMismatchError, match="input 'x': expected rank 2"):
        mlp_prepared.eval([np.zeros((2, 4, 1), np.float32)])


def test_batch_size_contradicting_shapes() -> None:
    p = Device.cpu().prepare(load_onnx(_mlp_model()), batch_size=3)
    assert p.eval([np.zeros((3, 4), np.float32)])[0].shape == (3, 2, 4)
    with pytest.raises(
        ShapeMismatchError, match=r"input 'x', axis 0: expected size B = 3.*found 2"
    ):
        p.eval([np.zeros((2, 4), np.float32)])


def test_inputs_by_name_missing(mlp_prepared) -> None:
    with pytest.raises(InputMismatchError, match="missing \\['x'\\]"):
        mlp_prepared.eval({"z": np.zeros((1, 4), np.float32)})


_MODEL_BYTES = _mlp_model().SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(_MODEL_BYTES) - 1), st.integers(0, 255)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, len(_MODEL_BYTES)),
)
def test_fuzzed_model_bytes_raise_only_our_errors(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(_MODEL_BYTES)
    for pos, byte in edits:
        data[pos] = byte
    data = data[: max(cut, 1)] if cut < len(data) // 4 else data
    try:
        g = load_onnx(bytes(data))
    except KnError:
        return
    # a model that still loads must evaluate or fail cleanly too
    try:
        shapes = [g[v].shape for v in g.inputs]
        feed = [
            np.ones([d.eval({s: 2 for s in sh.symbols}) for d in sh], g[v].dtype.np)
            for v, sh in zip(g.inputs, shapes, strict=True)
        ]
        if sum(int(np.prod(a.shape)) for a in feed) < 10**6:
            evaluate(g, feed)
    except KnError:
        pass
