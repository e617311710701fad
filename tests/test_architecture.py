"""The layout stays what docs/architecture.md says: no import circle anywhere in the three
packages (a lazy import inside a function, or one under `if TYPE_CHECKING:`, is an edge too:
each was once a circle dodged), no upward import between the layers of `kn_cuda_eval` — the
device-neutral plan, the code generator, the two backends — and small files and functions.

The imports are read from the source (`ast`), so a circle is caught before anything runs it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import ROOT

PACKAGES = ("kn_graph", "kn_cuda_eval", "kn_runtime")
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100

LAYERS = {
    "kn_cuda_eval.planning": "plan",
    "kn_cuda_eval.codegen": "codegen",
    "kn_cuda_eval.cuda": "cuda",
    "kn_cuda_eval.cpu": "cpu",
}
ALLOWED = {  # layer -> the layers it may import (besides itself and kn_graph)
    "plan": set(),
    "codegen": {"plan"},
    "cuda": {"plan", "codegen"},
    "cpu": {"plan", "codegen"},
}


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    target: str
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """Every import of one of our modules in `path`, wherever it stands (top level, inside a
    function, under `if TYPE_CHECKING:`); `from a import b` names `a.b` when that is a module."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            targets = [node.module, *(s for s in subs if s in known)]
        else:
            continue
        for t in targets:
            if t in known and t != name:
                yield Import(name, t, node.lineno)


def layer(module: str) -> str | None:
    for prefix, name in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    known = modules()
    return {name: list(imports(name, path, known)) for name, path in known.items()}


def strongly_connected(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Tarjan's algorithm with an explicit stack: the import circles (components of 2+)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for e in edges:
                w = e.target
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circle(graph: dict[str, list[Import]]) -> None:
    circles = strongly_connected(graph)
    detail = [
        " -> ".join(c)
        + ": "
        + ", ".join(
            f"{e.source}:{e.line} imports {e.target}" for m in c for e in graph[m] if e.target in c
        )
        for c in circles
    ]
    assert not circles, "import circles:\n" + "\n".join(detail)


def test_layers_import_downward_only(graph: dict[str, list[Import]]) -> None:
    bad = []
    for edges in graph.values():
        for e in edges:
            src, dst = layer(e.source), layer(e.target)
            if (
                (e.source.startswith("kn_graph") and not e.target.startswith("kn_graph"))
                or (e.source.startswith("kn_cuda_eval") and e.target.startswith("kn_runtime"))
                or (src and dst and src != dst and dst not in ALLOWED[src])
                or (src and e.target == "kn_cuda_eval")
            ):
                bad.append(e)
    assert not bad, "upward imports:\n" + "\n".join(
        f"{e.source}:{e.line} ({layer(e.source)}) imports {e.target} ({layer(e.target)})"
        for e in bad
    )


def test_the_layering_check_catches_a_backend_importing_the_other() -> None:
    fake = {
        "kn_cuda_eval.cpu.x": [Import("kn_cuda_eval.cpu.x", "kn_cuda_eval.cuda.y", 1)],
        "kn_cuda_eval.cuda.y": [Import("kn_cuda_eval.cuda.y", "kn_cuda_eval.cpu.x", 2)],
    }
    assert strongly_connected(fake) == [["kn_cuda_eval.cpu.x", "kn_cuda_eval.cuda.y"]]
    with pytest.raises(AssertionError, match=r"cpu\.x:1 \(cpu\) imports kn_cuda_eval\.cuda\.y"):
        test_layers_import_downward_only(fake)


TEST_EXEMPT = {ROOT / "tests" / "models" / "make_models.py"}
"""The fixture exporter: a developer script run under torch (CI only reads what it made), whose
regeneration would rewrite the committed models; split it when it is next changed."""


def python_files() -> list[Path]:
    """The packages' modules and the test modules (tests mirror the packages)."""
    tests = sorted((ROOT / "tests").rglob("*.py"))
    return [*modules().values(), *(p for p in tests if p not in TEST_EXEMPT)]


def test_files_and_functions_are_small() -> None:
    long_files, long_functions = [], []
    for path in python_files():
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
