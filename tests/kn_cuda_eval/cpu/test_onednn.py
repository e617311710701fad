"""oneDNN runners (kn_cuda_eval.cpu.onednn) against the plan emulator, step by step: every
convolution and GEMM step of the fixture corpus (unoptimized and optimized, every binding), and
hand-built steps with adversarial layouts. Where oneDNN is not installed (or hidden by
KN_ONEDNN=0), or does not implement a step's data type on this CPU (F16 needs AVX512-FP16 or AMX:
`onednn_probe` asks it), the same tests check the fallback instead: the factories return None
and the emulator's step runs."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.onednn import lib as onednn_lib
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate_step, load_arena, view_array
from kn_cuda_eval.planning.gemm import plan_gemm
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import EvaluationError, KnError
from kn_graph.optimizer import optimize
from tests.kn_cuda_eval.corpus import FIXTURES, cases
from tests.kn_cuda_eval.cpu.onednn_probe import implements

TOL = {DType.F32: 1e-5, DType.F16: 2e-2, DType.F64: 1e-12}
HAVE = onednn.available() is None


def _runner(s: st.Step, arena: np.ndarray, const: bool) -> onednn.Runner | object | None:
    if isinstance(s, st.Conv):
        return onednn.conv_runner(s, arena, 2, constant_weights=const)
    assert isinstance(s, st.MatMul)
    return onednn.gemm_runner(s, arena, 2, constant_weights=const)


def _close(got: np.ndarray, ref: np.ndarray, dt: DType, what: str) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    g, r = got.astype(np.float64), ref.astype(np.float64)
    assert (np.isnan(g) == np.isnan(r)).all(), f"{what}: NaN positions differ"
    fin = np.isfinite(r)
    assert (g[~fin] == r[~fin]).all(), f"{what}: non-finite values differ"
    if fin.any():
        err = float(np.max(np.abs(g[fin] - r[fin]))) / max(1.0, float(np.max(np.abs(r[fin]))))
        assert err <= TOL[dt], f"{what}: max relative difference {err:.3g} > {TOL[dt]}"


def runs(s: st.Conv | st.MatMul) -> bool:
    """Whether a runner must take step s here: F64 GEMMs go to NumPy's BLAS on every machine;
    convolutions and other GEMMs to oneDNN where it implements their kind and data type on
    this CPU (asked of oneDNN; F32 everywhere, F16 only with AVX512-FP16/AMX), else the
    factories give None and the emulator's step runs (the documented fallback)."""
    if isinstance(s, st.Conv):
        return implements("conv", s.out.dtype)
    return s.dtype is DType.F64 or implements("gemm", s.dtype)


def check_step(arena: np.ndarray, k: int, s: st.Conv | st.MatMul, const: bool = False) -> bool:
    """Run step k through its runner on a copy of `arena` and through the emulator on `arena`
    itself; compare what the step wrote. `const`: the weights are constants (packed once).
    The runner must exist exactly where `runs(s)` says. Returns whether a runner ran."""
    mine = arena.copy()
    r = _runner(s, mine, const)
    out = s.out if isinstance(s, st.Conv) else s.c
    if runs(s):
        assert r is not None, f"step {k} ({s.describe()}) fell back to the emulator"
    else:
        why = onednn.available() or f"oneDNN does not implement {s.describe()} on this CPU"
        assert r is None, f"a runner for step {k} ({s.describe()}), where {why}"
    if r is None:
        emulate_step(mine, k, s)  # the caller's fallback
    else:
        r()  # type: ignore[operator]
    emulate_step(arena, k, s)
    _close(view_array(mine, out), view_array(arena, out), out.dtype, f"step {k} {s.describe()}")
    return r is not None


# -- the fixture corpus ---------------------------------------------------------------------------


def _corpus_names() -> list[str]:
    return [f["name"] for f in FIXTURES]


