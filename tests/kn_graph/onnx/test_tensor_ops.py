"""Indexing ONNX ops (handlers/tensor.py) and If (handlers/control.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from kn_graph.errors import EvaluationError, UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size
from kn_runtime import Device
from tests.kn_graph.onnx.test_shape_ops import check, i64, make_model, node

RNG = np.random.default_rng(1)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
BIG = 2**63 - 1


# -- Slice ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([0, 1], [2, 3], [0, 1], [1, 1]),
        ([-1], [-BIG], [2], [-1]),  # full reversal
        ([4], [0], [-1], [-2]),
        ([-100], [100], [1], [1]),  # clamped both ways
        ([10], [20], [2], [1]),  # empty
        ([1], [BIG], [0], [2]),
        ([3], [-10], [2], [-1]),
        ([-100], [-BIG], [2], [-1]),  # start clamps to 0 on a negative step: one element
    ],
)
def test_slice_clamps_and_steps_like_onnx(
    starts: list[int], ends: list[int], axes: list[int], steps: list[int]
) -> None:
    inits = {"s": i64(*starts), "e": i64(*ends), "a": i64(*axes), "t": i64(*steps)}
    check([node("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": X}, ["y"], inits=inits)


def test_slice_default_axes_and_steps() -> None:
    check(
        [node("Slice", ["x", "s", "e"], ["y"])],
        {"x": X},
        ["y"],
        inits={"s": i64(1, 1), "e": i64(3, -1)},
    )


def test_slice_attributes_before_opset_10() -> None:
    check(
        [node("Slice", ["x"], ["y"], starts=[1, -3], ends=[BIG, -1], axes=[0, 2])],
        {"x": X},
        ["y"],
        opset=9,
    )


def test_slice_on_symbolic_axis_keeps_the_symbol() -> None:
    """On a dynamic sequence axis x[:, :2] has a fixed size and x[:, 0:INT_MAX] is the whole axis."""
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    nodes = [
        node("Slice", ["x", "zero", "two", "one"], ["head"]),
        node("Slice", ["x", "zero", "big", "one"], ["all"]),
    ]
    inits = {"zero": i64(0), "two": i64(2), "one": i64(1), "big": i64(BIG)}
    g = check(
        nodes, {"x": X}, ["head", "all"], inits=inits, dims={"x": [3, "seq", 5]}, more=[{"x": x7}]
    )
    assert g[g.outputs[0]].shape == Shape.of(3, 2, 5)
    assert g[g.outputs[1]].shape == Shape.of(3, Size.sym("seq"), 5)


def test_slice_last_elements_of_symbolic_axis_starts_at_an_expression() -> None:
    """x[:, -2:] (a GPT-style last-token slice) on a dynamic axis: a slice from seq-2."""
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    inits = {"s": i64(-2), "e": i64(BIG), "a": i64(1)}
    g = check(
        [node("Slice", ["x", "s", "e", "a"], ["y"])],
        {"x": X},
        ["y"],
        inits=inits,
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )
    assert g[g.outputs[0]].op.start == Size.sym("seq") - 2


def test_slice_with_symbolic_end_from_a_shape() -> None:
    """cos_cached[:seq] (rotary tables) where seq comes from another input's shape."""
    table = RNG.standard_normal((16, 4)).astype(np.float32)
    nodes = [
        node("Shape", ["x"], ["s"], start=1, end=2),
        node("Slice", ["t", "zero", "s", "zero"], ["y"]),
    ]
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    g = check(
        nodes,
        {"x": X},
        ["y"],
        inits={"t": table, "zero": i64(0)},
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )
    assert g[g.outputs[0]].shape == Shape.of(Size.sym("seq"), 4)


def test_slice_mixing_start_and_end_of_symbolic_axis() -> None:
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    g = check(
        [node("Slice", ["x", "s", "e", "a"], ["y"])],
        {"x": X},
        ["y"],
        inits={"s": i64(1), "e": i64(-1), "a": i64(1)},
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )
    assert str(g[g.outputs[0]].shape) == "[3,seq-2,5]"


