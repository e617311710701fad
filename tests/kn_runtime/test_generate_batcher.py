"""Continuous batching (`kn_runtime.generate.Batcher`): requests submitted from several threads,
at once and while others run, share decode steps, and each one's greedy tokens are those it gets
alone (the stored onnxruntime continuation for the fixture's prompt)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kn_graph.errors import ArgumentValueError
from kn_runtime import Device, load_generator
from kn_runtime.generate import Batcher
from tests.paths import MODELS

LLM = MODELS / "llm"


class _Gated:
    """The model of a batcher whose `call`-th forward waits for `go` (the test's thread has
    submitted what it means to join by then): the join happens at a known step whatever the
    speed of the machine, not when the loop thread happens to be slow."""

    def __init__(self, model: object, call: int) -> None:
        self._model, self._call, self._calls = model, call, 0
        self.go = threading.Event()

    def forward(self, *args: object) -> object:
        self._calls += 1
        if self._calls == self._call and not self.go.wait(timeout=120):
            raise TimeoutError("the test never released the gated forward")
        return self._model.forward(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


def _prompts(folder: str = "llama_optimum") -> list[list[int]]:
    ref = np.load(LLM / folder / "reference.npz")
    first = ref["prompt_ids"][0].tolist()
    mask = ref["batch_mask"]
    rows = [ref["batch_ids"][i][mask[i] == 1].tolist() for i in range(2)]
    return [first, *rows, first[:3]]


@pytest.mark.parametrize(
    ("folder", "device"),
    [
        ("llama_optimum", "reference"),
        ("llama_optimum", "cpu"),
        ("qwen2_optimum", "cpu"),
        ("gpt2_optimum", "cpu"),
        ("qwen2_genai", "cpu"),  # GroupQueryAttention: pasts padded at their end
        ("qwen2_genai_int4", "cpu"),
    ],
)
def test_concurrent_requests_share_steps_and_keep_their_tokens(folder: str, device: str) -> None:
    gen = load_generator(
        LLM / folder, Device.cpu(reference=True) if device == "reference" else Device.cpu()
    )
    prompts = _prompts(folder)
    new = [24, 16, 30, 12]  # rows leave at different steps
    alone = [gen.generate([p], max_new_tokens=n).ids[0] for p, n in zip(prompts, new, strict=True)]
    b = Batcher(gen, max_batch=4)
    b.model = gated = _Gated(b.model, call=1)  # the first prefill waits for every submission
    got: list[tuple[int, ...] | None] = [None] * len(prompts)
    go = threading.Barrier(len(prompts))
    submitted = threading.Semaphore(0)

    def client(i: int) -> None:
        go.wait()
        stream = b.submit(prompts[i], max_new_tokens=new[i])
        submitted.release()
        ids = [e.token_id for e in stream]
        assert stream.result is not None and tuple(ids) == stream.result.ids[0]
        got[i] = tuple(ids)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for _ in threads:
        submitted.acquire()
    gated.go.set()
    for t in threads:
        t.join()
    b.close()
    assert got == [tuple(a) for a in alone]
    assert gen.model.positions_from_mask == ("genai" in folder)
    if (gen.model.appends and gen.model.pads_exactly) or gen.model.positions_from_mask:
        assert b.steps < sum(new) - len(new)  # shared: fewer steps than the requests' tokens
        assert b.largest_batch >= 2
    else:
        assert b.max_batch == b.largest_batch == 1


@pytest.mark.parametrize("folder", ["llama_optimum", "qwen2_genai"])
def test_a_request_joins_a_running_batch(folder: str) -> None:
    """The second request arrives after the first has made 6 tokens (a longer past joins a
    shorter one and the other way round, both padded: at their front, or for
    GroupQueryAttention at their end), and leaves first."""
    gen = load_generator(LLM / folder, Device.cpu())
    long_prompt, short_prompt = _prompts(folder)[0], _prompts(folder)[3]
    for first, second in ((short_prompt, long_prompt), (long_prompt, short_prompt)):
        want_a = gen.generate([first], max_new_tokens=20).ids[0]
        want_b = gen.generate([second], max_new_tokens=8).ids[0]
        b = Batcher(gen)
        b.model = gated = _Gated(b.model, call=7)  # the 7th forward waits for the submission
        a_ids, b_stream = [], None
        for e in b.submit(first, max_new_tokens=20):
            a_ids.append(e.token_id)
            if len(a_ids) == 6:
                b_stream = b.submit(second, max_new_tokens=8)
                gated.go.set()
        assert b_stream is not None
        assert tuple(a_ids) == want_a
        assert tuple(e.token_id for e in b_stream) == want_b
        assert b.largest_batch == 2
        b.close()


def test_bad_requests_fail_alone() -> None:
    gen = load_generator(LLM / "llama_optimum", Device.cpu(reference=True))
    b = Batcher(gen)
    with pytest.raises(ArgumentValueError, match="one prompt"):
        b.submit(["a", "b"])
    with pytest.raises(ArgumentValueError, match="outside the vocabulary"):
        b.submit([10**9])
    ok = b.submit([1, 2, 3], max_new_tokens=3)
    assert len(list(ok)) == 3
    b.close()
    with pytest.raises(ArgumentValueError, match="max_batch"):
        Batcher(gen, max_batch=0)


def test_async_readers_share_steps_on_one_loop() -> None:
    """`async for` over several streams on one event loop (as a served replica reads them):
    each gets its tokens alone, and the loop waits without blocking (both advance together)."""
    import asyncio

    gen = load_generator(LLM / "llama_optimum", Device.cpu())
    prompts, new = _prompts()[:3], [12, 20, 7]
    alone = [gen.generate([p], max_new_tokens=n).ids[0] for p, n in zip(prompts, new, strict=True)]
    b = Batcher(gen)
    b.model = gated = _Gated(b.model, call=1)

    async def read(i: int) -> tuple[int, ...]:
        stream = b.submit(prompts[i], max_new_tokens=new[i])
        if i == len(prompts) - 1:
            gated.go.set()  # every request is submitted: the first prefill may run
        ids = [e.token_id async for e in stream]
        assert stream.result is not None and stream.result.ids[0] == tuple(ids)
        return tuple(ids)

    async def main() -> list[tuple[int, ...]]:
        return list(await asyncio.gather(*(read(i) for i in range(len(prompts)))))

    assert asyncio.run(main()) == [tuple(a) for a in alone]
    assert b.largest_batch == len(prompts)
    b.close()


def test_a_reader_that_goes_away_cancels_its_row() -> None:
    """A stream whose reader stops early (a client that left) ends "cancelled" at the next step
    and leaves the batch; the other request's tokens are unchanged."""
    import asyncio

    gen = load_generator(LLM / "llama_optimum", Device.cpu())
    keep, drop = _prompts()[0], _prompts()[1]
    want = gen.generate([keep], max_new_tokens=16).ids[0]
    b = Batcher(gen)
    b.model = gated = _Gated(b.model, call=1)

    async def main() -> tuple[tuple[int, ...], object]:
        kept = b.submit(keep, max_new_tokens=16)
        dropped = b.submit(drop, max_new_tokens=500)
        gated.go.set()
        first = [e.token_id async for e in _take(dropped, 3)]
        assert len(first) == 3
        ids = tuple([e.token_id async for e in kept])
        return ids, dropped

    async def _take(stream, n):  # type: ignore[no-untyped-def]
        got = 0
        async for e in stream:
            yield e
            got += 1
            if got == n:
                return

    ids, dropped = asyncio.run(main())
    assert ids == tuple(want)
    rest = list(dropped)  # what it made before it left, then its end
    assert dropped.result is not None and dropped.result.finish_reasons == ("cancelled",)
    assert 3 + len(rest) == len(dropped.result.ids[0]) < 500
    assert b.cancelled == 1
    b.close()


def test_a_model_counting_positions_from_the_past_runs_requests_alone() -> None:
    """The tiny LLM has no position_ids (its rotary position is the past length): a row joined
    with its past left-padded would see its keys' distances off by the padding (its tokens
    changed from the 5th on when it was joined). Its requests take turns, each its own tokens."""
    gen = load_generator()
    assert gen.model.appends and not gen.model.pads_exactly
    prompts, new = ["Once upon a time", "Hello", "The cat"], [12, 16, 20]
    alone = [gen.generate(p, max_new_tokens=n).ids[0] for p, n in zip(prompts, new, strict=True)]
    b = Batcher(gen, max_batch=4)
    streams = [b.submit(p, max_new_tokens=n) for p, n in zip(prompts, new, strict=True)]
    assert [tuple(e.token_id for e in s) for s in streams] == [tuple(a) for a in alone]
    assert b.max_batch == b.largest_batch == 1
    b.close()
