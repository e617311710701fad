"""Small stand-ins for the real-size models of `real_models.py`: fixed-shape copies of the test
fixtures saved under the real models' names, so that a folder of them passed as `--cache` lets
`real_models.py`, `prepare_time.py` and `contended.py` be tried in seconds, on a machine without
the torch venvs that export the real ones. Timings on them say nothing about the real models.

    .venv/bin/python benchmarks/standin_models.py /tmp/kn_standins
    .venv/bin/python benchmarks/prepare_time.py --cache /tmp/kn_standins -k resnet50 --repeat 1

Each copy has every symbolic input dim fixed (batch 1, or 8 for `resnet50_b8`; sequence 32;
height and width 64), and integer inputs made safe for the random ids `real_models.feeds_for`
gives (0..999): an input that indexes an embedding table is taken modulo the table's rows,
any other (an attention mask) becomes all ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "models"
SEQ = 32  # the fixtures have 64 positions (real_models.SEQ is 128)
HW = 64

# real model name -> (fixture, batch)
STANDINS: dict[str, tuple[str, int]] = {
    "resnet50": ("resnet18_ts", 1),
    "resnet50_b8": ("resnet18_ts", 8),
    "mobilenet_v2": ("mobilenetv2_ts", 1),
    "efficientnet_b0": ("mobilenetv3_hw_dynamo", 1),
    "bert_base": ("bert_ts", 1),
    "gpt2_small": ("gpt2_ts", 1),
}


def _dim_value(name: str, batch: int) -> int | None:
    if name in ("batch", "batch_size", "N", "B"):
        return batch
    if name in ("seq", "sequence", "sequence_length"):
        return SEQ
    if name in ("height", "width"):
        return HW
    return None


def _fix_dims(vi: onnx.ValueInfoProto, batch: int) -> None:
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_param"):
            v = _dim_value(d.dim_param, batch)
            d.Clear()
            if v is not None:
                d.dim_value = v


def _safe_int_input(g: onnx.GraphProto, name: str) -> None:
    """Route integer input `name` through Mod(rows of the table it indexes) or to all ones."""
    inits = {i.name: i for i in g.initializer}
    rows = [
        int(inits[n.input[0]].dims[0])
        for n in g.node
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == name
        if n.input[0] in inits
    ]
    safe = f"{name}__standin"
    for n in g.node:
        n.input[:] = [safe if i == name else i for i in n.input]
    if rows:
        div = numpy_helper.from_array(np.array(min(rows), np.int64), f"{name}__rows")
        g.initializer.append(div)
        nodes = [helper.make_node("Mod", [name, div.name], [safe])]
    else:
        zero = numpy_helper.from_array(np.array(0, np.int64), f"{name}__zero")
        one = numpy_helper.from_array(np.array(1, np.int64), f"{name}__one")
        g.initializer.extend([zero, one])
        nodes = [
            helper.make_node("Mul", [name, zero.name], [f"{name}__zeros"]),
            helper.make_node("Add", [f"{name}__zeros", one.name], [safe]),
        ]
    for k, n in enumerate(nodes):  # before every user: the node list stays topologically sorted
        g.node.insert(k, n)


def standin(fixture: str, batch: int) -> onnx.ModelProto:
    m = onnx.load(str(FIXTURES / f"{fixture}.onnx"))
    g = m.graph
    inits = {i.name for i in g.initializer}
    for vi in [*g.input, *g.output, *g.value_info]:
        _fix_dims(vi, batch)
    for i in g.input:
        if i.name not in inits and i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            _safe_int_input(g, i.name)
    onnx.checker.check_model(m)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("folder", type=Path, help="where to write <name>.onnx (a --cache folder)")
    args = ap.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    for name, (fixture, batch) in STANDINS.items():
        onnx.save(standin(fixture, batch), str(args.folder / f"{name}.onnx"))
        print(f"{name}: {fixture} at batch {batch}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