# -- Gather family ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("axis", "indices"),
    [
        (0, np.array([2, -1, 0])),
        (1, np.array([[0, -4], [3, 1]])),
        (2, np.array(-2)),
        (-1, np.array([4, 4])),
    ],
)
def test_gather_constant_indices_any_rank_and_negative(axis: int, indices: np.ndarray) -> None:
    check(
        [node("Gather", ["x", "i"], ["y"], axis=axis)],
        {"x": X},
        ["y"],
        inits={"i": indices.astype(np.int64)},
    )


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_gather_runtime_indices_wrap_negatives(dtype: type) -> None:
    idx = np.array([[1, -1], [-3, 0]], dtype)
    check([node("Gather", ["x", "i"], ["y"], axis=1)], {"x": X, "i": idx}, ["y"])


def test_gather_negative_constant_index_on_symbolic_axis() -> None:
    """x[:, -1] on a dynamic sequence: the index becomes seq-1 at runtime."""
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    check(
        [node("Gather", ["x", "i"], ["y"], axis=1)],
        {"x": X},
        ["y"],
        inits={"i": np.array(-1, np.int64)},
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )


def test_gather_out_of_range_constant_index_is_refused() -> None:
    m = make_model([node("Gather", ["x", "i"], ["y"])], {"x": X}, ["y"], inits={"i": i64(3)})
    with pytest.raises(UnsupportedOnnxError, match="out of range"):
        load_onnx(m)


def test_gather_on_shape_tensor_stays_known() -> None:
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "i"], ["d"]),
        node("Reshape", ["x", "d2"], ["y"]),
        node("Concat", ["d1", "m1"], ["d2"], axis=0),
        node("Unsqueeze", ["d", "zero"], ["d1"]),
    ]
    nodes = [nodes[0], nodes[1], nodes[4], nodes[3], nodes[2]]
    x7 = RNG.standard_normal((7, 4, 5)).astype(np.float32)
    g = check(
        nodes,
        {"x": X},
        ["y"],
        inits={"i": np.array(0, np.int64), "zero": i64(0), "m1": i64(-1)},
        dims={"x": ["batch", 4, 5]},
        more=[{"x": x7}],
    )
    assert g[g.outputs[0]].shape == Shape.of(Size.sym("B"), 20)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("static", [True, False])
def test_gather_elements(axis: int, static: bool) -> None:
    shape = list(X.shape)
    shape[axis] = 2
    idx = RNG.integers(-X.shape[axis], X.shape[axis], size=shape).astype(np.int64)
    if static:
        check(
            [node("GatherElements", ["x", "i"], ["y"], axis=axis)],
            {"x": X},
            ["y"],
            inits={"i": idx},
        )
    else:
        check([node("GatherElements", ["x", "i"], ["y"], axis=axis)], {"x": X, "i": idx}, ["y"])


@pytest.mark.parametrize(
    ("batch_dims", "idx_shape", "depth"),
    [(0, (2,), 2), (0, (2, 3), 1), (0, (4, 3), 3), (1, (3, 2), 1), (2, (3, 4, 1), 1)],
)
@pytest.mark.parametrize("static", [True, False])
def test_gather_nd(batch_dims: int, idx_shape: tuple[int, ...], depth: int, static: bool) -> None:
    dims = X.shape[batch_dims : batch_dims + depth]
    idx = np.stack([RNG.integers(-d, d, size=idx_shape[:-1]) for d in dims], axis=-1).astype(
        np.int64
    )
    n = node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    if static:
        check([n], {"x": X}, ["y"], inits={"i": idx})
    else:
        check([n], {"x": X, "i": idx}, ["y"])


