"""The `Dynamic` kind "recurrence": one direction of an ONNX RNN / GRU / LSTM layer over all its
time steps, in a NumPy loop of one small matmul and a few in-place element ops per step.

Unrolling puts every step into the graph (prepare time grows with the length) and a scan over a
one-step body graph costs milliseconds of Python per step; this loop costs microseconds, as
onnxruntime's kernel does. The loader (`kn_graph.onnx.handlers.rnn`) computes the input
projection of every step with one matmul outside; this kind adds the recurrent part. Gate
layouts and formulas are those of `kn_graph.onnx.handlers.rnn_cells` (ONNX: GRU z, r, h; LSTM
i, o, f, c), which builds the same step from graph ops for short unrolled sequences.

Arguments, in order (the optional ones as `Recurrence` says they are present):
xw [T, B, G·H] (input projection plus its bias), R [G·H, H], Rb [G·H], h0 [B, H], c0 [B, H]
(LSTM), P [3H] (LSTM peepholes: i, o, f), running [T, B, 1] (bool: a row whose sequence ended
keeps its state and outputs zeros). Results: Y [T, B, H] in time order, h_T, (LSTM) c_T.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.special

from kn_graph.errors import EvaluationError

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "Operands",
    "Recurrence",
    "operands",
    "run_recurrence",
]

ACTIVATIONS = (
    "Relu",
    "Tanh",
    "Sigmoid",
    "Softsign",
    "Softplus",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
)
"""The activation functions of the ONNX recurrent ops, as `Activation.name` spells them."""

Array = np.ndarray


@dataclass(frozen=True, slots=True)
class Activation:
    """An activation function of the recurrent ops (one of `ACTIVATIONS`), with its alpha and
    beta. `apply` computes it in NumPy; `rnn_cells.activate` builds the same formula from graph
    ops (keep the two alike)."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def apply(self, x: Array) -> Array:
        """The activation of `x`, computed in place (x is a step's own scratch buffer)."""
        a, b = self.alpha, self.beta
        match self.name:
            case "Relu":
                np.maximum(x, 0.0, out=x)
            case "Tanh":
                np.tanh(x, out=x)
            case "Sigmoid":
                scipy.special.expit(x, out=x)
            case "Softsign":  # x / (1 + |x|)
                np.divide(x, np.abs(x) + 1.0, out=x)
            case "Softplus":
                np.logaddexp(0.0, x, out=x)
            case "Affine":  # a·x + b
                x *= a
                x += b
            case "LeakyRelu":  # x >= 0 ? x : a·x
                np.multiply(x, a, out=x, where=~(x >= 0.0))
            case "ThresholdedRelu":  # x > a ? x : 0
                np.copyto(x, 0.0, where=~(x > a))
            case "ScaledTanh":  # a·tanh(b·x)
                x *= b
                np.tanh(x, out=x)
                x *= a
            case "HardSigmoid":  # clamp(a·x + b, 0, 1)
                x *= a
                x += b
                _clamp(x, 0.0, 1.0)
            case "Elu":  # x > 0 ? x : a·(exp(x) - 1)
                neg = np.exp(np.minimum(x, 0.0))  # the positive side is not used: no overflow
                neg -= 1.0
                neg *= a
                np.copyto(x, neg, where=~(x > 0.0))
            case _:
                raise EvaluationError(
                    f"recurrence: unknown activation '{self.name}' (known: {', '.join(ACTIVATIONS)})"
                )
        return x


def _clamp(x: Array, lo: float, hi: float) -> None:
    """min then max, in place (as the graph's clamp)."""
    np.minimum(x, hi, out=x)
    np.maximum(x, lo, out=x)


@dataclass(frozen=True, slots=True, repr=False)
class Recurrence:
    """One direction of a recurrent layer: the cell and which optional arguments it has (the
    op's params; hashable, as a Dynamic op is a memo key)."""

    kind: str  # RNN, GRU or LSTM
    hidden: int
    acts: tuple[Activation, ...]  # RNN: f; GRU: f, g; LSTM: f, g, h
    clip: float | None
    linear_before_reset: bool  # GRU
    input_forget: bool  # LSTM
    has_bias: bool  # Rb is an argument
    has_peepholes: bool  # P is an argument (LSTM)
    masked: bool  # running is an argument
    reverse: bool  # steps run last to first

    def __repr__(self) -> str:
        """Short, for graph printouts: `GRU(H=64, reverse, ...)`."""
        acts = ",".join(a.name for a in self.acts)
        flags = [
            f"H={self.hidden}",
            acts,
            *([f"clip={self.clip:g}"] if self.clip is not None else []),
            *(["linear_before_reset"] if self.linear_before_reset else []),
            *(["input_forget"] if self.input_forget else []),
            *(["bias"] if self.has_bias else []),
            *(["peepholes"] if self.has_peepholes else []),
            *(["masked"] if self.masked else []),
            *(["reverse"] if self.reverse else []),
        ]
        return f"{self.kind}({', '.join(flags)})"

    @property
    def gates(self) -> int:
        return {"RNN": 1, "GRU": 3, "LSTM": 4}[self.kind]


