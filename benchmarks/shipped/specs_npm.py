"""Models shipped inside npm packages."""

from __future__ import annotations

from spec import Spec

SPECS: list[Spec] = []
