"""The C kernel of the block-quantized product (`steps.BlockQuantMatMul`, onnxruntime's
MatMulNBits): out [m, n] = a [m, k] @ Wᵀ with W [n, k] read packed, `bits` bits a weight, one
scale and zero point per `block` weights along k.

Two paths, chosen per call:
- **direct** (decode: few rows): a's rows are first copied into the step's scratch in the order
  the packed bytes hold their weights (per block: the values of every byte's lowest bits, then
  the next bits, ...; zero past k), so that unpacking a block is a few vector shifts and masks
  with no shuffle; then each output column is one thread's: per block the weights are unpacked
  once, their zero point subtracted (exact: small integers) and multiplied into up to four rows at
  a time, and the block's sum is scaled into per-lane accumulators (a horizontal sum per column,
  not per block). A 4-bit weight costs half a byte of memory traffic, where the float GEMV that
  dequantizing at load gave streams four bytes.
- **tiled** (prefill: many f32 rows, oneDNN present): the weights are dequantized a tile of
  columns at a time into the scratch (as the reference dequantizes: (q - zero) · scale in
  float32) and multiplied by oneDNN's `dnnl_sgemm` (set by `kn_set_sgemm`; its OpenMP team runs
  it, the pool parked first, as before a oneDNN primitive).
"""

from __future__ import annotations

import dataclasses

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cpu.csource.kernel import Args, CCall, call, parallel
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.intplan import GEMM_ROWS, TILE_FLOATS
from kn_graph.dtype import DType

__all__ = ["block_quant_call"]

_ROWS = 4  # rows of a per pass of the direct path


