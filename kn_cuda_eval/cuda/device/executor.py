"""`CudaExecutor`: runs a plan on a CUDA device exactly as the emulator runs it on the CPU — one
allocation (the plan's arena plus staging, zeros and library workspaces), constants uploaded once,
NVRTC cubins, cuBLAS GEMMs on a private handle (the C API: stream and workspace set on every call,
so GEMMs are captured too), cuDNN convolutions, all on one stream; after a warm-up evaluation the
step list is replayed as one CUDA graph. The library handles are shared by the executors built on
one thread (`DeviceApi.blas_handle`), which may run on several: each library call holds its
handle's lock from setting the stream to the call, so no GEMM or convolution lands on another
executor's stream.

>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> x = g.input(Shape.of(2, 3), DType.F32, "x")
>>> g.add_output(g.relu(x), "y")
>>> ex = CudaExecutor(g)                                   # doctest: +SKIP
>>> ex.eval([np.ones((2, 3), np.float32)])[0].sum()        # doctest: +SKIP
6.0
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kn_cuda_eval.cuda.cudnn.lib import CudnnLib
from kn_cuda_eval.cuda.device.api import D2D, D2H, H2D, DeviceApi, DeviceArray, default_api
from kn_cuda_eval.cuda.device.calls import ConvCall, GemmCall, KernelCall, LaunchList, bind
from kn_cuda_eval.cuda.device.conv import CudnnBackend, PreparedConv
from kn_cuda_eval.cuda.device.cublas import CublasError
from kn_cuda_eval.cuda.device.settings import ExecutorSettings
from kn_cuda_eval.cuda.kernels.compile import clamp_arch, compile_kernel
from kn_cuda_eval.planning.memory import align
from kn_cuda_eval.planning.plan import Plan, plan
from kn_cuda_eval.planning.profile import Profile, ProfileRow
from kn_graph.errors import CudaUnavailableError, EvaluationError, InputMismatchError
from kn_graph.graph import Graph

__all__ = ["CudaExecutor"]

log = logging.getLogger(__name__)

Inputs = Sequence[object] | Mapping[str, object]


@dataclass(frozen=True, slots=True)
class _Slot:
    """An input or output: where it lives in the allocation and in the pinned host buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    host: int
    nbytes: int


def _describer(pc: PreparedConv) -> Callable[[], str]:
    return lambda: pc.description


def _close_all(convs: list[PreparedConv]) -> None:
    for pc in convs:
        pc.close()
    convs.clear()


