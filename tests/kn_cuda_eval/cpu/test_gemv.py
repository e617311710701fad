"""`gemv.c`'s `kn_gemv`, the decode product over weights packed in column strips, checked on
strips packed here by hand (every strip width and row count it is built for, whatever oneDNN
picks on this CPU) against a float64 product; and through `Device.cpu()`: decode and prefill
bindings agree with the product and share one packed copy of the weights."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_cuda_eval.cpu.onednn import gemv
from kn_graph.onnx import load_onnx
from kn_runtime.device import Device


def _strips(w: np.ndarray, b: int, a: int = 16) -> tuple[np.ndarray, int]:
    """W [k, n] as oneDNN's BA{a}a{b}b: strips of b columns, k padded to a multiple of a, n to a
    multiple of b with zeros; and the elements from one strip to the next."""
    k, n = w.shape
    kp, nb = -(-k // a) * a, -(-n // b)
    padded = np.zeros((kp, nb * b), np.float32)
    padded[:k, :n] = w
    return np.ascontiguousarray(padded.reshape(kp, nb, b).transpose(1, 0, 2)), kp * b


def _gemv(
    x: np.ndarray, packed: np.ndarray, strip: int, b: int, n: int, y: np.ndarray,
    alpha: float = 1.0, beta: float = 0.0,
) -> int:  # fmt: skip
    lib = gemv._library()
    assert lib is not None, "no C compiler"
    fn = ctypes.cast(lib.kn_gemv, ctypes.c_void_p).value
    q = (ctypes.c_longlong * 14)(
        fn, x.ctypes.data, x.strides[0] // 4, y.ctypes.data, y.strides[0] // 4,
        packed.ctypes.data, strip, x.shape[1], n, x.shape[0], b, 2,
        gemv._bits(alpha), gemv._bits(beta),
    )  # fmt: skip
    return gemv.HostCall(q, [])()


@pytest.mark.parametrize("b", [8, 16, 24, 32, 48, 64])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_every_strip_width_and_row_count_matches_the_product(b: int, rows: int) -> None:
    rng = np.random.default_rng(b * 10 + rows)
    k, n = 37, 3 * b + 5  # k not a multiple of the row blocks, a last strip partly filled
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    packed, strip = _strips(w, b)
    y = np.full((rows, n), np.nan, np.float32)  # beta 0: never read
    assert _gemv(x, packed, strip, b, n, y) == 0
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_alpha_beta_row_strides_and_what_lies_past_the_columns() -> None:
    rng = np.random.default_rng(7)
    k, n, b = 20, 70, 64
    w = rng.standard_normal((k, n)).astype(np.float32)
    xs = rng.standard_normal((3, k + 6)).astype(np.float32)  # rows 26 apart, 20 used
    ys = rng.standard_normal((3, n + 9)).astype(np.float32)  # rows 79 apart, 70 written
    before = ys.copy()
    packed, strip = _strips(w, b)
    assert _gemv(xs[:, :k], packed, strip, b, n, ys[:, :n], alpha=0.5, beta=-2.0) == 0
    want = 0.5 * (xs[:, :k].astype(np.float64) @ w) - 2.0 * before[:, :n]
    np.testing.assert_allclose(ys[:, :n], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ys[:, n:], before[:, n:])  # the gap after each row untouched


def test_a_nan_stays_in_its_row_and_an_inf_weight_in_its_column() -> None:
    rng = np.random.default_rng(3)
    k, n, b = 30, 100, 16
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[4, 17] = np.inf
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[1, 9] = np.nan
    packed, strip = _strips(w, b)
    y = np.empty((3, n), np.float32)
    assert _gemv(x, packed, strip, b, n, y) == 0
    assert np.isnan(y[1]).all()
    others = np.delete(y[[0, 2]], 17, axis=1)
    assert np.isfinite(others).all()
    assert not np.isfinite(y[[0, 2], 17]).any()


def test_widths_and_row_counts_it_was_not_built_for_are_refused() -> None:
    w = np.ones((4, 8), np.float32)
    packed, strip = _strips(w, 8)
    x, y = np.ones((5, 4), np.float32), np.zeros((5, 8), np.float32)
    assert _gemv(x, packed, strip, 8, 8, y) == 1  # 5 rows
    assert _gemv(x[:1], packed, strip, 12, 8, y[:1]) == 1  # no 12-wide strips
    assert (y == 0).all()


def test_decode_and_prefill_agree_and_share_the_packed_weights() -> None:
    """Through Device.cpu(): 64 rows (oneDNN's matmul) then 1-4 rows (kn_gemv where oneDNN
    packed in strips, its matmul elsewhere) give the product, and the packed weights are held
    once for every binding."""
    rng = np.random.default_rng(11)
    k, n = 300, 1000
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    prepared = Device.cpu(2).prepare(load_onnx(model.SerializeToString()))
    packed = None
    for rows in (64, 1, 2, 3, 4):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        [y] = prepared.eval([x])
        np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
        held = prepared.memory()["packed"]
        packed = held if packed is None else packed
        assert held == packed, f"{rows} rows packed the weights again: {held} != {packed}"


def _matmul_model(w: np.ndarray, elem: int) -> bytes:
    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", elem, ["rows", k])],
        [helper.make_tensor_value_info("y", elem, ["rows", n])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_nan_row_of_a_decode_batch_stays_in_its_row_through_the_executor() -> None:
    """Device.cpu(), 3 rows against packed weights (kn_gemv where oneDNN packs in strips): a
    NaN in one row's input makes that row NaN and leaves the others the product; an Inf
    weight makes its column non-finite and no other."""
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((130, 200)) * 0.1).astype(np.float32)
    w[7, 150] = np.inf
    prepared = Device.cpu(2).prepare(load_onnx(_matmul_model(w, TensorProto.FLOAT)))
    x = rng.standard_normal((3, 130)).astype(np.float32)
    x[1, 60] = np.nan
    [y] = prepared.eval([x])
    assert np.isnan(y[1]).all()
    finite = np.delete(np.arange(200), 150)
    want = x[[0, 2]].astype(np.float64) @ np.where(np.isinf(w), 0, w)
    np.testing.assert_allclose(y[[0, 2]][:, finite], want[:, finite], rtol=1e-4, atol=1e-4)
    assert not np.isfinite(y[[0, 2], 150]).any()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_products_of_few_rows_stay_exact(dtype: type) -> None:
    """kn_gemv is float32 only: an integer MatMul of 1-4 rows keeps its exact path, extremes
    that wrap included (the product modulo 2^bits, as onnxruntime computes it)."""
    info = np.iinfo(dtype)
    w = np.array([[info.max, 1, -1], [2, info.min, 0], [-3, 5, info.max]], dtype)
    elem = TensorProto.INT32 if dtype is np.int32 else TensorProto.INT64
    prepared = Device.cpu(2).prepare(load_onnx(_matmul_model(w, elem)))
    for rows in (1, 4):
        x = np.array([[1, 2, 3], [info.max, -1, 0], [0, 0, info.min], [7, -7, 1]], dtype)[:rows]
        [y] = prepared.eval([x])
        with np.errstate(over="ignore"):
            want = x @ w  # NumPy's integer product wraps as two's complement does
        np.testing.assert_array_equal(y, want)
