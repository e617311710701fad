"""Models shipped inside PyPI packages."""

from __future__ import annotations

from spec import Spec

SPECS: list[Spec] = []
