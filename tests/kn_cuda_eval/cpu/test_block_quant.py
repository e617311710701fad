"""Block-quantized products (`BlockQuantMatMul`, com.microsoft MatMulNBits) on the CPU backend's
own step, which reads the packed weights: against onnxruntime for 2-, 4- and 8-bit weights,
whole and partial blocks, with and without zero points, for the decode path (few rows: the
packed GEMV) and the prefill path (16 rows or more: tiles dequantized for oneDNN's sgemm); f16
activations against the reference executor; the plan keeps the weights packed; the emulator runs
the step; other devices get the dequantized MatMul."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from kn_cuda_eval.cpu.executor import host_plan_settings
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate
from kn_cuda_eval.planning.plan import plan
from kn_cuda_eval.planning.settings import PlanSettings
from kn_graph import DType, Graph, Shape
from kn_graph.errors import GraphError
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import model, reference


def _pack(vals: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `bits`-bit values packed along the last axis, low-order bits first."""
    per = 8 // bits
    v = vals.reshape(*vals.shape[:-1], -1, per).astype(np.uint16)
    return (v << (np.arange(per) * bits)).sum(-1).astype(np.uint8)


def _nbits(
    rng: np.random.Generator, k: int, n: int, bits: int, block: int, zeros: bool | str, rows: int
) -> tuple[onnx.ModelProto, np.ndarray]:
    """A MatMulNBits model x [rows, k] -> [rows, n] with random weights (packed zero points when
    `zeros`, float ones when "float", else the default 2^(bits-1)) and its input."""
    blocks = -(-k // block)
    inits = {
        "b": _pack(rng.integers(0, 2**bits, (n, blocks, block)), bits),
        "s": rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32),
    }
    names = ["x", "b", "s"]
    if zeros == "float":  # zero points of A's type, not integers
        inits["z"] = rng.uniform(0, 2**bits - 1, (n, blocks)).astype(np.float32)
        names.append("z")
    elif zeros:
        per_row = -(-blocks * bits // 8)
        z = np.zeros((n, per_row * 8 // bits), np.int64)
        z[:, :blocks] = rng.integers(0, 2**bits, (n, blocks))
        inits["z"] = _pack(z, bits)
        names.append("z")
    nd = helper.make_node(
        "MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n, bits=bits, block_size=block
    )
    x = rng.standard_normal((rows, k)).astype(np.float32)
    m = model([nd], {"x": x}, inits=inits)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m, x


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale)


@pytest.mark.parametrize("rows", [1, 3, 4, 6, 17, 40])  # the GEMV's remainder, groups; tiles
@pytest.mark.parametrize(
    ("bits", "block", "k", "zeros"),
    [
        (4, 32, 96, False),
        (4, 32, 80, True),
        (4, 32, 64, "float"),
        (4, 128, 200, True),
        (2, 16, 64, True),
        (8, 16, 48, False),
    ],
)
def test_device_cpu_matches_onnxruntime(
    rows: int, bits: int, block: int, k: int, zeros: bool | str
) -> None:
    rng = np.random.default_rng(rows * 1000 + bits * 100 + k)
    m, x = _nbits(rng, k, 40, bits, block, zeros, rows)
    g = load_onnx(m)
    p = plan(g, settings=host_plan_settings(g))
    assert sum(isinstance(s, st.BlockQuantMatMul) for s in p.steps) == 1
    (want,) = reference(m, {"x": x})
    (got,) = Device.cpu().prepare(g).eval({"x": x})
    _close(got, want)


def test_the_weights_stay_packed_in_the_plan() -> None:
    """A 4-bit [896 x 1024] weight takes its 458 KB of bytes plus scales and zero points in the
    arena's constants, not the 3.7 MB of its float32 form; other devices' plans dequantize."""
    rng = np.random.default_rng(1)
    k, n = 896, 1024
    m, x = _nbits(rng, k, n, 4, 32, True, 2)
    g = load_onnx(m)
    p = plan(g, settings=host_plan_settings(g))
    assert p.const_size < 2 * (n * k // 2) < n * k * 4 // 2
    lowered = plan(g, settings=PlanSettings())
    assert not any(isinstance(s, st.BlockQuantMatMul) for s in lowered.steps)
    assert any(isinstance(s, st.MatMul) for s in lowered.steps)
    assert lowered.const_size >= n * k * 4
    (want,) = reference(m, {"x": x})
    _close(emulate(p, {"x": x})[0], want)
    _close(emulate(lowered, {"x": x})[0], want)


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_f16_activations_against_the_reference(rows: int) -> None:
    """f16 a (a float16 export's MatMulNBits): always the direct path, computed in float32 and
    rounded once; the reference dequantizes in float32 and multiplies in float16."""
    rng = np.random.default_rng(rows)
    m, x = _nbits(rng, 80, 24, 4, 32, True, rows)
    for init in m.graph.initializer:
        if init.name == "s":
            arr = onnx.numpy_helper.to_array(init).astype(np.float16)
            init.CopyFrom(onnx.numpy_helper.from_array(arr, "s"))
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    g = load_onnx(m)
    xh = x.astype(np.float16)
    (want,) = evaluate(g, {"x": xh})
    (got,) = Device.cpu().prepare(g).eval({"x": xh})
    assert got.dtype == np.float16
    want32 = want.astype(np.float32)  # float16 sums: within a few ulps of the largest value
    atol = 2e-3 * float(np.abs(want32).max())
    np.testing.assert_allclose(got.astype(np.float32), want32, rtol=2e-3, atol=atol)


@pytest.mark.parametrize("rows", [2, 20])
def test_nan_and_inf_in_a_row_stay_in_that_row(rows: int) -> None:
    rng = np.random.default_rng(7)
    m, x = _nbits(rng, 64, 16, 4, 32, True, rows)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    (want,) = reference(m, {"x": x})
    (got,) = Device.cpu().prepare(load_onnx(m)).eval({"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_bad_operands_are_graph_errors() -> None:
    g = Graph()
    a = g.input(Shape.of(2, 64), DType.F32, "a")
    packed = g.constant(np.zeros((8, 2, 16), np.uint8))
    sc = g.constant(np.ones((8, 2), np.float32))
    with pytest.raises(GraphError, match="packed must be u8 \\[n, 4, 8\\]"):
        g.block_quant_matmul(a, packed, sc, sc, 4, 16)
    with pytest.raises(GraphError, match="bits must be 2, 4 or 8"):
        g.block_quant_matmul(a, packed, sc, sc, 3, 32)
    with pytest.raises(GraphError, match="zeros must be u8 or f32 \\[8, 2\\]"):
        g.block_quant_matmul(a, packed, sc, g.constant(np.ones((8, 3), np.float32)), 4, 32)
    b = g.input(Shape.of(2, 64), DType.F64, "b")
    with pytest.raises(GraphError, match="a must be f32 or f16"):
        g.block_quant_matmul(b, packed, sc, sc, 4, 32)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "native"])
@pytest.mark.parametrize(("bits", "block"), [(4, 32), (4, 128), (2, 16), (8, 16)])
def test_the_row_kernels_on_every_x86_target(
    tmp_path: object, target: str, bits: int, block: int
) -> None:
    """The direct path's row functions compiled for SSE-only (generic vectors), AVX2 (8 lanes,
    vpmovzxbd) and AVX-512 (16 lanes) targets, whatever this machine runs: the library is
    compiled with -march=native, so each user's CPU picks one variant, and this machine alone
    would test one. Each compiles here; each that this CPU can execute runs against NumPy."""
    import ctypes
    import subprocess
    from pathlib import Path

    from kn_cuda_eval.cpu import build
    from kn_cuda_eval.cpu.csource.blockquant import _rows_helper
    from kn_graph.blockquant import dequantize

    cc = build.compiler()
    assert cc is not None
    flags = (Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]).split()
    needs = {"x86-64-v3": {"avx2", "fma"}, "x86-64-v4": {"avx512f", "avx512bw", "avx512vl"}}
    per, mask = 8 // bits, (1 << bits) - 1
    bpb = block // per
    src = "#include <stdint.h>\n#include <string.h>\n" + _rows_helper(
        "t", bits, block, per, bpb, mask
    )
    src += """
void run(const uint8_t* w, const float* s, const float* z, const float* x, long long kp,
         long long blocks, long long n, long long rows, float* out) {
    for (long long j = 0; j < n; ++j) {
        long long r = 0;
        for (; r + 4 <= rows; r += 4) kn_bq_rows4_t(w + j * blocks * BPB, s + j * blocks,
                                                     z + j * blocks, x + r * kp, kp, blocks, out + j * rows + r);
        for (; r < rows; ++r) kn_bq_rows1_t(w + j * blocks * BPB, s + j * blocks, z + j * blocks,
                                            x + r * kp, kp, blocks, out + j * rows + r);
    }
}
""".replace("BPB", str(bpb))
    d = Path(str(tmp_path))
    (d / "k.c").write_text(src)
    lib = d / "k.so"
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-O3",
            f"-march={target}",
            "-shared",
            "-fPIC",
            "-w",
            "-ffp-contract=fast",
            str(d / "k.c"),
            "-o",
            str(lib),
        ],
        check=True,
    )
    rng = np.random.default_rng(bits * block)
    n, blocks, rows = 12, 3, 6
    kp = blocks * block
    packed = rng.integers(0, 256, (n, blocks, bpb), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32)
    zeros = rng.integers(0, mask + 1, (n, blocks)).astype(np.float32)
    x = rng.standard_normal((rows, kp)).astype(np.float32)
    want = x.astype(np.float64) @ dequantize(packed, scales, zeros, bits, block, kp).T.astype(
        np.float64
    )
    # the row functions read x reordered as the kernel's first region writes it
    xr = x.reshape(rows, blocks, bpb, per).transpose(0, 1, 3, 2).reshape(rows, kp).copy()
    if not needs.get(target, set()) <= set(flags):
        assert lib.stat().st_size > 0  # this CPU cannot execute it: compiled, not run
        return
    out = np.zeros((n, rows), np.float32)
    f = ctypes.CDLL(str(lib)).run
    ptr = ctypes.c_void_p
    f.argtypes = [
        ptr,
        ptr,
        ptr,
        ptr,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ptr,
    ]
    f(
        packed.ctypes.data,
        scales.ctypes.data,
        zeros.ctypes.data,
        xr.ctypes.data,
        kp,
        blocks,
        n,
        rows,
        out.ctypes.data,
    )
    np.testing.assert_allclose(out.T, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
