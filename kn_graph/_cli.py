"""What the command-line tools share: every bad invocation is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np

from kn_graph.errors import KnError

__all__ = [
    "CliError",
    "OneLineParser",
    "load_npy",
    "one_line",
    "parse_int",
    "run_tool",
    "writable_path",
]


class CliError(KnError):
    """A bad command-line argument (printed as one line by the tool)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`prog: error: ...`) and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def one_line(e: BaseException) -> str:
    """An error as one line: an OS error's file and reason, else the message's lines joined."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


def run_tool(
    prog: str,
    body: Callable[[], object],
    errors: tuple[type[BaseException], ...] = (KnError, OSError),
    interrupted: str = "interrupted",
) -> int:
    """A command-line tool's exit status around `body`: 0 when it returns, 2 on one of `errors`
    (one line on stderr, `prog: error: ...`, no traceback), 130 on Ctrl-C."""
    try:
        body()
    except errors as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    return 0


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
