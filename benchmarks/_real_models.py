"""`real_models.py` as a library for the other benchmark scripts (`prepare_time.py`,
`contended.py`): its model list, exports, feeds, onnxruntime session and prepared graph.

It reads its command line when imported (and sets OMP/OpenBLAS/MKL_NUM_THREADS from it), so it
is imported here with only the cache folder and the thread count on a stand-in command line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType


def import_real_models(cache: Path, threads: int) -> ModuleType:
    """`benchmarks/real_models.py` imported with `--cache cache --threads threads`."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    argv = sys.argv
    sys.argv = [argv[0], "--cache", str(cache), "--threads", str(threads)]
    try:
        import real_models
    finally:
        sys.argv = argv
    return real_models


def export_or_why(rm: ModuleType, name: str) -> str | None:
    """`rm.ensure_exported(name)`, with a missing exporter venv as a reason, not a traceback."""
    try:
        why: str | None = rm.ensure_exported(name)
    except OSError as e:
        return f"cannot export ({e.strerror}: {e.filename})"
    return why


def export_all(rm: ModuleType, names: list[str]) -> dict[str, str]:
    """Export every model before any timing; the ones that failed, with why (printed)."""
    failures: dict[str, str] = {}
    for n in names:
        why = export_or_why(rm, n)
        if why is not None:
            failures[n] = why
            print(f"export of {n} failed: {why}", flush=True)
    return failures
