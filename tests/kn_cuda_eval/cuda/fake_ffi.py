"""The foreign-call side of the fake libraries (`fake_cublas`, `fake_cudnn`): pointer arguments
as ctypes passes them, and Python functions that accept a binding's prototypes and, when strict,
check each call against them as a foreign call would.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any


def _v(x: Any) -> int:
    """A pointer argument as an int (ctypes passes ints, c_void_p or None)."""
    if x is None:
        return 0
    if isinstance(x, ctypes.c_void_p):
        return int(x.value or 0)
    return int(x)


class _Fn:
    """A Python function that tolerates the restype/argtypes a binding sets on it; `strict`
    checks the arguments against the argtypes as a foreign call would (count, types, and that
    a C int is not truncated)."""

    def __init__(self, f: Callable[..., Any], strict: bool = False) -> None:
        self.f = f
        self.strict = strict
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.strict:
            assert self.argtypes is not None, "prototype not declared"
            assert len(args) == len(self.argtypes), (len(args), len(self.argtypes))
            for k, (t, a) in enumerate(zip(self.argtypes, args, strict=True)):
                t.from_param(a)  # raises ctypes.ArgumentError-like TypeError on a bad type
                if t is ctypes.c_int and isinstance(a, int):
                    assert -(2**31) <= a < 2**31, f"argument {k} ({a}) truncated to a C int"
        return self.f(*args)
