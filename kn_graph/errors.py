"""The one exception hierarchy of Kyanite: every error a user can provoke is a `KnError`.

Messages say what was expected, what was found and where (node, op, value, input, axis).
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "CudaUnavailableError",
    "EvaluationError",
    "FixedSizeRequiredError",
    "GraphError",
    "InputMismatchError",
    "KernelCompileError",
    "KnError",
    "ModelFolderError",
    "OnnxImportError",
    "PlanError",
    "RequestError",
    "ShapeMismatchError",
    "StaticInputRequiredError",
    "SymbolicSizeError",
    "UnknownOperatorError",
    "UnsupportedOnnxError",
]


class KnError(Exception):
    """Base class of every error raised on purpose by Kyanite."""


class GraphError(KnError):
    """A graph builder was called with operands it cannot accept (shapes, dtypes, attributes)."""


class FixedSizeRequiredError(GraphError):
    """A builder needs a fixed number where it was given a symbolic size."""


class ArgumentTypeError(KnError, TypeError):
    """A public function was called with an argument of the wrong type (`except TypeError`
    catches it too, as Python convention expects)."""


class ArgumentValueError(KnError, ValueError):
    """A public function was called with an argument of the right type but a bad value
    (`except ValueError` catches it too)."""


class ShapeMismatchError(KnError, ValueError):
    """Actual input shapes contradict the graph's (symbolic) input shapes or a given batch size,
    or a binding violates a guard (`except ValueError` catches it too)."""


class InputMismatchError(ShapeMismatchError):
    """Wrong number of inputs, wrong dtype or wrong shape passed to an evaluation."""


class EvaluationError(KnError):
    """An executor failed while computing one value; the message names the value and its op."""


class OnnxImportError(KnError):
    """The ONNX file itself is unreadable: corrupt bytes, missing external data, invalid graph."""


class UnsupportedOnnxError(OnnxImportError):
    """A valid ONNX node that Kyanite cannot express (op, attribute value, dynamic behaviour)."""

    def __init__(self, node_name: str, op_type: str, detail: str) -> None:
        self.node_name = node_name
        self.op_type = op_type
        self.detail = detail
        # a graph input or initializer has no op type: then `node_name` already says what it is
        where = f"node '{node_name}' ({op_type})" if op_type else node_name
        super().__init__(f"{where}: {detail}")


class StaticInputRequiredError(UnsupportedOnnxError):
    """A node needs the value of a graph input at load time (e.g. the target shape of a Reshape).

    Pass it with `load_onnx(..., input_values={name: array})`.
    """

    def __init__(self, node_name: str, op_type: str, input_name: str, what: str) -> None:
        self.input_name = input_name
        super().__init__(
            node_name,
            op_type,
            f"{what} comes from graph input '{input_name}', whose value must be known at load "
            f"time; pass it with load_onnx(..., input_values={{'{input_name}': ...}})",
        )


class PlanError(KnError):
    """The CUDA planner cannot plan a graph (unsupported layout, dtype or size)."""


class KernelCompileError(KnError):
    """NVRTC rejected a generated kernel; the message carries the log and the numbered source."""


class CudaUnavailableError(KnError):
    """CUDA was asked for but no working device, driver or library was found."""


class UnknownOperatorError(UnsupportedOnnxError):
    """An operator (or domain) Kyanite has no handler for. A model holding one fails at load,
    even inside an If branch that may never run, as onnxruntime fails at session creation."""


class SymbolicSizeError(UnsupportedOnnxError):
    """A node the IR can express for fixed sizes only (an LSTM over a symbolic length, SAME
    padding of a symbolic size with a stride). `load_onnx` then returns a model that is
    loaded per binding of the input shapes; `load_onnx(..., static=True)` raises this."""


class ModelFolderError(KnError):
    """A model folder (an LLM export for `kn_runtime.generate`) lacks a file, has a layout
    Kyanite does not know, or holds files that do not fit together (a tokenizer whose vocabulary
    is larger than the model's logits); the message names the file and what to do."""


class RequestError(KnError, ValueError):
    """A request to a served model is malformed: unreadable body, unknown media type, missing or
    unexpected inputs, a dtype or shape the model does not take, a body over the size limit.
    `status` is the HTTP status a server answers with (400, 413 or 415)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
