"""Serving a model on the engines teams already run: `BatchedModel` (many requests, one
evaluation; thread-safe), the HTTP bodies every front end shares (`codec`), a Ray Serve
deployment (`ray_serve`), PyTriton and a Triton model repository (`triton`, `repository`), and
`kn-serve`. The engines are extras (`serve-ray`, `serve-triton`), imported only when used."""

from kn_runtime.serve.batching import BatchedModel, TensorSpec
from kn_runtime.serve.loading import load_model

__all__ = ["BatchedModel", "TensorSpec", "load_model"]
