"""Regenerate docs/resnet_block.svg: a ResNet-18 downsampling BasicBlock (conv-BN-ReLU, conv-BN,
1x1 projection shortcut, add, ReLU) built with the graph builders, optimized (batchnorm folded
into the convolutions), drawn by kn-svg's graph_to_dot.

    python docs/make_resnet_block.py        # needs Graphviz's dot
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kn_graph import DType, Graph, Shape, Size, Value
from kn_graph.optimizer import optimize
from kn_graph.svg import graph_to_dot, render_svg


def basic_block(g: Graph, x: Value, c_in: int, c_out: int, rng: np.random.Generator) -> Value:
    def conv_bn(y: Value, c: int, k: int, stride: int) -> Value:
        w = g.constant((rng.standard_normal((c_out, c, k, k)) * 0.1).astype(np.float32))
        y = g.conv(y, w, stride=[stride, stride], padding=[k // 2, k // 2])
        scale = g.constant(rng.uniform(0.5, 1.5, (c_out, 1, 1)).astype(np.float32))
        shift = g.constant(rng.standard_normal((c_out, 1, 1)).astype(np.float32))
        return g.add(g.mul(y, scale), shift)  # inference batchnorm, as exporters leave it

    y = g.relu(conv_bn(x, c_in, 3, 2))
    y = conv_bn(y, c_out, 3, 1)
    return g.relu(g.add(y, conv_bn(x, c_in, 1, 2)))


def main() -> None:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 8, 16, 16), DType.F32, "x")
    g.add_output(basic_block(g, x, 8, 16, np.random.default_rng(0)), "y")
    out = Path(__file__).with_name("resnet_block.svg")
    out.write_text(render_svg(graph_to_dot(optimize(g), hide_const=True)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
