"""The HTTP bodies every front end shares: each request form decodes to the arrays it spells,
each response form decodes back to the outputs bit for bit, and every malformed body is a
RequestError with the status a server must answer."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from kn_graph.errors import InputMismatchError, RequestError
from kn_runtime import Device
from kn_runtime.serve import BatchedModel, codec
from tests.paths import MODELS


@pytest.fixture(scope="module")
def bert() -> BatchedModel:
    from kn_graph.onnx import load_onnx

    return BatchedModel(Device.cpu(threads=1).prepare(load_onnx(MODELS / "bert_ts.onnx")))


@pytest.fixture(scope="module")
def one_input() -> BatchedModel:
    from kn_graph import DType, Graph, Shape, Size

    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 2), DType.F32, "x")
    g.add_output(g.relu(x), "y")
    return BatchedModel(Device.cpu().prepare(g))


IDS = [[101, 7, 9]]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_json_forms_decode_to_the_model_dtypes(bert: BatchedModel) -> None:
    plain = {"input_ids": IDS, "attention_mask": [[1, 1, 1]], "token_type_ids": [[0, 0, 0]]}
    for doc in (
        {"inputs": plain},
        plain,
        {"inputs": {k: {"data": v[0], "shape": [1, 3]} for k, v in plain.items()}},
        {
            "inputs": [
                {"name": k, "shape": [1, 3], "datatype": "INT64", "data": v[0]}
                for k, v in plain.items()
            ]
        },
    ):
        got = codec.decode_request(json.dumps(doc).encode(), "application/json", bert)
        assert sorted(got) == sorted(plain)
        for k, v in plain.items():
            assert got[k].dtype == np.int64
            np.testing.assert_array_equal(got[k], np.array(v))


def test_npy_and_npz_bodies(bert: BatchedModel, one_input: BatchedModel) -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for ctype in ("application/x-npy", "application/octet-stream", None):
        got = codec.decode_request(_npy(x), ctype, one_input)
        np.testing.assert_array_equal(got["x"], x)
    buf = io.BytesIO()
    np.savez(buf, input_ids=np.array(IDS), attention_mask=np.ones((1, 3), np.int64))
    got = codec.decode_request(buf.getvalue(), "application/x-npz", bert)
    np.testing.assert_array_equal(got["input_ids"], np.array(IDS))
    with pytest.raises(RequestError, match=r"send an \.npz archive") as e:
        codec.decode_request(_npy(x), "application/x-npy", bert)
    assert e.value.status == 400


@pytest.mark.parametrize(
    ("body", "ctype", "status", "words"),
    [
        (b'{"inputs": {"x": [[1, 2]', "application/json", 400, "malformed JSON"),
        (b"[1, 2]", "application/json", 400, "expected an object"),
        (b'{"x": [[1, "a"]]}', "application/json", 400, "input 'x'"),
        (b'{"x": {"data": [1, 2, 3], "shape": [2, 2]}}', "application/json", 400, "holds 4"),
        (b'{"x": {"data": [1], "dtype": "nonsense"}}', "application/json", 400, "unknown dtype"),
        (b'{"inputs": [{"name": "x", "datatype": "FP99", "data": [1]}]}', None, 400, "FP99"),
        (b"\x93NUMPY garbage", "application/x-npy", 400, "not a readable .npy"),
        (b"PK garbage", "application/x-npz", 400, "not a readable .npz"),
        (b"x=1", "text/plain", 415, "unsupported media type"),
    ],
)
def test_malformed_bodies_get_their_status(
    one_input: BatchedModel, body: bytes, ctype: str | None, status: int, words: str
) -> None:
    with pytest.raises(RequestError, match=words) as e:
        codec.decode_request(body, ctype, one_input)
    assert e.value.status == status
    code, text = codec.encode_error(e.value)
    assert code == status and json.loads(text)["error"] == "RequestError"


def test_a_body_over_the_limit_is_413(one_input: BatchedModel) -> None:
    body = _npy(np.zeros((1000, 2), np.float32))
    with pytest.raises(RequestError, match="over the limit") as e:
        codec.decode_request(body, "application/x-npy", one_input, max_bytes=len(body) - 1)
    assert e.value.status == 413


def test_a_pickled_npy_never_loads(one_input: BatchedModel) -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(RequestError, match=r"not a readable \.npy"):
        codec.decode_request(buf.getvalue(), "application/x-npy", one_input)


@pytest.mark.parametrize(
    "a",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.asfortranarray(np.arange(24.0).reshape(4, 6)),
        np.arange(6, dtype=">i4").reshape(3, 2),
        np.float16(1.5) * np.ones((), np.float16),
        np.zeros((0, 2), np.int64),
    ],
    ids=["c-order", "fortran-order", "big-endian", "scalar", "empty"],
)
def test_npy_bodies_read_as_np_load_reads_them(a: np.ndarray) -> None:
    """The `.npy` reader views the body instead of copying it (np.load copies); what it reads
    is what np.load reads, in every header form: both memory orders, a byte order that is not
    the machine's, a 0-d and an empty array, and a version 2.0 header."""
    for version in ((1, 0), (2, 0)):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, version=version)
        body = buf.getvalue()
        got = codec._load_npy(body)
        want = np.load(io.BytesIO(body))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_npy_view_evaluates_on_the_cpu_with_nan_and_extreme_values(
    one_input: BatchedModel,
) -> None:
    """The read-only view goes through `Device.cpu()` as a copied array would: NaN stays NaN,
    infinities and the float32 extremes come back as relu gives them, and the body is not
    written to."""
    f32 = np.finfo(np.float32)
    x = np.array(
        [[np.nan, -np.nan], [np.inf, -np.inf], [f32.max, f32.min], [f32.tiny, -0.0]], np.float32
    )
    body = _npy(x)
    inputs = codec.decode_request(body, "application/x-npy", one_input)
    assert not inputs["x"].flags.writeable
    (got,) = one_input.run_batch([inputs])
    np.testing.assert_array_equal(got["y"], np.maximum(x, 0))  # NaN where x is NaN
    assert body == _npy(x)