@dataclass(frozen=True, slots=True)
class _Args:
    """The arguments in the compute dtype, the recurrent bias folded into xw where the formula
    allows (everywhere but a GRU's candidate gate with linear_before_reset)."""

    xw: Array  # [T, B, G·H]
    rt: Array  # [H, G·H]: R transposed, for h @ rt
    rb_h: Array | None  # [H]: GRU linear_before_reset's candidate bias
    h0: Array
    c0: Array | None
    p: Array | None
    running: Array | None


@dataclass(frozen=True, slots=True)
class Operands:
    """The op's arguments by name, as given (see the module docstring); `extra`: how many more
    there were than `Recurrence` says (a malformed op)."""

    xw: Array
    r: Array
    rb: Array | None
    h0: Array
    c0: Array | None
    p: Array | None
    running: Array | None
    extra: int


def operands(spec: Recurrence, xs: Sequence[Array]) -> Operands:
    """`xs` split into the arguments `spec` says the op has, in order."""
    it = iter(xs)
    try:
        xw, r = next(it), next(it)
        rb = next(it) if spec.has_bias else None
        h0 = next(it)
        c0 = next(it) if spec.kind == "LSTM" else None
        p = next(it) if spec.has_peepholes else None
        running = next(it) if spec.masked else None
    except StopIteration:
        raise EvaluationError(f"recurrence {spec!r}: {len(xs)} arguments, too few") from None
    return Operands(xw, r, rb, h0, c0, p, running, sum(1 for _ in it))


def _unpack(spec: Recurrence, xs: list[Array]) -> _Args:
    o = operands(spec, xs)
    xw, r, rb, h0, c0, p, running = o.xw, o.r, o.rb, o.h0, o.c0, o.p, o.running
    n, gh = spec.hidden, spec.gates * spec.hidden
    if o.extra or xw.ndim != 3 or xw.shape[2] != gh or r.shape != (gh, n) or h0.shape[-1:] != (n,):
        raise EvaluationError(
            f"recurrence {spec!r}: arguments {[list(a.shape) for a in (xw, r, h0)]} (+{o.extra} "
            f"extra) do not fit xw [T, B, {gh}], R [{gh}, {n}], h0 [B, {n}]"
        )
    ct = np.dtype(np.float32) if xw.dtype.itemsize < 4 else xw.dtype  # f16 math in f32
    xw = xw.astype(ct)  # a copy: the bias is added in place
    rb_h = None
    if rb is not None:
        rb = rb.astype(ct, copy=False)
        if spec.kind == "GRU" and spec.linear_before_reset:
            xw[..., : 2 * n] += rb[: 2 * n]
            rb_h = rb[2 * n :]
        else:
            xw += rb

    def own(a: Array | None) -> Array | None:
        return None if a is None else np.array(a, dtype=ct)  # a copy: the loop writes states

    h, c = own(h0), own(c0)
    assert h is not None
    pa = None if p is None else p.astype(ct, copy=False)
    rt = np.ascontiguousarray(r.astype(ct, copy=False).T)
    run = None if running is None else running.astype(bool, copy=False)
    return _Args(xw, rt, rb_h, h, c, pa, run)


def _order(spec: Recurrence, steps: int) -> range:
    return range(steps - 1, -1, -1) if spec.reverse else range(steps)


def _clip(spec: Recurrence, x: Array) -> Array:
    if spec.clip is not None:
        _clamp(x, -spec.clip, spec.clip)
    return x


def _out(y: Array, scratch: Array, running: Array | None, t: int) -> Array:
    """Where step t writes its new hidden state: straight into Y[t] when every row runs (no
    copy), else a scratch buffer that `_keep` merges."""
    return scratch if running is not None else y[t]


def _keep(y: Array, h: Array, new: Array, running: Array | None, t: int) -> Array:
    """The hidden state after step t (`new`, from `_out`). A row not running keeps its h and
    outputs zeros (Y is zero-filled)."""
    if running is None:
        return new  # Y[t] itself
    np.copyto(h, new, where=running[t])
    np.copyto(y[t], new, where=running[t])
    return h


def _rnn(spec: Recurrence, a: _Args, y: Array) -> tuple[Array, None]:
    (f,) = spec.acts
    h, scratch = a.h0, np.empty_like(a.h0)
    for t in _order(spec, a.xw.shape[0]):
        new = _out(y, scratch, a.running, t)
        np.dot(h, a.rt, out=new)
        new += a.xw[t]
        f.apply(_clip(spec, new))
        h = _keep(y, h, new, a.running, t)
    return h, None