@pytest.mark.parametrize("axis", [None, 0, 2])
def test_compress(axis: int | None) -> None:
    cond = np.array([True, False, True, True][: 3 if axis == 0 else 4])
    attrs = {} if axis is None else {"axis": axis}
    check([node("Compress", ["x", "c"], ["y"], **attrs)], {"x": X}, ["y"], inits={"c": cond})


@pytest.mark.parametrize(
    ("batch_axis", "time_axis", "lens"), [(1, 0, [3, 1, 2, 0]), (0, 1, [4, 2, 1])]
)
def test_reverse_sequence(batch_axis: int, time_axis: int, lens: list[int]) -> None:
    x = np.ascontiguousarray(
        X[:, :, 0] if batch_axis == 1 else X[:, :4, 0]
    )  # [time, batch] or [batch, time]
    n = node("ReverseSequence", ["x", "l"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
    check([n], {"x": x}, ["y"], inits={"l": i64(*lens)})


# -- Pad / CenterCropPad ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 0, 2, 1), (1, 0, -1, 0, 1, 2)])
def test_pad_modes(mode: str, pads: tuple[int, ...]) -> None:
    ins = ["x", "p", "v"] if mode == "constant" else ["x", "p"]
    inits = {"p": i64(*pads), "v": np.array(1.5, np.float32)}
    check([node("Pad", ins, ["y"], mode=mode)], {"x": X}, ["y"], inits=inits, opset=19)


def test_pad_axes_input_and_attribute_form() -> None:
    inits = {"p": i64(1, 2, 3, 0), "a": i64(-1, 0)}
    check([node("Pad", ["x", "p", "", "a"], ["y"])], {"x": X}, ["y"], inits=inits)
    check(
        [node("Pad", ["x"], ["y"], pads=[0, 1, 0, 2, 0, 1], value=-2.0)], {"x": X}, ["y"], opset=10
    )


def test_pad_value_computed_at_load_time() -> None:
    """A constant_value written as Cast(-inf) folds to a constant when the model loads."""
    nodes = [node("Cast", ["ninf"], ["v"], to=10), node("Pad", ["x", "p", "v"], ["y"])]
    x = X.astype(np.float16)
    check(
        nodes,
        {"x": x},
        ["y"],
        inits={"ninf": np.array(-np.inf, np.float32), "p": i64(0, 1, 0, 0, 0, 1)},
    )


def test_pad_fixed_axes_of_symbolic_shape() -> None:
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    check(
        [node("Pad", ["x", "p"], ["y"])],
        {"x": X},
        ["y"],
        inits={"p": i64(2, 0, 0, 0, 0, 1)},
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )


def test_pad_growing_a_symbolic_axis() -> None:
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    g = check(
        [node("Pad", ["x", "p"], ["y"])],
        {"x": X},
        ["y"],
        inits={"p": i64(0, 2, 0, 0, 0, 0)},
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )
    assert str(g[g.outputs[0]].shape) == "[3,seq+2,5]"


@pytest.mark.parametrize(("shape", "axes"), [((2, 6, 5), None), ((5, 1), [0, -1]), ((4,), [1])])
def test_center_crop_pad(shape: tuple[int, ...], axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    check(
        [node("CenterCropPad", ["x", "s"], ["y"], **attrs)],
        {"x": X},
        ["y"],
        inits={"s": i64(*shape)},
    )


# -- masks, one-hot, eye ----------------------------------------------------------------------------
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2, 7])
def test_trilu(upper: int, k: int | None) -> None:
    ins, inits = (["x"], None) if k is None else (["x", "k"], {"k": np.array(k, np.int64)})
    check([node("Trilu", ins, ["y"], upper=upper)], {"x": X}, ["y"], inits=inits)


def test_trilu_of_symbolic_square_mask() -> None:
    x = np.ones((4, 4), np.float32)
    x6 = np.ones((6, 6), np.float32)
    check(
        [node("Trilu", ["x"], ["y"], upper=0)],
        {"x": x},
        ["y"],
        dims={"x": ["seq", "seq"]},
        more=[{"x": x6}],
    )


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis: int) -> None:
    idx = np.array([[0, 3, -1], [-4, 5, 2]], np.int64)  # 5 and -4 (with depth 4: -4 → 0) edge cases
    inits = {"d": np.array(4, np.int64), "v": np.array([-1.0, 2.0], np.float32)}
    check([node("OneHot", ["i", "d", "v"], ["y"], axis=axis)], {"i": idx}, ["y"], inits=inits)


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -2, "dtype": 6}, {"k": 4, "dtype": 7}])
def test_eye_like(attrs: dict[str, int]) -> None:
    x = np.zeros((3, 5), np.float32)
    check([node("EyeLike", ["x"], ["y"], **attrs)], {"x": x}, ["y"])


