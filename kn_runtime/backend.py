"""Backends: what a device needs to run a pure graph (no Dynamic op) at one binding of its size
symbols. `PreparedGraph` (kn_runtime.prepared) does the rest the same way for every device:
binding shapes, one executor per binding in a `BindingCache`, segments for data-dependent ops,
value-specialized models.

- `HostBackend`: `Device.cpu()`, the plan on the host (`kn_cuda_eval.cpu.executor.HostExecutor`),
  every executor of one graph sharing one `SharedMemory` (arena, packed weights, workspace);
- `CudaBackend`: a CUDA device (`kn_cuda_eval.cuda.device.CudaExecutor`);
- `ReferenceBackend`: `Device.cpu(reference=True)`, the NumPy reference executor
  (`kn_graph.reference.evaluate`): one executor serves every binding and runs Dynamic ops itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from kn_graph.errors import KnError
from kn_graph.graph import Graph
from kn_graph.reference import evaluate

if TYPE_CHECKING:
    from kn_cuda_eval.cpu.arena import SharedMemory
    from kn_cuda_eval.cuda.device import CudaExecutor
    from kn_cuda_eval.planning.planner import PlanSettings

__all__ = ["Backend", "CudaBackend", "Executor", "HostBackend", "ReferenceBackend"]

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


class Executor(Protocol):
    """A graph ready to run at one binding: planned, compiled, its memory allocated."""

    @property
    def stale(self) -> bool:
        """True when it must be built again (the CPU arena it ran in was replaced)."""
        ...

    def eval(self, inputs: Inputs, **kw: Any) -> list[Any]: ...

    def profile(self, inputs: Inputs) -> Any: ...

    def close(self) -> None: ...


class Backend(Protocol):
    @property
    def per_binding(self) -> bool:
        """True: an executor runs one binding of a pure graph (a plan), so the prepared graph
        binds shapes, caches one executor per binding and runs Dynamic ops in segments. False:
        one executor runs the graph at every binding, Dynamic ops included (the reference)."""
        ...

    @property
    def device_arrays(self) -> bool:
        """Executors take `return_device=True` and then give arrays in device memory (values
        stay on the device between the segments of a graph run in segments)."""
        ...

    def executor(self, graph: Graph, bindings: Mapping[str, int]) -> Executor:
        """Plan, compile and allocate `graph` at these symbol values."""
        ...

    def memory(self) -> dict[str, int] | None:
        """Bytes held beside the executors (None: not reported by this backend)."""
        ...

    def close(self) -> None:
        """Let go of what the executors shared (they are closed already)."""
        ...


@dataclass
class HostBackend:
    """The plan on the host: one `HostExecutor` per binding; every executor of one graph (a
    whole graph, or one segment) runs in that graph's `SharedMemory`, an arena that grows to
    the largest binding seen with the weights packed once. A larger binding replaces the arena:
    the executors built over the old one go stale."""

    threads: int | None
    per_binding: ClassVar[bool] = True
    device_arrays: ClassVar[bool] = False
    _graphs: dict[int, tuple[SharedMemory, PlanSettings]] = field(
        default_factory=dict, init=False, repr=False
    )

    def shared(self, graph: Graph) -> SharedMemory:
        """The memory every executor of `graph` shares (made on first use)."""
        return self._of(graph)[0]

    def _of(self, graph: Graph) -> tuple[SharedMemory, PlanSettings]:
        got = self._graphs.get(graph.id)
        if got is None:
            from kn_cuda_eval.cpu.arena import SharedMemory
            from kn_cuda_eval.cpu.executor import host_plan_settings

            got = self._graphs[graph.id] = (SharedMemory.make(), host_plan_settings(graph))
        return got

    def executor(self, graph: Graph, bindings: Mapping[str, int]) -> Executor:
        from kn_cuda_eval.cpu.executor import host_executor

        shared, settings = self._of(graph)
        return host_executor(graph, bindings, self.threads, shared, settings)

    def memory(self) -> dict[str, int]:
        """The arenas' mapped bytes (pages given back included), the packed weights and
        oneDNN's workspace, summed over the graphs."""
        total = {"arena": 0, "packed": 0, "workspace": 0}
        for shared, _ in self._graphs.values():
            for k, v in shared.nbytes().items():
                total[k] += v
        return total

    def close(self) -> None:
        self._graphs.clear()


@dataclass(frozen=True, slots=True)
class CudaRun:
    """A `CudaExecutor` as a prepared graph keeps it: its memory is its own, so it never goes
    stale."""

    executor: CudaExecutor
    stale: ClassVar[bool] = False

    def eval(self, inputs: Inputs, **kw: Any) -> list[Any]:
        return self.executor.eval(inputs, **kw)

    def profile(self, inputs: Inputs) -> Any:
        return self.executor.profile(inputs)

    def close(self) -> None:
        self.executor.close()


@dataclass(frozen=True, slots=True)
class CudaBackend:
    """CUDA device `index`: one `CudaExecutor` (its own arena, stream and kernels) per binding;
    `settings` a `kn_cuda_eval.cuda.device.ExecutorSettings` (None: the defaults)."""

    index: int
    settings: Any = None
    per_binding: ClassVar[bool] = True
    device_arrays: ClassVar[bool] = True

    def executor(self, graph: Graph, bindings: Mapping[str, int]) -> Executor:
        from kn_cuda_eval.cuda.device import CudaExecutor

        ex = CudaExecutor(graph, device=self.index, bindings=dict(bindings), settings=self.settings)
        return CudaRun(ex)

    def memory(self) -> None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    """The NumPy reference executor on one graph, at every binding (`known`: what prepare
    fixed, the batch size)."""

    graph: Graph
    known: Mapping[str, int]
    device: str
    stale: ClassVar[bool] = False

    def eval(self, inputs: Inputs, **kw: Any) -> list[Any]:
        return evaluate(self.graph, inputs, known=self.known)

    def profile(self, inputs: Inputs) -> Any:
        raise KnError(
            f"profiling times device steps; {self.device} has none (use Device.cpu() or a CUDA "
            "device)"
        )

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ReferenceBackend:
    """`Device.cpu(reference=True)`: `kn_graph.reference.evaluate`, the oracle of every test.
    It keeps no state between calls, so evaluations need no executor per binding."""

    device: str
    per_binding: ClassVar[bool] = False
    device_arrays: ClassVar[bool] = False

    def executor(self, graph: Graph, bindings: Mapping[str, int]) -> Executor:
        return ReferenceRun(graph, dict(bindings), self.device)

    def memory(self) -> None:
        return None

    def close(self) -> None:
        pass
