"""An onnxruntime greedy decode loop in plain Python, independent of `kn_runtime.generate`: the
reference its tests (and the LLM fixture folders under tests/models/llm/) are checked against.

It reads the roles of the inputs from the onnxruntime session by name (`input_ids`,
`attention_mask`, `position_ids`, `use_cache_branch`, `past_key_values.*` or `past_*`, whose
output is the same name with `present` for `past_key_values` / `past`), left-pads a batch,
feeds position ids counted from each row's first real token (pads get 1, as Hugging Face
does), and grows the cache by concatenation (the presents are the next pasts). A model whose
`input_ids` has a fixed length 1 is fed its prompt token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["ort_greedy"]

_NP = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": np.float32,
}


def _present(name: str) -> str:
    if name.startswith("past_key_values"):
        return name.replace("past_key_values", "present", 1)
    return name.replace("past", "present", 1)


def ort_greedy(
    model: str | Path,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    pad: int = 0,
) -> np.ndarray:
    """`new_tokens` greedy tokens per row [batch, new_tokens] (no early stop), onnxruntime CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past")]
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = np.full((batch, width), pad, np.int64)
    mask = np.zeros((batch, width), np.int64)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :], mask[r, width - len(p) :] = p, 1
    cache = {}
    for n in pasts:
        shape = inputs[n].shape  # [batch, heads, past, head size]; heads and size are fixed
        cache[n] = np.zeros((batch, shape[1], 0, shape[3]), _NP.get(inputs[n].type, np.float32))
    one_at_a_time = inputs["input_ids"].shape[1] == 1
    chunks = [ids[:, j : j + 1] for j in range(width)] if one_at_a_time else [ids]
    seen = 0
    tokens: list[np.ndarray] = []
    for step in range(len(chunks) + new_tokens - 1):
        chunk = chunks[step] if step < len(chunks) else tokens[-1][:, None]
        seen += chunk.shape[1]
        full_mask = (
            mask[:, :seen]
            if seen <= width
            else np.concatenate([mask, np.ones((batch, seen - width), np.int64)], axis=1)
        )
        feed = {"input_ids": chunk, **cache}
        if "attention_mask" in inputs:
            feed["attention_mask"] = full_mask
        if "position_ids" in inputs:
            pos = np.cumsum(full_mask, axis=1) - 1
            feed["position_ids"] = np.where(full_mask == 0, 1, pos)[:, -chunk.shape[1] :]
        if "use_cache_branch" in inputs:
            feed["use_cache_branch"] = np.array([seen > chunk.shape[1]])
        outs = dict(zip(outputs, sess.run(outputs, feed), strict=True))
        cache = {n: outs[_present(n)] for n in pasts}
        if step >= len(chunks) - 1:
            tokens.append(np.argmax(outs["logits"][:, -1, :], axis=-1).astype(np.int64))
    return np.stack(tokens, axis=1)
