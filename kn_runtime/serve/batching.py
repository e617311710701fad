"""`BatchedModel`: many requests, one evaluation. The entry point every server front end uses
(Ray Serve, Triton, the benchmarks): `run_batch(requests)` checks each request on its own, groups
those that can share an evaluation, concatenates them along the batch axis, evaluates once per
group and splits the outputs back.

When requests share an evaluation:
- the graph has a batch axis: one plain size symbol on axis 0 of every input and every output,
  nowhere else (`resnet [B,3,224,224] -> [B,1000]`); then requests whose other axes agree are
  concatenated (each request brings its own batch axis: 1 or more rows);
- ragged sequences are padded on the right when the model says which positions are real: an
  `attention_mask` input `[B, S]` (BERT, GPT-2, any Hugging Face export). Every input with `S` on
  axis 1 is padded with zeros, every output with `S` as an axis is cut back to each request's own
  length. Right padding leaves the real positions' outputs as they were: masked positions add
  exactly nothing to a softmax whose other terms are not all masked, and causal models never see
  later positions;
- anything else (an image model at several sizes) runs once per distinct shape.
A graph without a batch axis (a fixed batch of 1, outputs that fold the batch into another axis,
a model whose shapes depend on input values) runs one evaluation per request; `why_not` says why,
and it is logged once.

Thread-safe: `PreparedGraph` lets evaluations take turns; this class keeps no state per call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kn_graph.errors import ArgumentValueError, RequestError
from kn_graph.size import Size

if TYPE_CHECKING:
    from kn_graph.graph import Graph

__all__ = ["MASK_NAMES", "BatchedModel", "Prepared", "TensorSpec"]

log = logging.getLogger(__name__)

MASK_NAMES = ("attention_mask", "input_mask")
"""Input names that mark which sequence positions are real (Hugging Face and TF BERT exports):
a model with one of them, shaped `[B, S]`, may get ragged requests padded to one length."""

Request = Mapping[str, Any]


class Prepared(Protocol):
    """What `BatchedModel` needs of a `kn_runtime.PreparedGraph` (named here, not imported: the
    prepared graph's own `run_batch` builds a BatchedModel)."""

    batch_size: int | None

    @property
    def graph(self) -> Graph: ...

    def eval(self, inputs: Mapping[str, np.ndarray]) -> list[Any]: ...

    def warm(self, bindings: Mapping[str, int]) -> bool: ...


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as a server describes it: name, NumPy dtype, shape with None for a
    size the graph leaves symbolic, and whether axis 0 is the batch axis requests share."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]
    batched: bool

    def describe(self) -> dict[str, Any]:
        """JSON-ready: name, dtype, shape (-1 for a symbolic size), batched."""
        shape = [-1 if d is None else d for d in self.shape]
        return {
            "name": self.name,
            "dtype": self.dtype.name,
            "shape": shape,
            "batched": self.batched,
        }


class BatchedModel:
    """A prepared graph behind a server: `run` one request, `run_batch` many (see the module
    docstring). `max_batch_size` caps the rows of one evaluation (None: no cap; a single request
    larger than the cap still runs, alone)."""

    def __init__(
        self,
        prepared: Prepared,
        *,
        max_batch_size: int | None = None,
        evaluate: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None,
    ) -> None:
        """`evaluate`: another runtime behind the same checks and batching (None: the prepared
        graph's `eval`; the serving benchmark puts onnxruntime here, `load_model(...,
        runtime="onnxruntime")`). It takes inputs by name, returns outputs in graph order."""
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
        ):
            raise ArgumentValueError(f"max_batch_size: expected an int, found {max_batch_size!r}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ArgumentValueError(f"max_batch_size must be >= 1, found {max_batch_size}")
        self.prepared = prepared
        self.max_batch_size = max_batch_size
        self._evaluate = evaluate
        self._warned = False
        self.why_not: str | None = None
        """Why requests cannot share an evaluation (None: they can)."""
        self._pad: str | None = None  # the sequence symbol ragged requests are padded along
        self._seq_axes: dict[str, tuple[int, ...]] = {}  # output name -> axes that are `S`
        self._padded_inputs: frozenset[str] = frozenset()  # inputs with `S` as axis 1
        self._batch: Size | None = None  # the batch axis's size symbol
        specializing = getattr(prepared, "_specializing", None)
        if specializing is not None:  # shapes decided by input values: no one graph
            self.inputs, self.outputs = _onnx_specs(specializing.model.model)
            self.why_not = "the model's shapes depend on its input values (one graph per value)"
            return
        graph = prepared.graph
        batch = _batch_symbol(graph)
        if isinstance(batch, str) and prepared.batch_size is not None:
            batch = f"it was prepared for a fixed batch size ({prepared.batch_size})"
        if isinstance(batch, str) or batch is None:
            self.why_not = batch or "the graph has no inputs"
            batch = None
        self._batch = batch
        self.inputs = _specs(graph, graph.inputs, graph.input_names, batch)
        self.outputs = _specs(graph, graph.outputs, graph.output_names, batch)
        if batch is not None:
            self._pad, self._seq_axes = _padding(graph, batch)
            self._padded_inputs = frozenset(
                n
                for v, n in zip(graph.inputs, graph.input_names, strict=True)
                if graph[v].shape.rank > 1 and graph[v].shape[1].symbol == self._pad
            )

    @property
    def batchable(self) -> bool:
        """Whether requests are concatenated along the batch axis."""
        return self.why_not is None

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    def describe(self) -> dict[str, Any]:
        """The model's inputs and outputs and how it batches, JSON-ready (a server's metadata)."""
        return {
            "inputs": [s.describe() for s in self.inputs],
            "outputs": [s.describe() for s in self.outputs],
            "batchable": self.batchable,
            "why_not": self.why_not,
            "pads_sequences": self._pad is not None,
            "max_batch_size": self.max_batch_size,
        }

    def warm_up(self, sizes: Mapping[str, int] | None = None) -> int:
        """Plan and compile the evaluation of every batch size from `max_batch_size` down to 1
        before a request meets it, as Triton's model warm-up does: otherwise the first batch of
        each size pays it (ResNet-50 about 0.5 s, BERT-base at 16 rows 2.5 s, on 1 thread).
        `sizes` gives the model's other symbolic sizes by name (a sequence length: `{"seq": 128}`;
        other lengths still plan when they come). Largest first, so the arena is sized once and
        the smaller sizes fit in it; no more sizes than the prepared graph keeps executors
        (`max_bindings`: on a GPU the 8 largest). Returns how many sizes were planned: 0 for
        another runtime, a model that does not batch or has no `max_batch_size`, and a graph
        that plans once or as it runs (segments). ArgumentValueError names a symbol left
        without a size."""
        if self._evaluate is not None or self._batch is None or not self.max_batch_size:
            return 0
        graph = self.prepared.graph
        batch = self._batch.symbol
        symbols = set().union(*(graph[v].shape.symbols for v in graph.inputs)) - {batch}
        given = dict(sizes or {})
        missing = sorted(symbols - set(given))
        if missing:
            raise ArgumentValueError(
                f"warm-up needs a size for {', '.join(missing)} (the inputs "
                f"{', '.join(f'{s.name} {_shape_text(s.shape)}' for s in self.inputs)}): "
                f"give them as sizes, e.g. {{{missing[0]!r}: 128}}"
            )
        unknown = sorted(set(given) - symbols)
        if unknown:
            raise ArgumentValueError(
                f"warm-up sizes name {', '.join(unknown)}, which no input has; the model's "
                f"symbols besides the batch size {batch}: {sorted(symbols) or 'none'}"
            )
        planned = 0
        # no more than the prepared graph keeps: a GPU keeps 8 executors (each holds memory)
        kept = getattr(self.prepared, "max_bindings", None) or self.max_batch_size
        for rows in range(self.max_batch_size, max(0, self.max_batch_size - kept), -1):
            if not self.prepared.warm({batch: rows, **given}):
                return 0
            planned += 1
        return planned

    # -- requests ------------------------------------------------------------------------------

    def check(self, request: Request) -> dict[str, np.ndarray]:
        """The request's arrays by name, in the model's dtypes (a cast only where NumPy calls it
        safe: int32 ids for an int64 input), with rank and fixed sizes checked. RequestError
        (400) naming the input otherwise."""
        if not isinstance(request, Mapping):
            raise RequestError(f"a request is a name -> array map, found {type(request).__name__}")
        names = self.input_names
        missing = [n for n in names if n not in request]
        extra = [n for n in request if n not in names]
        if missing or extra:
            raise RequestError(
                f"request inputs: missing {missing}, unexpected {extra}; the model takes {names}"
            )
        out: dict[str, np.ndarray] = {}
        rows: int | None = None
        for spec in self.inputs:
            a = _as_array(spec, request[spec.name])
            if len(a.shape) != len(spec.shape) or any(
                want is not None and want != got
                for want, got in zip(spec.shape, a.shape, strict=True)
            ):
                raise RequestError(
                    f"input '{spec.name}': expected shape {_shape_text(spec.shape)}, found "
                    f"{list(a.shape)}"
                )
            if spec.batched:
                if rows is not None and a.shape[0] != rows:
                    raise RequestError(
                        f"input '{spec.name}': batch of {a.shape[0]} rows, but an earlier input "
                        f"of the same request has {rows}"
                    )
                rows = a.shape[0]
            out[spec.name] = a
        return out

    def run(self, request: Request) -> dict[str, np.ndarray]:
        """One request: its outputs by name."""
        arrays = self.check(request)
        return self._eval(arrays)

    def run_batch(
        self, requests: Sequence[Request], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Each request's outputs by name, in order, from as few evaluations as the model allows.
        A request that fails its check (or the evaluation of its group) raises; with
        `return_exceptions=True` its place in the list holds the exception instead and the others
        are still answered (what a server wants: one bad request fails alone)."""
        results: list[Any] = [None] * len(requests)
        checked: list[tuple[int, dict[str, np.ndarray]]] = []
        for i, request in enumerate(requests):
            try:
                checked.append((i, self.check(request)))
            except Exception as exc:
                if not return_exceptions:
                    raise
                results[i] = exc
        if not self.batchable and len(checked) > 1 and not self._warned:
            self._warned = True
            log.warning("%s: one evaluation per request: %s", self.prepared, self.why_not)
        for group in self._groups(checked):
            try:
                outs = self._run_group([arrays for _, arrays in group])
            except Exception as exc:
                if len(group) > 1:  # answer each on its own: one request may be the cause
                    outs = []
                    for _, arrays in group:
                        try:
                            outs.append(self._eval(arrays))
                        except Exception as one:
                            if not return_exceptions:
                                raise
                            outs.append(one)
                elif return_exceptions:
                    outs = [exc]
                else:
                    raise
            for (i, _), out in zip(group, outs, strict=True):
                results[i] = out
        return results

    # -- inside --------------------------------------------------------------------------------

    def _groups(
        self, checked: list[tuple[int, dict[str, np.ndarray]]]
    ) -> list[list[tuple[int, dict[str, np.ndarray]]]]:
        """Requests that share an evaluation: same sizes apart from the batch axis (and the padded
        sequence axis), at most `max_batch_size` rows together."""
        if not self.batchable:
            return [[item] for item in checked]
        by_key: dict[tuple[Any, ...], list[list[tuple[int, dict[str, np.ndarray]]]]] = {}
        rows_of: dict[int, int] = {}
        cap = self.max_batch_size
        for item in checked:
            arrays = item[1]
            key = tuple(self._group_shape(s, arrays[s.name]) for s in self.inputs)
            rows = self._rows(arrays)
            chunks = by_key.setdefault(key, [[]])
            last = chunks[-1]
            if last and cap is not None and rows_of[id(last)] + rows > cap:
                last = []
                chunks.append(last)
            last.append(item)
            rows_of[id(last)] = rows_of.get(id(last), 0) + rows
        return [chunk for chunks in by_key.values() for chunk in chunks]

    def _group_shape(self, spec: TensorSpec, a: np.ndarray) -> tuple[int, ...]:
        shape = list(a.shape[1:]) if spec.batched else list(a.shape)
        if spec.name in self._padded_inputs:
            shape[0] = -1  # axis 1 of the request: padded to the group's longest
        return tuple(shape)

    def _rows(self, arrays: dict[str, np.ndarray]) -> int:
        for spec in self.inputs:
            if spec.batched:
                return int(arrays[spec.name].shape[0])
        return 1

    def _run_group(self, group: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if len(group) == 1:
            return [self._eval(group[0])]
        padded = self._padded_inputs
        lengths = [self._length(arrays, padded) for arrays in group]
        longest = max(lengths) if lengths else 0
        merged: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            parts = [arrays[spec.name] for arrays in group]
            if spec.name in padded:
                parts = [_pad_axis1(p, longest) for p in parts]
            merged[spec.name] = np.concatenate(parts, axis=0)
        outs = self._eval(merged)
        answers: list[dict[str, np.ndarray]] = []
        start = 0
        for arrays, length in zip(group, lengths, strict=True):
            stop = start + self._rows(arrays)
            answer = {}
            for spec in self.outputs:
                part = outs[spec.name][start:stop]
                for axis in self._seq_axes.get(spec.name, ()):
                    if length != longest:
                        part = np.take(part, np.arange(length), axis=axis)
                answer[spec.name] = np.ascontiguousarray(part)
            answers.append(answer)
            start = stop
        return answers

    @staticmethod
    def _length(arrays: dict[str, np.ndarray], padded: frozenset[str]) -> int:
        for name in padded:
            return int(arrays[name].shape[1])
        return 0

    def _eval(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.prepared.eval(arrays) if self._evaluate is None else self._evaluate(arrays)
        return dict(zip(self.output_names, outs, strict=True))


def _batch_symbol(graph: Graph) -> str | Size | None:
    """The batch axis's size (a plain symbol on axis 0 of every input and output, nowhere else),
    or a string saying why there is none."""
    if not graph.inputs:
        return None
    first = graph[graph.inputs[0]].shape
    sym = first[0].symbol if first.rank else None
    if sym is None:
        return f"input '{graph.input_names[0]}' has no symbolic axis 0 to batch along"
    for what, values, names in (
        ("input", graph.inputs, graph.input_names),
        ("output", graph.outputs, graph.output_names),
    ):
        for v, name in zip(values, names, strict=True):
            shape = graph[v].shape
            if not shape.rank or shape[0].symbol != sym:
                return f"{what} '{name}' does not have the batch size {sym} as its axis 0"
            if any(sym in d.symbols for d in list(shape)[1:]):
                return f"{what} '{name}' uses the batch size {sym} beyond axis 0"
    return Size.sym(sym)


def _padding(graph: Graph, batch: Size) -> tuple[str | None, dict[str, tuple[int, ...]]]:
    """The sequence symbol ragged requests may be padded along (an attention mask `[B, S]` says
    which positions are real) and, per output, the axes to cut back; (None, {}) when padding
    would change what the real positions compute or could not be undone."""
    masks = [
        graph[v].shape
        for v, n in zip(graph.inputs, graph.input_names, strict=True)
        if n in MASK_NAMES
    ]
    if len(masks) != 1 or masks[0].rank != 2 or masks[0][0] != batch:
        return None, {}
    seq = masks[0][1].symbol
    if seq is None:
        return None, {}
    for v in graph.inputs:  # the sequence length may appear as axis 1 only
        dims = list(graph[v].shape)
        if any(seq in d.symbols for i, d in enumerate(dims) if i != 1 or d.symbol != seq):
            return None, {}
    axes: dict[str, tuple[int, ...]] = {}
    for v, name in zip(graph.outputs, graph.output_names, strict=True):
        dims = list(graph[v].shape)
        if any(seq in d.symbols and d.symbol != seq for d in dims):
            return None, {}  # an output whose size is an expression of S cannot be cut back
        axes[name] = tuple(i for i, d in enumerate(dims) if d.symbol == seq)
    return seq, axes


def _specs(
    graph: Graph, values: Sequence[Any], names: Sequence[str], batch: Size | None
) -> list[TensorSpec]:
    specs = []
    for v, name in zip(values, names, strict=True):
        info = graph[v]
        shape = tuple(d.fixed_value() for d in info.shape)
        batched = batch is not None and info.shape.rank > 0 and info.shape[0] == batch
        specs.append(TensorSpec(name, np.dtype(info.dtype.np), shape, batched))
    return specs


def _onnx_specs(model: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Specs from an ONNX model's declared inputs and outputs (a value-specialized model has no
    one graph to read them from)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    init = {t.name for t in model.graph.initializer}

    def spec(v: Any) -> TensorSpec:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        return TensorSpec(v.name, np.dtype(tensor_dtype_to_np_dtype(t.elem_type)), dims, False)

    inputs = [spec(v) for v in model.graph.input if v.name not in init]
    return inputs, [spec(v) for v in model.graph.output]


def _as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        a = value
    else:
        try:
            a = np.asarray(value, dtype=spec.dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise RequestError(
                f"input '{spec.name}': cannot be read as {spec.dtype.name}: {exc}"
            ) from None
    if a.dtype != spec.dtype:
        if not np.can_cast(a.dtype, spec.dtype, casting="safe"):
            raise RequestError(
                f"input '{spec.name}': expected dtype {spec.dtype.name}, found {a.dtype.name} "
                "(only casts that lose nothing are made)"
            )
        a = a.astype(spec.dtype)
    return a


def _pad_axis1(a: np.ndarray, length: int) -> np.ndarray:
    if a.shape[1] == length:
        return a
    pad = [(0, 0)] * a.ndim
    pad[1] = (0, length - a.shape[1])
    return np.pad(a, pad)


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
