"""Old import paths of the modules that moved in the one-plan-two-backends restructuring keep
working for one release: each imports in a fresh interpreter, warns once with its new home, and
gives the very objects of the new module (classes keep their identity); the paths our own code
imports are the new ones (no warning when the packages and the CLI load)."""

from __future__ import annotations

import json
import subprocess
import sys

from kn_graph._moved import MOVED
from tests.paths import ROOT

SCRIPT = r"""
import importlib, json, warnings
from kn_graph._moved import MOVED
out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    names = [n for n in getattr(importlib.import_module(new[0]), "__all__", [])]
    same = all(getattr(module, n) is getattr(importlib.import_module(new[0]), n) for n in names)
    out[old] = {
        "warnings": [str(w.message) for w in caught if w.category is DeprecationWarning],
        "names": len(names),
        "same": same,
    }
print(json.dumps(out))
"""


def test_old_module_paths_import_with_a_warning_and_the_same_objects() -> None:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    got = json.loads(r.stdout)
    assert set(got) == set(MOVED)
    for old, new in MOVED.items():
        assert got[old]["same"], old
        assert any(old in w and new[0] in w for w in got[old]["warnings"]), (old, got[old])
    # the public names the README used before: the executor and the reference
    assert got["kn_cuda_eval.device"]["names"] > 0
    assert got["kn_graph.cpu"]["names"] > 0


def test_our_own_code_imports_no_old_path() -> None:
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning);"
        "import kn_graph, kn_graph.onnx, kn_graph.optimizer, kn_cuda_eval, kn_runtime, "
        "kn_runtime.cli, kn_cuda_eval.cpu.executor, kn_cuda_eval.cuda.device.executor, "
        "kn_cuda_eval.cuda.hostcheck.sweep"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
