"""The executor's own logic on the fake device (CPU): staging through pinned buffers, device
arrays in and out, warm-up then CUDA-graph replay, capture failure, the status word, input
checks, profiling, TF32 and the arena's initial contents. (Every planner test also runs its plans
through the executor on the fake device: see helpers.check_device.)"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from collections.abc import Callable

import numpy as np
import pytest

from kn_cuda_eval import emulate, plan
from kn_cuda_eval.cuda.cudnn.lib import ConvFwdAlgo, MathType
from kn_cuda_eval.cuda.device import ExecutorSettings
from kn_cuda_eval.cuda.device.calls import CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32
from kn_cuda_eval.cuda.device.executor import CudaExecutor
from kn_graph import DType, Graph, Shape, Size
from kn_graph.errors import CudaUnavailableError, EvaluationError, InputMismatchError
from tests.kn_cuda_eval.cuda.fake_device import FakeApi
from tests.kn_cuda_eval.cuda.test_executor_binding import _mixed_graph
from tests.kn_cuda_eval.helpers import assert_close

RNG = np.random.default_rng(11)


def _executor(g: Graph, **settings: object) -> tuple[CudaExecutor, FakeApi]:
    fake = FakeApi()
    ex = CudaExecutor(g, api=fake, settings=ExecutorSettings(**settings))  # type: ignore[arg-type]
    fake.expect(ex.launches)
    return ex, fake


def _x() -> np.ndarray:
    return RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_close(a, b, f"output {k}")


def test_warm_up_then_one_graph_launch_per_evaluation() -> None:
    ex, fake = _executor(_mixed_graph())
    xs = [_x() for _ in range(3)]
    for k, x in enumerate(xs):
        _same(ex.eval([x]), emulate(ex.plan, [x]))
        assert ex.uses_cuda_graph == (k >= 1)
    assert fake.captures == 1 and fake.graph_launches == 2
    n_kernels = sum(1 for c in ex.launches.calls if type(c).__name__ == "KernelCall")
    assert fake.launches == 2 * n_kernels  # the warm-up run and the capture; replays launch none
    assert fake.streams[0].waits == 0  # host inputs: nothing to wait for
    assert "cuda graphs on" in repr(ex)


def test_without_cuda_graphs_every_evaluation_launches_each_step() -> None:
    ex, fake = _executor(_mixed_graph(), cuda_graphs=False)
    for _ in range(3):
        x = _x()
        _same(ex.eval({"x": x}), emulate(ex.plan, [x]))
    assert fake.captures == 0 and not ex.uses_cuda_graph and ex.graph_error is None


def test_a_failed_capture_falls_back_to_step_by_step(caplog: pytest.LogCaptureFixture) -> None:
    ex, fake = _executor(_mixed_graph())
    fake.fail_capture = True
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            x = _x()
            _same(ex.eval([x]), emulate(ex.plan, [x]))
    assert not ex.uses_cuda_graph and "injected" in (ex.graph_error or "")
    assert sum("capture failed" in r.message for r in caplog.records) == 1


def test_device_arrays_in_and_out() -> None:
    ex, fake = _executor(_mixed_graph())
    x = _x()
    want = emulate(ex.plan, [x])
    for _ in range(2):
        outs = ex.eval([fake.device_array(x)], return_device=True)
        _same([o.get() for o in outs], want)
    # the executor's stream waits for the caller's twice per call: the inputs' writes, and the
    # outputs' memory (fresh from the caller's pool)
    assert fake.streams[0].waits == 4
    assert {o.ptr for o in outs}.isdisjoint({o.ptr for o in ex.eval([x], return_device=True)})


def test_out_of_range_gather_raises_then_recovers() -> None:
    g = Graph()
    x = g.input(Shape.of(5, 3), DType.F32, "x")
    i = g.input(Shape.of(4), DType.I64, "i")
    g.add_output(g.gather(x, 0, i), "y")
    ex, _ = _executor(g)
    xv = RNG.standard_normal((5, 3)).astype(np.float32)
    good = np.array([0, 4, 2, 1])
    _same(ex.eval([xv, good]), [xv[good]])
    with pytest.raises(EvaluationError, match="gather index was out of range"):
        ex.eval([xv, np.array([0, 5, 2, 1])])
    for _ in range(2):  # the status word is cleared by every run, captured or not
        _same(ex.eval([xv, good]), [xv[good]])


def test_inputs_are_checked() -> None:
    ex, fake = _executor(_mixed_graph())
    x = _x()
    with pytest.raises(
        InputMismatchError, match=r"input 'x': expected float32\[2, 4, 9, 9\], found float64"
    ):
        ex.eval([x.astype(np.float64)])
    with pytest.raises(InputMismatchError, match=r"found float32\[2, 4, 9, 8\]"):
        ex.eval([x[..., :8]])
    with pytest.raises(InputMismatchError, match="expected 1 inputs, found 2"):
        ex.eval([x, x])
    with pytest.raises(InputMismatchError, match=r"missing inputs \['x'\]"):
        ex.eval({"y": x})
    with pytest.raises(InputMismatchError, match="found float32"):
        ex.eval([fake.device_array(x[:1])])
    _same(ex.eval([np.asfortranarray(x)]), emulate(ex.plan, [x]))  # any host layout


def test_profile_times_every_call() -> None:
    ex, _ = _executor(_mixed_graph())
    prof = ex.profile([_x()])
    assert len(prof.rows) == len(ex.launches.calls) == 4
    assert [r.kind for r in prof.rows] == ["conv", "matmul", "softmax", "output-copy"]
    assert prof.rows[0].call.startswith("cudnnConvolutionBiasActivationForward algo=")
    assert prof.rows[1].call.startswith("cublasGemmStridedBatchedEx TN")
    assert abs(sum(t.percent for t in prof.by_kind()) - 100) < 1e-9
    assert "by kind:" in str(prof) and "Fake GPU" in str(prof)
    assert not ex.uses_cuda_graph  # profiling runs step by step and is no warm-up for capture


@pytest.mark.parametrize("tf32", [False, True])
def test_f32_stays_f32_unless_tf32_is_asked_for(tf32: bool) -> None:
    ex, fake = _executor(_mixed_graph(), tf32=tf32)
    ex.eval([_x()])
    want_gemm = CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 else CUBLAS_COMPUTE_32F
    assert [r.compute for r in fake.cublas_c.gemms] == [want_gemm]
    conv_math = fake.lib.lib.convs[0]["math"]
    assert conv_math == int(MathType.TENSOR_OP if tf32 else MathType.FMA)


def test_arena_is_poisoned_zeros_zeroed_constants_uploaded() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 2, 5, 5), DType.F32, "x")
    w = g.constant(RNG.standard_normal((3, 2, 3, 3)).astype(np.float32))
    g.add_output(g.conv(x, w, (1, 1), (1, 1), (1, 1), 1), "y")  # no bias: the zeros region
    ex, fake = _executor(g)
    mem = fake.mem.blocks[0]
    lay = ex.launches.layout
    assert mem.size == ex.arena_bytes == lay.total(fake.lib.lib.WORKSPACE[ex._convs[0].algo])
    ((off, data),) = ex.plan.constants
    assert np.array_equal(mem[off : off + data.nbytes].view(np.float32), data.reshape(-1))
    work = mem[ex.plan.workspace_offset : lay.plan_size]
    assert (work == 0xFF).all()
    assert (mem[lay.zeros : lay.zeros + lay.zeros_size] == 0).all() and lay.zeros_size
    xv = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    _same(ex.eval([xv]), emulate(ex.plan, [xv]))


def test_empty_and_constant_and_input_outputs() -> None:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
    g.add_output(x, "same")
    g.add_output(g.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), "const")
    g.add_output(g.slice(x, 1, 0, 0), "empty")
    for b in (0, 2):
        fake = FakeApi()
        ex = CudaExecutor(g, batch_size=b, api=fake)
        fake.expect(ex.launches)
        xv = RNG.standard_normal((b, 3)).astype(np.float32)
        got = ex.eval([xv])
        assert [a.shape for a in got] == [(b, 3), (2, 3), (b, 0)]
        _same(got, emulate(ex.plan, [xv]))


def test_missing_device_and_closing() -> None:
    with pytest.raises(CudaUnavailableError, match="CUDA device 3 is not usable"):
        CudaExecutor(_mixed_graph(), device=3, api=FakeApi())
    with _executor(_mixed_graph())[0] as ex:
        ex.eval([_x()])
    ex.close()  # idempotent
    assert ex._convs == [] and ex._arena is None


def test_plans_made_elsewhere_run_unchanged() -> None:
    p = plan(_mixed_graph())
    fake = FakeApi()
    ex = CudaExecutor.from_plan(p, api=fake)
    fake.expect(ex.launches)
    assert ex.plan is p
    x = _x()
    _same(ex.eval([x]), emulate(p, [x]))


def test_a_refused_conv_algorithm_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    ex, fake = _executor(_mixed_graph())  # its conv has a relu: the heuristics' choice is used
    fake.lib.lib.refuse.add(int(ConvFwdAlgo.WINOGRAD_NONFUSED))
    assert ex._convs[0].algo is ConvFwdAlgo.WINOGRAD_NONFUSED
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            x = _x()
            _same(ex.eval([x]), emulate(ex.plan, [x]))
    assert ex._convs[0].algo is ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM and ex.uses_cuda_graph
    assert sum("refused WINOGRAD_NONFUSED" in r.message for r in caplog.records) == 1
    assert "algo=implicit_precomp_gemm" in ex.profile([_x()]).rows[0].call


# -- cuBLAS through its C API, captured with everything else ------------------------------------
def _matmul_graph(batch: int) -> Graph:
    g = Graph()
    a = g.input(Shape.of(batch, 5, 7), DType.F32, "a")
    b = g.input(Shape.of(batch, 7, 3), DType.F32, "b")
    g.add_output(g.relu(g.matmul(a, b)), "c")
    return g


@pytest.mark.parametrize(
    ("batch", "function"), [(1, "cublasGemmEx"), (3, "cublasGemmStridedBatchedEx")]
)
def test_gemms_run_on_the_executor_stream_and_are_captured(batch: int, function: str) -> None:
    """CuPy 14.2's wrappers (modelled by the fake) would refuse the capture (setStream raises on
    a capturing stream) and run every eager GEMM on the legacy stream without our workspace."""
    ex, fake = _executor(_matmul_graph(batch))
    a = RNG.standard_normal((batch, 5, 7)).astype(np.float32)
    b = RNG.standard_normal((batch, 7, 3)).astype(np.float32)
    want = np.maximum(np.matmul(a.astype(np.float64), b), 0).astype(np.float32)
    for _ in range(4):  # the warm-up, the capture (and its replay), two replays
        _same(ex.eval([a, b]), [want])
    assert ex.uses_cuda_graph and ex.graph_error is None
    lay = ex.launches.layout
    workspace = (ex._base + lay.cublas_workspace, lay.cublas_workspace_size)
    assert [(g.function, g.stream, g.workspace, g.captured) for g in fake.cublas_c.gemms] == [
        (function, ex._stream.ptr, workspace, False),  # the warm-up
        (function, ex._stream.ptr, workspace, True),  # recorded into the graph
    ]
    assert fake.graph_launches == 3 and fake.blas.calls == []


def test_a_failed_gemm_status_is_an_error_naming_the_step() -> None:
    ex, fake = _executor(_matmul_graph(3))
    fake.cublas_c.fail["cublasGemmStridedBatchedEx"] = 13
    a, b = np.ones((3, 5, 7), np.float32), np.ones((3, 7, 3), np.float32)
    with pytest.raises(
        EvaluationError,
        match=r"step 0 \(cublasGemmStridedBatchedEx NN m=3 n=5 k=7 batch=3 f32\): "
        r"cublasGemmStridedBatchedEx failed with status 13 \(FAKE_CUBLAS_STATUS_13 fake status\)",
    ):
        ex.eval([a, b])
    del fake.cublas_c.fail["cublasGemmStridedBatchedEx"]
    _same(ex.eval([a, b]), [np.full((3, 5, 3), 7, np.float32)])


# -- two executors on two threads, one library handle ---------------------------------------------
def _meeting() -> Callable[[], None]:
    """A thread switch: wait for the other thread to come to the same place (0.5 s at most; a
    no-op from then on once it could not, e.g. because a lock keeps it out)."""
    meet = threading.Barrier(2, timeout=0.5)

    def switch() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            meet.wait()

    return switch


def test_executors_sharing_a_handle_run_their_calls_on_their_own_streams() -> None:
    """Executors built on one thread share its cuBLAS and cuDNN handles. Run on two threads,
    one could set the shared handle's stream between the other's SetStream and its call, which
    would then run on the wrong stream (or land in the other's CUDA graph). The fake switches
    threads right after each SetStream (both threads meet there); every GEMM and convolution
    must still run on the stream of the executor that issued it, and both results be right."""
    fake = FakeApi()
    g = _mixed_graph()  # a convolution and a batched GEMM
    exs = [CudaExecutor(g, api=fake) for _ in range(2)]  # built on this thread
    for ex in exs:
        fake.expect(ex.launches)
    assert exs[0]._blas == exs[1]._blas  # one handle: what could race
    fake.cublas_c.preempt = _meeting()
    fake.lib.lib.preempt = _meeting()  # type: ignore[attr-defined]
    xs = [_x() for _ in exs]
    want = [emulate(ex.plan, [x]) for ex, x in zip(exs, xs, strict=True)]
    stream_of: dict[int, int] = {}
    got: dict[int, list[list[np.ndarray]]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        stream_of[threading.get_ident()] = exs[i]._stream.ptr
        try:
            got[i] = [exs[i].eval([xs[i]]) for _ in range(3)]  # eager, captured, replayed
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(exs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    gemms, convs = fake.cublas_c.gemms, fake.lib.lib.convs  # type: ignore[attr-defined]
    assert len(gemms) == len(convs) == 4  # per executor: the warm-up and the capture
    assert [(r.stream == stream_of[r.thread]) for r in gemms] == [True] * 4, gemms
    assert [(c["stream"] == stream_of[c["thread"]]) for c in convs] == [True] * 4, convs
    assert all(ex.uses_cuda_graph for ex in exs)
    for i, outs in got.items():
        for out in outs:
            _same(out, want[i])


# -- ordering: constants before the first kernel, close() waits --------------------------------
def test_constants_are_uploaded_on_the_executor_stream_before_any_kernel() -> None:
    ex, fake = _executor(_mixed_graph())
    assert fake.streams[0].pending == 0  # the uploads were waited for in the constructor
    x = _x()
    _same(ex.eval([x]), emulate(ex.plan, [x]))
    stream = ex._stream.ptr
    consts = {ex._base + off for off, data in ex.plan.constants if data.nbytes}
    assert consts
    first_launch = next(k for k, (call, _, _) in enumerate(fake.log) if call == "launch")
    copies = [(k, call, s) for k, (call, s, dst) in enumerate(fake.log) if dst in consts]
    uploads = [u for u in copies if u[1] in ("memcpy", "memcpy_async")]
    assert len(uploads) == len(consts)
    assert {s for _, _, s in uploads} == {stream}  # never a synchronous (legacy-stream) memcpy
    assert all(k < first_launch for k, _, _ in uploads)


def test_close_waits_for_the_work_in_flight() -> None:
    ex, fake = _executor(_mixed_graph())
    ex.eval([_x()])
    ex.run_device(sync=False)
    assert fake.streams[0].pending > 0
    ex.close()
    assert fake.streams[0].pending == 0


# -- cuDNN only where a plan has convolutions ---------------------------------------------------
def test_a_missing_cudnn_fails_only_plans_with_convolutions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = CudaUnavailableError("cuDNN (libcudnn.so.9) could not be loaded: nowhere")
    fake = FakeApi()
    fake.cudnn_error = missing
    ex = CudaExecutor(_matmul_graph(2), api=fake)  # no convolution: cuDNN is never asked for
    fake.expect(ex.launches)
    a, b = np.ones((2, 5, 7), np.float32), np.ones((2, 7, 3), np.float32)
    _same(ex.eval([a, b]), [np.full((2, 5, 3), 7, np.float32)])
    with pytest.raises(
        CudaUnavailableError,
        match=r"step 0 \(cudnnConvolutionBiasActivationForward x=\[2, 4, 9, 9\] .*\) needs "
        r"cuDNN: cuDNN \(libcudnn.so.9\) could not be loaded: nowhere",
    ):
        CudaExecutor(_mixed_graph(), api=fake)
    probe_module = importlib.import_module(
        "kn_cuda_eval.cuda.device.probe"
    )  # the function shadows it

    monkeypatch.setattr(probe_module, "_api", lambda: fake)
    assert probe_module.probe(0) is None  # the device itself is usable
    assert probe_module.cudnn_problem() == f"cuDNN is not usable: CudaUnavailableError: {missing}"
    fake.cudnn_error = None
    assert probe_module.cudnn_problem() is None
