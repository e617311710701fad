"""Seeded mutations of an ONNX model: each takes the model (mutated in place) and a NumPy
`Generator` and returns a one-line description of what it did, or None when it found nothing
to mutate (the fuzzer then tries another)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

__all__ = ["MUTATIONS", "corrupt_bytes", "mutate"]

Mutation = Callable[[onnx.ModelProto, np.random.Generator], str | None]

SIBLINGS = [
    ["Add", "Mul", "Sub", "Div", "Pow", "Max", "Min", "Mod", "PRelu"],
    ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt", "Erf", "Softplus", "Identity"],
    ["MaxPool", "AveragePool", "LpPool"],
    ["GlobalAveragePool", "GlobalMaxPool"],
    ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"],
    ["Softmax", "LogSoftmax", "Hardmax"],
    ["MatMul", "Gemm", "Add"],
    ["Conv", "ConvTranspose"],
    ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"],
    ["And", "Or", "Xor"],
    ["Squeeze", "Unsqueeze", "Flatten"],
    ["Gather", "GatherElements", "GatherND"],
    ["Reshape", "Expand", "Tile"],
    ["Transpose", "Identity", "Cast"],
    ["Where", "Concat"],
    ["LayerNormalization", "InstanceNormalization", "GroupNormalization"],
    ["Slice", "Pad"],
    ["Shape", "Size", "NonZero"],
    ["Gelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "LeakyRelu"],
]
"""Op types that take similar inputs: a swap keeps the model plausible."""

DTYPES = [
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.DOUBLE,
    TensorProto.INT64,
    TensorProto.INT32,
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.BOOL,
    TensorProto.STRING,
    TensorProto.UNDEFINED,
    TensorProto.FLOAT8E4M3FN,
    TensorProto.INT4,
    TensorProto.COMPLEX64,
    99,
]

HUGE = [2**31, 2**40, 2**62, -(2**62), 2**63 - 1]

STRINGS = ["", "nearest", "linear", "cubic", "SAME_UPPER", "VALID", "NOTSET", "constant"]
STRINGS += ["reflect", "edge", "DCR", "CRD", "bogus", "\x00", "tf_crop_and_resize", "floor"]


T = TypeVar("T")


def _pick(rng: np.random.Generator, items: Sequence[T]) -> T:
    return items[int(rng.integers(len(items)))]


def _node_name(model: onnx.ModelProto, i: int) -> str:
    n = model.graph.node[i]
    return f"node {i} {n.op_type} '{n.name}'"


def swap_op(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    nodes = [
        (i, grp) for i, n in enumerate(model.graph.node) for grp in SIBLINGS if n.op_type in grp
    ]
    if not nodes:
        return None
    i, grp = _pick(rng, nodes)
    node = model.graph.node[i]
    old = node.op_type
    node.op_type = str(_pick(rng, [t for t in grp if t != old]))
    return f"{_node_name(model, i)}: op {old} -> {node.op_type}"


def _int_variant(v: int, rng: np.random.Generator) -> int:
    new = int(_pick(rng, [v + 1, v - 1, 2 * v, -v, -1, 0, 2, _pick(rng, HUGE)]))
    return min(max(new, -(2**63)), 2**63 - 1)  # what an int64 field holds


def perturb_attr(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    nodes = [i for i, n in enumerate(model.graph.node) if n.attribute]
    if not nodes:
        return None
    i = int(_pick(rng, nodes))
    node = model.graph.node[i]
    a = node.attribute[int(rng.integers(len(node.attribute)))]
    where = f"{_node_name(model, i)} attribute {a.name}"
    r = rng.random()
    if r < 0.1:  # removed
        node.attribute.remove(a)
        return f"{where}: removed"
    if r < 0.2:  # wrong type
        kind = int(_pick(rng, [AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.INTS]))
        kind = kind if kind != a.type else AttributeProto.STRING
        new = onnx.helper.make_attribute(
            a.name,
            {
                AttributeProto.INT: 3,
                AttributeProto.FLOAT: 0.5,
                AttributeProto.INTS: [1, 2],
                AttributeProto.STRING: "x",
            }[kind],
        )
        a.CopyFrom(new)
        return f"{where}: type -> {AttributeProto.AttributeType.Name(kind)}"
    match a.type:
        case AttributeProto.INT:
            old = a.i
            a.i = _int_variant(a.i, rng)
            return f"{where}: {old} -> {a.i}"
        case AttributeProto.INTS:
            vals = list(a.ints)
            choice = rng.integers(4)
            if choice == 0 and vals:
                k = int(rng.integers(len(vals)))
                vals[k] = _int_variant(vals[k], rng)
            elif choice == 1 and vals:
                del vals[int(rng.integers(len(vals)))]
            elif choice == 2:
                vals.append(int(_pick(rng, [0, 1, -1, 2**31])))
            else:
                vals = []
            del a.ints[:]
            a.ints.extend(vals)
            return f"{where}: -> {vals}"
        case AttributeProto.FLOAT:
            old_f = a.f
            a.f = float(_pick(rng, [2 * a.f, -a.f, 0.0, float("nan"), float("inf"), 1e30]))
            return f"{where}: {old_f} -> {a.f}"
        case AttributeProto.FLOATS:
            vals_f = [float(x) for x in a.floats]
            if vals_f:
                vals_f[int(rng.integers(len(vals_f)))] = float(
                    _pick(rng, [0.0, -1.0, float("nan"), 1e30])
                )
            else:
                vals_f = [1.0]
            del a.floats[:]
            a.floats.extend(vals_f)
            return f"{where}: -> {vals_f}"
        case AttributeProto.STRING:
            a.s = str(_pick(rng, STRINGS)).encode()
            return f"{where}: -> {a.s!r}"
        case AttributeProto.TENSOR:
            return _mutate_tensor(a.t, rng, where)
    return None


def _mutate_tensor(t: TensorProto, rng: np.random.Generator, where: str) -> str:
    if rng.random() < 0.5:
        old = t.data_type
        t.data_type = int(_pick(rng, [d for d in DTYPES if d != old]))
        return f"{where}: dtype {old} -> {t.data_type}"
    dims = list(t.dims)
    choice = rng.integers(4)
    if choice == 0 and dims:
        dims[int(rng.integers(len(dims)))] = int(_pick(rng, [0, 1, -1, -3, 2**31, 2**40]))
    elif choice == 1:
        dims.append(int(_pick(rng, [1, 2])))
    elif choice == 2 and dims:
        dims.pop()
    else:
        dims = dims[::-1]
    del t.dims[:]
    t.dims.extend(dims)
    return f"{where}: dims -> {dims}"


def tensor_values(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    """Change one element of a small integer or float constant (shapes, axes, slice bounds)."""
    found: list[tuple[str, TensorProto]] = [
        (f"initializer '{t.name}'", t) for t in model.graph.initializer
    ]
    for i, n in enumerate(model.graph.node):
        found += [
            (f"{_node_name(model, i)} attribute {a.name}", a.t)
            for a in n.attribute
            if a.type == AttributeProto.TENSOR
        ]
    small = []
    for where, t in found:
        try:
            arr = numpy_helper.to_array(t)
        except Exception:
            continue
        if 0 < arr.size <= 64 and arr.dtype.kind in "iuf":
            small.append((where, t, arr))
    if not small:
        return None
    where, t, arr = _pick(rng, small)
    flat = arr.reshape(-1).copy()
    k = int(rng.integers(flat.size))
    old = flat[k].item()
    if arr.dtype.kind == "f":
        new = _pick(rng, [0.0, -old, 2 * old, float("nan"), float("inf"), -1e30])
    else:
        new = _int_variant(int(old), rng)
        info = np.iinfo(arr.dtype)
        new = min(max(new, info.min), info.max)
    flat[k] = new
    t.CopyFrom(numpy_helper.from_array(flat.reshape(arr.shape), t.name))
    return f"{where}: element {k} {old} -> {new}"


def relabel_dtype(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    g = model.graph
    if g.initializer and (rng.random() < 0.6 or not g.input):
        t = g.initializer[int(rng.integers(len(g.initializer)))]
        return _mutate_tensor(t, rng, f"initializer '{t.name}'")
    if not g.input:
        return None
    inp = g.input[int(rng.integers(len(g.input)))]
    old = inp.type.tensor_type.elem_type
    inp.type.tensor_type.elem_type = int(_pick(rng, [d for d in DTYPES if d != old]))
    return f"input '{inp.name}': dtype {old} -> {inp.type.tensor_type.elem_type}"


def delete_node(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    g = model.graph
    if not g.node:
        return None
    i = int(rng.integers(len(g.node)))
    node = g.node[i]
    desc = _node_name(model, i)
    bypass = rng.random() < 0.7 and node.input and node.output
    if bypass:  # its first output now reads its first input
        src, dst = node.input[0], node.output[0]
        for n in g.node:
            for k, name in enumerate(n.input):
                if name == dst:
                    n.input[k] = src
        for o in g.output:
            if o.name == dst:
                o.name = src
    del g.node[i]
    return f"{desc}: deleted{' (bypassed)' if bypass else ''}"


def swap_inputs(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    g = model.graph
    multi = [i for i, n in enumerate(g.node) if len(n.input) >= 2]
    if multi and rng.random() < 0.5:
        i = int(_pick(rng, multi))
        node = g.node[i]
        a, b = rng.choice(len(node.input), 2, replace=False)
        node.input[a], node.input[b] = node.input[b], node.input[a]
        return f"{_node_name(model, i)}: inputs {a} <-> {b}"
    if not g.node:
        return None
    i = int(rng.integers(len(g.node)))
    node = g.node[i]
    if not node.input:
        return None
    defined = [x.name for x in g.input] + [t.name for t in g.initializer]
    defined += [o for n in g.node[:i] for o in n.output if o]
    k = int(rng.integers(len(node.input)))
    node.input[k] = str(_pick(rng, [*defined, ""]))
    return f"{_node_name(model, i)}: input {k} -> '{node.input[k]}'"


def input_dim(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    ins = [x for x in model.graph.input if x.type.tensor_type.HasField("shape")]
    if not ins:
        return None
    inp = ins[int(rng.integers(len(ins)))]
    shape = inp.type.tensor_type.shape
    if not shape.dim or rng.random() < 0.1:
        shape.dim.add().dim_value = int(_pick(rng, [1, 2]))
        return f"input '{inp.name}': one more axis"
    if rng.random() < 0.1:
        del shape.dim[int(rng.integers(len(shape.dim)))]
        return f"input '{inp.name}': one axis less"
    d = shape.dim[int(rng.integers(len(shape.dim)))]
    choice = rng.random()
    if choice < 0.7:
        d.dim_value = int(_pick(rng, [0, 1, 2, 3, 2**31, 2**40, -1, -7]))
        return f"input '{inp.name}': dim -> {d.dim_value}"
    d.dim_param = str(_pick(rng, ["", "fresh", "batch", "seq + 1", "2*seq", "h//0", "?", "a b"]))
    return f"input '{inp.name}': dim -> '{d.dim_param}'"


def initializer_dims(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    g = model.graph
    if not g.initializer:
        return None
    t = g.initializer[int(rng.integers(len(g.initializer)))]
    dims = list(t.dims)
    if dims and rng.random() < 0.5:
        dims[int(rng.integers(len(dims)))] = int(_pick(rng, [-1, -4, 0, 2**40]))
    else:
        dims = dims[::-1] if len(dims) > 1 else [*dims, 1]
    del t.dims[:]
    t.dims.extend(dims)
    return f"initializer '{t.name}': dims -> {dims}"


def structure(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    """Whole-model damage: duplicate names, opset imports, outputs."""
    g = model.graph
    choice = int(rng.integers(8))
    if choice == 0 and g.node:  # two nodes write one name
        i = int(rng.integers(len(g.node)))
        dup = onnx.NodeProto()
        dup.CopyFrom(g.node[i])
        g.node.insert(i + 1, dup)
        return f"{_node_name(model, i)}: duplicated"
    if choice == 1 and g.input:  # an input declared twice
        dup_in = onnx.ValueInfoProto()
        dup_in.CopyFrom(g.input[0])
        g.input.append(dup_in)
        return f"input '{dup_in.name}': declared twice"
    if choice == 2 and g.node and g.input:  # a node writes a graph input's name
        i = int(rng.integers(len(g.node)))
        g.node[i].output[0] = g.input[0].name
        return f"{_node_name(model, i)}: writes input '{g.input[0].name}'"
    if choice == 3:
        del model.opset_import[:]
        if rng.random() < 0.5:
            model.opset_import.add(domain="com.microsoft", version=1)
        return "opset imports removed"
    if choice == 4:
        v = int(_pick(rng, [1, 6, 9, 11, 13, 25, 99]))
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = v
        return f"opset -> {v}"
    if choice == 5 and g.output:
        g.output[0].name = str(_pick(rng, ["ghost", g.input[0].name if g.input else "x", ""]))
        return f"output 0 -> '{g.output[0].name}'"
    if choice == 6 and g.initializer:  # an initializer given twice
        dup_t = TensorProto()
        dup_t.CopyFrom(g.initializer[int(rng.integers(len(g.initializer)))])
        g.initializer.append(dup_t)
        return f"initializer '{dup_t.name}': given twice"
    if g.node:
        i = int(rng.integers(len(g.node)))
        g.node[i].domain = str(_pick(rng, ["com.microsoft", "ai.onnx", "bogus"]))
        return f"{_node_name(model, i)}: domain -> '{g.node[i].domain}'"
    return None


MUTATIONS: dict[str, Mutation] = {
    "swap_op": swap_op,
    "perturb_attr": perturb_attr,
    "relabel_dtype": relabel_dtype,
    "tensor_values": tensor_values,
    "delete_node": delete_node,
    "swap_inputs": swap_inputs,
    "input_dim": input_dim,
    "initializer_dims": initializer_dims,
    "structure": structure,
}
WEIGHTS = {"swap_op": 3, "perturb_attr": 4, "relabel_dtype": 2, "delete_node": 2}
WEIGHTS |= {"tensor_values": 4}
WEIGHTS |= {"swap_inputs": 2, "input_dim": 2, "initializer_dims": 1, "structure": 1}


def mutate(model: onnx.ModelProto, rng: np.random.Generator, count: int) -> list[str]:
    """Apply `count` random mutations (weighted by `WEIGHTS`); returns their descriptions."""
    names = list(MUTATIONS)
    p = np.array([WEIGHTS[n] for n in names], float)
    done: list[str] = []
    for _ in range(count * 4):
        if len(done) == count:
            break
        name = names[int(rng.choice(len(names), p=p / p.sum()))]
        desc = MUTATIONS[name](model, rng)
        if desc is not None:
            done.append(f"{name}: {desc}")
    return done


def corrupt_bytes(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """Bit flips, overwritten runs or a truncation of serialized bytes."""
    buf = bytearray(data)
    choice = int(rng.integers(3))
    if choice == 0:
        flips = int(rng.integers(1, 9))
        for _ in range(flips):
            pos = int(rng.integers(len(buf)))
            buf[pos] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"{flips} bit flips"
    if choice == 1:
        pos = int(rng.integers(len(buf)))
        n = int(rng.integers(1, 17))
        buf[pos : pos + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        return bytes(buf), f"{n} bytes overwritten at {pos}"
    cut = int(rng.integers(len(buf)))
    return bytes(buf[:cut]), f"truncated to {cut} of {len(buf)} bytes"
