"""ONNX → kn_graph: `load_onnx` checks its arguments and the model (`kn_graph.onnx.options`),
reads the model (`reading`), imports it with one registered handler per node (`importer`), or
returns a `ValueSpecializedModel` (`specialized`) when shapes depend on input values."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from kn_graph.errors import StaticInputRequiredError, SymbolicSizeError
from kn_graph.graph import Graph
from kn_graph.onnx.importer import load_graph
from kn_graph.onnx.mapped import FileMaps
from kn_graph.onnx.options import Source, check_arguments, check_model, check_source
from kn_graph.onnx.reading import read_model
from kn_graph.onnx.sequences import sequence_outputs
from kn_graph.onnx.specialized import ValueSpecializedModel
from kn_graph.shape import SizeLike

__all__ = ["DEFAULT_BATCH_AXES", "load_onnx"]

DEFAULT_BATCH_AXES = ("batch_size", "batch", "N", "B", "b", "batch_dim", "unk__batch")
"""dim_params unified into the batch symbol B."""


def load_onnx(
    source: Source,
    *,
    batch_axes: Iterable[str] = DEFAULT_BATCH_AXES,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[SizeLike]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    static: bool = False,
    mmap: bool = True,
) -> Graph | ValueSpecializedModel:
    """Load an ONNX model (path, bytes or ModelProto) into a new `Graph`.

    - every `dim_param` becomes a size symbol (`"past + 1"` an expression of one); those named
      in `batch_axes` become `B`; dims without a name become `<input>_<axis>`;
    - sizes an op needs equal (broadcasting, concat, matmul, reshape) are unified when one is a
      plain input symbol (the exporter named one length twice), else recorded as a guard;
    - `dims` pins symbols to numbers (`dims={"seq": 77}`), `input_shapes` gives whole shapes;
    - `input_values` turns graph inputs into constants. When a shape, repeats, pads, sizes or a
      condition comes from a graph input and no value is given, the result is a
      `ValueSpecializedModel` (`Device.prepare` accepts it: one graph per distinct value),
      or with `static=True` a `StaticInputRequiredError` naming the input;
    - external data is read relative to `base_dir` (default: the model's folder) and may not
      leave it;
    - with `mmap` (the default) a model given by path keeps its large initializers and its
      external data as read-only views of the files (`kn_graph.onnx.mapped`): no copy, and a
      backend that packed them can give their pages back. The files must then stay as they
      are while the graph lives; `mmap=False` reads everything into memory.
    Raises `ArgumentTypeError`/`ArgumentValueError` for misused arguments, `OnnxImportError`
    for unreadable or invalid models and `UnsupportedOnnxError` for what the IR cannot express.
    """
    options = check_arguments(batch_axes, dims, input_shapes, input_values, base_dir, static, mmap)
    model, folder, mapped = read_model(check_source(source), base_dir, mmap)
    check_model(model, options)
    files = FileMaps(mapped, mmap)
    if sequence_outputs(model) and not static:  # outputs regrouped into lists per call
        return ValueSpecializedModel(model, folder, options, [], files=files)
    try:
        return load_graph(model, folder, options, files)
    except StaticInputRequiredError as e:
        if static:
            raise
        return ValueSpecializedModel(model, folder, options, [e.input_name], files=files)
    except SymbolicSizeError:
        if static:
            raise
        return ValueSpecializedModel(model, folder, options, [], by_shape=True, files=files)
