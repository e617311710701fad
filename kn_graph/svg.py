"""`kn-svg`: draw any graph with Graphviz — one box per value (index, op, key attributes, shape),
colored by op family, edges operand → user — to see what the loader and the optimizer made.

    kn-svg model.onnx out.svg --optimize --hide-const --batch 4
    kn-svg model.onnx out.dot            # the dot source; needs no Graphviz

`graph_to_dot` is pure (a string); only `render_svg` needs Graphviz's `dot` program.

>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> x = g.input(Shape.of(2, 3), DType.F32, "x")
>>> g.add_output(g.exp(x), "y")
>>> print(graph_to_dot(g).splitlines()[5])
  v0 [label="%0 input #0\\nf32[2,3]\\n\\"x\\"", fillcolor="#9ecae1"];
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import assert_never

from kn_graph._cli import CliError, OneLineParser, load_npy, parse_int, writable_path
from kn_graph.errors import KnError
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import (
    Attention,
    Binary,
    BlockQuantMatMul,
    Broadcast,
    Concat,
    Constant,
    Conv,
    Dynamic,
    Gather,
    Input,
    IntConv,
    IntMatMul,
    Iota,
    Layernorm,
    MatMul,
    Op,
    Permute,
    Reduce,
    Select,
    Slice,
    Softmax,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.shape import BATCH, Shape, Size

__all__ = ["FAMILY_COLORS", "GraphvizNotFoundError", "family", "graph_to_dot", "main", "render_svg"]

FAMILY_COLORS: dict[str, str] = {
    "input": "#9ecae1",
    "constant": "#d9d9d9",
    "view / shape": "#fff2cc",
    "elementwise": "#c7e9c0",
    "matmul / conv": "#fdae6b",
    "reduce / norm": "#dadaeb",
    "attention": "#fb6a4a",
    "dynamic": "#fdd0a2",
}
"""Fill color of each op family, in legend order."""


class GraphvizNotFoundError(KnError):
    """Rendering SVG needs Graphviz's `dot` program, which is not installed."""


def family(op: Op) -> str:
    """The op family a box is colored by (a key of FAMILY_COLORS)."""
    match op:
        case Input():
            return "input"
        case Constant():
            return "constant"
        case View() | Broadcast() | Permute() | Slice() | Gather() | Concat() | Iota():
            return "view / shape"
        case Unary() | Binary() | Select():
            return "elementwise"
        case MatMul() | Conv() | IntMatMul() | IntConv() | BlockQuantMatMul():
            return "matmul / conv"
        case Reduce() | Softmax() | Layernorm():
            return "reduce / norm"
        case Attention():
            return "attention"
        case Dynamic():
            return "dynamic"
        case _:
            assert_never(op)  # type: ignore[arg-type]


def _op_name(info: ValueInfo) -> str:
    """The op as `print(graph)` names it (add, reduce_sum, cast_f16, ...)."""
    op = info.op
    match op:
        case Unary(_, u):
            return f"{u.value}_{info.dtype}" if u in (UnaryOp.CAST, UnaryOp.BITCAST) else u.value
        case Binary(_, _, bop):
            return bop.value
        case Reduce(_, _, rop):
            return f"reduce_{rop.value}"
        case _:
            return op.NAME


def _bind_size(d: Size, bindings: Mapping[str, int]) -> Size:
    """Substitute the bound symbols, keep the others (2*B*seq with B=4 is 8*seq)."""
    return d.subs(bindings)


def _fmt_shape(shape: Shape, bindings: Mapping[str, int]) -> str:
    if not bindings:
        return str(shape)
    return str(Shape(tuple(_bind_size(d, bindings) for d in shape)))


