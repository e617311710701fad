"""Input/output signatures of the three ONNX models, read without their weights, and the checks
that a folder's models fit together (a UNet whose inputs are not a UNet's fails here, in one
line, before gigabytes of weights are read)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

__all__ = ["PipelineError", "Port", "Signature", "UNetPorts", "read_signature", "unet_ports"]

Dim = int | str | None
"""A static size, a named dynamic size, or unknown."""


class PipelineError(ValueError):
    """Bad input to the pipeline: a missing file, models that do not fit, bad settings."""


@dataclass(frozen=True, slots=True)
class Port:
    """One model input or output: name, NumPy dtype and dims."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def static(self, axis: int) -> int | None:
        """The size of `axis` when the model fixes it."""
        d = (
            self.dims[axis]
            if self.dims is not None and -len(self.dims) <= axis < len(self.dims)
            else None
        )
        return d if isinstance(d, int) else None

    def __str__(self) -> str:
        dims = (
            "?" if self.dims is None else ",".join("?" if d is None else str(d) for d in self.dims)
        )
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True, slots=True)
class Signature:
    path: Path
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]

    def describe(self) -> str:
        return "(" + ", ".join(map(str, self.inputs)) + ")"


def _port(vi: onnx.ValueInfoProto, where: str) -> Port:
    if not vi.type.HasField("tensor_type"):
        raise PipelineError(f"{where}: '{vi.name}' is not a tensor")
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except (KeyError, TypeError, ValueError):
        raise PipelineError(
            f"{where}: '{vi.name}' has an unsupported element type {tt.elem_type}"
        ) from None
    dims: tuple[Dim, ...] | None = None
    if tt.HasField("shape"):
        dims = tuple(
            int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim
        )
    return Port(vi.name, dtype, dims)


def read_signature(path: Path) -> Signature:
    """Inputs (initializers excluded) and outputs of an ONNX file, external data not read."""
    if not path.is_file():
        raise PipelineError(f"{path} is missing")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError, OSError, onnx's own errors
        raise PipelineError(
            f"{path} is not a readable ONNX model ({type(e).__name__}: {e})"
        ) from None
    if not model.HasField("graph"):
        raise PipelineError(f"{path} is not an ONNX model (no graph)")
    inits = {t.name for t in model.graph.initializer}
    where = str(path)
    inputs = tuple(_port(i, where) for i in model.graph.input if i.name not in inits)
    outputs = tuple(_port(o, where) for o in model.graph.output)
    return Signature(path, inputs, outputs)


@dataclass(frozen=True, slots=True)
class UNetPorts:
    """The UNet's three inputs, whatever the exporter called them."""

    sample: Port
    timestep: Port
    encoder_hidden_states: Port
    out: Port


UNET_EXPECTED = (
    "sample float[B,4,H,W], timestep [] or [B] (int or float), encoder_hidden_states float[B,S,D]"
)


def unet_ports(sig: Signature, latent_channels: int) -> UNetPorts:
    """Match the UNet's inputs by name (sample, timestep, encoder_hidden_states), else by
    position, and check their ranks, dtypes and the latent channels."""

    def bad(why: str) -> PipelineError:
        return PipelineError(
            f"{sig.path}: not a Stable Diffusion UNet ({why}); expected inputs "
            f"({UNET_EXPECTED}), found {sig.describe()}"
        )

    if len(sig.inputs) != 3:
        raise bad(f"{len(sig.inputs)} inputs")
    if len(sig.outputs) < 1:
        raise bad("no outputs")
    by_name = {p.name: p for p in sig.inputs}
    names = ("sample", "timestep", "encoder_hidden_states")
    sample, timestep, ehs = (
        (by_name[n] for n in names) if all(n in by_name for n in names) else sig.inputs
    )
    if sample.rank != 4 or sample.dtype.kind != "f":
        raise bad(f"'{sample.name}' is not a float tensor of rank 4")
    if timestep.rank not in (0, 1) or timestep.dtype.kind not in "fiu":
        raise bad(f"'{timestep.name}' is not a numeric scalar or vector")
    if ehs.rank != 3 or ehs.dtype.kind != "f":
        raise bad(f"'{ehs.name}' is not a float tensor of rank 3")
    channels = sample.static(1)
    if channels is not None and channels != latent_channels:
        raise bad(
            f"'{sample.name}' has {channels} channels, the VAE's latents have {latent_channels}"
        )
    return UNetPorts(sample, timestep, ehs, sig.outputs[0])


def text_encoder_ports(sig: Signature) -> tuple[Port, Port]:
    """The token-id input and the hidden-state output (`last_hidden_state`, else the first output
    of rank 3)."""
    ints = [p for p in sig.inputs if p.dtype.kind in "iu"]
    if len(sig.inputs) != 1 or len(ints) != 1 or ints[0].rank != 2:
        raise PipelineError(
            f"{sig.path}: not a CLIP text encoder; expected one input "
            f"input_ids int[B,S], found {sig.describe()}"
        )
    named = [p for p in sig.outputs if p.name == "last_hidden_state"]
    rank3 = [p for p in sig.outputs if p.rank == 3]
    if not (named or rank3):
        raise PipelineError(f"{sig.path}: the text encoder has no rank-3 hidden-state output")
    return ints[0], (named or rank3)[0]


def vae_decoder_ports(sig: Signature, latent_channels: int) -> tuple[Port, Port]:
    """The latent input and the image output of the VAE decoder."""
    if (
        len(sig.inputs) != 1
        or sig.inputs[0].rank != 4
        or sig.inputs[0].dtype.kind != "f"
        or not sig.outputs
    ):
        raise PipelineError(
            f"{sig.path}: not a VAE decoder; expected one input latent_sample "
            f"float[B,{latent_channels},h,w], found {sig.describe()}"
        )
    latent = sig.inputs[0]
    channels = latent.static(1)
    if channels is not None and channels != latent_channels:
        raise PipelineError(
            f"{sig.path}: the VAE decoder takes {channels} latent channels, "
            f"expected {latent_channels}"
        )
    return latent, sig.outputs[0]
