r"""Block-quantized weights (`BlockQuantMatMul`, onnxruntime's MatMulNBits): unpacking, the
dequantized float32 weights the op is defined by, and the lowering of the op to a MatMul with
those weights for a device that has no step for it (every executor but the CPU backend's, which
reads the packed weights in its own step and so keeps a 4-bit model at a quarter of its float
size in memory).

>>> import numpy as np
>>> from kn_graph import DType, Graph, Shape
>>> packed = np.full((1, 1, 8), 0x21, np.uint8)  # one row, one block of 16: 1 2 1 2 ...
>>> one, two = np.ones((1, 1), np.float32), np.full((1, 1), 2, np.float32)
>>> dequantize(packed, one, two, 4, 16, 4)
array([[-1.,  0., -1.,  0.]], dtype=float32)
>>> g = Graph()
>>> a = g.input(Shape.of(2, 16), DType.F32, "a")
>>> y = g.block_quant_matmul(a, g.constant(packed), g.constant(one), g.constant(two), 4, 16)
>>> g.add_output(y, "y")
>>> print(*str(lower_block_products(g)).splitlines()[-4:-1], sep="\n")
%6: f32[1,2,16] = view(%0)
%7: f32[1,2,1] = matmul(%6, %5)
%8: f32[2,1] = view(%7)
"""

from __future__ import annotations

import weakref

import numpy as np

from kn_graph.errors import GraphError
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import BlockQuantMatMul, Constant, Op, Value
from kn_graph.shape import Shape

__all__ = ["dequantize", "has_block_products", "lower_block_products", "unpack_bits"]

_LOWERED: weakref.WeakKeyDictionary[Graph, Graph] = weakref.WeakKeyDictionary()


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The `count` unsigned `bits`-bit values packed along the last axis of uint8 `packed`,
    low-order bits first (MatMulNBits' and GatherBlockQuantized's layout)."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(*packed.shape[:-1], -1)[..., :count]


def dequantize(
    packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, bits: int, block: int, k: int
) -> np.ndarray:
    """W [n, k] float32 = (q - zeros) · scales per block, as onnxruntime dequantizes."""
    n, blocks = scales.shape
    q = unpack_bits(packed, bits, block).astype(np.float32)  # [n, blocks, block]
    w = (q - zeros.reshape(n, blocks, 1).astype(np.float32)) * scales.reshape(n, blocks, 1)
    return w.reshape(n, blocks * block)[:, :k]


def has_block_products(graph: Graph) -> bool:
    return any(isinstance(graph[v].op, BlockQuantMatMul) for v in graph.values())


def lower_block_products(graph: Graph) -> Graph:
    """A copy of `graph` whose BlockQuantMatMuls are MatMuls with the dequantized weights (as
    constants of a's type); everything else rebuilt as it is. Cached per graph."""
    from kn_graph.optimizer.core import rebuild_with

    done = _LOWERED.get(graph)
    if done is None:
        done = _LOWERED[graph] = rebuild_with(graph, _lowered)
    return done


def _lowered(g: Graph, info: ValueInfo, op: Op) -> Value | None:
    if not isinstance(op, BlockQuantMatMul):
        return None
    arrays = [_constant(g, x) for x in (op.packed, op.scales, op.zeros)]
    m, k = g.shape(op.a).dims
    w = dequantize(*arrays, op.bits, op.block, k.as_int()).T.astype(info.dtype.np)
    b = g.view(g.constant(np.ascontiguousarray(w)), Shape.of(1, k, w.shape[1]))
    return g.view(g.matmul(g.view(op.a, Shape.of(1, m, k)), b), info.shape)


def _constant(graph: Graph, v: Value) -> np.ndarray:
    op = graph[v].op
    if not isinstance(op, Constant):
        raise GraphError(
            f"{graph.format_value(v)}: a block-quantized product's weights must be constants"
        )
    return op.tensor.array
