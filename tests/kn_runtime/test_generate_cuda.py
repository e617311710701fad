"""Generation on a real CUDA device (skips without one; `benchmarks/gpu_check.sh` runs it with
KN_REQUIRE_CUDA=1): the greedy tokens of the fixture prompt are onnxruntime's, for fp32 and the
4-bit genai folder (MatMulNBits dequantized at plan time there), and the decode steps' executors
replay CUDA graphs. Its fake-device twin (`test_generate_cuda_fake.py`) runs in CI."""

from __future__ import annotations

import numpy as np
import pytest

from kn_runtime import Device, load_generator
from tests.kn_cuda_eval.helpers import need_gpu
from tests.paths import MODELS

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", ["llama_optimum", "qwen2_optimum", "qwen2_genai_int4"])
def test_greedy_tokens_on_the_gpu(name: str) -> None:
    need_gpu()
    folder = MODELS / "llm" / name
    ref = np.load(folder / "reference.npz")
    gen = load_generator(folder, Device.cuda())
    r = gen.generate([ref["prompt_ids"][0].tolist()], max_new_tokens=24)
    assert r.ids[0] == tuple(ref["tokens"][0][:24].tolist())
    if gen.model.bucket > 1:  # decode steps share a binding: its executor replays a graph
        past = 32  # the fixtures' prompts are under 32 tokens: the first padded length
        ex = gen.model.prepared.executor(
            {"B": 1, "past_sequence_length": past, "sequence_length": 1}
        )
        assert ex.executor.uses_cuda_graph
