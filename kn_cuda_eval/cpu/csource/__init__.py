"""Host C for a plan's fused steps: elementwise (and copy), reduce, softmax, layernorm, gather and
attention, printed from the same expression table as the CUDA kernels (`codegen/exprs.py`, through
`codegen/printer.py`) — the row kernels and attention from the same device-neutral descriptions
too (`codegen/rows.py`, `codegen/attention.py`) — over the C prelude `prelude.h` (half, the
`kn_*` helpers, vectorizable exp / tanh / erf).

Every kernel has the signature `int name(char* base, const long long* p, const double* f)`: sizes,
strides and byte offsets come in `p`, scales and epsilons in `f`, so one compiled function serves
every step of the same structure (program, dtypes, rank, innermost stride class). It returns 0, or
1 when a gather index is out of range (nothing written). Loops: the innermost axis is a plain
counted loop over restrict pointers (vectorizable), the outer axes are split into chunks that the
process's thread pool (`pool.c`) hands out dynamically when the step is big enough (`PAR_WORK`
units of work): the parallel part of a kernel is a region function of its own
(`kernel.parallel`), which the calling thread runs too, taking chunks until none is left.

Modules: `kernel` (the signature, arguments, offsets, the work split), `elementwise` (elementwise,
copy, gather), `rows` and `folds` (softmax, layernorm, reductions along rows), `columns`
(reductions down columns), `attention`, `library` (the shared library's step loop).

>>> from kn_cuda_eval.planning.program import Bin, Load, Program
>>> from kn_cuda_eval.planning.view import StridedView
>>> from kn_graph.dtype import DType
>>> from kn_graph.ops import BinaryOp
>>> v = StridedView.dense(256, (4, 8), DType.F32)
>>> prog = Program((Load(0, DType.F32), Load(1, DType.F32), Bin(BinaryOp.ADD, 0, 1, DType.F32)), (2,))
>>> call = step_call(st.Elementwise((4, 8), (v, v.with_offset(512)), (), (v.with_offset(768),), prog))
>>> call.kernel.name.startswith("kn_ew_"), call.ints[:3]
(True, (4, 8, 768))
"""

from __future__ import annotations

from typing import assert_never

from kn_cuda_eval.cpu.csource.attention import attention_call
from kn_cuda_eval.cpu.csource.blockquant import block_quant_call
from kn_cuda_eval.cpu.csource.columns import columnar, reduce_columns_call
from kn_cuda_eval.cpu.csource.elementwise import (
    copy_call,
    elementwise_call,
    gather_call,
    memory_order,
)
from kn_cuda_eval.cpu.csource.kernel import PAR_WORK, CCall, CKernel
from kn_cuda_eval.cpu.csource.library import library_sources
from kn_cuda_eval.cpu.csource.rows import layernorm_call, reduce_rows_call, softmax_call
from kn_cuda_eval.planning import steps as st

__all__ = ["PAR_WORK", "CCall", "CKernel", "library_sources", "memory_order", "step_call"]


def step_call(step: st.Step) -> CCall | None:
    """The C call of a step, or None for the library steps (GEMMs and convolutions, float or
    integer)."""
    match step:
        case st.Elementwise():
            return elementwise_call(step)
        case st.Copy():
            return copy_call(step)
        case st.Gather():
            return gather_call(step)
        case st.Softmax():
            return softmax_call(step)
        case st.Layernorm():
            return layernorm_call(step)
        case st.Reduce():
            return reduce_columns_call(step) if columnar(step) else reduce_rows_call(step)
        case st.Attention():
            return attention_call(step)
        case st.BlockQuantMatMul():
            return block_quant_call(step)
        case st.MatMul() | st.Conv() | st.IntMatMul() | st.IntConv():
            return None
        case _:
            assert_never(step)
