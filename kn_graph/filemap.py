"""Arrays that view read-only maps of files (mapped model weights, `kn_graph.onnx.mapped`):
the maps, whether their file was rewritten since (`check_unchanged`), and handing their
resident pages back (`release_pages`). No ONNX here: the executors import it."""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from kn_graph.errors import EvaluationError

__all__ = ["MappedFile", "check_all", "check_unchanged", "release_pages"]


# every live map: the file it shows and that file's identity when it was mapped
_FILES: weakref.WeakKeyDictionary[mmap.mmap, tuple[Path, tuple[int, int, int]]] = (
    weakref.WeakKeyDictionary()
)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


class MappedFile:
    """A read-only map of one file, kept alive by the arrays viewing it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            self.size = st.st_size
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        if self.map is not None:
            _FILES[self.map] = (self.path, _identity(st))

    def view(self, offset: int, length: int) -> memoryview:
        """Bytes [offset, offset + length) of the file, without a copy (the caller checked
        them against the size)."""
        if self.map is None:
            return memoryview(b"")
        return memoryview(self.map)[offset : offset + length]


def _root_map(arr: np.ndarray) -> mmap.mmap | None:
    root: object = arr
    while isinstance(root, np.ndarray):
        root = root.base
    if isinstance(root, memoryview):
        root = root.obj
    return root if isinstance(root, mmap.mmap) else None


def check_unchanged(arr: np.ndarray, seen: set[int] | None = None) -> None:
    """Raise `EvaluationError` when `arr` views a mapped file that was rewritten in place since
    it was mapped (same inode, another size or time); `seen` (ids of maps already checked)
    keeps it to one `stat` a file."""
    m = _root_map(arr)
    if m is None or (seen is not None and id(m) in seen):
        return
    if seen is not None:
        seen.add(id(m))
    entry = _FILES.get(m)
    if entry is None:
        return
    path, (ino, size, mtime) = entry
    try:
        now = _identity(os.stat(path))
    except OSError:  # removed: the map keeps the old contents
        return
    if now[0] == ino and now[1:] != (size, mtime):
        raise EvaluationError(
            f"the model file '{path}' was rewritten since it was loaded, and its weights are "
            "read from it (mapped): load the model again (load_onnx(..., mmap=False) reads the "
            "weights into memory, so the file may change)"
        )


def check_all(arrays: Iterable[np.ndarray]) -> None:
    """`check_unchanged` for each array, one `stat` per mapped file: before a pass that reads
    constants' bytes (planning, optimizing)."""
    seen: set[int] = set()
    for a in arrays:
        check_unchanged(a, seen)


def release_pages(arr: np.ndarray) -> int:
    """Hand back the resident pages of `arr` when it views a read-only file map (a mapped
    initializer): the pages are clean copies of the file, so a later read faults them in
    again. Returns the bytes released (0 for memory of any other kind)."""
    root = _root_map(arr)
    if root is None or arr.nbytes == 0 or root.closed:
        return 0
    base = np.frombuffer(root, np.uint8).ctypes.data
    lo = arr.ctypes.data - base
    hi = lo + arr.nbytes
    page = mmap.PAGESIZE
    lo = lo // page * page  # neighbours' pages may go too: they fault back from the file
    hi = min(-(-hi // page) * page, len(root))
    if not 0 <= lo < hi:
        return 0
    root.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return hi - lo
