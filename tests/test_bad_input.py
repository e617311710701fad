"""Bad input gets a specific exception from our hierarchy naming what and where."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    InputMismatchError,
    KnError,
    OnnxImportError,
    ShapeMismatchError,
    StaticInputRequiredError,
    UnsupportedOnnxError,
)
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
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


# -- robustness: every bad input is one clear KnError -------------------------------------------
def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=inits or [],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, elem: int, shape: list[object] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _scalar(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def test_range_over_a_declared_dim_of_2_31_loads_without_allocating() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["y"], name="pos"),
    ]
    inits = [_scalar("zero", 0, np.int64), _scalar("one", 1, np.int64)]
    m = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 2**31])], ["y"], inits)
    g = load_onnx(m)  # was a MemoryError: the 2^31 elements were a load-time constant
    assert g[g.outputs[0]].shape.fixed_dims() == (2**31,)
    consts = [g.const_value(v) for v in g.values()]
    assert all(c is None or c.size <= 1 for c in consts)  # an iota, no constant


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [(0, 2**40, 1, np.int64), (0.0, 1e12, 1.0, np.float32), (5, -(2**40), -3, np.int64)],
)
def test_range_with_huge_fixed_bounds_is_computed_by_the_graph(start, limit, delta, dtype) -> None:
    inits = [_scalar("a", start, dtype), _scalar("b", limit, dtype), _scalar("d", delta, dtype)]
    m = _model([helper.make_node("Range", ["a", "b", "d"], ["y"])], [], ["y"], inits)
    g = load_onnx(m)
    (n,) = g[g.outputs[0]].shape.fixed_dims()
    assert n == len(range(0, 2**40)) if start == 0 and dtype is np.int64 else n > 2**30


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [(3, 3 + 2 * (1 << 20) + 1, 2, np.int64), (0.5, (1 << 20) + 3.75, 1.0, np.float32)],
)
def test_a_range_longer_than_a_constant_matches_numpy(start, limit, delta, dtype) -> None:
    inits = [_scalar("a", start, dtype), _scalar("b", limit, dtype), _scalar("d", delta, dtype)]
    m = _model([helper.make_node("Range", ["a", "b", "d"], ["y"])], [], ["y"], inits)
    (y,) = evaluate(load_onnx(m), [])
    want = np.arange(start, limit, delta).astype(dtype)
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(y, want)


def test_range_with_an_infinite_bound_is_refused() -> None:
    inits = [_scalar("a", 0, np.float32), _scalar("b", np.inf, np.float32)]
    inits.append(_scalar("d", 1, np.float32))
    m = _model([helper.make_node("Range", ["a", "b", "d"], ["y"], name="r")], [], ["y"], inits)
    with pytest.raises(UnsupportedOnnxError, match=r"node 'r' \(Range\): .*finite"):
        load_onnx(m)


@pytest.mark.parametrize(
    ("data", "label", "message"),
    [
        (np.ones(16, np.float32), TensorProto.BFLOAT16, "holds 64 bytes, expected 32 for bfloat16"),
        (np.ones(16, np.float16), TensorProto.FLOAT, "holds 32 bytes, expected 64 for f32"),
        (np.ones(16, np.float32), TensorProto.FLOAT16, "holds 64 bytes, expected 32 for f16"),
        (np.ones(16, np.int64), TensorProto.INT32, "holds 128 bytes, expected 64 for i32"),
    ],
)
def test_an_initializer_whose_data_type_does_not_match_its_bytes(data, label, message) -> None:
    t = numpy_helper.from_array(data, "w")
    t.data_type = label
    x = _vi("x", TensorProto.FLOAT, [16])
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], ["y"], [t])
    with pytest.raises(OnnxImportError, match=f"initializer 'w': raw data {message}"):
        load_onnx(m)


def test_a_bfloat16_initializer_with_too_few_values_is_refused() -> None:
    t = onnx.TensorProto(name="w", data_type=TensorProto.BFLOAT16, dims=[4])
    t.int32_data.extend([0x3F80, 0x4000])  # 1.0 and 2.0: two values for four elements
    x = _vi("x", TensorProto.FLOAT, [4])
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], ["y"], [t])
    with pytest.raises(OnnxImportError, match="holds 2 values, expected 4"):
        load_onnx(m)


def test_negative_initializer_dims_are_refused() -> None:
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-1, 4])
    t.raw_data = np.ones(4, np.float32).tobytes()
    x = _vi("x", TensorProto.FLOAT, [1, 4])
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], ["y"], [t])
    with pytest.raises(OnnxImportError, match=r"initializer 'w': negative dims \[-1, 4\]"):
        load_onnx(m)


@pytest.mark.parametrize(
    ("cos_shape", "pos_shape", "message"),
    [
        ([], None, r"cos_cache must be \[batch, sequence, 2\].*found \[\]"),
        ([3, 2], None, r"cos_cache must be \[batch, sequence, 2\].*found \[3,2\]"),
        ([1, 3, 2, 1], None, "cos_cache must be"),
        ([8], [1, 3], r"cos_cache must be \[positions, 2\], found \[8\]"),
        ([8, 2], [], r"position_ids must be integers of shape \[1, 3\], found i64\[\]"),
        ([8, 2], [1, 3, 1], "position_ids must be integers of shape"),
    ],
)
def test_rotary_embedding_with_wrong_ranks_names_the_node(cos_shape, pos_shape, message) -> None:
    inputs = [
        _vi("x", TensorProto.FLOAT, [1, 2, 3, 4]),
        _vi("c", TensorProto.FLOAT, cos_shape),
        _vi("s", TensorProto.FLOAT, cos_shape),
    ]
    names = ["x", "c", "s"]
    if pos_shape is not None:
        inputs.append(_vi("p", TensorProto.INT64, pos_shape))
        names.append("p")
    node = helper.make_node("RotaryEmbedding", names, ["y"], name="rope")
    m = _model([node], inputs, ["y"], opset=23)
    with pytest.raises(
        UnsupportedOnnxError, match=r"node 'rope' \(RotaryEmbedding\): .*" + message
    ):
        load_onnx(m)


def test_a_nul_byte_in_the_model_path(tmp_path) -> None:
    with pytest.raises(ArgumentValueError, match=r"source: the path .* contains a NUL byte"):
        load_onnx(str(tmp_path / "a\0b.onnx"))
    with pytest.raises(ArgumentValueError, match="source"):
        load_onnx(tmp_path / "a\0b.onnx")


def _external_model(tmp_path, **info: str) -> object:
    """The MLP with w1 in `w.bin` (64 zero bytes of padding first), external_data from `info`."""
    m = _mlp_model()
    t = m.graph.initializer[0]
    data = t.raw_data
    (tmp_path / "w.bin").write_bytes(b"\0" * 64 + data)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    fields = {"location": "w.bin", "offset": "64", "length": str(len(data))} | info
    for k, v in fields.items():
        t.external_data.add(key=k, value=v)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_at_an_offset_loads(tmp_path) -> None:
    g = load_onnx(_external_model(tmp_path))
    np.testing.assert_allclose(
        evaluate(g, [np.ones((1, 4), np.float32)])[0],
        evaluate(load_onnx(_mlp_model()), [np.ones((1, 4), np.float32)])[0],
    )


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"location": "w\0.bin"}, "location 'w\\\\x00.bin' contains a NUL byte"),
        ({"length": str(2**40)}, "holds 192 bytes, but the tensor is at offset 64 with length"),
        ({"offset": str(2**40)}, "beyond its end"),
        ({"offset": "-8"}, "offset -8 and length 128 must be >= 0"),
        ({"length": "12abc"}, "offset/length must be integers"),
        ({"length": "64"}, "external data holds 64 bytes, expected 128 for f32"),
        ({"location": "."}, "cannot read external data file .*: Is a directory"),
    ],
)
def test_bad_external_data_is_refused_before_reading(tmp_path, info, message) -> None:
    with pytest.raises(OnnxImportError, match=f"initializer 'w1': .*{message}"):
        load_onnx(_external_model(tmp_path, **info))


def test_unknown_names_in_input_shapes_and_input_values() -> None:
    with pytest.raises(ArgumentValueError, match=r"input_shapes names \['y'\], which are not"):
        load_onnx(_mlp_model(), input_shapes={"y": [1, 4]})
    with pytest.raises(ArgumentValueError, match=r"input_values names \['z'\].*inputs are \['x'\]"):
        load_onnx(_mlp_model(), input_values={"z": np.zeros(1)})


_FLAGS = [
    ("ReduceSum", "keepdims", {}, [2, 2], 11),
    ("ArgMax", "select_last_index", {}, [2, 2], 13),
    ("Gemm", "transB", {}, [2, 2], 13),
    ("MaxPool", "ceil_mode", {"kernel_shape": [1, 1]}, [1, 1, 2, 2], 13),
    ("AveragePool", "count_include_pad", {"kernel_shape": [1, 1]}, [1, 1, 2, 2], 13),
    ("CumSum", "reverse", {}, [2, 2], 14),
    ("Mod", "fmod", {}, [2, 2], 13),
    ("Trilu", "upper", {}, [2, 2], 14),
]


@pytest.mark.parametrize(("op", "attr", "attrs", "shape", "opset"), _FLAGS)
@pytest.mark.parametrize("value", [2, -1])
def test_flag_attributes_other_than_0_or_1_are_refused(op, attr, attrs, shape, opset, value):
    inputs = {"Gemm": ["x", "x"], "Mod": ["x", "x"], "CumSum": ["x", "axis"]}.get(op, ["x"])
    inits = [_scalar("axis", 0, np.int64)] if op == "CumSum" else []
    node = helper.make_node(op, inputs, ["y"], name="n", **attrs, **{attr: value})
    m = _model([node], [_vi("x", TensorProto.FLOAT, shape)], ["y"], inits, opset)
    with pytest.raises(UnsupportedOnnxError, match=f"'{attr}' is a flag and must be 0 or 1"):
        load_onnx(m)
    next(a for a in m.graph.node[0].attribute if a.name == attr).i = 1
    load_onnx(m)  # 1 is fine


def _relu_then(nodes: list[onnx.NodeProto], inits=None, inputs=None) -> onnx.ModelProto:
    inputs = inputs or [_vi("x", TensorProto.FLOAT, [2])]
    return _model(nodes, inputs, [nodes[-1].output[0]], inits)


@pytest.mark.parametrize(
    ("nodes", "inits", "inputs", "message"),
    [
        (
            [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
            None,
            None,
            r"node 'Neg#1' \(Neg\) writes 'y', which is already defined",
        ),
        ([helper.make_node("Relu", ["x"], ["x"])], None, None, "writes 'x', which is already"),
        (
            [helper.make_node("Relu", ["x"], ["w"])],
            [numpy_helper.from_array(np.ones(2, np.float32), "w")],
            None,
            "writes 'w', which is already defined",
        ),
        (
            [helper.make_node("Split", ["x"], ["a", "a"], axis=0, num_outputs=2)],
            None,
            None,
            "writes 'a', which is already defined",
        ),
        (
            [helper.make_node("Relu", ["x"], ["y"])],
            None,
            [_vi("x", TensorProto.FLOAT, [2]), _vi("x", TensorProto.FLOAT, [2])],
            "graph input 'x' is declared twice",
        ),
    ],
)
def test_a_value_name_defined_twice_is_refused(nodes, inits, inputs, message) -> None:
    with pytest.raises(OnnxImportError, match=message):
        load_onnx(_relu_then(nodes, inits, inputs))


def test_an_initializer_given_twice_uses_the_last_as_onnxruntime_does() -> None:
    inits = [_scalar("w", [1.0, 1.0], np.float32), _scalar("w", [5.0, 7.0], np.float32)]
    m = _relu_then([helper.make_node("Add", ["x", "w"], ["y"])], inits)
    (y,) = evaluate(load_onnx(m), [np.zeros(2, np.float32)])
    np.testing.assert_array_equal(y, [5.0, 7.0])


def test_a_graph_output_listed_twice_is_returned_twice() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", TensorProto.FLOAT, [2])], ["y"])
    m.graph.output.append(m.graph.output[0])
    out = evaluate(load_onnx(m), [np.array([-1.0, 2.0], np.float32)])
    assert len(out) == 2 and out[0].tolist() == out[1].tolist() == [0.0, 2.0]


def test_a_model_without_any_opset_import_is_refused() -> None:
    m = _mlp_model()
    del m.opset_import[:]
    with pytest.raises(OnnxImportError, match="imports no opset"):
        load_onnx(m)


def test_a_model_importing_only_other_domains_reads_the_newest_default_opset() -> None:
    m = _mlp_model()
    del m.opset_import[:]
    m.opset_import.add(domain="com.microsoft", version=1)
    g = load_onnx(m)  # as onnxruntime does
    assert evaluate(g, [np.ones((1, 4), np.float32)])[0].shape == (1, 2, 4)


@pytest.mark.parametrize(
    ("source", "kwargs", "error", "message"),
    [
        (None, {}, ArgumentTypeError, "source: expected a path, bytes or an onnx.ModelProto"),
        (3, {}, ArgumentTypeError, "source: .* found int"),
        ("m", {"dims": {"batch": "x"}}, ArgumentTypeError, r"dims\['batch'\]: expected an int"),
        (
            "m",
            {"dims": {"batch": -1}},
            ArgumentValueError,
            r"dims\['batch'\]: expected a size >= 0",
        ),
        ("m", {"dims": {"batch": True}}, ArgumentTypeError, r"dims\['batch'\]"),
        ("m", {"dims": [("batch", 1)]}, ArgumentTypeError, "dims: expected a dict"),
        ("m", {"dims": {1: 2}}, ArgumentTypeError, "dims: expected names"),
        ("m", {"batch_axes": None}, ArgumentTypeError, "batch_axes: expected a collection"),
        ("m", {"batch_axes": "batch"}, ArgumentTypeError, "batch_axes: .* found str"),
        ("m", {"batch_axes": [1]}, ArgumentTypeError, r"batch_axes: expected dim names \(str\)"),
        ("m", {"input_shapes": {"x": [1.5, 4]}}, ArgumentTypeError, r"input_shapes\['x'\]"),
        ("m", {"input_shapes": {"x": [None, 4]}}, ArgumentTypeError, r"input_shapes\['x'\]"),
        ("m", {"input_shapes": {"x": "abc"}}, ArgumentTypeError, "expected a sequence of sizes"),
        ("m", {"input_shapes": {"x": [-2, 4]}}, ArgumentValueError, r"input_shapes\['x'\]"),
        ("m", {"input_values": {"x": [1.0] * 4}}, ArgumentTypeError, "expected a NumPy array"),
        ("m", {"input_values": {"x": "x"}}, ArgumentTypeError, r"input_values\['x'\]"),
        ("m", {"base_dir": 3}, ArgumentTypeError, "base_dir: expected a folder path"),
        ("m", {"base_dir": "a\0b"}, ArgumentValueError, "base_dir: .* NUL"),
        ("m", {"static": "yes"}, ArgumentTypeError, "static: expected a bool"),
    ],
)
def test_load_onnx_argument_misuse_names_the_argument(source, kwargs, error, message) -> None:
    with pytest.raises(error, match=message) as e:
        load_onnx(_mlp_model() if source == "m" else source, **kwargs)
    assert str(e.value).startswith("load_onnx: ")


def test_a_float_reshape_target_is_refused() -> None:
    shape = numpy_helper.from_array(np.array([np.nan, 4], np.float32), "shape")
    x = _vi("x", TensorProto.FLOAT, [2, 4])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")
    with pytest.raises(
        UnsupportedOnnxError, match=r"target shape .* must be integers, found float32"
    ):
        load_onnx(_model([node], [x], ["y"], [shape]))


def test_an_expand_to_rank_4096_is_refused() -> None:
    target = numpy_helper.from_array(np.ones(4096, np.int64), "t")
    node = helper.make_node("Expand", ["c", "t"], ["y"], name="ex")
    c = _scalar("c", [1], np.int64)
    with pytest.raises(UnsupportedOnnxError, match="rank 4096, more than 32"):
        load_onnx(_model([node], [], ["y"], [c, target]))


def test_gather_nd_with_runtime_indices_on_an_expression_dim() -> None:
    # the size value of `n + 1` (a constant term) used to trip an assertion in Graph.size_value
    x = _vi("x", TensorProto.FLOAT, [2, "n + 1"])
    idx = _vi("i", TensorProto.INT64, [3, 2])
    m = _model([helper.make_node("GatherND", ["x", "i"], ["y"])], [x, idx], ["y"], opset=13)
    g = load_onnx(m)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    i = np.array([[0, -1], [1, 2], [-2, 0]], np.int64)
    np.testing.assert_array_equal(evaluate(g, [a, i])[0], [a[0, -1], a[1, 2], a[-2, 0]])


def _one_node(op: str, inputs: list[tuple[str, list[object]]], opset: int = 17, **attrs):
    """A model of one node `op` over float inputs (name, shape), output `y`."""
    vis = [_vi(n, TensorProto.FLOAT, s) for n, s in inputs]
    node = helper.make_node(op, [n for n, _ in inputs], ["y"], name="n", **attrs)
    return _model([node], vis, ["y"], opset=opset)


@pytest.mark.parametrize(
    ("model", "message"),
    [  # each was an internal error, a hang or a MemoryError found by tests/fuzz
        (_one_node("LRN", [("x", [1, 3, 4, 4])], size=2**31), "size 2147483648 .supported: 1 to"),
        (
            _one_node("MaxPool", [("x", [1, 1, "h", "w"])], kernel_shape=[2**40, 3]),
            "kernel .* has more than 65536 positions",
        ),
        (
            _one_node("AveragePool", [("x", [1, 1, 2**31, 2])], kernel_shape=[1, 1], pads=[1] * 4),
            "too large for a count table",
        ),
        (_one_node("Conv", [("x", [1, 1, 4]), ("w", [1, 1, 0])]), "empty kernel axis"),
        (_one_node("ArgMax", [("x", [2, 0])], axis=1), "ArgMax over the empty axis 1"),
        (_one_node("ArgMax", [("x", [])]), "axis 0 of a rank-0 operand"),
        (
            _one_node("Attention", [(n, [1, 1, 3, 0]) for n in "qkv"], opset=23),
            "head size of Q .* is 0",
        ),
    ],
)
def test_fuzz_found_models_raise_one_clear_error(model, message) -> None:
    with pytest.raises(UnsupportedOnnxError, match=message):
        load_onnx(model)


def test_cumsum_of_a_scalar_is_refused() -> None:
    x = _vi("x", TensorProto.FLOAT, [])
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], name="cs")
    m = _model([node], [x], ["y"], [_scalar("axis", 0, np.int64)], opset=14)
    with pytest.raises(UnsupportedOnnxError, match="rank-0"):
        load_onnx(m)


def test_a_float_range_that_is_empty_by_far() -> None:
    inits = [_scalar("a", 0, np.float32), _scalar("b", -3.4e38, np.float32)]
    inits.append(_scalar("d", 1, np.float32))
    m = _model([helper.make_node("Range", ["a", "b", "d"], ["y"])], [], ["y"], inits)
    assert evaluate(load_onnx(m), [])[0].shape == (0,)  # NumPy's arange refuses it
