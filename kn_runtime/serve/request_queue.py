"""Dynamic batching on an event loop, the way Triton's dynamic batcher does it: the model runs one
evaluation at a time, in a worker thread; a request that finds it idle is evaluated at once (or
after waiting up to `wait_s` for company), and the requests that arrive while an evaluation runs
are evaluated together the moment it ends, up to `max_batch_size` of them.

Why not Ray's `@serve.batch`: it forms a batch from what is queued at the instant the previous
batch was *formed*, not when the model is free, and then waits for the model with the batch
already fixed. Under a steady load every arrival during an evaluation becomes a batch of its own:
16 clients of a ResNet-50 replica made batches of 1.65 requests on average (benchmarks/RESULTS.md),
and its per-batch bookkeeping (tasks, metrics) cost about 0.3 ms a request at concurrency 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from kn_graph.errors import ArgumentValueError, EvaluationError

__all__ = ["RequestQueue"]

R = TypeVar("R")


class RequestQueue(Generic[R]):
    """`await queue.submit(request)` -> that request's result from `evaluate(requests)`, which
    takes a list of requests and returns one result per request, in order (an exception object
    in a request's place is that request's failure: `submit` raises it). `evaluate` runs in a
    worker thread, one call at a time, so the loop keeps taking requests while it runs.

    A request whose caller stops waiting (its task is cancelled: the client left) is dropped
    before its batch is formed; one whose batch already runs is evaluated and its result
    discarded. `served` counts requests, evaluations and the largest batch."""

    def __init__(
        self,
        evaluate: Callable[[list[R]], Sequence[Any]],
        max_batch_size: int,
        wait_s: float = 0.0,
    ) -> None:
        if max_batch_size < 1:
            raise ArgumentValueError(f"max_batch_size must be at least 1, found {max_batch_size}")
        if wait_s < 0:
            raise ArgumentValueError(f"wait_s must be at least 0, found {wait_s}")
        self.evaluate = evaluate
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.served = {"requests": 0, "batches": 0, "largest_batch": 0}
        # (request, its future, when it arrived on the perf_counter clock)
        self._queue: deque[tuple[R, asyncio.Future[Any], float]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._full = asyncio.Event()  # set when a waiting batch fills up

    async def submit(self, request: R) -> Any:
        """The request's result; raises its exception when `evaluate` put one in its place."""
        result, _, _ = await self.submit_timed(request)
        return result

    async def submit_timed(self, request: R) -> tuple[Any, float, float]:
        """`submit`, with when its batch's evaluation started (perf_counter seconds) and how
        long it took: what a server reports in its Server-Timing header."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((request, future, time.perf_counter()))
        if len(self._queue) >= self.max_batch_size:
            self._full.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        result, started, took = await future
        if isinstance(result, BaseException):
            raise result
        return result, started, took

    async def _work(self) -> None:
        """Evaluate batches until the queue is empty; any request left when the task ends
        abnormally (the loop shuts down) gets the error instead of waiting forever."""
        try:
            while self._queue:
                await self._wait_for_company()
                batch = self._take()
                if batch:
                    await self._run(batch)
        except BaseException as exc:
            while self._queue:
                _, future, _ = self._queue.popleft()
                if not future.done():
                    future.set_exception(exc)
            raise

    async def _wait_for_company(self) -> None:
        """With `wait_s`, hold a batch that is not full until its oldest request has waited
        that long."""
        if self.wait_s <= 0 or len(self._queue) >= self.max_batch_size:
            return
        remaining = self._queue[0][2] + self.wait_s - time.perf_counter()
        if remaining > 0:
            self._full.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), remaining)

    def _take(self) -> list[tuple[R, asyncio.Future[Any]]]:
        batch = []
        while self._queue and len(batch) < self.max_batch_size:
            request, future, _ = self._queue.popleft()
            if not future.done():  # a cancelled caller is dropped here
                batch.append((request, future))
        if len(self._queue) < self.max_batch_size:
            self._full.clear()
        return batch

    async def _run(self, batch: list[tuple[R, asyncio.Future[Any]]]) -> None:
        served = self.served
        served["requests"] += len(batch)
        served["batches"] += 1
        served["largest_batch"] = max(served["largest_batch"], len(batch))
        started = time.perf_counter()
        try:
            results: Sequence[Any] = await asyncio.to_thread(
                self.evaluate, [request for request, _ in batch]
            )
            if len(results) != len(batch):
                raise EvaluationError(
                    f"evaluate returned {len(results)} results for {len(batch)} requests"
                )
        except Exception as exc:  # every request of the batch fails with it
            results = [exc] * len(batch)
        took = time.perf_counter() - started
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result((result, started, took))
