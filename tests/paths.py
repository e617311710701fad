"""Where the tests find the checkout and the committed fixture models, wherever a test file sits."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository root."""
MODELS = ROOT / "tests" / "models"
"""The fixture models (tests/models/make_models.py)."""
