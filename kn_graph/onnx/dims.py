"""How an input's declared dims become sizes: a `dim_param` that is an expression of names
(`past_sequence_length + 1`, `32*h32`, as exporters write them) is parsed into a `Size`; a dim
without a name gets one made from its input and axis."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from kn_graph.errors import GraphError
from kn_graph.shape import Size

__all__ = ["parse_size_expr", "unnamed_dim"]


def unnamed_dim(input_name: str, axis: int) -> str:
    """The symbol name of a dim the model leaves unnamed (no name, "?" or -1)."""
    base = re.sub(r"\W", "_", input_name) or "input"
    return f"{base}_{axis}"


_EXPR_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Constant, ast.Load)
_EXPR_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd)


def parse_size_expr(text: str, symbol: Callable[[str], Size]) -> Size | None:
    """`past + 1`, `2*seq`, `(h+1)//2` as a Size; None unless the text is such an expression
    with at least one operator (plain names stay opaque symbols)."""
    if not any(c in text for c in "+-*/%"):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    for n in ast.walk(tree):
        if isinstance(n, ast.operator | ast.unaryop):
            if not isinstance(n, _EXPR_OPS):
                return None
        elif not isinstance(n, _EXPR_NODES):
            return None
        if isinstance(n, ast.Constant) and (type(n.value) is not int):
            return None

    def ev(n: ast.AST) -> Size:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return Size(int(n.value))
        if isinstance(n, ast.Name):
            return symbol(n.id)
        if isinstance(n, ast.UnaryOp):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else v
        assert isinstance(n, ast.BinOp)
        a, b = ev(n.left), ev(n.right)
        match n.op:
            case ast.Add():
                return a + b
            case ast.Sub():
                return a - b
            case ast.Mult():
                return a * b
            case ast.FloorDiv():
                return a // b
            case _:
                return a % b

    try:
        return ev(tree)
    except GraphError:
        return None
