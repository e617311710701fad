"""The graph optimizer: `optimize(graph, settings) -> Graph`, a rebuild with named rewrites.

Each rewrite family lives in its own module and registers itself with `@rewrite(flag)`; the
import order below is the order rewrites are tried on each value.
"""

from kn_graph.optimizer import attention  # noqa: F401  (registers detect_attention)
from kn_graph.optimizer.core import REWRITES, OptimizerSettings, Rewriter, optimize, rewrite

__all__ = ["REWRITES", "OptimizerSettings", "Rewriter", "optimize", "rewrite"]
