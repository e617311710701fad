"""Shape and data-movement ONNX ops (handlers/shape.py) against onnxruntime: each test builds a
one- or few-node model, loads it (symbolic dims where it matters) and compares the CPU executor's
outputs with onnxruntime's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from kn_graph.errors import (
    InputMismatchError,
    ShapeMismatchError,
    StaticInputRequiredError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.ops import Broadcast, View
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size
from kn_runtime import Device

Dims = Sequence[int | str]


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    *,
    inits: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, Dims] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """A model whose graph inputs are typed after `inputs` (shapes from `dims` when given)."""
    dims = dims or {}
    ins = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), list(dims.get(n, a.shape))
        )
        for n, a in inputs.items()
    ]
    init = [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()]
    g = helper.make_graph(
        list(nodes), "g", ins, [onnx.ValueInfoProto(name=n) for n in outputs], initializer=init
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    # onnxruntime wants typed outputs: take them from ONNX's own shape inference
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in inferred.graph.value_info}
    for o in model.graph.output:
        if o.name in types:
            o.type.CopyFrom(types[o.name])
        elif o.name in (i.name for i in model.graph.input):
            o.type.CopyFrom(next(i.type for i in model.graph.input if i.name == o.name))
    return model


def reference(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in sess.run(None, dict(inputs))]


def check(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    *,
    inits: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, Dims] | None = None,
    opset: int = 18,
    more: Sequence[Mapping[str, np.ndarray]] = (),
) -> Graph:
    """Load once (symbolic when `dims` name symbols), then compare every feed with onnxruntime."""
    model = make_model(nodes, inputs, outputs, inits=inits, dims=dims, opset=opset)
    g = load_onnx(model)
    for feed in [inputs, *more]:
        ours = evaluate(g, {n: feed[n] for n in g.input_names})
        for got, ref in zip(ours, reference(model, feed), strict=True):
            assert got.dtype == ref.dtype and got.shape == ref.shape, (
                got.dtype,
                got.shape,
                ref.dtype,
                ref.shape,
            )
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    return g


def node(op: str, ins: Sequence[str], outs: Sequence[str], **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, list(ins), list(outs), **attrs)


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


RNG = np.random.default_rng(0)
X234 = RNG.standard_normal((2, 3, 4)).astype(np.float32)


# -- Shape / Size ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "end"), [(None, None), (1, None), (-1, None), (0, -1), (2, 1), (-9, 9)]
)
def test_shape_start_end_clamp_like_python(start: int | None, end: int | None) -> None:
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check([node("Shape", ["x"], ["y"], **attrs)], {"x": X234}, ["y"])


def test_size_counts_elements() -> None:
    check([node("Size", ["x"], ["y"])], {"x": X234}, ["y"])


def test_shape_of_symbolic_input_is_a_known_of_sizes() -> None:
    """Shape arithmetic never enters the graph: Reshape(x, [Shape(x)[0], -1]) is one View."""
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["b"]),
        node("Unsqueeze", ["b", "zero1"], ["b1"]),
        node("Concat", ["b1", "rest"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "zero1": i64(0), "rest": i64(-1)}
    x5 = RNG.standard_normal((5, 3, 4)).astype(np.float32)
    g = check(nodes, {"x": X234}, ["y"], inits=inits, dims={"x": ["batch", 3, 4]}, more=[{"x": x5}])
    out = g.outputs[0]
    assert isinstance(g[out].op, View)
    assert g[out].shape == Shape.of(Size.sym("B"), 12)


# -- Reshape family ----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [(4, -1), (0, 0, -1), (-1,), (2, 0, 2, 2), (24,)])
def test_reshape_with_zero_copy_and_minus_one(target: tuple[int, ...]) -> None:
    check([node("Reshape", ["x", "t"], ["y"])], {"x": X234}, ["y"], inits={"t": i64(*target)})


def test_reshape_allowzero_keeps_zero_sizes() -> None:
    x = np.zeros((0, 3), np.float32)
    check(
        [node("Reshape", ["x", "t"], ["y"], allowzero=1)], {"x": x}, ["y"], inits={"t": i64(3, 0)}
    )


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten_axis(axis: int) -> None:
    check([node("Flatten", ["x"], ["y"], axis=axis)], {"x": X234}, ["y"])


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_and_unsqueeze_axes_attribute_then_input(opset: int) -> None:
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    if opset < 13:
        nodes = [
            node("Squeeze", ["x"], ["s"], axes=[0, -2]),
            node("Unsqueeze", ["s"], ["y"], axes=[-1, 0]),
        ]
        inits = None
    else:
        nodes = [node("Squeeze", ["x", "a"], ["s"]), node("Unsqueeze", ["s", "b"], ["y"])]
        inits = {"a": i64(0, -2), "b": i64(-1, 0)}
    check(nodes, {"x": x}, ["y", "s"], inits=inits, opset=opset)


def test_squeeze_without_axes_drops_every_one() -> None:
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    check([node("Squeeze", ["x"], ["y"])], {"x": x}, ["y"])


def test_squeeze_without_axes_on_symbolic_shape_is_loaded_per_shape() -> None:
    m = make_model([node("Squeeze", ["x"], ["y"])], {"x": X234}, ["y"], dims={"x": ["batch", 3, 4]})
    with pytest.raises(UnsupportedOnnxError, match="may be 1"):
        load_onnx(m, static=True)
    prepared = Device.cpu().prepare(load_onnx(m))  # whether batch is squeezed depends on it
    assert prepared.eval([X234[:1]])[0].shape == (3, 4)
    assert prepared.eval([X234])[0].shape == (2, 3, 4)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose_default_reverses(perm: list[int] | None) -> None:
    attrs = {"perm": perm} if perm is not None else {}
    check([node("Transpose", ["x"], ["y"], **attrs)], {"x": X234}, ["y"])


def test_concat_of_runtime_values_and_known_shapes() -> None:
    y = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    nodes = [
        node("Concat", ["x", "y"], ["c"], axis=-2),
        node("Shape", ["c"], ["s"]),
        node("Concat", ["s", "extra"], ["z"], axis=0),
    ]
    check(nodes, {"x": X234, "y": y}, ["c", "z"], inits={"extra": i64(7)})


# -- Split ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("opset", "n_out", "split", "attrs"),
    [
        (11, 2, [1, 3], {"axis": -1}),
        (13, 3, None, {"axis": 2}),
        (13, 2, [3, 1], {"axis": 2}),
        (18, 2, [0, 4], {"axis": 2}),
    ],
)
def test_split_sizes_from_attribute_input_or_equal(
    opset: int, n_out: int, split: list[int] | None, attrs: dict[str, object]
) -> None:
    x = RNG.standard_normal((2, 3, 6 if n_out == 3 else 4)).astype(np.float32)
    outs = [f"y{i}" for i in range(n_out)]
    inits = None
    ins = ["x"]
    if split is not None and opset < 13:
        attrs = {**attrs, "split": split}
    elif split is not None:
        ins, inits = ["x", "s"], {"s": i64(*split)}
    check([node("Split", ins, outs, **attrs)], {"x": x}, outs, inits=inits, opset=opset)


def test_split_num_outputs_uneven_last_chunk() -> None:
    x = RNG.standard_normal((7, 2)).astype(np.float32)
    outs = ["a", "b", "c"]
    check([node("Split", ["x"], outs, num_outputs=3)], {"x": x}, outs, opset=18)


def test_split_symbolic_axis_into_equal_halves() -> None:
    """An axis of 2·seq splits into two halves of seq."""
    y = RNG.standard_normal((2, 3)).astype(np.float32)
    y5 = RNG.standard_normal((2, 5)).astype(np.float32)
    nodes = [node("Concat", ["y", "y"], ["x"], axis=1), node("Split", ["x"], ["a", "b"], axis=1)]
    g = check(nodes, {"y": y}, ["a", "b"], dims={"y": [2, "seq"]}, opset=13, more=[{"y": y5}])
    assert g[g.outputs[1]].shape == Shape.of(2, Size.sym("seq"))


def test_split_of_a_symbolic_axis_guards_that_it_is_even() -> None:
    m = make_model(
        [node("Split", ["x"], ["a", "b"], axis=1)],
        {"x": X234},
        ["a", "b"],
        dims={"x": [2, "seq", 4]},
        opset=13,
    )
    g = load_onnx(m)
    x = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    a, b = evaluate(g, [x])
    np.testing.assert_array_equal(a, x[:, :3])
    np.testing.assert_array_equal(b, x[:, 3:])
    with pytest.raises(ShapeMismatchError, match=r"split of axis size seq into 2.*seq=5"):
        evaluate(g, [x[:, :5]])


# -- Expand / Tile / ConstantOfShape ----------------------------------------------------------------
@pytest.mark.parametrize("target", [(2, 3, 4), (3, 1), (5, 1, 1, 1), (1, 4)])
def test_expand_broadcasts_both_ways(target: tuple[int, ...]) -> None:
    x = RNG.standard_normal((3, 1)).astype(np.float32)
    check([node("Expand", ["x", "t"], ["y"])], {"x": x}, ["y"], inits={"t": i64(*target)})


def test_expand_to_symbolic_shape_is_a_broadcast() -> None:
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["c", "s"], ["y"])]
    x5 = RNG.standard_normal((5, 3, 4)).astype(np.float32)
    g = check(
        nodes,
        {"x": X234},
        ["y"],
        inits={"c": np.ones((1, 4), np.float32)},
        dims={"x": ["batch", 3, 4]},
        more=[{"x": x5}],
    )
    assert isinstance(g[g.outputs[0]].op, Broadcast)


@pytest.mark.parametrize("repeats", [(1, 1, 1), (2, 1, 3), (1, 0, 2)])
def test_tile(repeats: tuple[int, ...]) -> None:
    check([node("Tile", ["x", "r"], ["y"])], {"x": X234}, ["y"], inits={"r": i64(*repeats)})


def test_constant_of_shape_default_int_and_symbolic() -> None:
    value = numpy_helper.from_array(np.array([7], np.int32), "v")
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("ConstantOfShape", ["s"], ["zeros"]),
        node("ConstantOfShape", ["s"], ["sevens"], value=value),
    ]
    x5 = RNG.standard_normal((5, 3, 4)).astype(np.float32)
    g = check(
        nodes, {"x": X234}, ["zeros", "sevens"], dims={"x": ["batch", 3, 4]}, more=[{"x": x5}]
    )
    assert g[g.outputs[0]].shape == Shape.of(Size.sym("B"), 3, 4)


# -- Range ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "limit", "delta"),
    [(0, 5, 1), (10, 2, -3), (1.5, 4.0, 0.7), (3, 3, 1), (-2.0, 1.0, 0.25)],
)
def test_range_static(start: float, limit: float, delta: float) -> None:
    dt = np.float32 if isinstance(start, float) else np.int64
    inits = {"a": np.array(start, dt), "b": np.array(limit, dt), "c": np.array(delta, dt)}
    check(
        [node("Range", ["a", "b", "c"], ["y"]), node("Identity", ["x"], ["z"])],
        {"x": X234},
        ["y", "z"],
        inits=inits,
    )


def test_range_of_symbolic_length_is_iota() -> None:
    """Position ids: Range(0, Shape(x)[1], 1) keeps the symbolic sequence length."""
    nodes = [
        node("Shape", ["x"], ["s"], start=1, end=2),
        node("Squeeze", ["s", "zero1"], ["n"]),
        node("Range", ["zero", "n", "one"], ["pos"]),
        node("Range", ["zero", "n2", "two"], ["even"]),
        node("Mul", ["n", "two"], ["n2"]),
    ]
    nodes = [*nodes[:3], nodes[4], nodes[3]]
    inits = {
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "two": np.array(2, np.int64),
        "zero1": i64(0),
    }
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    x7 = RNG.standard_normal((2, 7)).astype(np.float32)
    g = check(
        nodes, {"x": x}, ["pos", "even"], inits=inits, dims={"x": [2, "seq"]}, more=[{"x": x7}]
    )
    assert g[g.outputs[0]].shape == Shape.of(Size.sym("seq"))


# -- Constant / Identity / Dropout ------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {"value_float": 2.5},
        {"value_floats": [1.0, -2.0]},
        {"value_int": 3},
        {"value_ints": [4, 5, 6]},
        {"value": numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3))},
    ],
)
def test_constant_attribute_forms(attrs: dict[str, object]) -> None:
    check(
        [node("Constant", [], ["c"], **attrs), node("Identity", ["x"], ["y"])],
        {"x": X234},
        ["c", "y"],
    )


def test_constant_int_value_is_known_at_load_time() -> None:
    m = make_model([node("Constant", [], ["c"], value_ints=[1, 2])], {}, ["c"])
    g = load_onnx(m)
    np.testing.assert_array_equal(g.const_value(g.outputs[0]), [1, 2])


def test_sparse_constant_is_refused() -> None:
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "v"),
        numpy_helper.from_array(i64(1), "i"),
        [3],
    )
    m = make_model([node("Constant", [], ["c"], sparse_value=sparse)], {}, ["c"])
    with pytest.raises(UnsupportedOnnxError, match="sparse"):
        load_onnx(m)


def test_dropout_at_inference_is_identity_with_all_true_mask() -> None:
    inits = {"r": np.array(0.3, np.float32), "t": np.array(False)}
    check(
        [node("Dropout", ["x", "r", "t"], ["y", "m"])],
        {"x": X234},
        ["y", "m"],
        inits=inits,
        opset=13,
    )
    check([node("Dropout", ["x"], ["y"], ratio=0.2)], {"x": X234}, ["y"], opset=11)


def test_dropout_training_with_zero_ratio_is_identity() -> None:
    inits = {"r": np.array(0.0, np.float32), "t": np.array(True)}
    check(
        [node("Dropout", ["x", "r", "t"], ["y", "m"])],
        {"x": X234},
        ["y", "m"],
        inits=inits,
        opset=13,
    )


def test_dropout_training_with_nonzero_ratio_is_refused() -> None:
    inits = {"r": np.array(0.3, np.float32), "t": np.array(True)}
    m = make_model([node("Dropout", ["x", "r", "t"], ["y"])], {"x": X234}, ["y"], inits=inits)
    with pytest.raises(UnsupportedOnnxError, match="training"):
        load_onnx(m)


def test_known_results_stay_known() -> None:
    """Integer ops on initializers fold at load time (no graph values are created)."""
    nodes = [node("Transpose", ["k"], ["t"]), node("Reshape", ["t", "s"], ["y"])]
    m = make_model(
        nodes, {}, ["y"], inits={"k": np.arange(6, dtype=np.int64).reshape(2, 3), "s": i64(-1)}
    )
    g = load_onnx(m)
    np.testing.assert_array_equal(
        g.const_value(g.outputs[0]), np.arange(6).reshape(2, 3).T.reshape(-1)
    )
    assert len(g) == 1


def test_split_with_symbolic_sizes_from_shapes() -> None:
    """Split(x, [seq, 0]) along a dynamic axis (rotary-embedding exports)."""
    x7 = RNG.standard_normal((2, 7)).astype(np.float32)
    nodes = [
        node("Shape", ["x"], ["s"], start=1, end=2),
        node("Concat", ["s", "zero"], ["sizes"], axis=0),
        node("Split", ["x", "sizes"], ["a", "b"], axis=1),
    ]
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    g = check(
        nodes,
        {"x": x},
        ["a", "b"],
        inits={"zero": i64(0)},
        dims={"x": [2, "seq"]},
        more=[{"x": x7}],
    )
    assert g[g.outputs[1]].shape == Shape.of(2, 0)


def test_squeeze_with_empty_axes_is_refused() -> None:
    """onnxruntime squeezes every size-1 axis for axes=[], the ONNX reference none: refuse."""
    x = np.zeros((1, 3), np.float32)
    m = make_model(
        [node("Squeeze", ["x", "a"], ["y"])], {"x": x}, ["y"], inits={"a": np.zeros(0, np.int64)}
    )
    with pytest.raises(UnsupportedOnnxError, match="empty axes"):
        load_onnx(m)


def test_static_input_computed_from_a_graph_input_names_that_input() -> None:
    """Reshape(x, Add(t, 0)) with t a graph input: the loader asks for t's value, then folds."""
    nodes = [node("Add", ["t", "zero"], ["t2"]), node("Reshape", ["x", "t2"], ["y"])]
    t = i64(4, 6)
    m = make_model(nodes, {"x": X234, "t": t}, ["y"], inits={"zero": i64(0)})
    with pytest.raises(StaticInputRequiredError) as e:
        load_onnx(m, static=True)
    assert e.value.input_name == "t"
    g = load_onnx(m, input_values={"t": t})
    np.testing.assert_array_equal(evaluate(g, [X234])[0], X234.reshape(4, 6))


def test_squeeze_of_an_axis_that_is_1_only_for_the_intended_inputs() -> None:
    """A voice-activity detector's pattern (issue 21): Squeeze of an axis whose size is an
    expression, `(samples+511)//512` here, that is 1 for the chunks the model is meant for. It
    loads with a guard; at a binding where the axis is 1 it equals onnxruntime on every
    executor, elsewhere it is our error naming the node, the size and the input axis."""
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in [("st", [0]), ("en", [2**62]), ("ax", [2]), ("sp", [512]), ("sq", [2])]
    ]
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
        helper.make_node("Squeeze", ["s", "sq"], ["q"], name="chunk"),
        helper.make_node("Relu", ["q"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, "samples"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    graph = load_onnx(m)
    x = np.random.default_rng(0).standard_normal((1, 4, 300)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    for device in (Device.cpu(reference=True), Device.cpu()):
        np.testing.assert_array_equal(device.prepare(graph).eval([x])[0], want)
    with pytest.raises(InputMismatchError, match=r"Squeeze 'chunk'.*samples=600"):
        Device.cpu().prepare(graph).eval([np.zeros((1, 4, 600), np.float32)])
