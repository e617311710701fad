"""What the benchmark scripts share: the median wall time of a few calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def median_time(f: Callable[[], T], repeat: int) -> tuple[float, T]:
    """(median seconds of `repeat` calls of f, the last call's result)."""
    times: list[float] = []
    out: T | None = None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out  # type: ignore[return-value]
