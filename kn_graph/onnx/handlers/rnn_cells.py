"""One time step of the ONNX recurrent cells (RNN, GRU, LSTM) and their activation functions,
built from graph ops. Gate layouts follow the ONNX spec: GRU z, r, h; LSTM i, o, f, c."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kn_graph.graph import Graph
from kn_graph.onnx.context import NodeContext
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.recurrence import ACTIVATIONS, Activation

__all__ = ["Cell", "activate", "gru_cell", "lstm_cell", "read_activations", "rnn_cell"]

_ALPHA = {
    "Affine": 1.0,
    "LeakyRelu": 0.01,
    "ThresholdedRelu": 1.0,
    "ScaledTanh": 1.0,
    "HardSigmoid": 0.2,
    "Elu": 1.0,
}
_BETA = {"Affine": 0.0, "ScaledTanh": 1.0, "HardSigmoid": 0.5}
_PLAIN = tuple(a for a in ACTIVATIONS if a not in _ALPHA)


def activate(g: Graph, act: Activation, x: Value) -> Value:
    """`act` of `x` from graph ops (the formulas of `Activation.apply`, which runs the
    "recurrence" kind in NumPy: keep the two alike)."""
    a, b = act.alpha, act.beta
    match act.name:
        case "Relu":
            return g.relu(x)
        case "Tanh":
            return g.unary(UnaryOp.TANH, x)
        case "Sigmoid":
            return g.unary(UnaryOp.SIGMOID, x)
        case "Softsign":
            return g.div(x, g.add(g.unary(UnaryOp.ABS, x), 1.0))
        case "Softplus":
            return g.unary(UnaryOp.SOFTPLUS, x)
        case "Affine":
            return g.add(g.mul(x, a), b)
        case "LeakyRelu":
            return g.select(g.binary(BinaryOp.GE, x, 0.0), x, g.mul(x, a))
        case "ThresholdedRelu":
            return g.select(g.binary(BinaryOp.GT, x, a), x, 0.0)
        case "ScaledTanh":
            return g.mul(g.unary(UnaryOp.TANH, g.mul(x, b)), a)
        case "HardSigmoid":
            return g.clamp(g.add(g.mul(x, a), b), 0.0, 1.0)
        case "Elu":
            return g.select(g.binary(BinaryOp.GT, x, 0.0), x, g.mul(g.sub(g.exp(x), 1.0), a))
        case _:
            raise AssertionError(act.name)


def read_activations(
    ctx: NodeContext, defaults: Sequence[str], directions: int
) -> list[Activation]:
    """`activations` (one per function and direction), consuming activation_alpha / _beta in order
    by the functions that take them (as onnxruntime does)."""
    names = ctx.attr_strings("activations", list(defaults) * directions) or []
    if len(names) != len(defaults) * directions:
        ctx.unsupported(
            f"{len(names)} activations for {directions} direction(s), expected {len(defaults) * directions}"
        )
    alphas = list(ctx.attr_floats("activation_alpha", []) or [])
    betas = list(ctx.attr_floats("activation_beta", []) or [])
    out = []
    for name in names:
        canon = next((k for k in (*_PLAIN, *_ALPHA) if k.lower() == name.lower()), None)
        if canon is None:
            ctx.unsupported(f"activation '{name}'")
        alpha = (alphas.pop(0) if alphas else _ALPHA[canon]) if canon in _ALPHA else 0.0
        beta = (betas.pop(0) if betas else _BETA[canon]) if canon in _BETA else 0.0
        out.append(Activation(canon, alpha, beta))
    return out


def _clip(g: Graph, x: Value, clip: float | None) -> Value:
    return x if clip is None else g.clamp(x, -clip, clip)


def _recurrent(g: Graph, h: Value, r: Value, rb: Value | None) -> Value:
    """h @ rᵀ (+ rb): the recurrent projection of the previous hidden state."""
    y = g.matmul_nd(h, g.transpose(r))
    return y if rb is None else g.add(y, rb)


def _part(g: Graph, v: Value, i: int, n: int) -> Value:
    """The i-th of the gate blocks of size n along the last axis."""
    return g.slice(v, -1, i * n, (i + 1) * n)


def rnn_cell(
    g: Graph,
    xw: Value,
    h: Value,
    r: Value,
    rb: Value | None,
    acts: list[Activation],
    clip: float | None,
) -> Value:
    return activate(g, acts[0], _clip(g, g.add(xw, _recurrent(g, h, r, rb)), clip))


def gru_cell(
    g: Graph,
    xw: Value,
    h: Value,
    r: Value,
    rb: Value | None,
    acts: list[Activation],
    clip: float | None,
    linear_before_reset: bool,
) -> Value:
    n = g.shape(h)[-1].as_int()
    f, act = acts
    r_zr, r_h = g.slice(r, 0, 0, 2 * n), g.slice(r, 0, 2 * n, 3 * n)
    rb_zr = None if rb is None else g.slice(rb, 0, 0, 2 * n)
    rb_h = None if rb is None else g.slice(rb, 0, 2 * n, 3 * n)
    zr = g.add(g.slice(xw, -1, 0, 2 * n), _recurrent(g, h, r_zr, rb_zr))
    z = activate(g, f, _clip(g, _part(g, zr, 0, n), clip))
    reset = activate(g, f, _clip(g, _part(g, zr, 1, n), clip))
    xh = _part(g, xw, 2, n)
    if linear_before_reset:
        pre = g.add(xh, g.mul(reset, _recurrent(g, h, r_h, rb_h)))
    else:
        pre = g.add(xh, _recurrent(g, g.mul(reset, h), r_h, rb_h))
    cand = activate(g, act, _clip(g, pre, clip))
    return g.add(g.mul(g.sub(1.0, z), cand), g.mul(z, h))


def lstm_cell(
    g: Graph,
    xw: Value,
    h: Value,
    c: Value,
    r: Value,
    rb: Value | None,
    p: Value | None,
    acts: list[Activation],
    clip: float | None,
    input_forget: bool,
) -> tuple[Value, Value]:
    n = g.shape(h)[-1].as_int()
    f, act_g, act_h = acts
    gates = g.add(xw, _recurrent(g, h, r, rb))
    pi = po = pf = None
    if p is not None:
        pi, po, pf = (g.slice(p, 0, k * n, (k + 1) * n) for k in range(3))

    def peep(x: Value, weight: Value | None, state: Value) -> Value:
        return x if weight is None else g.add(x, g.mul(weight, state))

    i = activate(g, f, _clip(g, peep(_part(g, gates, 0, n), pi, c), clip))
    if input_forget:
        forget = g.sub(g.full(1.0, g.shape(i), g.dtype(i)), i)
    else:
        forget = activate(g, f, _clip(g, peep(_part(g, gates, 2, n), pf, c), clip))
    cand = activate(g, act_g, _clip(g, _part(g, gates, 3, n), clip))
    c_new = g.add(g.mul(forget, c), g.mul(i, cand))
    o = activate(g, f, _clip(g, peep(_part(g, gates, 1, n), po, c_new), clip))
    return g.mul(o, activate(g, act_h, c_new)), c_new


@dataclass(frozen=True, slots=True)
class Cell:
    """One direction's step function: the kind, its recurrent weights and options (values of
    the node's graph)."""

    kind: str  # RNN, GRU or LSTM
    r: Value  # [G·H, H]
    rb: Value | None  # [G·H]
    p: Value | None  # [3H] (LSTM peepholes)
    acts: list[Activation]
    clip: float | None
    linear_before_reset: bool  # GRU
    input_forget: bool  # LSTM

    def __call__(
        self, g: Graph, xw: Value, h: Value, c: Value | None
    ) -> tuple[Value, Value | None]:
        """The next hidden state and (LSTM) cell state from one step's input projection."""
        match self.kind:
            case "RNN":
                return rnn_cell(g, xw, h, self.r, self.rb, self.acts, self.clip), None
            case "GRU":
                lbr = self.linear_before_reset
                return gru_cell(g, xw, h, self.r, self.rb, self.acts, self.clip, lbr), None
            case "LSTM":
                assert c is not None  # _directions gives every LSTM direction a cell state
                return lstm_cell(
                    g, xw, h, c, self.r, self.rb, self.p, self.acts, self.clip, self.input_forget
                )
            case _:
                raise AssertionError(self.kind)
