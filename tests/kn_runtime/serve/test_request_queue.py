"""The replica's dynamic batching (`RequestQueue`): what arrives while an evaluation runs is
evaluated together next, never more than `max_batch_size` at once; each request gets its own
result or its own failure; a caller that leaves is dropped; `wait_s` holds a lone request for
company. Driven with an `evaluate` that blocks until the test lets it go, so every batch's
contents are decided by the test, not by timing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from kn_graph.errors import ArgumentValueError, EvaluationError
from kn_runtime.serve.request_queue import RequestQueue

LIMIT_S = 20.0


def _run(main: Any) -> None:
    asyncio.run(asyncio.wait_for(main(), 2 * LIMIT_S))


class Gate:
    """An `evaluate` that records each batch and waits for `release()` before answering
    (request -> request * 10, or the exception object a request names)."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def __call__(self, requests: list[Any]) -> list[Any]:
        self.batches.append(list(requests))
        self.entered.release()
        if not self.go.acquire(timeout=LIMIT_S):  # a failing test fails, it does not hang
            raise TimeoutError(f"batch {requests} was never released")
        return [r if isinstance(r, BaseException) else r * 10 for r in requests]

    async def running(self) -> None:
        """Until an evaluation has started."""
        assert await asyncio.to_thread(self.entered.acquire, timeout=LIMIT_S)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.go.release()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_requests_that_arrive_during_an_evaluation_are_evaluated_together() -> None:
    async def main() -> None:
        gate = Gate()
        queue = RequestQueue(gate, max_batch_size=4)
        first = asyncio.create_task(queue.submit(1))
        await gate.running()  # request 1 found the model idle: evaluated alone, at once
        rest = [asyncio.create_task(queue.submit(i)) for i in range(2, 12)]
        await _settle()
        gate.release(4)
        assert await first == 10
        assert await asyncio.gather(*rest) == [i * 10 for i in range(2, 12)]
        assert gate.batches == [[1], [2, 3, 4, 5], [6, 7, 8, 9], [10, 11]]
        assert queue.served == {"requests": 11, "batches": 4, "largest_batch": 4}

    _run(main)


def test_each_request_gets_its_own_failure() -> None:
    async def main() -> None:
        gate = Gate()
        queue = RequestQueue(gate, max_batch_size=8)
        blocker = asyncio.create_task(queue.submit(0))
        await gate.running()
        bad = ValueError("request 2 is bad")
        tasks = [asyncio.create_task(queue.submit(r)) for r in (1, bad, 3)]
        await _settle()
        gate.release(2)
        await blocker
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[0] == 10 and results[2] == 30
        assert results[1] is bad
        assert gate.batches[1] == [1, bad, 3]

    _run(main)


def test_an_evaluation_that_raises_fails_its_batch_and_the_queue_goes_on() -> None:
    calls: list[list[int]] = []

    def evaluate(requests: list[int]) -> list[int]:
        calls.append(requests)
        if 666 in requests:
            raise EvaluationError("the model failed")
        if 7 in requests:
            return []  # a wrong number of results is an error, not a silent misalignment
        return [r * 10 for r in requests]

    async def main() -> None:
        queue = RequestQueue(evaluate, max_batch_size=1)
        with pytest.raises(EvaluationError, match="the model failed"):
            await queue.submit(666)
        with pytest.raises(EvaluationError, match="0 results for 1 requests"):
            await queue.submit(7)
        assert await queue.submit(2) == 20

    _run(main)


def test_a_caller_that_leaves_is_dropped_before_its_batch_forms() -> None:
    async def main() -> None:
        gate = Gate()
        queue = RequestQueue(gate, max_batch_size=8)
        blocker = asyncio.create_task(queue.submit(0))
        await gate.running()
        leaving = asyncio.create_task(queue.submit(1))
        staying = asyncio.create_task(queue.submit(2))
        await _settle()
        leaving.cancel()
        await _settle()
        gate.release(2)
        await blocker
        assert await staying == 20
        assert leaving.cancelled()
        assert gate.batches == [[0], [2]]

    _run(main)


def test_wait_s_holds_a_lone_request_until_its_batch_fills() -> None:
    """With a wait far longer than the test's limit, only a full batch can have run."""

    async def main() -> None:
        gate = Gate()
        gate.release(1)
        queue = RequestQueue(gate, max_batch_size=2, wait_s=600.0)
        first = asyncio.create_task(queue.submit(1))
        await _settle()
        assert gate.batches == []  # waiting for company
        second = asyncio.create_task(queue.submit(2))
        assert await asyncio.gather(first, second) == [10, 20]
        assert gate.batches == [[1, 2]]

    _run(main)


def test_wait_s_runs_what_came_once_the_oldest_has_waited() -> None:
    async def main() -> None:
        gate = Gate()
        gate.release(1)
        queue = RequestQueue(gate, max_batch_size=16, wait_s=0.01)
        assert await queue.submit(3) == 30
        assert gate.batches == [[3]]

    _run(main)


@pytest.mark.parametrize(("size", "wait", "words"), [(0, 0.0, "max_batch_size"), (4, -1, "wait_s")])
def test_settings_are_checked(size: int, wait: float, words: str) -> None:
    with pytest.raises(ArgumentValueError, match=words):
        RequestQueue(lambda r: r, max_batch_size=size, wait_s=wait)