def test_eye_like_bool() -> None:
    """onnxruntime has no bool EyeLike: NumPy is the reference."""
    m = make_model(
        [node("EyeLike", ["x"], ["y"], k=-1, dtype=9)], {"x": np.zeros((4, 3), np.float32)}, ["y"]
    )
    (y,) = evaluate(load_onnx(m), [np.zeros((4, 3), np.float32)])
    np.testing.assert_array_equal(y, np.eye(4, 3, k=-1, dtype=bool))


# -- blocks -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode: str) -> None:
    x = RNG.standard_normal((2, 8, 3, 2)).astype(np.float32)
    check([node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)], {"x": x}, ["y"])
    z = RNG.standard_normal((2, 2, 4, 6)).astype(np.float32)
    check([node("SpaceToDepth", ["z"], ["y"], blocksize=2)], {"z": z}, ["y"])


# -- scatter ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_with_repeated_positions(reduction: str) -> None:
    data = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[1, 1], [0, -1], [3, 3]], np.int64)
    if reduction == "none":
        idx = np.array([[1, 0], [0, -1], [3, 2]], np.int64)
    upd = RNG.standard_normal((3, 2)).astype(np.float32)
    n = node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction=reduction)
    check([n], {"d": data, "u": upd}, ["y"], inits={"i": idx})


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd(reduction: str) -> None:
    data = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[1], [3]] if reduction == "none" else [[1], [1], [-1]], np.int64)
    upd = RNG.standard_normal((idx.shape[0], 3, 2)).astype(np.float32)
    check(
        [node("ScatterND", ["d", "i", "u"], ["y"], reduction=reduction)],
        {"d": data, "u": upd},
        ["y"],
        inits={"i": idx},
    )


def test_scatter_with_runtime_indices_loads_once() -> None:
    data = np.zeros((3, 4), np.float32)
    m = make_model(
        [node("ScatterElements", ["d", "i", "u"], ["y"])],
        {"d": data, "i": np.zeros((1, 4), np.int64), "u": np.ones((1, 4), np.float32)},
        ["y"],
    )
    idx = np.array([[2, 0, 1, 2]], np.int64)
    (y,) = (
        Device.cpu()
        .prepare(load_onnx(m, static=True))  # indices from data: no specialization needed
        .eval({"d": data, "i": idx, "u": np.ones((1, 4), np.float32)})
    )
    want = data.copy()
    want[idx[0], np.arange(4)] = 1.0
    np.testing.assert_array_equal(y, want)


# -- If ---------------------------------------------------------------------------------------------
def _branch(name: str, op: str) -> onnx.GraphProto:
    out = helper.make_tensor_value_info(f"{name}_y", 1, None)
    return helper.make_graph([node(op, ["x"], [f"{name}_y"])], name, [], [out])


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_known_condition_inlines_the_taken_branch(cond: bool) -> None:
    n = node(
        "If", ["c"], ["y"], then_branch=_branch("then", "Neg"), else_branch=_branch("else", "Abs")
    )
    g = check([n], {"x": X}, ["y"], inits={"c": np.array(cond)})
    assert len([v for v in g.values() if g[v].op.NAME == "unary"]) == 1


