"""Generation on the LLM fixture folders (tests/models/llm: Optimum exports of tiny Llama, Qwen2
and GPT-2, an older merged Optimum decoder, onnxruntime-genai builder folders in fp32 and int4
with GroupQueryAttention and MatMulNBits): greedy continuations equal the stored onnxruntime ones
token for token, for one prompt and for a left-padded batch of two."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kn_runtime import Device, load_generator
from tests.paths import MODELS

LLM = MODELS / "llm"
FOLDERS = sorted(json.loads((LLM / "manifest.json").read_text())["folders"])


@pytest.mark.parametrize("name", FOLDERS)
def test_greedy_64_tokens_equal_onnxruntime(name: str) -> None:
    ref = np.load(LLM / name / "reference.npz")
    gen = load_generator(LLM / name, Device.cpu(reference=True))
    r = gen.generate([ref["prompt_ids"][0].tolist()], max_new_tokens=64)
    np.testing.assert_array_equal(np.array(r.ids[0]), ref["tokens"][0])
    # a left-padded batch: each row as onnxruntime's loop over the same export continues it (for
    # the genai folders that loop, not og.Generator, whose padded row differs: the manifest)
    key = "batch_tokens_ort_loop" if "batch_tokens_ort_loop" in ref else "batch_tokens"
    mask = ref["batch_mask"]
    rows = [ref["batch_ids"][i][mask[i] == 1].tolist() for i in range(2)]
    r = gen.generate(rows, max_new_tokens=64)
    for i in range(2):
        np.testing.assert_array_equal(np.array(r.ids[i]), ref[key][i], err_msg=f"row {i}")


@pytest.mark.parametrize("name", ["llama_optimum", "qwen2_genai_int4"])
def test_the_cpu_backend_continues_like_onnxruntime(name: str) -> None:
    """Device.cpu() (a plan per past length today: a few tokens keep this fast)."""
    ref = np.load(LLM / name / "reference.npz")
    r = load_generator(LLM / name, Device.cpu()).generate(
        [ref["prompt_ids"][0].tolist()], max_new_tokens=4
    )
    np.testing.assert_array_equal(np.array(r.ids[0]), ref["tokens"][0][:4])
