"""Stable Diffusion from a checkout, without installing: the same program as `kn-sd`, whose code
lives in `kn_runtime.sd` (the pipeline) and `kn_runtime.sd.cli` (this command line).

    python examples/stable_diffusion.py "a photograph of an astronaut riding a horse" --png x.png
    python -m examples.stable_diffusion --help
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the checkout's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kn_runtime.sd.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
