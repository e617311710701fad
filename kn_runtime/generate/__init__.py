"""kn_runtime.generate — text generation with an exported LLM folder (Optimum or
onnxruntime-genai builder layout) on a Kyanite device: `load_generator(folder).generate(prompt)`,
`.stream(prompt)` for tokens as they come, `Batcher(generator).submit(prompt)` for concurrent
requests decoded together (continuous batching), and the `kn-generate` CLI (`cli`)."""

from kn_runtime.generate.batcher import BatchedStream, Batcher
from kn_runtime.generate.generator import TINY_LLM, GenerationStream, Generator, load_generator
from kn_runtime.generate.result import GenerationResult, Timing, TokenEvent
from kn_runtime.generate.sampling import SamplingParams

__all__ = [
    "TINY_LLM",
    "BatchedStream",
    "Batcher",
    "GenerationResult",
    "GenerationStream",
    "Generator",
    "SamplingParams",
    "Timing",
    "TokenEvent",
    "load_generator",
]
