"""kn-svg and graph_to_dot: the dot text (pure), the rendered SVG of every fixture (parsed, one
node per value), the CLI options, and the clear error when Graphviz is missing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import kn_graph.ops as ops_module
from kn_graph import DType, Graph, KnError, Shape, Size
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.ops import Op
from kn_graph.svg import (
    FAMILY_COLORS,
    GraphvizNotFoundError,
    family,
    graph_to_dot,
    main,
    render_svg,
)
from tests.paths import MODELS

FIXTURES = [f["file"] for f in json.loads((MODELS / "manifest.json").read_text())["fixtures"]]
SVG = "{http://www.w3.org/2000/svg}"
B = Size.sym("B")

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")


def svg_value_nodes(svg: str) -> list[str]:
    """The titles (v<index>) of the value boxes in a Graphviz SVG (one <g class="node"> each)."""
    root = ET.fromstring(svg)
    titles = [
        g.findtext(f"{SVG}title") or "" for g in root.iter(f"{SVG}g") if g.get("class") == "node"
    ]
    return [t for t in titles if re.fullmatch(r"v\d+", t)]


def node_lines(dot: str) -> dict[int, str]:
    return {
        int(m.group(1)): line for line in dot.splitlines() if (m := re.match(r"\s*v(\d+) \[", line))
    }


def edges(dot: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"^\s*v(\d+) -> v(\d+);", dot, re.M)]


def small_graph() -> Graph:
    g = Graph()
    x = g.input(Shape.of(B, 3, 8, 8), DType.F32, "image")
    w = g.constant(np.ones((4, 3, 3, 3), np.float32))
    y = g.relu(g.add(g.conv(x, w, padding=[1, 1]), 1.0))
    g.set_debug_name(y, "features")
    q = g.view(y, Shape.of(B, 4, 64))
    g.add_output(g.attention(q, q, q, scale=0.5), "out")
    return g


# -- graph_to_dot ---------------------------------------------------------------------------------
def test_one_node_per_value_and_one_edge_per_operand():
    g = small_graph()
    dot = graph_to_dot(g)
    assert sorted(node_lines(dot)) == list(range(len(g)))
    want = sorted((x.index, v.index) for v in g.values() for x in g[v].op.inputs)
    assert sorted(edges(dot)) == want


def test_labels_show_index_op_attributes_and_shape():
    g = small_graph()
    lines = node_lines(graph_to_dot(g))
    conv = next(i for i in lines if "conv" in lines[i])
    assert f"%{conv} conv s=1 p=1" in lines[conv] and "f32[B,4,8,8]" in lines[conv]
    att = next(i for i in lines if "attention" in lines[i])
    assert "scale=0.5" in lines[att] and "→ out" in lines[att] and "peripheries=2" in lines[att]
    assert '\\"image\\"' in lines[0]  # inputs always show their name


@pytest.mark.parametrize(
    ("needle", "fam"),
    [
        ("input", "input"),
        ("const", "constant"),
        ("conv", "matmul / conv"),
        ("max", "elementwise"),
        ("attention", "attention"),
        ("view", "view / shape"),
    ],
)
def test_colors_by_op_family(needle, fam):
    lines = node_lines(graph_to_dot(small_graph()))
    hit = [line for line in lines.values() if re.search(rf"%\d+ {needle}\b", line)]
    assert hit and all(f'fillcolor="{FAMILY_COLORS[fam]}"' in line for line in hit)


def test_every_op_class_has_a_family():
    classes = [
        c
        for c in vars(ops_module).values()
        if isinstance(c, type) and issubclass(c, Op) and c is not Op
    ]
    assert len(classes) >= 17
    for c in classes:
        inst = object.__new__(c)  # family() only looks at the class
        assert family(inst) in FAMILY_COLORS


def test_legend_lists_every_family():
    dot = graph_to_dot(small_graph())
    legend = next(line for line in dot.splitlines() if line.strip().startswith("legend"))
    for name, color in FAMILY_COLORS.items():
        assert f'bgcolor="{color}">{name}<' in legend


def test_hide_const_drops_constants_and_their_views_but_keeps_outputs():
    g = small_graph()
    full, hidden = node_lines(graph_to_dot(g)), node_lines(graph_to_dot(g, hide_const=True))
    consts = {i for i, line in full.items() if re.search(r"%\d+ const\b", line)}
    assert consts and not consts & set(hidden)
    add = next(line for line in hidden.values() if re.search(r"%\d+ add", line))
    assert "+ const 1.0" in add  # what was left out: a scalar by its value...
    conv = next(line for line in hidden.values() if re.search(r"%\d+ conv", line))
    assert "+ const f32[4,3,3,3]" in conv  # ...anything else by its shape
    assert all(a in hidden and b in hidden for a, b in edges(graph_to_dot(g, hide_const=True)))


def test_show_names_and_batch_binding():
    g = small_graph()
    assert '\\"features\\"' not in graph_to_dot(g)
    assert '\\"features\\"' in graph_to_dot(g, show_names=True)
    bound = graph_to_dot(g, bindings={"B": 4})
    assert "f32[4,4,8,8]" in bound and "[B," not in bound


def test_names_with_quotes_and_backslashes_are_escaped():
    g = Graph()
    x = g.input(Shape.of(2), DType.F32, 'we"ird\\name\\N')
    g.add_output(g.neg(x), 'o"ut')
    dot = graph_to_dot(g, show_names=True)
    assert '\\"we\\"ird\\\\name\\\\N\\"' in dot
    if shutil.which("dot"):
        assert svg_value_nodes(render_svg(dot)) == ["v0", "v1"]


# -- rendering ------------------------------------------------------------------------------------------
@needs_dot
@pytest.mark.parametrize("fixture", FIXTURES)
def test_kn_svg_renders_every_fixture(fixture, tmp_path, capsys):
    out = tmp_path / "g.svg"
    graph = load_onnx(MODELS / fixture)
    extra = []
    if isinstance(graph, ValueSpecializedModel):  # shapes from input values: give them
        with capsys.disabled():
            assert main([str(MODELS / fixture), str(out)]) == 2
        data = np.load(MODELS / fixture.replace(".onnx", ".npz"))
        values = {n: data[f"in0:{n}"] for n in graph.input_names}
        for n in graph.input_names:  # the others give shapes where sizes need pinning
            np.save(tmp_path / f"{n}.npy", values[n])
            extra += ["--input", f"{n}={tmp_path / (n + '.npy')}"]
        graph = graph.specialize(values)
    assert main([str(MODELS / fixture), str(out), *extra]) == 0, capsys.readouterr().err
    nodes = svg_value_nodes(out.read_text())
    assert sorted(nodes, key=lambda t: int(t[1:])) == [f"v{i}" for i in range(len(graph))]


@needs_dot
def test_kn_svg_options(tmp_path):
    out = tmp_path / "bert.svg"
    model = str(MODELS / "bert_ts.onnx")
    assert (
        main([model, str(out), "--optimize", "--hide-const", "--batch", "3", "--show-names"]) == 0
    )
    svg = out.read_text()
    assert "attention" in svg and "[3,seq" in svg and "[B," not in svg
    assert len(svg_value_nodes(svg)) > 20


def test_dot_output_needs_no_graphviz(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "g.dot"
    assert main([str(MODELS / "resnet18_ts.onnx"), str(out)]) == 0
    assert out.read_text().startswith("digraph kyanite {")


def test_missing_dot_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no `dot`
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz") as e:
        render_svg(graph_to_dot(small_graph()))
    assert isinstance(e.value, KnError)
    out = tmp_path / "g.svg"
    assert main([str(MODELS / "resnet18_ts.onnx"), str(out)]) == 2
    err = capsys.readouterr().err
    assert "kn-svg: error:" in err and "apt-get install graphviz" in err and ".dot" in err
    assert not out.exists()


def test_bad_model_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main([str(bad), str(tmp_path / "g.svg")]) == 2
    assert "kn-svg: error:" in capsys.readouterr().err


@needs_dot
def test_console_entry_point_runs(tmp_path):
    out = tmp_path / "r.svg"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kn_graph.svg",
            str(MODELS / "resnet18_ts.onnx"),
            str(out),
            "--hide-const",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and out.read_text().lstrip().startswith("<?xml")