def block_quant_call(s: st.BlockQuantMatMul) -> CCall:
    """The kernel and arguments of step `s` (its scratch laid out as `intplan.block_scratch`
    sizes it: 16 bytes, a's rows reordered, a tile of dequantized weights)."""
    bits, block = s.bits, s.block
    per = 8 // bits
    bpb = block // per  # bytes per block
    mask = (1 << bits) - 1
    dt, odt = s.a.dtype, s.out.dtype
    tag = f"{bits}_{block}_{dt.name}_{odt.name}_{s.zeros.dtype.name}".lower()
    m, k = s.a.shape
    n = s.out.shape[1]
    a = Args()
    a.int_("m", m)
    a.int_("k", k)
    a.int_("n", n)
    a.int_("blocks", s.packed.shape[1])
    a.int_("tile", min(n, max(1, TILE_FLOATS // (s.packed.shape[1] * block))))
    for name, view in (("x", s.a), ("w", s.packed), ("sc", s.scales), ("zp", s.zeros)):
        a.ptr(name, view)
    a.ptr("out", s.out, const=False)
    a.decls.append(f"char* restrict slot = base + p[{len(a.ints)}];")
    a.ints.append(s.scratch.offset)
    a.decls.append("float* restrict xp = (float*)(slot + 16);")
    a.decls.append("const long long kp = blocks * " + str(block) + ";")
    body = CodeWriter(1)
    if dt is DType.F32 and odt is DType.F32:
        _tiled(body, a, bits, block, exprs.storage_ctype(s.zeros.dtype))
    _direct(body, a, s, tag)
    c = call("block_quant", a, body)
    helper = _rows_helper(tag, bits, block, per, bpb, mask, exprs.storage_ctype(s.zeros.dtype))
    kernel = dataclasses.replace(c.kernel, source=_EXTERNS + helper + c.kernel.source)
    return dataclasses.replace(c, kernel=kernel)


def _tiled(body: CodeWriter, a: Args, bits: int, block: int, zt: str) -> None:
    """With `GEMM_ROWS` rows or more and oneDNN: per tile of columns, the weights dequantized
    into the scratch (in parallel), then one sgemm into the tile's columns of out."""
    per, mask = 8 // bits, (1 << bits) - 1
    bpb = block // per

    def dequant(r: CodeWriter) -> None:
        r.line("float* restrict wt = xp + m * kp;")
        r.line("long long j0;")
        r.line("memcpy(&j0, slot, sizeof j0);")
        r.line("long long lo, hi;")
        with (
            r.block("while (kn_next(kn_t, &lo, &hi))"),
            r.block("for (long long jj = lo; jj < hi; ++jj)"),
        ):
            r.line(f"const uint8_t* restrict wj = w + (j0 + jj) * blocks * {bpb};")
            r.line("const float* restrict sj = sc + (j0 + jj) * blocks;")
            r.line(f"const {zt}* restrict zj = zp + (j0 + jj) * blocks;")
            r.line("float* restrict dst = wt + jj * kp;")
            with r.block("for (long long b = 0; b < blocks; ++b)"):
                r.line(f"const uint8_t* restrict wb = wj + b * {bpb};")
                r.line("const float s = sj[b], z = zj[b];")
                r.line(f"float* restrict d = dst + b * {block};")
                with r.block(f"for (int i = 0; i < {bpb}; ++i)"):
                    for t in range(per):
                        q = f"(float)((wb[i] >> {t * bits}) & {mask})"
                        r.line(f"d[i * {per} + {t}] = ({q} - z) * s;")

    with (
        body.block(f"if (m >= {GEMM_ROWS} && kn_sgemm)"),
        body.block("for (long long j0 = 0; j0 < n; j0 += tile)"),
    ):
        body.line("const long long nt = j0 + tile < n ? tile : n - j0;")
        body.line("float* restrict wt = xp + m * kp;")
        body.line("memcpy(slot, &j0, sizeof j0);  // the tile, for the region")
        parallel(body, a, [], "nt", "nt * kp * 4", dequant)
        body.line("kn_park_pool();")
        body.line(
            "if (kn_sgemm('N', 'T', m, nt, k, 1.0f, x, k, wt, kp, 0.0f, out + j0, n)) return 1;"
        )
        body.line("if (j0 + tile >= n) return 0;")


def _direct(body: CodeWriter, a: Args, s: st.BlockQuantMatMul, tag: str) -> None:
    """a's rows reordered into the scratch, then the columns shared among the threads, each
    column's rows four at a time (`_rows_helper`)."""
    bits, block, dt, odt = s.bits, s.block, s.a.dtype, s.out.dtype
    zt = exprs.storage_ctype(s.zeros.dtype)
    per = 8 // bits
    bpb = block // per

    def reorder(r: CodeWriter) -> None:
        r.line("long long lo, hi;")
        with (
            r.block("while (kn_next(kn_t, &lo, &hi))"),
            r.block("for (long long row = lo; row < hi; ++row)"),
        ):
            r.line("float* restrict dst = xp + row * kp;")
            with (
                r.block("for (long long b = 0; b < blocks; ++b)"),
                r.block(f"for (int t = 0; t < {per}; ++t)"),
                r.block(f"for (int i = 0; i < {bpb}; ++i)"),
            ):
                r.line(f"const long long c = b * {block} + i * {per} + t;")
                src = exprs.load(dt, "x[row * k + c]")
                r.line(f"dst[b * {block} + t * {bpb} + i] = c < k ? (float)({src}) : 0.0f;")

    def columns(r: CodeWriter) -> None:
        r.line("long long lo, hi;")
        r.line(f"float res[{_ROWS}];")
        with (
            r.block("while (kn_next(kn_t, &lo, &hi))"),
            r.block("for (long long j = lo; j < hi; ++j)"),
        ):
            r.line(f"const uint8_t* restrict wj = w + j * blocks * {bpb};")
            r.line("const float* restrict sj = sc + j * blocks;")
            r.line(f"const {zt}* restrict zj = zp + j * blocks;")
            with r.block(f"for (long long r0 = 0; r0 < m; r0 += {_ROWS})"):
                r.line("const float* restrict xr = xp + r0 * kp;")
                with r.block(f"if (m - r0 >= {_ROWS})"):
                    r.line(f"kn_bq_rows{_ROWS}_{tag}(wj, sj, zj, xr, kp, blocks, res);")
                    r.line(
                        f"for (int q = 0; q < {_ROWS}; ++q) "
                        f"out[(r0 + q) * n + j] = {exprs.store(odt, 'res[q]')};"
                    )
                with r.block("else"), r.block("for (long long q = r0; q < m; ++q)"):
                    r.line(f"kn_bq_rows1_{tag}(wj, sj, zj, xp + q * kp, kp, blocks, res);")
                    r.line(f"out[q * n + j] = {exprs.store(odt, 'res[0]')};")

    parallel(body, a, [], "m", "m * kp", reorder)
    parallel(body, a, [], "n", f"m * n * kp / {per}", columns)


_EXTERNS = """
#ifndef KN_BQ_EXTERNS
#define KN_BQ_EXTERNS
// oneDNN's dnnl_sgemm (row-major; NULL without oneDNN) and the pool's park, from the main unit
extern __attribute__((visibility("hidden"))) int (*kn_sgemm)(
    char, char, long long, long long, long long, float, const float*, long long, const float*,
    long long, float, float*, long long);
extern __attribute__((visibility("hidden"))) void kn_park_pool(void);
#endif
"""


def _rows_helper(
    tag: str, bits: int, block: int, per: int, bpb: int, mask: int, zt: str = "float"
) -> str:
    """`kn_bq_rows<R>_<tag>(w, s, z, x, xstride, blocks, res)` for R = 1 and `_ROWS`:
    res[r] = Σ_b s_b · Σ_i (q_bi - z_b) · x[r][b, i] for R rows of reordered x. Written with
    GCC's generic vectors as wide as the target's registers (16 lanes with AVX-512, else 8; at
    most a block's bytes): GCC 12's vectorizer unrolled the plain loops of one row and left them
    scalar (12x slower than four rows), and 16-lane vectors on an AVX2 target go through memory
    (20x slower)."""
    wide = _rows_variant(tag, bits, block, per, bpb, mask, min(16, bpb), zt)
    narrow = _rows_variant(tag, bits, block, per, bpb, mask, min(8, bpb), zt)
    guard = f"KN_BQ_ROWS_{tag.upper()}"
    return (
        f"\n#ifndef {guard}\n#define {guard}\n#if defined(__AVX512F__)\n{wide}\n#else\n"
        f"{narrow}\n#endif\n#endif\n"
    )


def _rows_variant(
    tag: str, bits: int, block: int, per: int, bpb: int, mask: int, vw: int, zt: str
) -> str:
    """`_rows_helper` with `vw`-lane vectors and zero points of C type `zt`."""
    chunks = bpb // vw
    vf, vu, vb = f"kn_bq_vf{vw}", f"kn_bq_vu{vw}", f"kn_bq_vb{vw}"
    types = f"""
#if defined(__AVX2__) && !defined(KN_BQ_X86)
#define KN_BQ_X86
#include <immintrin.h>
#endif
#ifndef KN_BQ_VECTORS_{vw}
#define KN_BQ_VECTORS_{vw}
typedef float {vf} __attribute__((vector_size({4 * vw})));
typedef int32_t {vu} __attribute__((vector_size({4 * vw})));
typedef uint8_t {vb} __attribute__((vector_size({vw})));
static inline {vf} {vf}_load(const float* p) {{
    {vf} v;
    memcpy(&v, p, sizeof v);
    return v;
}}
static inline {vu} {vu}_widen(const uint8_t* p) {{  // {vw} bytes zero-extended to int32 lanes
{_widen(vw, vb, vu)}
}}
#endif"""
    funcs = []
    for rows in sorted({1, _ROWS}):
        dots = "\n".join(
            f"                d += q[{t}] * {vf}_load(xb + {t * bpb} + c * {vw});"
            for t in range(1, per)
        )
        funcs.append(f"""
static void kn_bq_rows{rows}_{tag}(
    const uint8_t* restrict w, const float* restrict s, const {zt}* restrict z,
    const float* restrict x, const long long xstride, const long long blocks, float* restrict res) {{
    {vf} acc[{rows}][{chunks}];
    memset(acc, 0, sizeof acc);
    for (long long b = 0; b < blocks; ++b) {{
        const uint8_t* restrict wb = w + b * {bpb};
        const float zb = (float)z[b], sb = s[b];
        for (int c = 0; c < {chunks}; ++c) {{
            const {vu} u = {vu}_widen(wb + c * {vw});
            {vf} q[{per}];
            for (int t = 0; t < {per}; ++t)
                q[t] = __builtin_convertvector((u >> (t * {bits})) & {mask}, {vf}) - zb;
            for (int r = 0; r < {rows}; ++r) {{
                const float* restrict xb = x + r * xstride + b * {block};
                {vf} d = q[0] * {vf}_load(xb + c * {vw});
{dots}
                acc[r][c] += sb * d;
            }}
        }}
    }}
    for (int r = 0; r < {rows}; ++r) {{
        float sum = 0;
        for (int c = 0; c < {chunks}; ++c)
            for (int i = 0; i < {vw}; ++i) sum += acc[r][c][i];
        res[r] = sum;
    }}
}}""")
    return types + "".join(funcs)


def _widen(vw: int, vb: str, vu: str) -> str:
    """C body: `vw` bytes at p as int32 lanes. GCC 12 compiles `__builtin_convertvector` of
    bytes to a byte-by-byte extraction (most of the kernel's time), so on x86 the widening is
    the instruction made for it (vpmovzxbd), chosen by the target the library is compiled for;
    elsewhere the generic conversion."""
    generic = f"""    {vb} raw;
    memcpy(&raw, p, sizeof raw);
    return __builtin_convertvector(raw, {vu});"""
    if vw == 16:
        return f"""#if defined(__AVX512F__)
    return ({vu})_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
#elif defined(__AVX2__)
    __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
    {vu} v;
    memcpy(&v, &lo, 32);
    memcpy((char*)&v + 32, &hi, 32);
    return v;
#else
{generic}
#endif"""
    if vw == 8:
        return f"""#if defined(__AVX2__)
    return ({vu})_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
#else
{generic}
#endif"""
    return generic
