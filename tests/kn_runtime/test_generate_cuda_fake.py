"""Generation on the CUDA executor over the fake device (`tests/kn_cuda_eval/cuda/fake_device.py`:
the plan's kernels and cuBLAS/cuDNN calls run on the CPU as the real libraries document them):
the tokens are onnxruntime's, and every decode step after an executor's first is one CUDA-graph
replay — the decode steps of one padded past length share one executor (one binding), so a
generation replays one captured graph per 32 tokens instead of launching every kernel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kn_cuda_eval.cuda.device import CudaExecutor
from kn_graph import Graph
from kn_graph.optimizer import optimize
from kn_runtime import Device, load_generator
from kn_runtime.backend import CudaRun
from kn_runtime.generate.generator import Generator
from kn_runtime.generate.model import DecoderModel
from kn_runtime.prepared import PreparedGraph
from tests.kn_cuda_eval.cuda.fake_device import FakeApi
from tests.paths import MODELS


class FakeCudaBackend:
    """`kn_runtime.backend.CudaBackend` with each executor on a fake device of its own."""

    per_binding = True
    device_arrays = True

    def __init__(self) -> None:
        self.built: list[tuple[dict[str, int], CudaExecutor, FakeApi]] = []

    def executor(self, graph: Graph, bindings: Mapping[str, int]) -> Any:
        fake = FakeApi()
        ex = CudaExecutor(graph, api=fake, bindings=dict(bindings))  # type: ignore[arg-type]
        fake.expect(ex.launches)
        self.built.append((dict(bindings), ex, fake))
        return CudaRun(ex)

    def memory(self) -> None:
        return None

    def close(self) -> None:
        pass


def test_decode_steps_replay_one_cuda_graph_per_binding() -> None:
    folder = MODELS / "llm" / "llama_optimum"
    ref = np.load(folder / "reference.npz")
    host = load_generator(folder, Device.cpu(reference=True))  # the folder read, outputs trimmed
    backend = FakeCudaBackend()
    graph = optimize(host.model.prepared.graph)
    prepared = PreparedGraph(graph, "fake CUDA device", None, backend)  # type: ignore[arg-type]
    model = DecoderModel(prepared, host.model.signature, appends=host.model.appends)
    gen = Generator(host.spec, model, host.tokenizer)
    r = gen.generate([ref["prompt_ids"][0].tolist()], max_new_tokens=24)
    assert r.ids[0] == tuple(ref["tokens"][0][:24].tolist())
    # a 19-token prompt: the prefill (past 0), then 23 decode steps at past 19..41, fed as 32
    # (past 19..32: 14 steps) and 64 (33..41: 9 steps): three executors, one CUDA-graph capture
    # each but the prefill's (evaluated once), every evaluation after an executor's first a
    # graph replay
    past = [b.get("past_sequence_length") for b, _, _ in backend.built]
    assert past == [0, 32, 64], backend.built
    evals = [14, 9]
    for (_, ex, fake), n in zip(backend.built[1:], evals, strict=True):
        assert ex.uses_cuda_graph and fake.captures == 1
        assert fake.graph_launches == n - 1, (fake.graph_launches, n)
    assert backend.built[0][2].graph_launches == 0
