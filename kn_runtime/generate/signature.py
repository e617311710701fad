"""Which input and output of a decoder graph is which: token ids, attention mask, positions, the
merged decoder's `use_cache_branch`, and the past/present pairs of the KV cache, found by name in
the loaded graph (genai's name templates first, when the folder gives them) — with the shapes the
loop needs: how many tokens a step takes (a plain export may take exactly one) and each past
tensor's heads, head size and dtype."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kn_graph.errors import ModelFolderError
from kn_graph.graph import Graph

__all__ = ["DecoderSignature", "PastSpec", "read_signature"]

PAST = re.compile(r"^past_key_values[._].+|^past_.+")
"""A cache input: Optimum's `past_key_values.{i}.key` / `.value`, a plain export's `past_*`."""


@dataclass(frozen=True, slots=True)
class PastSpec:
    """One cache input and the output that extends it: [batch, heads, length, head size]."""

    name: str
    present: str
    heads: int
    head_dim: int
    dtype: np.dtype


@dataclass(frozen=True, slots=True)
class DecoderSignature:
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    use_cache_branch: str | None
    logits: str
    past: tuple[PastSpec, ...]
    outputs: tuple[str, ...]
    """Every output, in the order an evaluation returns them."""
    vocab: int | None
    """The logits' last dim when the graph fixes it."""
    step_tokens: int | None
    """The sequence length every step must have (1 for a plain export that takes one token at a
    time; the prompt is then fed token by token), None when any length goes."""


def _dims(loaded: Any) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
    """Each graph input's dims (None where symbolic) and NumPy dtype."""
    if isinstance(loaded, Graph):
        return {
            n: (tuple(d.fixed_value() for d in loaded[v].shape.dims), loaded[v].dtype.np)
            for n, v in zip(loaded.input_names, loaded.inputs, strict=True)
        }
    from onnx import helper

    # a ValueSpecializedModel (shapes decided by input values): its ONNX inputs say the same
    out = {}
    for vi in loaded.model.graph.input:
        t = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        out[vi.name] = (dims, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
    return out


def _outputs(loaded: Any) -> dict[str, int | None]:
    """Each output's name and last dim (None where symbolic or unknown), in order."""
    if isinstance(loaded, Graph):
        return {
            n: loaded[v].shape.dims[-1].fixed_value() if loaded[v].shape.rank else None
            for n, v in zip(loaded.output_names, loaded.outputs, strict=True)
        }
    out: dict[str, int | None] = {}
    for o in loaded.model.graph.output:
        dims = o.type.tensor_type.shape.dim
        out[o.name] = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
    return out


def _present_of(past: str, outputs: set[str], names: Mapping[str, str]) -> str | None:
    """The output that extends cache input `past`: genai's templates, else Optimum's and the
    plain exports' spellings."""
    for kv in ("key", "value"):
        template = names.get(f"past_{kv}_names")
        out_template = names.get(f"present_{kv}_names")
        if template and out_template:
            m = re.fullmatch(re.escape(template).replace("%d", r"(\d+)"), past)
            if m:
                return out_template.replace("%d", m.group(1))
    for cand in (past.replace("past_key_values", "present"), past.replace("past", "present", 1)):
        if cand in outputs:
            return cand
    return None


def read_signature(
    loaded: Any,
    names: Mapping[str, str],
    kv_heads: int | None,
    head_dim: int | None,
    where: str,
) -> DecoderSignature:
    """The decoder's signature; ModelFolderError for inputs or outputs of no known role."""
    inputs = _dims(loaded)
    last_dims = _outputs(loaded)
    outputs = list(last_dims)
    role = {k: names.get(k, k) for k in ("input_ids", "attention_mask", "position_ids", "logits")}
    if role["input_ids"] not in inputs or role["logits"] not in outputs:
        raise ModelFolderError(
            f"{where}: unknown layout, expected an input '{role['input_ids']}' and an output "
            f"'{role['logits']}', found inputs {list(inputs)} and outputs {outputs}"
        )
    past: list[PastSpec] = []
    known = {role["input_ids"], role["attention_mask"], role["position_ids"], "use_cache_branch"}
    for name, (dims, dtype) in inputs.items():
        if name in known:
            continue
        present = _present_of(name, set(outputs), names) if PAST.match(name) else None
        if present is None or present not in outputs or len(dims) != 4:
            raise ModelFolderError(
                f"{where}: unknown layout, input '{name}' {list(dims)} is neither the ids, mask, "
                "positions, use_cache_branch nor a past_* cache input [batch, heads, length, "
                f"head size] with a present_* output (outputs: {outputs})"
            )
        heads, size = dims[1] or kv_heads, dims[3] or head_dim
        if heads is None or size is None:
            raise ModelFolderError(
                f"{where}: input '{name}' {list(dims)} has symbolic heads or head size and the "
                "config gives none (num_key_value_heads, head_dim)"
            )
        past.append(PastSpec(name, present, heads, size, dtype))
    ids_dims = inputs[role["input_ids"]][0]
    return DecoderSignature(
        input_ids=role["input_ids"],
        attention_mask=role["attention_mask"] if role["attention_mask"] in inputs else None,
        position_ids=role["position_ids"] if role["position_ids"] in inputs else None,
        use_cache_branch="use_cache_branch" if "use_cache_branch" in inputs else None,
        logits=role["logits"],
        past=tuple(past),
        outputs=tuple(outputs),
        vocab=last_dims[role["logits"]],
        step_tokens=ids_dims[1] if len(ids_dims) == 2 else None,
    )
