"""A model loaded per call (`ValueSpecializedModel`): what `load_onnx` returns when shapes
depend on the values of some inputs, or a node needs fixed sizes. It loads the model again per
distinct value (and shape) through `kn_graph.onnx.importer` and caches the graphs. `optimize`
takes it as a `kn_graph.optimizer.Reoptimizable` (the optimizer imports nothing of ONNX); this
module imports the optimizer only to optimize a graph it made."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from kn_graph.errors import OnnxImportError, StaticInputRequiredError, SymbolicSizeError
from kn_graph.graph import Graph
from kn_graph.onnx.importer import load_graph
from kn_graph.onnx.mapped import FileMaps
from kn_graph.onnx.options import LoadOptions

if TYPE_CHECKING:
    from kn_graph.optimizer import OptimizerSettings

__all__ = ["ValueSpecializedModel"]


class ValueSpecializedModel:
    """A model loaded per call: its shapes depend on the values of some integer inputs (a
    Reshape target, Tile repeats, Resize sizes, a Range limit, an If condition fed by a graph
    input), or it has a node the IR expresses for fixed sizes only (an LSTM over a symbolic
    length, SAME padding with a stride). `specialize` loads it once per distinct value of those
    inputs (and, with `by_shape`, per input shapes) and caches the graph; `Device.prepare`
    accepts it and does that per call. The cost: one load per new value or shape.
    `optimize(model)` returns a copy whose graphs are optimized as they are made (`optimized`)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        folder: Path | None,
        options: LoadOptions,
        value_inputs: list[str],
        by_shape: bool = False,
        files: FileMaps | None = None,
    ) -> None:
        self.model = model
        self.folder = folder
        self.files = files if files is not None else FileMaps(None, options.mmap)
        self.options = options
        self.value_inputs: list[str] = list(value_inputs)
        """The inputs whose values decide shapes (found so far; more may be found per call)."""
        init = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]
        self.by_shape = by_shape
        """Whether the other inputs' shapes are pinned too (set when symbolic dims fail)."""
        self.optimizations: tuple[OptimizerSettings, ...] = ()
        """Optimizer settings applied in order to each graph as it is made (`optimized`)."""
        self._cache: dict[tuple[object, ...], Graph] = {}

    def optimized(self, settings: OptimizerSettings) -> ValueSpecializedModel:
        """A copy of this model whose graphs are optimized with `settings` as they are made:
        what `optimize(model, settings)` returns, so `optimize(load_onnx(path))` works whatever
        the model is. The copy keeps its own graph cache (this one's graphs are not optimized)
        and starts from what this model found out (the value inputs, `by_shape`)."""
        new = ValueSpecializedModel(
            self.model, self.folder, self.options, self.value_inputs, self.by_shape, self.files
        )
        new.optimizations = (*self.optimizations, settings)
        return new

    def specialize(self, values: Mapping[str, np.ndarray]) -> Graph:
        """The graph for these input values (all inputs by name, or at least the value inputs);
        the value inputs become constants and leave the graph's inputs. The other inputs keep
        their symbolic dims unless a shape then cannot be expressed (a Resize to a size given
        by value on a symbolic axis): then their shapes are pinned as well (`by_shape`)."""
        for _ in range(len(self.input_names) + 1):
            missing = [n for n in self.value_inputs if n not in values]
            if missing:
                raise OnnxImportError(
                    f"the model's shapes depend on the values of inputs {missing}; pass them"
                )
            if self.by_shape:
                missing = [
                    n
                    for n in self.input_names
                    if n not in values and n not in self.options.input_shapes
                ]
                if missing:
                    raise OnnxImportError(
                        f"the model is loaded per input shape; pass inputs {missing} too"
                    )
            pinned = dict(self.options.input_values)
            pinned.update({n: _pin(values[n]) for n in self.value_inputs})
            shapes = dict(self.options.input_shapes)
            if self.by_shape:
                shapes.update({n: list(np.shape(v)) for n, v in values.items() if n not in pinned})
            key = tuple((n, _key(pinned[n])) for n in sorted(pinned)) + tuple(
                (n, tuple(shapes[n])) for n in sorted(shapes)
            )
            hit = self._cache.get(key)
            if hit is not None:
                return hit
            opts = LoadOptions(
                self.options.batch_axes, self.options.dims, shapes, pinned, self.options.mmap
            )
            try:
                graph = load_graph(self.model, self.folder, opts, self.files)
            except StaticInputRequiredError as e:
                if e.input_name in self.value_inputs or e.input_name not in values:
                    raise
                self.value_inputs.append(e.input_name)
                continue
            except SymbolicSizeError:
                if self.by_shape:
                    raise
                self.by_shape = True
                continue
            if self.optimizations:
                from kn_graph.optimizer import optimize

                for settings in self.optimizations:
                    graph = optimize(graph, settings)
            self._cache[key] = graph
            return graph
        raise OnnxImportError("could not find the inputs that decide the model's shapes")

    def __repr__(self) -> str:
        what = f"the values of {self.value_inputs}" if self.value_inputs else ""
        if self.by_shape:
            what += (" and " if what else "") + "the input shapes"
        opt = "; optimized" if self.optimizations else ""
        return f"<ValueSpecializedModel: inputs {self.input_names}; loaded per {what}{opt}>"


def _pin(v: object) -> object:
    """A value input as pinned: an array, or for a sequence input the list of its arrays."""
    if isinstance(v, list | tuple):
        return [np.asarray(a) for a in v]
    return np.asarray(v)


def _key(v: object) -> object:
    """The cache key of a pinned value: its bytes; a sequence by its structure only (its
    elements are graph inputs)."""
    if isinstance(v, list):
        return ("seq", tuple((a.dtype.str, a.shape) for a in v))
    a = np.asarray(v)
    return (a.dtype.str, a.shape, a.tobytes())
