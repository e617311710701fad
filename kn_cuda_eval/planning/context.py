"""What the planner's visitor modules (`convplan`, `reduceplan`, `attnplan`) use of the planner
(`planner.Planner`): its per-value state and the helpers that make buffers and emit steps. A
protocol, so that they depend on this interface, not on the planner that calls them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.lazy import Lazy
from kn_cuda_eval.planning.settings import PlanSettings
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.ops import Value

__all__ = ["PlannerContext", "State"]

State = StridedView | Lazy
"""A planned value: materialised (a view of the arena) or lazy (an elementwise DAG over views,
not yet computed)."""


class PlannerContext(Protocol):
    """The planner as its visitor modules see it; values are named by their graph index."""

    g: Graph
    s: PlanSettings
    state: list[State | None]
    """Each value's state once planned (None before)."""
    steps: list[st.Step]
    uses: list[int]
    """How many live users each value has."""

    def val(self, i: int) -> Value: ...

    def shape(self, i: int) -> tuple[int, ...]:
        """Value i's shape at this plan's bindings."""
        ...

    def name(self, i: int) -> str:
        """Value i's buffer name (its index and debug name)."""
        ...

    def temp(self, shape: Sequence[int], dtype: DType, name: str) -> StridedView:
        """A new dense temporary buffer."""
        ...

    def expr(self, i: int) -> Lazy:
        """Value i as a lazy expression (a view is a one-load expression)."""
        ...

    def mat(self, i: int) -> StridedView:
        """Value i as a view of memory, materialising a lazy value (once)."""
        ...

    def dense(self, view: StridedView, name: str) -> StridedView:
        """A row-major contiguous view of the same values (a Copy step when needed)."""
        ...

    def materialize(self, e: st.Expr, name: str, dest: StridedView | None = None) -> StridedView:
        """Compute an expression into `dest` (default: a new dense buffer)."""
        ...

    def settle(self, i: int, e: Lazy) -> None:
        """Make `e` value i's state: kept lazy, or materialised when fusing would recompute it."""
        ...

    def row_input(self, i: int) -> st.Expr:
        """A row kernel's input: value i, its lazy producer fused in when cheap enough."""
        ...

    def row_step(
        self,
        e: st.Expr,
        out: StridedView,
        axes: list[int],
        make: Callable[[st.Expr, StridedView], st.Step],
        keep_out: bool = True,
    ) -> None:
        """Emit the row step `make` over `axes` of `e` into `out`."""
        ...

    def gemm(self, a: StridedView, b: StridedView, out: StridedView, alpha: float) -> None:
        """Emit out [b,m,n] = alpha · a [b,m,k] @ b [b,k,n]."""
        ...
