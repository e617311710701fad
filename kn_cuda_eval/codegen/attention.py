"""The arithmetic of the fused attention step, shared by both backends' kernels: the accumulator
type, the exponential, the masked and causal score, the normalized output. Only the arithmetic:
the loop structure cannot be shared without costing one backend what makes it fast.

- CUDA (`cuda/kernels/attention.py`, `templates/attention.cu`): one warp per query row visits
  the keys one at a time — a warp-reduced dot product per key — with an *online* softmax: a
  running max, and the running sum and the dv output accumulators rescaled by exp(old - new)
  whenever the max grows. Nothing but registers: no row of scores is materialised, and a
  fully masked key is skipped (`s == -inf`).
- C (`cpu/csource/attention.py`): per (batch, head), k and v are transposed into per-thread
  scratch; per query row the n scores are materialised, then a *two-pass* softmax (the max,
  then the exponentials and their sum) and one dot product per output column. Every inner loop
  runs along contiguous keys under `omp simd`, whatever d and dv are; the online form's
  per-key rescaling of dv accumulators would serialise on the key loop instead.

The two orders round differently (the online sum is rescaled, the two-pass one is not); both
are checked against the reference within the tests' tolerance. A fully masked row gives
0 / 0 = NaN on both, as the reference.

>>> m = attention(DType.F16)
>>> m.acc, m.exp, m.causal_last
('float', 'expf', 'i + (n - m)')
>>> m.output(DType.F16, "o", "l")
'__float2half(o / l)'
"""

from __future__ import annotations

from dataclasses import dataclass

from kn_cuda_eval.codegen import exprs
from kn_graph.dtype import DType

__all__ = ["AttentionMath", "attention"]


@dataclass(frozen=True, slots=True)
class AttentionMath:
    """`acc`: the type of the scale, the scores, the softmax and the accumulators (float for f16
    and f32 storage, double for f64, as the emulator computes); `exp` its exponential."""

    acc: str
    exp: str

    causal_last = "i + (n - m)"
    """The last key query i sees under a causal mask (the queries are the last m of n keys)."""

    def mask(self, dt: DType, ref: str) -> str:
        """The additive mask element `ref` (of dtype `dt`) in the accumulator type."""
        return f"({self.acc}){exprs.load(dt, ref)}"

    def output(self, out: DType, weighted: str, total: str) -> str:
        """The stored output: the `weighted` sum of the values over the softmax's `total`."""
        return exprs.store(out, f"{weighted} / {total}")


def attention(q: DType) -> AttentionMath:
    acc = exprs.acc_ctype(q)
    return AttentionMath(acc, "exp" if acc == "double" else "expf")
