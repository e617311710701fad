"""`BatchedModel.run_batch`: many requests, as few evaluations as the graph allows, each answer
equal to evaluating that request alone on `Device.cpu()`; ragged sequences padded only where an
attention mask makes that exact; one bad request fails alone; concurrent callers get their own
answers."""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest

from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.errors import ArgumentValueError, RequestError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from kn_runtime.serve import BatchedModel, load_model
from tests.paths import MODELS, ROOT

TINY = ROOT / "kn_runtime" / "models" / "resnet_tiny.onnx"
RTOL, ATOL = 1e-4, 1e-5
"""A batch of several rows may take another blocking of the same convolution or GEMM than one
row: float32 sums in another order, a few ulps apart."""


def _counting(model: BatchedModel) -> list[int]:
    """Wrap the prepared graph's eval to count evaluations (and the rows of each)."""
    calls: list[int] = []
    inner = model.prepared.eval

    def counted(inputs, **kw):
        calls.append(next(iter(inputs.values())).shape[0])
        return inner(inputs, **kw)

    model.prepared.eval = counted  # type: ignore[method-assign]
    return calls


def _images(rng: np.random.Generator, rows: int, hw: int = 64) -> dict[str, np.ndarray]:
    return {"input": rng.standard_normal((rows, 3, hw, hw), dtype=np.float32)}


@pytest.fixture(scope="module")
def tiny() -> BatchedModel:
    return load_model(TINY, threads=2)


@pytest.fixture(scope="module")
def alone():
    """The independent answer: each request evaluated on its own by a separate prepared graph."""
    return Device.cpu(threads=2).prepare(load_onnx(TINY))


def test_requests_of_several_rows_share_one_evaluation(tiny: BatchedModel, alone) -> None:
    rng = np.random.default_rng(0)
    requests = [_images(rng, n) for n in (1, 2, 1, 3)]
    calls = _counting(tiny)
    try:
        answers = tiny.run_batch(requests)
    finally:
        del tiny.prepared.eval
    assert calls == [7]
    for request, answer in zip(requests, answers, strict=True):
        (want,) = alone.eval(request)
        assert answer["logits"].shape == want.shape
        np.testing.assert_allclose(answer["logits"], want, rtol=RTOL, atol=ATOL)


def test_max_batch_size_splits_the_rows(alone) -> None:
    model = load_model(TINY, threads=2, max_batch_size=3)
    rng = np.random.default_rng(1)
    requests = [_images(rng, n) for n in (1, 2, 1, 3, 4)]
    calls = _counting(model)
    answers = model.run_batch(requests)
    assert calls == [3, 1, 3, 4]  # a request over the cap runs alone, never split
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["logits"], alone.eval(request)[0], rtol=RTOL, atol=ATOL)


def test_a_batching_model_keeps_an_executor_for_every_batch_size(alone) -> None:
    """A server meets every batch size up to `max_batch_size`: once each has run (after the
    largest, which sizes the shared arena), none pushes another's executor out, so nothing is
    planned and compiled again; each size's answer is right."""
    model = load_model(TINY, threads=2, max_batch_size=12)
    rng = np.random.default_rng(4)
    cache = model.prepared.cache
    before = None
    for sizes in ([12, *range(1, 13)], range(12, 0, -1)):
        for rows in sizes:
            request = _images(rng, rows)
            (answer,) = model.run_batch([request])
            np.testing.assert_allclose(
                answer["logits"], alone.eval(request)[0], rtol=RTOL, atol=ATOL
            )
        if before is None:
            before = (cache.built, cache.dropped)
    assert (cache.built, cache.dropped) == before
    assert len(cache) == 12


def test_warm_up_plans_every_batch_size_before_the_first_request(alone) -> None:
    """After `warmup=True`, requests of every size up to the cap build nothing and let go of
    nothing (the largest was planned first, so no smaller executor went stale when the arena
    grew), and each answer is right."""
    model = load_model(TINY, threads=2, max_batch_size=6, warmup=True)
    cache = model.prepared.cache
    assert (cache.built, len(cache)) == (6, 6)
    before = (cache.built, cache.dropped)
    rng = np.random.default_rng(5)
    for rows in range(1, 7):
        request = _images(rng, rows)
        (answer,) = model.run_batch([request])
        np.testing.assert_allclose(answer["logits"], alone.eval(request)[0], rtol=RTOL, atol=ATOL)
    assert (cache.built, cache.dropped) == before


