"""kn_runtime — run a graph on the best available device.

>>> import numpy as np
>>> from kn_graph import Graph, DType, Shape, Size
>>> g = Graph()
>>> x = g.input(Shape.of(Size.sym("B"), 2), DType.F32, "x")
>>> g.add_output(g.relu(x), "y")
>>> Device.best().prepare(g).eval([np.array([[-1.0, 2.0]], np.float32)])[0]
array([[0., 2.]], dtype=float32)
"""

from kn_runtime.device import Device
from kn_runtime.generate import Generator, load_generator
from kn_runtime.prepared import PreparedGraph

__all__ = ["Device", "Generator", "PreparedGraph", "load_generator"]