def _gru(spec: Recurrence, a: _Args, y: Array) -> tuple[Array, None]:
    """h' = ĥ + z·(h - ĥ) (= (1 - z)·ĥ + z·h) with z, r = f(x_zr + h·R_zrᵀ) and
    ĥ = g(x_h + (r·h)·R_hᵀ), or with linear_before_reset ĥ = g(x_h + r·(h·R_hᵀ + Rb_h))."""
    f, g = spec.acts
    n = spec.hidden
    h = a.h0
    lbr = spec.linear_before_reset
    rec = np.empty((h.shape[0], (3 if lbr else 2) * n), h.dtype)  # h·Rᵀ (z, r[, h] gates)
    rt_first = a.rt if lbr else np.ascontiguousarray(a.rt[:, : 2 * n])
    rt_h = np.ascontiguousarray(a.rt[:, 2 * n :])
    zr, z, r = rec[:, : 2 * n], rec[:, :n], rec[:, n : 2 * n]
    x_zr, x_h = a.xw[..., : 2 * n], a.xw[..., 2 * n :]
    cand, tmp, scratch = np.empty_like(h), np.empty_like(h), np.empty_like(h)
    for t in _order(spec, a.xw.shape[0]):
        np.dot(h, rt_first, out=rec)
        zr += x_zr[t]
        f.apply(_clip(spec, zr))
        if lbr:
            np.copyto(cand, rec[:, 2 * n :])
            if a.rb_h is not None:
                cand += a.rb_h
            cand *= r
        else:
            np.multiply(r, h, out=tmp)
            np.dot(tmp, rt_h, out=cand)
        cand += x_h[t]
        g.apply(_clip(spec, cand))
        new = _out(y, scratch, a.running, t)
        np.subtract(h, cand, out=new)
        new *= z
        new += cand
        h = _keep(y, h, new, a.running, t)
    return h, None


def _lstm(spec: Recurrence, a: _Args, y: Array) -> tuple[Array, Array]:
    """c' = f·c + i·g(x_c + h·R_cᵀ), h' = o·h(c') with i, f (peeking at c) and o (at c') from
    f(x + h·Rᵀ); with input_forget, f = 1 - i."""
    f, g, act_h = spec.acts
    n = spec.hidden
    h, c = a.h0, a.c0
    assert c is not None  # _unpack gives every LSTM a cell state
    gates = np.empty((h.shape[0], 4 * n), h.dtype)
    i, o, fg, cc = (gates[:, k * n : (k + 1) * n] for k in range(4))
    pi, po, pf = (None, None, None) if a.p is None else (a.p[k * n : (k + 1) * n] for k in range(3))
    tmp, c_new, scratch = np.empty_like(h), np.empty_like(h), np.empty_like(h)

    def gate(x: Array, weight: Array | None, state: Array) -> None:
        if weight is not None:
            np.multiply(weight, state, out=tmp)
            x += tmp
        f.apply(_clip(spec, x))

    together = a.p is None and not spec.input_forget  # i, o, f in one call
    iof = gates[:, : 3 * n]
    for t in _order(spec, a.xw.shape[0]):
        np.dot(h, a.rt, out=gates)
        gates += a.xw[t]
        if together:
            f.apply(_clip(spec, iof))
        else:
            gate(i, pi, c)
            if spec.input_forget:
                np.subtract(1.0, i, out=fg)
            else:
                gate(fg, pf, c)
        g.apply(_clip(spec, cc))
        np.multiply(fg, c, out=c_new)
        np.multiply(i, cc, out=tmp)
        c_new += tmp
        if not together:
            gate(o, po, c_new)
        new = _out(y, scratch, a.running, t)
        np.copyto(new, c_new)
        act_h.apply(new)
        new *= o
        if a.running is None:
            c, c_new = c_new, c  # c_new's buffer is free again
        else:
            np.copyto(c, c_new, where=a.running[t])
        h = _keep(y, h, new, a.running, t)
    return h, c


def run_recurrence(spec: Recurrence, xs: list[Array]) -> list[Array]:
    """The `Dynamic` kind's results from its arguments: Y, h_T (and c_T) in the dtype of xw."""
    a = _unpack(spec, xs)
    dt = xs[0].dtype
    y = np.zeros((a.xw.shape[0], *a.h0.shape), a.xw.dtype)
    h: Array
    c: Array | None
    match spec.kind:
        case "RNN":
            h, c = _rnn(spec, a, y)
        case "GRU":
            h, c = _gru(spec, a, y)
        case "LSTM":
            h, c = _lstm(spec, a, y)
        case _:
            raise EvaluationError(f"recurrence: unknown cell kind '{spec.kind}'")
    states = [h] if c is None else [h, c]  # h may be a view of Y: astype copies
    return [y.astype(dt, copy=False), *(v.astype(dt) for v in states)]
