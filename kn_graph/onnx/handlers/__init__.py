"""ONNX op handlers, one module per op family; importing this package registers them all."""

from kn_graph.onnx.handlers import elementwise, nn, reduce, shape  # noqa: F401
from kn_graph.onnx.handlers import loss, quant  # noqa: F401  (elementwise compositions)
from kn_graph.onnx.handlers import control, tensor  # noqa: F401  (indexing, If)
from kn_graph.onnx.handlers import attention, conv, deform_conv, einsum, grid, linear_attention, norm, pool, resize, rnn, roi_align, rotary, signal  # noqa: F401  (nn family)
