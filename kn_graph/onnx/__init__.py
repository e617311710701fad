"""The ONNX loader: `load_onnx(path | bytes, ...) -> Graph`."""

from kn_graph.onnx import handlers as _handlers  # noqa: F401  (registers every op handler)
from kn_graph.onnx.loader import DEFAULT_BATCH_AXES, load_onnx
from kn_graph.onnx.specialized import ValueSpecializedModel

__all__ = ["DEFAULT_BATCH_AXES", "ValueSpecializedModel", "load_onnx"]
