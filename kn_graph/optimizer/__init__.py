"""The graph optimizer: `optimize(graph, settings) -> Graph`, a rebuild with named rewrites.

Each rewrite family lives in its own module and registers itself with `@rewrite(flag)`; the
import order below is the order rewrites are tried on each value.
"""

# import order is trial order
# isort: off
from kn_graph.optimizer import fold  # noqa: F401  (first: the patterns below then see constants)
from kn_graph.optimizer import norm  # noqa: F401  (detect_layernorm)
from kn_graph.optimizer import activations  # noqa: F401  (detect_gelu, detect_silu)
from kn_graph.optimizer import attention  # noqa: F401  (registers detect_attention)
from kn_graph.optimizer import qdq  # noqa: F401  (fuse_qdq: before affine folds DQ into convs)
from kn_graph.optimizer import intweights  # noqa: F401  (split_int_weights)
from kn_graph.optimizer import affine  # noqa: F401  (after detection: must not eat patterns)
from kn_graph.optimizer import clamp  # noqa: F401  (fuse_clamp)
from kn_graph.optimizer import pool  # noqa: F401  (max_through_pool)
from kn_graph.optimizer import grouped  # noqa: F401  (group_shared_matmul)

# isort: on
from kn_graph.optimizer.core import REWRITES, OptimizerSettings, Rewriter, optimize, rewrite

__all__ = ["REWRITES", "OptimizerSettings", "Rewriter", "optimize", "rewrite"]
