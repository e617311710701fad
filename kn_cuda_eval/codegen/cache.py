"""Where generated code is cached on disk, and how its source is shown in errors: shared by the
NVRTC compiler of the CUDA backend, the C compiler of the CPU backend and the host kernel checker.
The directory is `$KN_KERNEL_CACHE`, else `~/.cache/kyanite/kernels`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "numbered"]


def cache_dir() -> Path:
    env = os.environ.get("KN_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kyanite" / "kernels"


def numbered(source: str) -> str:
    """`source` with line numbers, as compile errors show it."""
    return "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(source.splitlines()))
