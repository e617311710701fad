"""The C kernel of the fused attention step: the arithmetic of `codegen/attention.py` (shared
with the CUDA kernel) in loops along the keys — per (batch, head), k and v transposed once into
per-thread scratch (kt [d, n], vt [dv, n]), so that every inner loop runs along contiguous keys
and vectorizes whatever d and dv are; then per query row the scores, their max, the exponentials
and their sum, and one dot per output column. (Why this is not the CUDA kernel's online softmax:
`codegen/attention.py`.)"""

from __future__ import annotations

from collections.abc import Sequence

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.attention import AttentionMath, attention
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cpu.csource.kernel import (
    Args,
    CCall,
    call,
    each_unit,
    offset_sum,
    parallel,
    term,
)
from kn_cuda_eval.planning import steps as st

__all__ = ["attention_call"]


def _at(strides: Sequence[str], *coords: str) -> str:
    return offset_sum("", [term(c, t) for c, t in zip(coords, strides, strict=False)])


class _Attention:
    """The kernel's parameters (declared in the order of the signature) and its row body."""

    def __init__(self, s: st.Attention) -> None:
        self.s = s
        self.math: AttentionMath = attention(s.q.dtype)
        a = self.a = Args()
        b1n, b2n, m, d = s.q.shape
        a.int_("batch", b1n * b2n)
        a.int_("heads", b2n)
        a.int_("m", m)
        a.int_("n", s.k.shape[2])
        a.int_("d", d)
        a.int_("dv", s.v.shape[3])
        a.float_("scale", s.scale, self.math.acc)
        self.q, self.sq = a.ptr("q", s.q), a.strides("sq", s.q.strides)
        self.k, self.sk = a.ptr("k", s.k), a.strides("sk", s.k.strides)
        self.v, self.sv = a.ptr("v", s.v), a.strides("sv", s.v.strides)
        self.out, self.so = a.ptr("out", s.out, const=False), a.strides("so", s.out.strides)
        if s.mask is not None:
            self.mask, self.sm = a.ptr("mask", s.mask), a.strides("sm", s.mask.strides)

    def transpose(self, w: CodeWriter) -> None:
        """k and v of the row's (batch, head) into kt and vt, when it is not the last row's."""
        acc, dt, sk, sv = self.math.acc, self.s.q.dtype, self.sk, self.sv
        with w.block("if (b != cur)"):
            w.line("cur = b;")
            with w.block("for (long long j = 0; j < n; ++j)"):
                w.line(f"const long long kb = {_at(sk, 'b1', 'b2', 'j')};")
                w.line(f"const long long vb = {_at(sv, 'b1', 'b2', 'j')};")
                kl = exprs.load(dt, f"{self.k}[{offset_sum('kb', [term('t', sk[3])])}]")
                vl = exprs.load(dt, f"{self.v}[{offset_sum('vb', [term('c', sv[3])])}]")
                w.line(f"for (long long t = 0; t < d; ++t) kt[t * n + j] = ({acc}){kl};")
                w.line(f"for (long long c = 0; c < dv; ++c) vt[c * n + j] = ({acc}){vl};")

    def scores(self, w: CodeWriter) -> None:
        """sc[j] = q_i · k_j for the keys [0, jend) the row sees."""
        acc, s = self.math.acc, self.s
        w.line(f"const long long qb = {_at(self.sq, 'b1', 'b2', 'i')};")
        if s.causal:
            w.line(f"long long jend = {self.math.causal_last} + 1;")
            w.line("jend = jend < 0 ? 0 : (jend > n ? n : jend);")
        else:
            w.line("const long long jend = n;")
        w.line("for (long long j = 0; j < jend; ++j) sc[j] = 0;")
        with w.block("for (long long t = 0; t < d; ++t)"):
            ql = exprs.load(s.q.dtype, f"{self.q}[{offset_sum('qb', [term('t', self.sq[3])])}]")
            w.line(f"const {acc} qt = ({acc}){ql};")
            w.line(f"const {acc}* restrict kr = kt + t * n;")
            w.line("#pragma omp simd")
            w.line("for (long long j = 0; j < jend; ++j) sc[j] += qt * kr[j];")

    def softmax(self, w: CodeWriter) -> None:
        """sc[j] scaled and masked, then exp(sc[j] - max), and their sum l."""
        acc, s = self.math.acc, self.s
        w.line(f"{acc} mx = -KN_INF;")
        masked = ""
        if s.mask is not None:
            w.line(f"const long long mb = {_at(self.sm, 'b1', 'b2', 'i')};")
            ref = f"{self.mask}[{offset_sum('mb', [term('j', self.sm[3])])}]"
            masked = f" + {self.math.mask(s.mask.dtype, ref)}"
        w.line("#pragma omp simd reduction(max : mx)")
        with w.block("for (long long j = 0; j < jend; ++j)"):
            w.line(f"const {acc} sj = sc[j] * scale{masked};")
            w.line("sc[j] = sj;")
            w.line("mx = sj > mx ? sj : mx;")
        w.line("if (!isfinite(mx)) mx = 0;  // as the reference: a fully masked row gives NaN")
        w.line(f"{acc} l = 0;")
        w.line("#pragma omp simd reduction(+ : l)")
        with w.block("for (long long j = 0; j < jend; ++j)"):
            w.line(f"const {acc} pj = {self.math.exp}(sc[j] - mx);")
            w.line("sc[j] = pj;")
            w.line("l += pj;")

    def output(self, w: CodeWriter) -> None:
        """out[c] = Σ_j sc[j] · v[j, c] / l for every output column c."""
        acc = self.math.acc
        w.line(f"const long long ob = {_at(self.so, 'b1', 'b2', 'i')};")
        with w.block("for (long long c = 0; c < dv; ++c)"):
            w.line(f"const {acc}* restrict vr = vt + c * n;")
            w.line(f"{acc} o = 0;")
            w.line("#pragma omp simd reduction(+ : o)")
            w.line("for (long long j = 0; j < jend; ++j) o += sc[j] * vr[j];")
            dst = f"{self.out}[{offset_sum('ob', [term('c', self.so[3])])}]"
            w.line(f"{dst} = {self.math.output(self.s.out.dtype, 'o', 'l')};")


def attention_call(s: st.Attention) -> CCall:
    t = _Attention(s)
    acc = t.math.acc
    w = CodeWriter(1)
    shared = ["const long long rows = batch * m;"]
    w.line(shared[0])

    def region(w: CodeWriter) -> None:
        w.line(f"{acc}* kt = ({acc}*)malloc(sizeof({acc}) * (size_t)((d + dv + 1) * n + 1));")
        w.line(f"{acc}* vt = kt + d * n;")
        w.line(f"{acc}* sc = vt + dv * n;")
        w.line("long long cur = -1;")
        with each_unit(w, "row"):
            w.line("const long long b = row / m, i = row % m, b1 = b / heads, b2 = b % heads;")
            t.transpose(w)
            t.scores(w)
            t.softmax(w)
            t.output(w)
        w.line("free(kt);")

    parallel(w, t.a, shared, "rows", "rows * n * (d + dv)", region)
    return call("attention", t.a, w)