def test_npy_integer_extremes_read_exactly() -> None:
    for dtype in (np.int64, np.uint64, np.int8):
        info = np.iinfo(dtype)
        a = np.array([info.min, info.max, 0, -1 if info.min else 1], dtype)
        got = codec._load_npy(_npy(a))
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)


def test_npy_bodies_of_the_wrong_length_are_400() -> None:
    body = _npy(np.arange(5, dtype=np.int64))
    for bad, found in ((body[:-3], 37), (body + b"\0", 41)):
        with pytest.raises(RequestError, match=f"{found} bytes of data.*\\[5\\] int64: 40") as e:
            codec._load_npy(bad)
        assert e.value.status == 400


def test_responses_decode_back_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    outs = {"y": rng.standard_normal((2, 3)).astype(np.float32), "k": np.arange(4)}
    body, ctype = codec.encode_response(outs, None, "application/json")
    assert ctype == "application/json"
    doc = json.loads(body)["outputs"]
    for name, a in outs.items():
        back = np.array(doc[name]["data"], dtype=doc[name]["dtype"]).reshape(doc[name]["shape"])
        np.testing.assert_array_equal(back, a)
    body, ctype = codec.encode_response({"y": outs["y"]}, None, "application/x-npy")
    assert ctype == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), outs["y"])
    body, ctype = codec.encode_response(outs, "application/x-npz", "application/json")
    assert ctype == "application/x-npz"
    with np.load(io.BytesIO(body)) as z:
        np.testing.assert_array_equal(z["k"], outs["k"])


def test_statuses_of_errors_that_are_not_request_errors() -> None:
    assert codec.http_status(InputMismatchError("x")) == 400
    status, body = codec.encode_error(RuntimeError("boom"))
    assert status == 500 and json.loads(body) == {
        "error": "internal error (RuntimeError)",
        "message": "boom",
    }
