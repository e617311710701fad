"""Stable Diffusion 1.x over ONNX exports: CLIP tokenizer, schedulers, model executors, the
pipeline, and `kn-sd` (`kn_runtime.sd.cli`) that drives them. The tiny random-weight pipeline
that `kn-sd` runs by default ships inside this package (`TINY_SD`)."""

from importlib import resources
from pathlib import Path

__all__ = ["TINY_SD"]

TINY_SD = Path(str(resources.files("kn_runtime.sd") / "tiny_sd"))
"""The tiny Stable-Diffusion-shaped pipeline (1.7 MB, random weights) shipped as package data."""