def test_if_on_shape_comparison() -> None:
    """The condition Equal(Size(x), 60) is decided while loading."""
    nodes = [
        node("Size", ["x"], ["n"]),
        node("Equal", ["n", "sixty"], ["c"]),
        node(
            "If",
            ["c"],
            ["y"],
            then_branch=_branch("then", "Neg"),
            else_branch=_branch("else", "Abs"),
        ),
    ]
    check(nodes, {"x": X}, ["y"], inits={"sixty": np.array(60, np.int64)})


def test_if_with_runtime_condition_runs_the_taken_branch() -> None:
    """A data condition loads once (no specialization) and runs only the branch it picks."""
    n = node(
        "If", ["c"], ["y"], then_branch=_branch("then", "Neg"), else_branch=_branch("else", "Abs")
    )
    m = make_model([n], {"x": X, "c": np.array(True)}, ["y"])
    graph = load_onnx(m, static=True)
    prepared = Device.cpu().prepare(graph)
    for c, want in ((True, -X), (False, np.abs(X)), (True, -X)):
        np.testing.assert_array_equal(prepared.eval({"x": X, "c": np.array(c)})[0], want)


def test_slice_reversal_of_symbolic_axis() -> None:
    """torch.flip exports x[:, ::-1] as Slice(-1, -INT64_MAX, step -1)."""
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    inits = {"s": i64(-1), "e": i64(-BIG), "a": i64(1), "t": i64(-1)}
    check(
        [node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
        {"x": X},
        ["y"],
        inits=inits,
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )


def test_pad_cropping_more_than_the_axis_is_refused() -> None:
    m = make_model(
        [node("Pad", ["x", "p"], ["y"])], {"x": X}, ["y"], inits={"p": i64(0, -3, 0, 0, -2, 0)}
    )
    with pytest.raises(UnsupportedOnnxError, match="crop more"):
        load_onnx(m)


@pytest.mark.parametrize("op", ["GatherElements", "GatherND"])
def test_out_of_range_runtime_indices_raise_instead_of_reading_a_neighbour(op: str) -> None:
    """Index 5 on an axis of 5 would alias the next row of the flattened data: it raises instead."""
    idx = (
        np.full((3, 4, 1), 5, np.int64)
        if op == "GatherElements"
        else np.array([[0, 1, 5]], np.int64)
    )
    m = make_model(
        [node(op, ["x", "i"], ["y"], **({"axis": 2} if op == "GatherElements" else {}))],
        {"x": X, "i": idx},
        ["y"],
    )
    with pytest.raises(EvaluationError, match="out of range"):
        evaluate(load_onnx(m), [X, idx])


@pytest.mark.parametrize(
    ("start", "end", "length"), [(-BIG, BIG, "seq"), (BIG, BIG, 0), (0, -BIG, 0)]
)
def test_slice_infinite_bounds_on_symbolic_axis(start: int, end: int, length: int | str) -> None:
    x7 = RNG.standard_normal((3, 7, 5)).astype(np.float32)
    inits = {"s": i64(start), "e": i64(end), "a": i64(1)}
    g = check(
        [node("Slice", ["x", "s", "e", "a"], ["y"])],
        {"x": X},
        ["y"],
        inits=inits,
        dims={"x": [3, "seq", 5]},
        more=[{"x": x7}],
    )
    want = Size.sym("seq") if length == "seq" else Size(length)
    assert g[g.outputs[0]].shape == Shape.of(3, want, 5)


def test_slice_int_max_end_with_negative_step_is_refused() -> None:
    """The spec clamps such an end to the last element, onnxruntime reads it as "to the start"."""
    inits = {"s": i64(2), "e": i64(2**31 - 1), "a": i64(0), "t": i64(-1)}
    m = make_model([node("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": X}, ["y"], inits=inits)
    with pytest.raises(UnsupportedOnnxError, match="disagree"):
        load_onnx(m)
