"""Shared helpers for the IR and CPU executor tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kn_graph import DType, Graph, Shape, Value
from kn_graph.reference import evaluate


def graph_with(shape: Sequence[object], dtype: DType = DType.F32) -> tuple[Graph, Value]:
    """A new graph with one input `x` of the given shape and dtype."""
    g = Graph()
    return g, g.input(Shape.from_seq(shape), dtype, "x")  # type: ignore[arg-type]


def run(g: Graph, out: Value, *inputs: np.ndarray, batch_size: int | None = None) -> np.ndarray:
    """Make `out` the graph's only output and evaluate it with the CPU executor."""
    g.add_output(out)
    (result,) = evaluate(g, list(inputs), batch_size)
    return result


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: DType) -> np.ndarray:
    """Values that make every op meaningful: signed floats, small signed/unsigned ints, bools."""
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.np)
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    lo = -20 if dtype.is_signed else 0
    return rng.integers(lo, 20, size=shape).astype(dtype.np)
