"""Sequence outputs: the importer turns a model's sequence-typed output into graph outputs
`name.0`, `name.1`, ... (or one `name.stacked` whose axis 0 runs over the elements), and
`regroup_outputs` turns a graph's results back into the model's terms, one list per sequence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from kn_graph.graph import Graph

__all__ = ["STACKED", "regroup_outputs", "sequence_outputs"]

STACKED = ".stacked"
"""Suffix of a graph output holding a sequence output's elements stacked on axis 0."""


def sequence_outputs(model: onnx.ModelProto) -> list[str]:
    """The names of the model's sequence-typed outputs."""
    out = []
    for o in model.graph.output:
        t = o.type.optional_type.elem_type if o.type.HasField("optional_type") else o.type
        if t.HasField("sequence_type"):
            out.append(o.name)
    return out


def regroup_outputs(
    model: onnx.ModelProto, graph: Graph, outputs: Sequence[object]
) -> list[object]:
    """The graph's outputs in the model's terms: a sequence output (graph outputs `name.0`,
    `name.1`, ... or `name.stacked`) becomes one list."""
    seqs = set(sequence_outputs(model))
    by_name = dict(zip(graph.output_names, outputs, strict=True))
    result: list[object] = []
    for o in model.graph.output:
        if o.name not in seqs:
            result.append(by_name[o.name])
        elif f"{o.name}{STACKED}" in by_name:
            result.append(list(np.asarray(by_name[f"{o.name}{STACKED}"])))
        else:
            k = 0
            items = []
            while f"{o.name}.{k}" in by_name:
                items.append(by_name[f"{o.name}.{k}"])
                k += 1
            result.append(items)
    return result
