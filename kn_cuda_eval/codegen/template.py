"""Strict `$NAME$` templates and an indented code writer, for both backends: kernel source is
assembled from reviewed template files, never from f-string soup."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["CodeWriter", "fill"]

_HOLE = re.compile(r"\$([A-Z][A-Z0-9_]*)\$")


def fill(text: str, values: Mapping[str, str | int]) -> str:
    """Replace every `$NAME$` hole; a hole without a value or a value without a hole raises
    (a typo in either place is a bug, not a silent blank)."""
    holes = set(_HOLE.findall(text))
    missing = holes - values.keys()
    extra = values.keys() - holes
    if missing or extra:
        raise KeyError(
            f"template holes without values: {sorted(missing)}; values without holes: {sorted(extra)}"
        )
    return _HOLE.sub(lambda m: str(values[m.group(1)]), text)


class CodeWriter:
    """Lines with indentation; `with w.block("for (...)"):` opens and closes a brace."""

    def __init__(self, indent: int = 0) -> None:
        self.lines: list[str] = []
        self.level = indent

    def line(self, text: str = "") -> None:
        self.lines.append(("    " * self.level + text) if text else "")

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        self.line(head + " {")
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1
            self.line("}")

    def __str__(self) -> str:
        return "\n".join(self.lines)