def _quote(text: str) -> str:
    """A dot string literal; backslashes are escaped so names never become dot escapes."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _legend() -> str:
    rows = "".join(
        f'<tr><td bgcolor="{color}">{name}</td></tr>' for name, color in FAMILY_COLORS.items()
    )
    return (
        '  legend [shape=plaintext, style="", label=<<table border="0" cellborder="1" '
        f'cellspacing="0" cellpadding="4"><tr><td><b>op family</b></td></tr>{rows}</table>>];'
    )


_BIG = 300
"""Visible values above which the layout is bounded (see graph_to_dot)."""


def graph_to_dot(
    graph: Graph,
    *,
    hide_const: bool = False,
    show_names: bool = False,
    bindings: Mapping[str, int] | None = None,
) -> str:
    """The graph in Graphviz's dot language: node `v<index>` per value, edges operand → user,
    outputs drawn with a double border, and a legend of the op-family colors.

    `hide_const` leaves out constants and the views/broadcasts/permutes of them (the scalar
    broadcasts that every `x + 1` carries), so the computation stands out; `show_names` adds each
    value's debug name (inputs always show theirs); `bindings` ({"B": 4}) substitutes symbols in
    the displayed shapes."""
    bindings = bindings or {}
    outputs: dict[int, list[str]] = {}
    for v, name in zip(graph.outputs, graph.output_names, strict=True):
        outputs.setdefault(v.index, []).append(name)
    hidden = [False] * len(graph)
    root: dict[int, int] = {}  # hidden value -> the constant it shows
    lines = [
        "digraph kyanite {",
        "  rankdir=TB;",
        '  graph [fontname="Helvetica", ranksep=0.3, nodesep=0.25];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [color="#555555", arrowsize=0.6];',
    ]
    for v in graph.values():  # index order is topological order: operands are decided first
        info = graph[v]
        op = info.op
        if hide_const and v.index not in outputs:
            shaped_const = isinstance(op, View | Broadcast | Permute | Slice) and all(
                hidden[x.index] for x in op.inputs
            )
            hidden[v.index] = isinstance(op, Constant) or shaped_const
            if hidden[v.index]:
                root[v.index] = v.index if isinstance(op, Constant) else root[op.inputs[0].index]
        if hidden[v.index]:
            continue
        head = f"{v} {_op_name(info)}"
        attrs = op.attrs()
        text = [f"{head} {attrs}" if attrs and len(head) + len(attrs) < 40 else head]
        if attrs and len(text[0]) == len(head):
            text.append(attrs)
        text.append(f"{info.dtype}{_fmt_shape(info.shape, bindings)}")
        consts = [x for x in op.inputs if hidden[x.index]]
        for x in consts[:2]:  # what --hide-const left out: the constant's value or its shape
            c = graph[Value(root[x.index], graph.id)]
            data = graph.const_value(Value(root[x.index], graph.id))
            shown = (
                f"{data.reshape(-1)[0].item()!r}"
                if data is not None and data.size == 1
                else f"{c.dtype}{c.shape}"
            )
            text.append(f"+ const {shown}")
        if len(consts) > 2:
            text.append(f"+ {len(consts) - 2} more const")
        if info.debug_name and (show_names or isinstance(op, Input)):
            text.append(f'"{info.debug_name}"')
        extra = ""
        if v.index in outputs:
            text.append("→ " + ", ".join(outputs[v.index]))
            extra = ", peripheries=2, penwidth=1.5"
        color = FAMILY_COLORS[family(op)]
        lines.append(
            f'  v{v.index} [label={_quote(chr(10).join(text))}, fillcolor="{color}"{extra}];'
        )
        for x in op.inputs:
            if not hidden[x.index]:
                lines.append(f"  v{x.index} -> v{v.index};")
    if sum(not h for h in hidden) > _BIG:
        # dot's crossing minimisation and network simplex grow much faster than linearly; on a
        # UNet-sized graph the defaults take minutes, these limits a few seconds
        lines.insert(3, "  graph [mclimit=0.1, nslimit=2, nslimit1=2];")
    lines.append(_legend())
    lines.append("}")
    return "\n".join(lines) + "\n"


_INSTALL_HINT = (
    "rendering SVG needs the `dot` program of Graphviz, which was not found on PATH; install it "
    "with `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or your "
    "system's package manager — or write the dot source instead (an output file ending in .dot)"
)


def render_svg(dot_source: str, *, timeout: float = 300.0) -> str:
    """SVG text from dot source, by running Graphviz's `dot -Tsvg`."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizNotFoundError(_INSTALL_HINT)
    try:
        done = subprocess.run(
            [exe, "-Tsvg"],
            input=dot_source,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise KnError(
            f"dot did not finish in {timeout:g} s (graph too large? try --hide-const)"
        ) from None
    if done.returncode != 0:
        raise KnError(f"dot failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(
        prog="kn-svg", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model", help="ONNX model")
    ap.add_argument("out", help="output file: .svg (needs Graphviz) or .dot")
    ap.add_argument("--optimize", action="store_true", help="draw the optimized graph")
    ap.add_argument("--hide-const", action="store_true", help="leave out constants and their views")
    ap.add_argument("--show-names", action="store_true", help="show every value's debug name")
    ap.add_argument("--batch", default=None, metavar="N", help=f"show shapes with {BATCH}=N")
    ap.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input's value: needed for inputs that decide shapes (Reshape targets, Resize "
        "sizes, ...); other inputs' shapes are used where a size cannot stay symbolic",
    )
    args = ap.parse_args(argv)
    try:
        from kn_graph.onnx import ValueSpecializedModel, load_onnx

        out = writable_path(args.out, "output")
        if out.suffix not in (".svg", ".dot"):
            raise CliError(f"output: '{args.out}' must end in .svg or .dot")
        batch = None if args.batch is None else parse_int(args.batch, "--batch", 0, 2**31 - 1)
        values = {}
        for item in args.input:
            name, sep, file = item.partition("=")
            if not sep or not name:
                raise CliError(f"--input must look like NAME=FILE.npy, found '{item}'")
            values[name] = load_npy(file, f"--input {name}")
        loaded = load_onnx(args.model)
        if isinstance(loaded, ValueSpecializedModel):
            missing = [n for n in loaded.value_inputs if n not in values]
            if missing:
                raise KnError(
                    f"the model's shapes depend on the values of inputs {missing}: give them "
                    "with --input NAME=FILE.npy"
                )
            loaded = loaded.specialize(values)
        graph = loaded
        if args.optimize:
            from kn_graph.optimizer import optimize

            graph = optimize(graph)
        bindings = {BATCH: batch} if batch is not None else None
        src = graph_to_dot(
            graph, hide_const=args.hide_const, show_names=args.show_names, bindings=bindings
        )
        try:
            out.write_text(src if out.suffix == ".dot" else render_svg(src))
        except OSError as e:
            raise CliError(f"output: cannot write '{out}': {e.strerror or e}") from None
    except KnError as e:
        print(f"kn-svg: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"kn-svg: wrote {out} ({len(graph)} values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
