"""Fixtures shared by the IR and reference-executor tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A fresh generator with a fixed seed for each test, so no test depends on another's draws."""
    return np.random.default_rng(42)
