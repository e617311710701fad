"""`PlanSettings`: the planner's switches (fusion on or off, kernel size limits), validated when
made; the defaults are what the executors run."""

from __future__ import annotations

from dataclasses import dataclass

from kn_graph.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["PlanSettings"]


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """Planner switches; the defaults are what the executor runs."""

    fuse_elementwise: bool = True
    """Merge chains of Unary/Binary/Select/Iota (and row-kernel prologues) into one kernel."""
    fuse_conv: bool = True
    """Fold bias, one residual add and relu into the cuDNN convolution."""
    fuse_conv_relu: bool = True
    """With `fuse_conv`: fold the relu too. Off where the library's relu does not keep NaN as
    `max(x, 0)` does (oneDNN's JIT relu is a max instruction that gives 0 for NaN: the CPU
    backend plans with it off then, `kn_cuda_eval.cpu.passes.fuse.relu_agrees`); the relu is then an
    elementwise step of its own."""
    fused_attention: bool = True
    """Attention as one generated kernel; off: MatMul (alpha=scale), Softmax, MatMul."""
    integer_steps: bool = False
    """Plan `IntMatMul` / `IntConv` as integer steps of their own (`steps.IntMatMul`,
    `steps.IntConv`: 8-bit operands, int32 sums) for a backend that runs them natively (the CPU
    backend: oneDNN's int8 matmul and convolution). Off: `plan()` first lowers them to exact
    float64 GEMMs and convolutions (`kn_graph.integer.lower_integer_products`), which every
    executor runs (the CUDA one: cuBLAS DGEMM, cuDNN)."""
    block_quant_steps: bool = False
    """Plan `BlockQuantMatMul` as a step of its own (`steps.BlockQuantMatMul`, reading the packed
    weights) for a backend that runs it (the CPU backend's C kernel). Off: `plan()` first lowers
    it to a MatMul with the dequantized weights (`kn_graph.blockquant.lower_block_products`)."""
    inputs_in_concat: bool = False
    """An input read only as the first operand of a Concat (a decoder's past, before the new
    positions) is placed at the head of the concat's buffer, which stays live to the end of the
    plan: the concat copies only the rest, the input's view in the arena is strided, and a
    caller that keeps the input in the arena between evaluations (`HostExecutor.input_view`)
    never copies it (the CPU backend)."""
    max_recompute: int = 8
    """A lazy value is fused through a broadcast (recomputed per copy) only up to this many
    arithmetic instructions; larger ones are materialised first."""
    max_kernel_inputs: int = 12
    """At most this many distinct operand views per generated kernel."""
    max_kernel_ops: int = 256
    """At most this many arithmetic instructions per fused elementwise kernel: a longer chain is
    split into several kernels, each storing its result for the next. NVRTC takes about 0.1 s
    for a 256-op kernel, 0.4 s for 1,024 and 0.9 s for 2,048 ops, growing faster than the
    length (benchmarks/RESULTS.md, "Planning time vs graph size"), and the emulator holds a few
    full-size temporaries per kernel; a split costs one extra pass over memory per 256 ops of
    arithmetic, noise for a kernel that long. Real chains (GELU, layernorm, a quantised
    activation) are tens of ops and never split."""

    def __post_init__(self) -> None:
        for name in (
            "fuse_elementwise",
            "fuse_conv",
            "fuse_conv_relu",
            "fused_attention",
            "integer_steps",
            "block_quant_steps",
            "inputs_in_concat",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(
                    f"PlanSettings: {name} must be a bool, found {getattr(self, name)!r}"
                )
        for name, low in (("max_recompute", 0), ("max_kernel_inputs", 1), ("max_kernel_ops", 1)):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int):
                raise ArgumentTypeError(f"PlanSettings: {name} must be an int, found {val!r}")
            if val < low:
                raise ArgumentValueError(f"PlanSettings: {name} must be >= {low}, found {val}")
