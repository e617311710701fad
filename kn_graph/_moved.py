"""Old import paths of the modules that moved when the package was split into the plan, the code
generator and the two backends (`docs/architecture.md`): importing one still works, for one
release, and warns with the new path. Only names that are not files any more are answered (a
finder placed after the real ones), and the old module is a view that forwards every attribute
to the new one, so classes and functions keep their identity."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

__all__ = ["MOVED", "install"]

MOVED: dict[str, tuple[str, ...]] = {
    "kn_graph.cpu": ("kn_graph.reference", "kn_graph.binding"),
    "kn_cuda_eval.convplan": ("kn_cuda_eval.planning.convplan",),
    "kn_cuda_eval.cpu.attention": ("kn_cuda_eval.cpu.passes.attention",),
    "kn_cuda_eval.cpu.elide": ("kn_cuda_eval.cpu.passes.elide",),
    "kn_cuda_eval.cpu.fuse": ("kn_cuda_eval.cpu.passes.fuse",),
    "kn_cuda_eval.cpu.layouts": ("kn_cuda_eval.cpu.passes.layouts",),
    "kn_cuda_eval.cudnn": ("kn_cuda_eval.cuda.cudnn",),
    "kn_cuda_eval.cudnn.descriptors": ("kn_cuda_eval.cuda.cudnn.descriptors",),
    "kn_cuda_eval.cudnn.lib": ("kn_cuda_eval.cuda.cudnn.lib",),
    "kn_cuda_eval.device": ("kn_cuda_eval.cuda.device",),
    "kn_cuda_eval.device.api": ("kn_cuda_eval.cuda.device.api",),
    "kn_cuda_eval.device.calls": ("kn_cuda_eval.cuda.device.calls",),
    "kn_cuda_eval.device.conv": ("kn_cuda_eval.cuda.device.conv",),
    "kn_cuda_eval.device.cublas": ("kn_cuda_eval.cuda.device.cublas",),
    "kn_cuda_eval.device.executor": ("kn_cuda_eval.cuda.device.executor",),
    "kn_cuda_eval.device.probe": ("kn_cuda_eval.cuda.device.probe",),
    "kn_cuda_eval.device.profile": ("kn_cuda_eval.planning.profile",),
    "kn_cuda_eval.device.settings": ("kn_cuda_eval.cuda.device.settings",),
    "kn_cuda_eval.emulator": ("kn_cuda_eval.planning.emulator",),
    "kn_cuda_eval.emulator_ops": ("kn_cuda_eval.planning.emulator_ops",),
    "kn_cuda_eval.gemm": ("kn_cuda_eval.planning.gemm",),
    "kn_cuda_eval.kernels": ("kn_cuda_eval.cuda.kernels",),
    "kn_cuda_eval.kernels.attention": ("kn_cuda_eval.cuda.kernels.attention",),
    "kn_cuda_eval.kernels.codegen": ("kn_cuda_eval.cuda.kernels.dispatch",),
    "kn_cuda_eval.kernels.compile": ("kn_cuda_eval.cuda.kernels.compile",),
    "kn_cuda_eval.kernels.elementwise": ("kn_cuda_eval.cuda.kernels.elementwise",),
    "kn_cuda_eval.kernels.exprs": ("kn_cuda_eval.codegen.exprs",),
    "kn_cuda_eval.kernels.host": ("kn_cuda_eval.cuda.hostcheck",),
    "kn_cuda_eval.kernels.host.check": ("kn_cuda_eval.cuda.hostcheck.check",),
    "kn_cuda_eval.kernels.host.compile": ("kn_cuda_eval.cuda.hostcheck.compile",),
    "kn_cuda_eval.kernels.host.run": ("kn_cuda_eval.cuda.hostcheck.run",),
    "kn_cuda_eval.kernels.host_check": ("kn_cuda_eval.cuda.hostcheck.sweep",),
    "kn_cuda_eval.kernels.launch": ("kn_cuda_eval.cuda.kernels.launch",),
    "kn_cuda_eval.kernels.rows": ("kn_cuda_eval.cuda.kernels.rows",),
    "kn_cuda_eval.kernels.template": ("kn_cuda_eval.codegen.template",),
    "kn_cuda_eval.lazy": ("kn_cuda_eval.planning.lazy",),
    "kn_cuda_eval.limits": ("kn_cuda_eval.planning.limits",),
    "kn_cuda_eval.memory": ("kn_cuda_eval.planning.memory",),
    "kn_cuda_eval.planner": ("kn_cuda_eval.planning.planner",),
    "kn_cuda_eval.program": ("kn_cuda_eval.planning.program",),
    "kn_cuda_eval.reduceplan": ("kn_cuda_eval.planning.reduceplan",),
    "kn_cuda_eval.segments": ("kn_cuda_eval.planning.segments",),
    "kn_cuda_eval.steps": ("kn_cuda_eval.planning.steps",),
    "kn_cuda_eval.validate": ("kn_cuda_eval.planning.validate",),
    "kn_cuda_eval.view": ("kn_cuda_eval.planning.view",),
}
"""Old module -> the new modules its names went to (looked up in order)."""


class _Forward(types.ModuleType):
    """An old module name whose attributes are the new module's."""

    def __init__(self, name: str, targets: tuple[str, ...]) -> None:
        super().__init__(name, f"moved to {', '.join(targets)}")
        self.__path__: list[str] = []  # a package, so old submodule paths resolve too
        self._targets = targets

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} (moved to {self._targets}) has no {attr!r}")

    def __dir__(self) -> list[str]:
        return sorted({a for t in self._targets for a in dir(importlib.import_module(t))})


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {' and '.join(new)}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        for target in new:
            importlib.import_module(target)
        return _Forward(spec.name, new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Answer the old paths (once per process), right after the path finder: the files are
    looked for first, and an editable install's finder of an older checkout never answers them."""
    if any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        return
    after = [i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder]
    sys.meta_path.insert(after[0] + 1 if after else len(sys.meta_path), _MovedFinder())
