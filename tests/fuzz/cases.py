"""The malformed-file and argument-misuse cases: a NUL in a path, external data whose location,
offset or length is wrong, and `load_onnx` / `eval` called with the wrong kinds of argument.
Each builds a thunk that loads the model (and says how to feed it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from kn_graph.onnx import load_onnx

__all__ = ["Case", "args_case", "eval_misuse", "file_case"]


@dataclass
class Case:
    """One fuzz case: what was done, how to load it, and whether to feed it wrongly."""

    description: list[str]
    load: Callable[[], Any]
    misuse_eval: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    model: onnx.ModelProto | None = None
    """The mutated model (None for the file and argument cases), for `--save`."""


def _externalize(model: onnx.ModelProto) -> TensorProto | None:
    """The largest initializer with raw data, for moving to an external file."""
    raw = [t for t in model.graph.initializer if t.HasField("raw_data")]
    return max(raw, key=lambda t: len(t.raw_data)) if raw else None


_EXTERNAL_VARIANTS = [
    "valid",
    "nul location",
    "length 2^40",
    "offset beyond the file",
    "negative offset",
    "length not a number",
    "location leaves the folder",
    "absolute location",
    "empty location",
    "location is a folder",
    "missing file",
    "truncated file",
    "relabelled dtype",
    "given as bytes",
]


def file_case(model: onnx.ModelProto, rng: np.random.Generator, workdir: Path) -> Case:
    """A model file whose path or external data is broken (or, once in a while, fine)."""
    if rng.random() < 0.1:
        bad = workdir / "mo\0del.onnx"
        return Case(["file: NUL in the model path"], lambda: load_onnx(os.fspath(bad)))
    t = _externalize(model)
    if t is None:
        return Case(["file: no raw initializer, plain save"], lambda: load_onnx(model))
    variant = _EXTERNAL_VARIANTS[int(rng.integers(len(_EXTERNAL_VARIANTS)))]
    data = bytes(t.raw_data)
    pad = int(rng.integers(0, 64))
    blob = b"\x00" * pad + data
    (workdir / "w.bin").write_bytes(blob[: len(blob) // 2] if variant == "truncated file" else blob)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    info = {"location": "w.bin", "offset": str(pad), "length": str(len(data))}
    match variant:
        case "nul location":
            info["location"] = "w\0.bin"
        case "length 2^40":
            info["length"] = str(2**40)
        case "offset beyond the file":
            info["offset"] = str(len(blob) + int(rng.integers(1, 2**20)))
        case "negative offset":
            info["offset"] = "-8"
        case "length not a number":
            info["length"] = "12abc"
        case "location leaves the folder":
            info["location"] = "../../w.bin"
        case "absolute location":
            info["location"] = "/etc/hostname"
        case "empty location":
            info["location"] = ""
        case "location is a folder":
            info["location"] = "."
        case "missing file":
            info["location"] = "nope.bin"
        case "relabelled dtype":
            t.data_type = int(
                rng.choice([TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT8])
            )
    for k, v in info.items():
        t.external_data.add(key=k, value=v)
    path = workdir / "m.onnx"
    path.write_bytes(model.SerializeToString())
    desc = [f"file: external data of '{t.name}' ({len(data)} bytes): {variant}"]
    if variant == "given as bytes":
        return Case(desc, lambda: load_onnx(path.read_bytes()))
    return Case(desc, lambda: load_onnx(path))


def args_case(model: onnx.ModelProto, rng: np.random.Generator) -> Case:
    """`load_onnx` called with a misused argument."""
    names = [i.name for i in model.graph.input] or ["x"]
    name = names[int(rng.integers(len(names)))]
    choices: list[tuple[str, Callable[[], Any]]] = [
        ("source None", lambda: load_onnx(None)),  # type: ignore[arg-type]
        ("source an int", lambda: load_onnx(3)),  # type: ignore[arg-type]
        ("source a list", lambda: load_onnx([model])),  # type: ignore[arg-type]
        ("dims value a str", lambda: load_onnx(model, dims={"batch": "x"})),  # type: ignore[dict-item]
        ("dims value negative", lambda: load_onnx(model, dims={"batch": -1})),
        ("dims value a bool", lambda: load_onnx(model, dims={"batch": True})),
        ("dims key an int", lambda: load_onnx(model, dims={1: 2})),  # type: ignore[dict-item]
        ("dims a list", lambda: load_onnx(model, dims=[("batch", 1)])),  # type: ignore[arg-type]
        ("batch_axes None", lambda: load_onnx(model, batch_axes=None)),  # type: ignore[arg-type]
        ("batch_axes a str", lambda: load_onnx(model, batch_axes="batch")),
        ("batch_axes of ints", lambda: load_onnx(model, batch_axes=[1])),  # type: ignore[list-item]
        ("input_shapes unknown name", lambda: load_onnx(model, input_shapes={"nope": [1]})),
        ("input_shapes float dims", lambda: load_onnx(model, input_shapes={name: [1.5, 2]})),
        ("input_shapes None dims", lambda: load_onnx(model, input_shapes={name: [None]})),
        ("input_shapes a str", lambda: load_onnx(model, input_shapes={name: "abc"})),
        ("input_shapes negative", lambda: load_onnx(model, input_shapes={name: [-2]})),
        ("input_shapes wrong rank", lambda: load_onnx(model, input_shapes={name: [2]})),
        ("input_values a list", lambda: load_onnx(model, input_values={name: [1, 2]})),
        ("input_values a str", lambda: load_onnx(model, input_values={name: "x"})),
        (
            "input_values wrong dtype",
            lambda: load_onnx(model, input_values={name: np.zeros(2, np.complex64)}),
        ),
        ("input_values unknown", lambda: load_onnx(model, input_values={"nope": np.zeros(1)})),
        ("base_dir an int", lambda: load_onnx(model, base_dir=3)),  # type: ignore[arg-type]
        ("base_dir with NUL", lambda: load_onnx(model, base_dir="a\0b")),
        ("static a str", lambda: load_onnx(model, static="yes")),  # type: ignore[arg-type]
    ]
    desc, thunk = choices[int(rng.integers(len(choices)))]
    return Case([f"args: {desc}"], thunk)


def eval_misuse(
    names: list[str], good: dict[str, np.ndarray], rng: np.random.Generator
) -> tuple[str, Any]:
    """Inputs for `eval` that are wrong in one way (dtype, rank, count, kind)."""
    name = names[int(rng.integers(len(names)))] if names else "x"
    bad = dict(good)
    choice = int(rng.integers(7))
    if choice == 0 and name in bad:
        bad[name] = bad[name].astype(np.complex64)
        return f"eval: '{name}' as complex64", bad
    if choice == 1 and name in bad:
        bad[name] = bad[name][None]
        return f"eval: '{name}' with one more axis", bad
    if choice == 2 and name in bad:
        del bad[name]
        return f"eval: '{name}' missing", bad
    if choice == 3:
        bad["extra"] = np.zeros(1, np.float32)
        return "eval: an extra input", bad
    if choice == 4:
        return "eval: None", None
    if choice == 5 and name in bad:
        bad[name] = "text"  # type: ignore[assignment]
        return f"eval: '{name}' a str", bad
    return "eval: a list of the wrong length", [*good.values(), np.zeros(1, np.float32)]
