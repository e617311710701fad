"""Binding inputs to a graph: the arrays in input order, their dtypes checked, and the size
symbols solved from their shapes (guards checked). Every executor starts here: the reference
(`kn_graph.reference`), the plan emulator, the CPU backend and the CUDA executor.

>>> from kn_graph import Graph, DType, Shape, Size
>>> g = Graph()
>>> x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
>>> g.add_output(g.neg(x), "y")
>>> bind_shapes(g, [np.ones((2, 3), np.float32)])
{'B': 2}
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    InputMismatchError,
    ShapeMismatchError,
)
from kn_graph.graph import Graph
from kn_graph.shape import BATCH, infer_symbols

__all__ = ["Inputs", "available_bytes", "bind_inputs", "bind_shapes", "inputs_in_order"]

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


def inputs_in_order(names: Sequence[str], inputs: Any, what: str = "graph") -> list[Any]:
    """The inputs (a list in input order, or a name → array map) as a list in `names` order;
    InputMismatchError for missing, unexpected or miscounted inputs."""
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise InputMismatchError(
                f"inputs by name: missing {missing}, unexpected {extra}; the {what} takes "
                f"{list(names)}"
            )
        return [inputs[n] for n in names]
    if isinstance(inputs, str | bytes) or not hasattr(inputs, "__iter__"):
        raise ArgumentTypeError(
            f"inputs: expected a list of arrays in input order or a name -> array map, found "
            f"{type(inputs).__name__}"
        )
    arrays = list(inputs)
    if len(arrays) != len(names):
        raise InputMismatchError(
            f"expected {len(names)} inputs ({', '.join(names)}), found {len(arrays)}"
        )
    return arrays


def _as_array(name: str, a: Any) -> np.ndarray:
    try:
        return np.asarray(a)
    except (ValueError, TypeError) as e:  # a ragged nested list, an object NumPy refuses
        raise InputMismatchError(f"input '{name}': not an array ({e})") from None


def bind_inputs(
    graph: Graph,
    inputs: Inputs,
    batch_size: int | None = None,
    known: Mapping[str, int] | None = None,
) -> tuple[list[np.ndarray], dict[str, int]]:
    """Check count, dtype and shape of the inputs; return them in order and the symbol bindings."""
    names = graph.input_names
    arrays = inputs_in_order(names, inputs)
    out: list[np.ndarray] = []
    for name, v, a in zip(names, graph.inputs, arrays, strict=True):
        a = _as_array(name, a)
        want = graph[v].dtype
        if a.dtype != want.np:
            raise InputMismatchError(f"input '{name}': expected dtype {want}, found {a.dtype}")
        out.append(a)
    return out, _solve(graph, [a.shape for a in out], batch_size, known)


BINDING_MEMO = 64
"""Input shapes whose bindings a graph remembers (`GraphBase.binding_memo`): a model called
again and again at the same shapes (a voice-activity detector per 32 ms chunk, a loop body per
step) skips solving its symbols and checking its guards, ~0.1 ms of Python per call."""


def _solve(
    graph: Graph,
    shapes: Sequence[Sequence[int]],
    batch_size: int | None,
    known: Mapping[str, int] | None,
) -> dict[str, int]:
    """The symbol bindings of input shapes, with B from `batch_size` and `known` (an enclosing
    graph's bindings when a subgraph runs) pre-bound; guards checked. A bad shape is an
    InputMismatchError."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)):
        raise ArgumentTypeError(f"batch_size: expected an int, found {batch_size!r}")
    if batch_size is not None and batch_size < 0:
        raise ArgumentValueError(f"batch_size: expected >= 0, found {batch_size}")
    pre = dict(known or {})
    if batch_size is not None:
        pre[BATCH] = int(batch_size)
    key = (len(graph.inputs), len(graph.guards), tuple(map(tuple, shapes)), *sorted(pre.items()))
    memo = graph.binding_memo
    hit = memo.get(key)
    if hit is not None:  # the same shapes bind the same symbols and meet the same guards
        return dict(hit)
    bindings = _infer(graph, shapes, pre)
    _remember(memo, key, bindings)
    return bindings


def _infer(graph: Graph, shapes: Sequence[Sequence[int]], pre: dict[str, int]) -> dict[str, int]:
    names = graph.input_names
    try:
        bindings = infer_symbols(
            [graph[v].shape for v in graph.inputs],
            shapes,
            [f"input '{n}'" for n in names],
            pre or None,
        )
        graph.check_bindings(bindings)
    except InputMismatchError:
        raise
    except ShapeMismatchError as e:  # a bad input shape is an input mismatch (a subclass)
        raise InputMismatchError(str(e)) from e
    return bindings


def bind_shapes(
    graph: Graph,
    inputs: Any,
    batch_size: int | None = None,
    known: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The symbol bindings of inputs given as anything with `.shape` and `.dtype` (NumPy, CuPy or
    torch arrays: nothing is copied), with the checks of `bind_inputs`."""
    names = graph.input_names
    arrays = inputs_in_order(names, inputs)
    key = _arrays_key(graph, arrays, batch_size, known)
    if key is not None and (hit := graph.binding_memo.get(key)) is not None:
        return dict(hit)  # these shapes and dtypes passed every check below already
    shapes = []
    for name, v, a in zip(names, graph.inputs, arrays, strict=True):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            a = _as_array(name, a)
        want = graph[v].dtype
        if _np_dtype(a.dtype) != want.np:
            raise InputMismatchError(f"input '{name}': expected dtype {want}, found {a.dtype}")
        shapes.append(tuple(int(d) for d in a.shape))
    bindings = _solve(graph, shapes, batch_size, known)
    if key is not None:
        _remember(graph.binding_memo, key, bindings)
    return bindings


def _arrays_key(
    graph: Graph, arrays: Sequence[Any], batch_size: Any, known: Mapping[str, int] | None
) -> tuple | None:
    """The binding memo's key for NumPy inputs as given (shapes and dtypes, before any check);
    None for other arrays, which take the checks every time."""
    if not all(type(a) is np.ndarray for a in arrays):
        return None
    return (
        "arrays",
        len(graph.guards),
        type(batch_size),
        batch_size,
        *((a.shape, a.dtype) for a in arrays),
        *sorted((known or {}).items()),
    )


def _remember(memo: dict, key: tuple, bindings: Mapping[str, int]) -> None:
    if len(memo) >= BINDING_MEMO:
        memo.clear()
    memo[key] = dict(bindings)


def _np_dtype(dt: Any) -> np.dtype | None:
    """A NumPy dtype for NumPy/CuPy dtypes and torch's (`torch.float32`); None if unknown."""
    try:
        return np.dtype(dt)
    except TypeError:
        try:
            return np.dtype(str(dt).removeprefix("torch."))
        except TypeError:
            return None


def available_bytes() -> int:
    """Memory this process may still allocate: MemAvailable from /proc/meminfo, else the free
    physical pages (os.sysconf); unbounded where neither is known. An address-space limit
    (`ulimit -v`, RLIMIT_AS) lowers it to what is left under the limit."""
    avail = 1 << 62
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            avail = min(avail, max(soft - used, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return avail