def test_warm_up_of_a_sequence_model_needs_its_other_sizes() -> None:
    path = MODELS / "bert_ts.onnx"
    model = load_model(path, threads=1, max_batch_size=3)
    with pytest.raises(ArgumentValueError, match=r"warm-up needs a size for seq.*input_ids"):
        model.warm_up()
    with pytest.raises(ArgumentValueError, match=r"name length, which no input has.*\['seq'\]"):
        model.warm_up({"seq": 8, "length": 8})
    assert model.warm_up({"seq": 8}) == 3
    cache = model.prepared.cache
    built = cache.built
    rng = np.random.default_rng(6)
    requests = [_bert_request(rng, 1, 8), _bert_request(rng, 2, 8)]
    answers = model.run_batch(requests)
    assert cache.built == built  # seq 8 at 3 rows was planned
    ref = Device.cpu(threads=1).prepare(load_onnx(path))
    for request, answer in zip(requests, answers, strict=True):
        want = dict(zip(model.output_names, ref.eval(request), strict=True))
        for name, got in answer.items():
            np.testing.assert_allclose(got, want[name], rtol=RTOL, atol=ATOL)


def test_warm_up_plans_no_more_sizes_than_the_graph_keeps() -> None:
    """A GPU keeps 8 executors: warming 16 sizes would evict the first ones it planned."""
    prepared = Device.cpu(threads=1).prepare(load_onnx(TINY), max_bindings=3)
    model = BatchedModel(prepared, max_batch_size=6)
    assert model.warm_up() == 3
    assert (prepared.cache.built, prepared.cache.dropped) == (3, 0)


def test_warm_up_has_nothing_to_plan_for_onnxruntime_or_an_uncapped_model() -> None:
    assert load_model(TINY, runtime="onnxruntime", max_batch_size=4).warm_up() == 0
    assert load_model(TINY, threads=1).warm_up() == 0  # no max_batch_size: no sizes to plan


def test_images_of_other_sizes_run_once_per_size() -> None:
    path = MODELS / "convnext_hw_dynamo.onnx"
    model = load_model(path, threads=2)
    assert model.batchable and model.inputs[0].shape == (None, 3, None, None)
    rng = np.random.default_rng(2)
    requests = [_images(rng, 1, 32), _images(rng, 2, 48), _images(rng, 1, 32)]
    calls = _counting(model)
    answers = model.run_batch(requests)
    assert sorted(calls) == [2, 2]
    ref = Device.cpu(threads=2).prepare(load_onnx(path))
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["logits"], ref.eval(request)[0], rtol=RTOL, atol=ATOL)


def _bert_request(rng: np.random.Generator, rows: int, seq: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": rng.integers(1, 100, (rows, seq), dtype=np.int64),
        "attention_mask": np.ones((rows, seq), np.int64),
        "token_type_ids": np.zeros((rows, seq), np.int64),
    }


def test_ragged_sequences_are_padded_under_the_attention_mask() -> None:
    """BERT `[batch, seq]` ids with an attention mask: three lengths, one evaluation; each
    request's `last_hidden_state` cut back to its own length and equal to evaluating it alone
    (and to onnxruntime's)."""
    import onnxruntime as ort

    path = MODELS / "bert_ts.onnx"
    model = load_model(path, threads=2)
    assert model.describe()["pads_sequences"]
    rng = np.random.default_rng(3)
    requests = [_bert_request(rng, 1, 5), _bert_request(rng, 2, 9), _bert_request(rng, 1, 7)]
    calls = _counting(model)
    answers = model.run_batch(requests)
    assert calls == [4]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for request, answer in zip(requests, answers, strict=True):
        hidden, pooled = session.run(None, request)
        assert answer["last_hidden_state"].shape == hidden.shape
        np.testing.assert_allclose(answer["last_hidden_state"], hidden, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(answer["pooler_output"], pooled, rtol=1e-3, atol=1e-4)


def test_without_a_mask_ragged_sequences_run_once_per_length() -> None:
    g = Graph()
    b, s = Size.sym("B"), Size.sym("S")
    x = g.input(Shape.of(b, s), DType.F32, "x")
    g.add_output(g.reduce(x, [1], ReduceOp.SUM), "total")  # padding would change it
    model = BatchedModel(Device.cpu().prepare(g))
    assert model.batchable and not model.describe()["pads_sequences"]
    requests = [{"x": np.ones((1, n), np.float32)} for n in (3, 5, 3)]
    calls = _counting(model)
    answers = model.run_batch(requests)
    assert sorted(calls) == [1, 2]
    assert [float(a["total"][0]) for a in answers] == [3.0, 5.0, 3.0]


def test_a_graph_without_a_batch_axis_runs_each_request_and_says_why(caplog) -> None:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 2), DType.F32, "x")
    g.add_output(g.view(x, [Size.sym("B") * 2]), "flat")  # the batch folded in
    model = BatchedModel(Device.cpu().prepare(g))
    assert not model.batchable and "flat" in model.why_not
    requests = [{"x": np.full((n, 2), n, np.float32)} for n in (1, 2)]
    with caplog.at_level(logging.WARNING):
        answers = model.run_batch(requests)
        model.run_batch(requests)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    np.testing.assert_array_equal(answers[1]["flat"], np.full(4, 2, np.float32))