@pytest.mark.parametrize("name", _corpus_names())
def test_corpus_conv_and_gemm_steps_match_the_emulator(name: str) -> None:
    for graph, feed, binds in cases(name):
        for g in (graph, optimize(graph)):
            if g.has_dynamic:  # segmented plans: their GEMM/conv steps are covered by others
                continue
            p = plan(g, bindings=binds)
            arena = load_arena(p, feed)
            for k, s in enumerate(p.steps):
                if isinstance(s, st.Conv | st.MatMul):
                    w = s.w if isinstance(s, st.Conv) else s.a
                    const = any(o <= w.offset < o + d.nbytes for o, d in p.constants)
                    check_step(arena, k, s, const=const)
                else:
                    emulate_step(arena, k, s)


def test_corpus_has_conv_and_gemm_steps() -> None:
    """The corpus test above is not vacuous: ResNet has convolutions, BERT GEMMs."""
    for name, kind in (("resnet18_ts", st.Conv), ("bert_ts", st.MatMul)):
        graph, _, binds = cases(name)[0]
        assert any(isinstance(s, kind) for s in plan(graph, bindings=binds).steps), name


# -- hand-built steps ---------------------------------------------------------------------------


class _Arena:
    """Views allocated one after another (256-byte aligned) in an arena filled with NaN bytes."""

    def __init__(self) -> None:
        self.end = 0
        self.fills: list[StridedView] = []

    def dense(self, shape: tuple[int, ...], dt: DType, fill: bool = True) -> StridedView:
        v = StridedView.dense(self.end, shape, dt)
        self.end += (v.nbytes + 255) // 256 * 256
        if fill:
            self.fills.append(v)
        return v

    def make(self, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        arena = np.full(self.end, 0xFF, np.uint8)
        for v in self.fills:
            view_array(arena, v)[...] = rng.standard_normal(v.shape)
        return arena


def _conv(
    n: int,
    c: int,
    spatial: tuple[int, ...],
    k: int,
    ks: tuple[int, ...],
    *,
    groups: int = 1,
    stride: int = 1,
    pad: int = 0,
    dil: int = 1,
    bias: bool = True,
    residual: str | None = None,
    relu: bool = False,
    dt: DType = DType.F32,
    x_layout: str = "dense",
) -> tuple[st.Conv, np.ndarray]:
    nd = len(spatial)
    out_sp = tuple(
        (i + 2 * pad - dil * (kk - 1) - 1) // stride + 1 for i, kk in zip(spatial, ks, strict=True)
    )
    a = _Arena()
    if x_layout == "channel_slice":  # x is channels 2..2+c of a wider tensor
        wide = a.dense((n, c + 3, *spatial), dt)
        x = wide.slice(1, 2, 1, c)
    elif x_layout == "channels_last":  # NHWC in memory, seen as NCHW
        cl = a.dense((n, *spatial, c), dt)
        x = cl.permute((0, nd + 1, *range(1, nd + 1)))
    else:
        x = a.dense((n, c, *spatial), dt)
    w = a.dense((k, c // groups, *ks), dt)
    b = a.dense((k,), dt) if bias else None
    res = None
    if residual == "dense":
        res = a.dense((n, k, *out_sp), dt)
    elif residual == "permuted":  # a residual read through a transpose of its spatial axes
        rp = a.dense((n, k, *reversed(out_sp)), dt)
        res = rp.permute((0, 1, *range(1 + nd, 1, -1)))
    out = a.dense((n, k, *out_sp), dt, fill=False)
    step = st.Conv(x, w, b, res, out, (stride,) * nd, (pad,) * nd, (dil,) * nd, groups, relu)
    return step, a.make()


CONVS = {
    "resnet 3x3 +bias+res+relu": dict(n=2, c=16, spatial=(9, 9), k=8, ks=(3, 3), pad=1,
                                      residual="dense", relu=True),
    "stride 2 dilation 2": dict(n=1, c=6, spatial=(11, 10), k=5, ks=(3, 3), stride=2, pad=2,
                                dil=2),
    "odd size stride 2 (right padding cut)": dict(n=1, c=3, spatial=(8, 8), k=4, ks=(3, 3),
                                                  stride=2, pad=1),
    "groups 2": dict(n=2, c=8, spatial=(7, 7), k=6, ks=(3, 3), groups=2, pad=1, relu=True),
    "depthwise": dict(n=1, c=12, spatial=(10, 10), k=12, ks=(3, 3), groups=12, pad=1),
    "depthwise multiplier 2": dict(n=1, c=4, spatial=(6, 6), k=8, ks=(3, 3), groups=4, pad=1),
    "1x1 no bias": dict(n=3, c=10, spatial=(5, 5), k=7, ks=(1, 1), bias=False),
    "1x1 +res+relu (plain NCHW path)": dict(n=2, c=9, spatial=(6, 5), k=7, ks=(1, 1),
                                            residual="dense", relu=True),
    "1x1 stride 2 (blocked path)": dict(n=1, c=8, spatial=(7, 7), k=4, ks=(1, 1), stride=2),
    "1-d": dict(n=2, c=4, spatial=(17,), k=3, ks=(5,), pad=2, residual="dense"),
    "3-d": dict(n=1, c=3, spatial=(5, 6, 4), k=4, ks=(3, 3, 3), pad=1, relu=True),
    "channel-slice input": dict(n=2, c=5, spatial=(6, 6), k=4, ks=(3, 3), pad=1,
                                x_layout="channel_slice"),
    "channels-last input, permuted residual": dict(n=2, c=5, spatial=(6, 7), k=4, ks=(3, 3),
                                                   pad=1, x_layout="channels_last",
                                                   residual="permuted", relu=True),
    "f16 +res+relu": dict(n=1, c=8, spatial=(8, 8), k=8, ks=(3, 3), pad=1, residual="dense",
                          relu=True, dt=DType.F16),
}  # fmt: skip


@pytest.mark.parametrize("const", [True, False], ids=["packed-weights", "weights-per-run"])
@pytest.mark.parametrize("case", list(CONVS))
def test_conv_runner_matches_the_emulator(case: str, const: bool) -> None:
    s, arena = _conv(**CONVS[case])  # type: ignore[arg-type]
    check_step(arena, 0, s, const=const)


def test_conv_weights_per_run_follow_a_change() -> None:
    """Weights not marked constant are read at every run (computed by an earlier step)."""
    s, arena = _conv(**CONVS["groups 2"])  # type: ignore[arg-type]
    r = onednn.conv_runner(s, arena, 2, constant_weights=False)
    view_array(arena, s.w)[...] *= -0.5  # after the build
    ref = arena.copy()
    emulate_step(ref, 0, s)
    if r is None:
        assert not HAVE
        return
    r()  # type: ignore[operator]
    _close(view_array(arena, s.out), view_array(ref, s.out), DType.F32, "new weights")


@pytest.mark.parametrize("layout", ["blocked", "plain", "auto"])
def test_conv_layouts_agree(layout: str) -> None:
    s, arena = _conv(**CONVS["resnet 3x3 +bias+res+relu"])  # type: ignore[arg-type]
    mine = arena.copy()
    r = onednn.conv_runner(s, mine, 1, layout=layout)
    emulate_step(arena, 0, s)
    if r is None:
        assert not HAVE
        return
    r()
    _close(view_array(mine, s.out), view_array(arena, s.out), DType.F32, layout)


def test_conv_f64_falls_back() -> None:
    s, arena = _conv(n=1, c=2, spatial=(4, 4), k=2, ks=(3, 3), dt=DType.F64)
    assert onednn.conv_runner(s, arena, 2) is None
    assert not runs(s)
    check_step(arena, 0, s)


def _gemm(
    batch: int,
    m: int,
    k: int,
    n: int,
    *,
    ta: bool = False,
    tb: bool = False,
    shared_a: bool = False,
    shared_b: bool = False,
    pad_ld: int = 0,
    alpha: float = 1.0,
    dt: DType = DType.F32,
) -> tuple[st.MatMul, np.ndarray]:
    """out [batch,m,n] = alpha·a [batch,m,k] @ b [batch,k,n], planned as the planner does;
    ta/tb store an operand transposed, shared_* broadcast it over the batch (stride 0), pad_ld
    leaves a gap after every row."""
    ar = _Arena()

    def operand(rows: int, cols: int, trans: bool, shared: bool) -> StridedView:
        r, c = (cols, rows) if trans else (rows, cols)
        v = ar.dense((1 if shared else batch, r, c + pad_ld), dt).slice(2, 0, 1, c)
        if trans:
            v = v.permute((0, 2, 1))
        return v.broadcast((batch, rows, cols)) if shared else v

    a = operand(m, k, ta, shared_a)
    b = operand(k, n, tb, shared_b)
    out = ar.dense((batch, m, n), dt, fill=False)
    s = plan_gemm(a, b, out, alpha, lambda v: 1 / 0)  # type: ignore[arg-type, return-value]
    assert isinstance(s, st.MatMul)
    return s, ar.make()


GEMMS = {
    "NN": dict(batch=1, m=33, k=17, n=9),
    "TN": dict(batch=3, m=8, k=12, n=5, ta=True),
    "NT (q·kᵀ)": dict(batch=4, m=16, k=8, n=16, tb=True),
    "TT alpha": dict(batch=2, m=7, k=9, n=11, ta=True, tb=True, alpha=0.125),
    "shared right operand (one big GEMM)": dict(batch=5, m=6, k=7, n=4, shared_b=True),
    "shared left operand (broadcast batch)": dict(batch=5, m=6, k=7, n=4, shared_a=True),
    "shared transposed right operand": dict(batch=3, m=4, k=5, n=6, tb=True, shared_b=True,
                                            ta=True),
    "padded leading dimensions": dict(batch=2, m=10, k=12, n=14, pad_ld=3, tb=True),
    "matrix-vector": dict(batch=2, m=1, k=31, n=1),
    "f16": dict(batch=2, m=24, k=40, n=16, alpha=0.5, dt=DType.F16),
    "f64 (BLAS)": dict(batch=2, m=9, k=8, n=7, ta=True, alpha=2.0, dt=DType.F64),
    "bert 128x768x768": dict(batch=1, m=128, k=768, n=768),
    "decode: one row": dict(batch=1, m=1, k=200, n=333),
    "decode: four rows, alpha": dict(batch=1, m=4, k=77, n=130, alpha=0.5),
    "decode: three rows, padded leading dimensions": dict(batch=1, m=3, k=40, n=70, pad_ld=5),
}  # fmt: skip


@pytest.mark.parametrize("const", [False, True], ids=["weights-per-run", "packed-weights"])
@pytest.mark.parametrize("case", list(GEMMS))
def test_gemm_runner_matches_the_emulator(case: str, const: bool) -> None:
    s, arena = _gemm(**GEMMS[case])  # type: ignore[arg-type]
    check_step(arena, 0, s, const=const)


def test_gemm_beta_is_a_sum_post_op() -> None:
    s, arena = _gemm(batch=2, m=5, k=6, n=7, tb=True)
    c = view_array(arena, s.c)
    c[...] = np.random.default_rng(1).standard_normal(c.shape)
    s = st.MatMul(s.a, s.b, s.c, s.transa, s.transb, s.m, s.n, s.k, s.batch, 0.5, 2.0)
    check_step(arena, 0, s)


@pytest.mark.parametrize("backend", ["onednn", "blas"])
def test_gemm_backends_agree(backend: str) -> None:
    s, arena = _gemm(batch=3, m=20, k=30, n=10, ta=True, alpha=3.0)
    mine = arena.copy()
    r = onednn.gemm_runner(s, mine, 2, backend=backend)
    emulate_step(arena, 0, s)
    if r is None:
        assert not HAVE and backend == "onednn"
        return
    r()
    _close(view_array(mine, s.c), view_array(arena, s.c), DType.F32, backend)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_decode_beta_is_summed_over_packed_weights(rows: int) -> None:
    """A few rows against constant weights (`kn_gemv` where oneDNN packs in strips): alpha
    and beta as the primitive's post-ops have them."""
    s, arena = _gemm(batch=1, m=rows, k=50, n=90)
    c = view_array(arena, s.c)
    c[...] = np.random.default_rng(2).standard_normal(c.shape)
    s = st.MatMul(s.a, s.b, s.c, s.transa, s.transb, s.m, s.n, s.k, s.batch, 0.5, 2.0)
    check_step(arena, 0, s, const=True)


@pytest.mark.parametrize("kind", ["conv", "decode gemm"])
def test_rebind_moves_a_runner_to_another_arena(kind: str) -> None:
    """The runner built over one arena runs over another of the same layout (new data; the
    constant weights are the runner's own), a decode product's `kn_gemv` call included."""
    if kind == "conv":
        s, arena = _conv(**CONVS["groups 2"])  # type: ignore[arg-type]
        other = _conv(**CONVS["groups 2"])[1]
        weights, data, out = s.w, s.x, s.out
    else:
        s, arena = _gemm(batch=1, m=2, k=64, n=100)
        other = _gemm(batch=1, m=2, k=64, n=100)[1]
        weights, data, out = s.a, s.b, s.c  # cuBLAS's A: the graph's right operand
    r = _runner(s, arena, kind != "conv")
    view_array(other, weights)[...] = view_array(arena, weights)
    view_array(other, data)[...] *= -1
    ref = other.copy()
    emulate_step(ref, 0, s)
    if r is None:
        assert not HAVE
        return
    r.rebind(other)  # type: ignore[union-attr]
    r()  # type: ignore[operator]
    _close(view_array(other, out), view_array(ref, out), DType.F32, f"rebound {kind}")


# -- through the executor ---------------------------------------------------------------------


@pytest.mark.parametrize("dt", [DType.F32, DType.F16], ids=["f32", "f16"])
def test_executor_runs_convolutions_and_gemms_where_onednn_implements_them(dt: DType) -> None:
    """A convolution and a GEMM through the host executor against the reference executor:
    oneDNN runs them where it implements the data type on this CPU, else the emulator's
    convolution and NumPy's matmul do (F16 on AVX-512 without FP16, AVX2), with equal results."""
    from kn_cuda_eval.cpu.executor import HostExecutor
    from kn_graph import Graph
    from kn_graph.reference import evaluate
    from tests.kn_cuda_eval.helpers import assert_close

    rng = np.random.default_rng(3)
    npdt = dt.np
    g = Graph()
    x = g.input((2, 8, 6, 6), dt, "x")
    w = g.constant((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(npdt))
    y = g.relu(g.conv(x, w, padding=(1, 1)))
    m = g.constant((rng.standard_normal((36, 12)) * 0.2).astype(npdt))
    g.add_output(g.matmul_nd(g.view(y, (2, 16, 36)), m), "z")
    feed = [rng.standard_normal((2, 8, 6, 6)).astype(npdt)]
    ex = HostExecutor(plan(g), threads=2)
    for got, ref in zip(ex.eval(feed), evaluate(g, feed), strict=True):
        assert_close(got, ref, f"{dt.name} conv + matmul")
    kinds = {type(s): ex.names[k] for k, s in enumerate(ex.plan.steps)}
    conv, gemm = kinds[st.Conv], kinds[st.MatMul]
    # the fallbacks: the emulator's convolution; NumPy's matmul on the arena views for F32,
    # the emulator's GEMM for F16 (its F32 accumulation and conversions)
    if implements("conv", dt):
        assert conv.startswith("onednn conv"), ex.names
    else:
        assert conv == "numpy", ex.names
    fallback = "numpy matmul" if dt is DType.F32 else "numpy"
    assert gemm == ("onednn/blas gemm" if implements("gemm", dt) else fallback), ex.names


# -- availability and errors ----------------------------------------------------------------------


def _wheel_installed() -> bool:
    try:
        importlib.metadata.version("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_available_when_the_wheel_is_installed() -> None:
    reason = onednn.available()
    if not onednn_lib.search():  # KN_ONEDNN=0: as if not installed, saying why
        assert reason is not None and onednn.HIDE_VARIABLE in reason and "\n" not in reason
    elif _wheel_installed():
        assert reason is None, reason
        assert onednn.load_dnnl().version().startswith("3.")
    else:
        assert isinstance(reason, str) and "oneDNN" in reason and "\n" not in reason


def test_f32_is_implemented_wherever_onednn_is() -> None:
    """The probe is not vacuous: F32 convolutions and GEMMs run in oneDNN on every x86-64 CPU it
    supports; F16 is the CPU's (the executor test above checks both answers)."""
    for kind in ("conv", "gemm"):
        assert implements(kind, DType.F32) == HAVE, kind  # type: ignore[arg-type]
        assert not implements(kind, DType.F64), kind  # type: ignore[arg-type]
        if not HAVE:
            assert not implements(kind, DType.F16), kind  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "off", "False", " no "])
def test_kn_onednn_hides_the_library(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """$KN_ONEDNN=0 behaves as if oneDNN were not installed, even after it was loaded: one-line
    reason naming the variable, no runners, the emulator's step (the GPU image's case)."""
    started_hidden = not onednn_lib.search()  # then stay hidden: the run is the GPU image's
    before = onednn.available()
    monkeypatch.setenv(onednn.HIDE_VARIABLE, value)
    reason = onednn.available()
    assert reason is not None and f"KN_ONEDNN={value!r}" in reason and "\n" not in reason
    with pytest.raises(onednn.OnednnUnavailableError, match="KN_ONEDNN"):
        onednn.load_dnnl.__wrapped__()  # the uncached search: what a fresh process does
    s, arena = _conv(**CONVS["resnet 3x3 +bias+res+relu"])  # type: ignore[arg-type]
    assert onednn.conv_desc(s, 2) is None and not runs(s)
    g, garena = _gemm(batch=2, m=3, k=4, n=5)
    assert onednn.gemm_runner(g, garena, 2) is None and not runs(g)
    check_step(arena, 0, s)
    check_step(garena, 0, g)
    if not started_hidden:
        monkeypatch.setenv(onednn.HIDE_VARIABLE, "1")  # any other value: the library as found
        assert onednn.available() == before
        monkeypatch.delenv(onednn.HIDE_VARIABLE)
        assert onednn.available() == before


def test_a_failed_execution_is_our_error_naming_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    s, arena = _conv(**CONVS["resnet 3x3 +bias+res+relu"])  # type: ignore[arg-type]
    if not HAVE:
        assert onednn.conv_runner(s, arena, 2) is None
        return
    r = onednn.conv_runner(s, arena, 2)
    assert isinstance(r, onednn.Runner)
    r()  # runs
    monkeypatch.setattr(r, "_execute", lambda *args: 5)  # dnnl_runtime_error from now on
    with pytest.raises(onednn.OnednnError) as info:
        r()
    e = info.value
    assert isinstance(e, EvaluationError) and e.function == "dnnl_primitive_execute"
    assert s.describe() in str(e) and "status 5 (runtime_error)" in str(e)


def test_a_failed_build_is_our_error_naming_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    s, arena = _gemm(batch=2, m=4, k=5, n=6)
    if not HAVE:
        assert onednn.gemm_runner(s, arena, 2) is None
        return
    lib = onednn.load_dnnl()
    monkeypatch.setitem(lib.fns, "dnnl_matmul_primitive_desc_create", lambda *args: 2)
    with pytest.raises(onednn.OnednnError) as info:
        onednn.gemm_runner(s, arena, 2)
    e = info.value
    assert isinstance(e, EvaluationError) and isinstance(e, KnError)
    assert e.function == "dnnl_matmul_primitive_desc_create" and e.status == 2
    assert s.describe() in str(e) and "invalid_arguments" in str(e)


def test_unimplemented_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    s, arena = _gemm(batch=2, m=4, k=5, n=6)
    if HAVE:
        lib = onednn.load_dnnl()
        monkeypatch.setitem(lib.fns, "dnnl_matmul_primitive_desc_create", lambda *args: 3)
    assert onednn.gemm_runner(s, arena, 2) is None


def test_a_missing_library_is_a_one_line_reason_and_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(onednn_lib, "search", lambda: [("nowhere", "/nonexistent/libdnnl.so.3")])
    caches = (onednn_lib.load_dnnl, onednn_lib.engine)
    for f in caches:
        f.cache_clear()
    try:
        reason = onednn.available()
        assert reason is not None and "could not be loaded" in reason and "\n" not in reason
        assert "/nonexistent/libdnnl.so.3" in reason and "'cpu' extra" in reason
        s, arena = _conv(**CONVS["1x1 no bias"])  # type: ignore[arg-type]
        assert onednn.conv_runner(s, arena, 2) is None
        g, garena = _gemm(batch=2, m=3, k=4, n=5)
        assert onednn.gemm_runner(g, garena, 2) is None
        assert not runs(s) and not runs(g)
        check_step(arena, 0, s)
    finally:
        for f in caches:
            f.cache_clear()  # the next caller loads the real library again