def _check_input(slot: _Slot, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if tuple(shape) != slot.shape or np.dtype(dtype) != slot.dtype:
        raise InputMismatchError(
            f"input '{slot.name}': expected {slot.dtype}{list(slot.shape)}, "
            f"found {np.dtype(dtype)}{list(shape)}"
        )


class CudaExecutor:
    """A graph (or plan) bound to CUDA device `device` for one binding of its size symbols.

    `eval(inputs)` takes NumPy arrays (copied through pinned buffers) or device arrays — CuPy,
    `__cuda_array_interface__` or CUDA DLPack tensors such as torch's (copied on the device,
    never through the host) — and returns NumPy arrays, or fresh CuPy arrays with
    `return_device=True`. Not re-entrant: one evaluation at a time (a lock enforces it)."""

    def __init__(
        self,
        graph: Graph,
        batch_size: int | None = None,
        device: int = 0,
        *,
        bindings: Mapping[str, int] | None = None,
        settings: ExecutorSettings | None = None,
        api: DeviceApi | None = None,
    ) -> None:
        sets = settings if settings is not None else ExecutorSettings()
        self._setup(plan(graph, batch_size, bindings, sets.plan), device, sets, api)

    @classmethod
    def from_plan(
        cls,
        p: Plan,
        device: int = 0,
        *,
        settings: ExecutorSettings | None = None,
        api: DeviceApi | None = None,
    ) -> CudaExecutor:
        """An executor for an existing plan (its PlanSettings are whatever made it)."""
        self = cls.__new__(cls)
        self._setup(p, device, settings if settings is not None else ExecutorSettings(), api)
        return self

    # -- construction ------------------------------------------------------------------------
    def _setup(self, p: Plan, device: int, sets: ExecutorSettings, api: DeviceApi | None) -> None:
        p.validate_once()  # a broken plan is a PlanError here, never a wrong answer later
        self.plan = p
        self.settings = sets
        self.device = device
        self.launches: LaunchList = bind(p, sets)
        self._api: DeviceApi = api if api is not None else default_api()
        self._lock = threading.Lock()
        self._graph: Any = None
        self.graph_error: str | None = None
        """Why CUDA graph capture failed (the executor then launches step by step), or None."""
        self.evaluations = 0
        self._convs: list[PreparedConv] = []
        self._release = weakref.finalize(self, _close_all, self._convs)
        self._open = False  # True once built, until closed
        reason = self._api.problem(device)
        if reason is not None:
            raise CudaUnavailableError(f"CUDA device {device} is not usable: {reason}")
        with self._api.use(device):
            self._build()
        self._open = True

    def _build(self) -> None:
        api, lay, calls = self._api, self.launches.layout, self.launches.calls
        self._stream = api.stream()  # first: a runtime call makes the device's context current
        self.arch = clamp_arch(api.compute_capability(self.device))
        self.device_name = api.device_name(self.device)
        functions = self._load_kernels()
        conv_ws = 0
        if self.launches.has_conv:
            lib = self._cudnn()
            handle = api.cudnn_handle(self.device)
            backend = CudnnBackend(
                lib, handle, self.settings.conv_workspace_limit, api.handle_lock(handle)
            )
            for c in calls:
                if isinstance(c, ConvCall):
                    self._convs.append(backend.prepare(c))
            conv_ws = max(pc.workspace for pc in self._convs)
        self.arena_bytes = lay.total(conv_ws)
        """Device bytes of the one allocation (constants, workspace, staging, library workspaces)."""
        self._base, self._arena = api.alloc(self.arena_bytes)
        self._upload()
        self._blas = api.blas_handle(self.device) if self.launches.has_gemm else 0
        self._cublas = api.cublas() if self.launches.has_gemm else None
        self._blas_lock = api.handle_lock(self._blas) if self.launches.has_gemm else None
        self._steps: list[Callable[[], None]] = []
        self._describe: list[Callable[[], str]] = []
        conv_iter = iter(self._convs)
        for c in calls:
            match c:
                case KernelCall():
                    self._steps.append(self._kernel_thunk(c, functions[c.name]))
                    self._describe.append(c.describe)
                case GemmCall():
                    self._steps.append(self._gemm_thunk(c))
                    self._describe.append(c.describe)
                case ConvCall():
                    pc = next(conv_iter)
                    self._steps.append(self._conv_thunk(pc, lay.conv_workspace))
                    self._describe.append(_describer(pc))  # its algorithm may change
        self._slots()
        self._stream.synchronize()

    def _load_kernels(self) -> dict[str, int]:
        kernels = self.launches.kernels
        workers = max(1, min(self.settings.compile_threads, len(kernels)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            compiled = list(pool.map(lambda k: compile_kernel(k, self.arch), kernels))
        return {
            k.name: self._api.load_function(self.device, k.name, ck.cubin)
            for k, ck in zip(kernels, compiled, strict=True)
        }

    def _cudnn(self) -> CudnnLib:
        """cuDNN, needed by this plan's convolutions only: a missing library fails here, naming
        the first convolution, never a plan without one."""
        try:
            return self._api.cudnn()
        except CudaUnavailableError as e:
            conv = next(c for c in self.launches.calls if isinstance(c, ConvCall))
            raise CudaUnavailableError(
                f"step {conv.step} ({conv.describe()}) needs cuDNN: {e}"
            ) from e

    def _upload(self) -> None:
        """Poison everything (as the emulator does), zero the zeros region, copy the constants:
        all on the executor's stream, so every kernel on it runs after them (a synchronous
        cudaMemcpy goes through the legacy stream, which a non-blocking stream does not wait
        for), then wait for them."""
        api, s, lay, base = self._api, self._stream, self.launches.layout, self._base
        if self.settings.poison:
            api.memset_async(base, 0xFF, lay.plan_size, s)
        api.memset_async(base + lay.zeros, 0, lay.zeros_size, s)
        staged: list[np.ndarray] = []  # pageable sources must live until the copies are done
        for off, data in self.plan.constants:
            raw = np.ascontiguousarray(data)
            if raw.nbytes:
                api.memcpy_async(base + off, raw.ctypes.data, raw.nbytes, H2D, s)
                staged.append(raw)
        api.memset_async(base + self.launches.status, 0, 4, s)
        s.synchronize()
        del staged

    def _slots(self) -> None:
        """Pinned host buffers: inputs packed in one, outputs and the status word in another."""
        pos = 0
        self._in: list[_Slot] = []
        for name, v in zip(self.plan.input_names, self.launches.inputs, strict=True):
            self._in.append(_Slot(name, v.shape, v.dtype.np, v.offset, pos, v.nbytes))
            pos = align(pos + v.nbytes)
        self._pin_in = self._api.alloc_pinned(pos)
        pos = 0
        self._out: list[_Slot] = []
        for o in self.launches.outputs:
            self._out.append(_Slot(o.name, o.shape, o.dtype.np, o.offset, pos, o.nbytes))
            pos = align(pos + o.nbytes)
        self._status_host = pos
        self._pin_out = self._api.alloc_pinned(pos + 8)

    # -- thunks: one closure per call, arguments packed once -------------------------------------
    def _kernel_thunk(self, c: KernelCall, fn: int) -> Callable[[], None]:
        packed = c.packed(self._base)
        slots = np.zeros(max(len(packed), 1), np.uint64)  # one 8-byte slot per argument
        for k, a in enumerate(packed):
            slots[k : k + 1].view(a.dtype)[0] = a  # little-endian: the value starts the slot
        params = slots.ctypes.data + 8 * np.arange(len(slots), dtype=np.uint64)
        api, stream, launch = self._api, self._stream, c.launch
        grid, block, shm, ptr = launch.grid, launch.block, launch.shared_mem, params.ctypes.data

        def run() -> None:
            api.launch(fn, grid, block, shm, stream, ptr)

        run.keep = (slots, params)  # type: ignore[attr-defined]
        return run

    def _gemm_thunk(self, c: GemmCall) -> Callable[[], None]:
        """The GEMM through cuBLAS's C API: the handle is pointed at the executor's stream and
        the arena's workspace on every call (SetStream resets the workspace, so it comes
        second), then the GEMM, all under the handle's lock (other executors share the handle
        and may run on other threads); a failed status is an EvaluationError naming the step."""
        lib, stream, handle, lock = self._cublas, self._stream, self._blas, self._blas_lock
        assert lib is not None and lock is not None
        alpha = np.array([c.alpha], c.scalar)
        beta = np.array([c.beta], c.scalar)
        args = c.arguments(handle, self._base, alpha.ctypes.data, beta.ctypes.data)
        lay = self.launches.layout
        ws, ws_size = self._base + lay.cublas_workspace, lay.cublas_workspace_size

        def run() -> None:
            try:
                with lock:
                    lib.call("cublasSetStream_v2", handle, stream.ptr)
                    lib.call("cublasSetWorkspace_v2", handle, ws, ws_size)
                    lib.call(c.function, *args)
            except CublasError as e:
                raise EvaluationError(f"step {c.step} ({c.describe()}): {e}") from e

        run.keep = (alpha, beta)  # type: ignore[attr-defined]
        return run

    def _conv_thunk(self, pc: PreparedConv, ws_offset: int) -> Callable[[], None]:
        base, stream = self._base, self._stream
        ws = base + ws_offset

        def run() -> None:
            pc.run(base, ws, stream.ptr)

        return run

    # -- running -----------------------------------------------------------------------------------
    def _run_steps(self) -> None:
        self._api.memset_async(self._base + self.launches.status, 0, 4, self._stream)
        for step in self._steps:
            step()

    def _capture(self) -> None:
        """Record the step list into a CUDA graph; on any failure, say why and stay eager."""
        s = self._stream
        try:
            s.begin_capture()
        except Exception as e:
            self._no_graph(e)
            return
        try:
            self._run_steps()
        except Exception as e:
            with contextlib.suppress(Exception):
                s.end_capture()  # leave capture mode; the graph is discarded
            self._no_graph(e)
            return
        try:
            graph = s.end_capture()
            graph.upload(s)
        except Exception as e:
            self._no_graph(e)
            return
        self._graph = graph

    def _no_graph(self, e: Exception) -> None:
        self.graph_error = f"{type(e).__name__}: {e}"
        log.warning("CUDA graph capture failed, launching step by step: %s", self.graph_error)

    def _maybe_capture(self) -> None:
        """Capture once a warm-up evaluation has run (library plans, module loads and lazy
        allocations happen then, not while capturing)."""
        if (
            self.settings.cuda_graphs
            and self._graph is None
            and self.graph_error is None
            and self.evaluations >= 1
        ):
            self._capture()

    def _launch(self) -> None:
        if self._graph is not None:
            self._graph.launch(self._stream)
        else:
            self._run_steps()

    @property
    def uses_cuda_graph(self) -> bool:
        return self._graph is not None

    def _arrays(self, inputs: Inputs) -> list[object]:
        names = self.plan.input_names
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            if missing:
                raise InputMismatchError(f"missing inputs {missing}; the graph takes {list(names)}")
            return [inputs[n] for n in names]
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise InputMismatchError(f"expected {len(names)} inputs, found {len(arrays)}")
        return arrays

    def _stage(self, inputs: Inputs) -> list[DeviceArray]:
        """Copy every input into its arena view (host data through the pinned buffer); returns
        the device inputs, which must stay alive until the stream is synchronised."""
        api, s, base = self._api, self._stream, self._base
        host: list[tuple[_Slot, np.ndarray]] = []
        dev: list[tuple[_Slot, DeviceArray]] = []
        for slot, a in zip(self._in, self._arrays(inputs), strict=True):
            d = api.wrap_device(a)
            if d is None:
                h = np.asarray(a)
                _check_input(slot, h.shape, h.dtype)
                host.append((slot, h))
            else:
                _check_input(slot, d.shape, d.dtype)
                dev.append((slot, d))
        if dev:
            s.wait_event(api.current_stream_event())  # the caller's writes come first
        pin = self._pin_in
        for slot, h in host:
            if slot.nbytes:
                view = pin[slot.host : slot.host + slot.nbytes].view(slot.dtype)
                np.copyto(view.reshape(slot.shape), h, casting="no")
                src = pin.ctypes.data + slot.host
                api.memcpy_async(base + slot.offset, src, slot.nbytes, H2D, s)
        for slot, d in dev:
            if slot.nbytes:
                api.memcpy_async(base + slot.offset, d.ptr, slot.nbytes, D2D, s)
        return [d for _, d in dev]

    def _finish(self, return_device: bool) -> list[Any]:
        api, s, base, pin = self._api, self._stream, self._base, self._pin_out
        outs: list[Any] = []
        fresh = [api.empty(slot.shape, slot.dtype) for slot in self._out] if return_device else []
        if fresh:
            s.wait_event(api.current_stream_event())  # their memory is free on the caller's stream
        for k, slot in enumerate(self._out):
            if return_device:
                d = fresh[k]
                if slot.nbytes:
                    api.memcpy_async(d.ptr, base + slot.offset, slot.nbytes, D2D, s)
                outs.append(d.owner)
            elif slot.nbytes:
                api.memcpy_async(
                    pin.ctypes.data + slot.host, base + slot.offset, slot.nbytes, D2H, s
                )
        api.memcpy_async(
            pin.ctypes.data + self._status_host, base + self.launches.status, 4, D2H, s
        )
        s.synchronize()
        self.evaluations += 1
        status = int(pin[self._status_host : self._status_host + 4].view(np.uint32)[0])
        if status:
            raise EvaluationError(
                f"a gather index was out of range on the device (status word {status:#x}); "
                "the outputs of this evaluation are not valid"
            )
        if return_device:
            return outs
        for slot in self._out:
            if slot.nbytes:
                raw = pin[slot.host : slot.host + slot.nbytes]
                outs.append(raw.view(slot.dtype).reshape(slot.shape).copy())
            else:
                outs.append(np.zeros(slot.shape, slot.dtype))
        return outs

    def eval(self, inputs: Inputs, *, return_device: bool = False) -> list[Any]:
        """Evaluate on the device. Inputs in the plan's order, or by name; NumPy or device
        arrays (checked for shape and dtype). Returns NumPy arrays, or CuPy arrays with
        `return_device=True` (fresh copies: the arena is reused by the next evaluation)."""
        with self._lock, self._api.use(self.device):
            self._maybe_capture()
            keep = self._stage(inputs)
            self._launch()
            outs = self._finish(return_device)
            del keep
            return outs

    def run_device(self, sync: bool = True) -> None:
        """Run the steps on whatever the arena holds, without copying inputs or outputs (for
        benchmarks: the cost of an evaluation itself). Uses the CUDA graph once captured."""
        with self._lock, self._api.use(self.device):
            self._maybe_capture()
            self._launch()
            self.evaluations += 1
            if sync:
                self._stream.synchronize()

    def synchronize(self) -> None:
        with self._api.use(self.device):
            self._stream.synchronize()

    def profile(self, inputs: Inputs) -> Profile:
        """Run once, step by step, with CUDA events around every call; returns the table of
        device times per call and per kind."""
        api = self._api
        with self._lock, api.use(self.device):
            keep = self._stage(inputs)
            s = self._stream
            events = [api.event() for _ in range(len(self._steps) + 1)]
            api.memset_async(self._base + self.launches.status, 0, 4, s)
            events[0].record(s)
            for k, step in enumerate(self._steps):
                step()
                events[k + 1].record(s)
            self._finish(False)
            del keep
            rows = tuple(
                ProfileRow(c.step, c.kind, desc(), api.elapsed_ms(events[k], events[k + 1]))
                for k, (c, desc) in enumerate(zip(self.launches.calls, self._describe, strict=True))
            )
        return Profile(f"cuda:{self.device} ({self.device_name})", rows)

    def close(self) -> None:
        """Wait for the work in flight (`run_device(sync=False)` may have left some), then free
        the device memory, the graph and the cuDNN descriptors now (else at collection)."""
        with self._lock:
            if self._open:
                with self._api.use(self.device):
                    self._stream.synchronize()
                self._open = False
            self._graph = None
            self._release()  # the cuDNN descriptors (once; also at garbage collection)
            self._steps = []
            self._arena = None

    def __enter__(self) -> CudaExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<CudaExecutor cuda:{self.device} sm_{self.arch}: {len(self.launches.calls)} calls, "
            f"arena {self.arena_bytes} B, cuda graphs "
            f"{'on' if self.uses_cuda_graph else 'off' if not self.settings.cuda_graphs else 'pending'}>"
        )
