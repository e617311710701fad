"""What the command-line tools share: every bad invocation is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from kn_graph.errors import KnError

__all__ = ["CliError", "OneLineParser", "load_npy", "parse_int", "writable_path"]


class CliError(KnError):
    """A bad command-line argument (printed as one line by the tool)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`prog: error: ...`) and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def parse_int(text: str, what: str, lo: int = 0, hi: int = 2**31 - 1) -> int:
    try:
        v = int(text)
    except ValueError:
        raise CliError(f"{what}: expected an integer, found '{text}'") from None
    if not lo <= v <= hi:
        raise CliError(f"{what}: expected an integer in [{lo}, {hi}], found {v}")
    return v


def load_npy(path: str, what: str) -> np.ndarray:
    """An array from a .npy file (no pickles), or CliError naming the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{what}: '{path}' is not a file")
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CliError(f"{what}: cannot read '{path}' as a .npy array ({e})") from None


def writable_path(path: str, what: str) -> Path:
    """A path whose folder exists and is writable (checked before any work is done)."""
    import os

    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise CliError(f"{what}: '{path}' is a folder")
    if not folder.is_dir():
        raise CliError(f"{what}: folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise CliError(f"{what}: cannot write '{path}'")
    return p