def test_a_bad_request_fails_alone(tiny: BatchedModel, alone) -> None:
    rng = np.random.default_rng(4)
    good = _images(rng, 1)
    wrong_shape = {"input": np.zeros((1, 3, 32, 64), np.float32)}
    wrong_dtype = {"input": np.zeros((1, 3, 64, 64), np.float64)}
    answers = tiny.run_batch([good, wrong_shape, wrong_dtype, {}], return_exceptions=True)
    np.testing.assert_allclose(answers[0]["logits"], alone.eval(good)[0], rtol=RTOL, atol=ATOL)
    assert isinstance(answers[1], RequestError) and answers[1].status == 400
    assert "input 'input': expected shape [?, 3, 64, 64], found [1, 3, 32, 64]" in str(answers[1])
    assert "expected dtype float32, found float64" in str(answers[2])
    assert "missing ['input']" in str(answers[3])
    with pytest.raises(RequestError, match="expected shape"):
        tiny.run_batch([good, wrong_shape])


def test_lossless_casts_are_made() -> None:
    model = load_model(MODELS / "bert_ts.onnx", threads=1)
    rng = np.random.default_rng(5)
    request = _bert_request(rng, 1, 4)
    as_int32 = {k: v.astype(np.int32) for k, v in request.items()}
    np.testing.assert_array_equal(
        model.run(as_int32)["pooler_output"], model.run(request)["pooler_output"]
    )


def test_concurrent_callers_get_their_own_answers(tiny: BatchedModel, alone) -> None:
    rng = np.random.default_rng(6)
    requests = [_images(rng, 1 + i % 3) for i in range(16)]
    wants = [alone.eval(r)[0] for r in requests]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            pair = tiny.run_batch([requests[i], requests[(i + 1) % 16]])
            got[i] = pair[0]["logits"]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(got) == 16
    for i, want in enumerate(wants):
        np.testing.assert_allclose(got[i], want, rtol=RTOL, atol=ATOL)


def test_prepared_graph_run_batch_is_the_same_entry_point(alone) -> None:
    rng = np.random.default_rng(7)
    requests = [_images(rng, 2), _images(rng, 1)]
    answers = Device.cpu(threads=2).prepare(load_onnx(TINY)).run_batch(requests)
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["logits"], alone.eval(request)[0], rtol=RTOL, atol=ATOL)


def test_onnxruntime_behind_the_same_batching(alone) -> None:
    """The peer the serving benchmark measures through the same server code."""
    model = load_model(TINY, threads=1, runtime="onnxruntime")
    rng = np.random.default_rng(8)
    requests = [_images(rng, 2), _images(rng, 1)]
    for request, answer in zip(requests, model.run_batch(requests), strict=True):
        np.testing.assert_allclose(answer["logits"], alone.eval(request)[0], rtol=RTOL, atol=ATOL)


def test_nan_and_infinity_stay_in_their_own_request(tiny: BatchedModel, alone) -> None:
    """Non-finite inputs in one request: its answer equals evaluating it alone (NaN where that
    gives NaN), and the request batched beside it is untouched."""
    from kn_runtime.serve import codec

    rng = np.random.default_rng(9)
    bad = _images(rng, 1)
    bad["input"][0, 0, :2, :2] = [[np.nan, np.inf], [-np.inf, 0.0]]
    good = _images(rng, 2)
    body, ctype = codec.encode_response(bad, None, "application/json")  # NaN survives JSON
    doc = {"inputs": {"input": json.loads(body)["outputs"]["input"]}}
    back = codec.decode_request(json.dumps(doc).encode(), ctype, tiny)
    answers = tiny.run_batch([back, good])
    want_bad, want_good = alone.eval(bad)[0], alone.eval(good)[0]
    np.testing.assert_array_equal(np.isnan(answers[0]["logits"]), np.isnan(want_bad))
    np.testing.assert_allclose(answers[0]["logits"], want_bad, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(answers[1]["logits"], want_good, rtol=RTOL, atol=ATOL)
