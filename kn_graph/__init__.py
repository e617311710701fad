"""kn_graph — the Kyanite IR: symbolic shapes, a closed op set, a hash-consed SSA graph, the ONNX
loader and the NumPy reference executor."""

from kn_graph._moved import install as _install_moved
from kn_graph.dtype import DType
from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EvaluationError,
    GraphError,
    InputMismatchError,
    KnError,
    OnnxImportError,
    ShapeMismatchError,
    StaticInputRequiredError,
    SymbolicSizeError,
    UnknownOperatorError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import BATCH, Shape, Size, infer_symbols

__all__ = [
    "BATCH",
    "ArgumentTypeError",
    "ArgumentValueError",
    "BinaryOp",
    "DType",
    "EvaluationError",
    "Graph",
    "GraphError",
    "InputMismatchError",
    "KnError",
    "OnnxImportError",
    "ReduceOp",
    "Shape",
    "ShapeMismatchError",
    "Size",
    "StaticInputRequiredError",
    "SymbolicSizeError",
    "UnaryOp",
    "UnknownOperatorError",
    "UnsupportedOnnxError",
    "Value",
    "ValueInfo",
    "infer_symbols",
]

_install_moved()  # old module paths keep working for one release, with a warning
