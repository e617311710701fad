"""Control flow: If, Loop and Scan.

- If with a condition known at load time (exports guard shape cases with it): the taken branch
  is inlined, the other never imported. With a data condition: a `Dynamic` "if" over both
  branches loaded as graphs of their own; only the taken one runs.
- Loop with a trip count known at load time, small, and a condition that stays true: unrolled.
  Otherwise a `Dynamic` "loop" over the body graph (trip count and/or condition, loop-carried
  values, scan outputs; the iteration count is a run-time size).
- Scan over a fixed, small length: unrolled; otherwise a `Dynamic` "scan" (the length is the
  scan axis' size, symbolic or not).

Subgraphs see the values of enclosing scopes (captures: extra inputs of the body graph). A
loop-carried value whose shape changes from one iteration to the next (a growing sequence) is
loaded with fresh symbols on the axes that change; its final size is a run-time symbol.
"""

from __future__ import annotations

import numpy as np
import onnx

from kn_graph.dtype import DType
from kn_graph.errors import (
    StaticInputRequiredError,
    SymbolicSizeError,
    UnknownOperatorError,
    UnsupportedOnnxError,
)
from kn_graph.graph import Graph
from kn_graph.onnx.context import Known, NodeContext, Result, Seq, onnx_dtype, onnx_op
from kn_graph.onnx.handlers.dynamic import results
from kn_graph.ops import Input, Value
from kn_graph.shape import Guard, Shape, Size

MAX_UNROLL_STEPS = 64
"""Loops and scans of at most this many steps (known at load time) are unrolled..."""
MAX_UNROLL_NODES = 4096
"""...when steps * body nodes stays within this; longer ones run as a Dynamic op."""
MAX_SETTING_ELEMENTS = 16
"""An If whose branches give different ranks is specialized on the value of the input its
condition comes from only when that input is setting-like: integer or bool, at most this many
elements (Silero VAD's sample rate); never on data."""


# -- If -------------------------------------------------------------------------------------------
def _known_condition(ctx: NodeContext, i: int) -> bool | None:
    """Input i (a condition) when known at load time, else None."""
    k = ctx.input_known(i)
    if k is None:
        arr = ctx.graph.const_value(ctx.input(i))
        if arr is None:
            return None
        k = Known(arr, ctx.input_dtype(i))
    if k.data.size != 1:
        ctx.unsupported(f"the condition must have one element, found shape {list(k.shape)}")
    if k.is_symbolic:
        return None  # a condition on sizes: decided per binding, like data
    return bool(k.data.reshape(-1)[0])


def _condition_by_value(ctx: NodeContext, why: str) -> bool:
    """The condition's value when branches cannot share one graph (`why`): a constant, or a
    setting-like graph input (an integer or bool of a few elements: a sample rate, a mode) it
    is computed from, on whose value the model is then specialized (StaticInputRequiredError
    reaches `load_onnx`). A condition on data would mean one graph per input: refused."""
    try:
        return bool(ctx.input_static(0, f"the condition ({why})").reshape(-1)[0])
    except StaticInputRequiredError as e:
        g = ctx.graph
        source = next((g[v] for v in g.inputs if g[v].debug_name == e.input_name), None)
        setting = (
            source is not None
            and not source.dtype.is_float
            and source.shape.is_fixed
            and source.shape.size().as_int() <= MAX_SETTING_ELEMENTS
        )
        if not setting:
            ctx.unsupported(f"{why}, and the condition is computed from data ('{e.input_name}')")
        raise


def _free(d: Size, local: set[str]) -> bool:
    """Whether size `d` of a subgraph is expressible in the enclosing graph's symbols."""
    return not (d.symbols & local)


@onnx_op("If")
def if_(ctx: NodeContext) -> list[Result]:
    then_branch, else_branch = ctx.attr_graph("then_branch"), ctx.attr_graph("else_branch")
    if then_branch is None or else_branch is None:
        ctx.unsupported("a branch is missing")
    n = len(ctx.node.output)
    for label, b in (("then", then_branch), ("else", else_branch)):
        if len(b.output) != n:
            ctx.unsupported(f"the {label} branch has {len(b.output)} outputs, the node {n}")
        if b.input:
            ctx.unsupported(f"the {label} branch has inputs")
    taken = _known_condition(ctx, 0)
    if taken is not None:
        return ctx.loader.inline_graph(then_branch if taken else else_branch, ctx)
    g = ctx.graph
    cond = ctx.input(0)
    if g[cond].shape.size() != Size(1):
        ctx.unsupported(f"the condition must have one element, found {g[cond].shape}")
    on_sizes = not _reads_inputs(g, cond)
    loaded = [_load_branch(ctx, b) for b in (then_branch, else_branch)]
    if isinstance(loaded[0], UnsupportedOnnxError) and isinstance(loaded[1], UnsupportedOnnxError):
        raise loaded[0]
    failed = [isinstance(b, UnsupportedOnnxError) for b in loaded]
    good = next(b for b in loaded if not isinstance(b, UnsupportedOnnxError))
    (then_g, then_caps), (else_g, else_caps) = (
        (_failing_branch(g, good[0], b, label), []) if isinstance(b, UnsupportedOnnxError) else b
        for b, label in zip(loaded, ("then", "else"), strict=True)
    )
    local = set(then_g.runtime_symbols | else_g.runtime_symbols)
    shapes, dtypes = [], []
    for j, (a, b) in enumerate(zip(then_g.outputs, else_g.outputs, strict=True)):
        sa, sb = then_g[a].shape, else_g[b].shape
        sa, sb = (sb if failed[0] else sa), (sa if failed[1] else sb)  # the one that loaded
        if then_g[a].dtype != else_g[b].dtype:
            ctx.unsupported(
                f"output {j}: the branches give {then_g[a].dtype} and {else_g[b].dtype}"
            )
        if sa.rank != sb.rank and on_sizes:  # one branch per binding: specialize on shapes
            ctx.needs_fixed_sizes(f"output {j}: the branches give ranks {sa.rank} and {sb.rank}")
        if sa.rank != sb.rank:  # no one graph holds both: the condition's value picks one
            taken = _condition_by_value(
                ctx, f"output {j}: the branches give ranks {sa.rank} and {sb.rank}"
            )
            return ctx.loader.inline_graph(then_branch if taken else else_branch, ctx)
        dims = [
            x if x == y and _free(x, local) else g.fresh_symbol("if")
            for x, y in zip(sa.dims, sb.dims, strict=True)
        ]
        shapes.append(Shape(tuple(dims)))
        dtypes.append(then_g[a].dtype)
    outs = g.dynamic(
        "if",
        [cond, *then_caps, *else_caps],
        (then_g, else_g, len(then_caps)),
        shapes,
        dtypes,
    )
    return results(ctx, outs)


def _reads_inputs(g: Graph, v: Value) -> bool:
    """Whether `v` is computed from the data of an input of `g` (a condition on sizes alone,
    Equal(Shape(x)[2], 1), reads none: the IR computes sizes from the symbols)."""
    stack, seen = [v], {v}
    while stack:
        op = g[stack.pop()].op
        if isinstance(op, Input):
            return True
        for u in op.inputs:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _load_branch(
    ctx: NodeContext, sub: onnx.GraphProto
) -> tuple[Graph, list[Value]] | UnsupportedOnnxError:
    """A branch of a data-conditioned If as a graph (and its captures), or why it cannot be
    loaded for these shapes. What a specialization could fix (fixed sizes, known input values)
    is raised, so that the loader specializes; so is an operator we have no handler for (the
    model fails at load, as in onnxruntime, whichever branch runs)."""
    try:
        return ctx.loader.subgraph(sub, [], ctx)
    except (SymbolicSizeError, StaticInputRequiredError, UnknownOperatorError):
        raise
    except UnsupportedOnnxError as e:
        return e


def _failing_branch(g: Graph, like: Graph, error: UnsupportedOnnxError, label: str) -> Graph:
    """A branch that cannot be built for these input shapes (silero VAD v5's 8 kHz branch fed
    16 kHz frames: its LSTM would get a rank-5 input) as a graph that fails when it runs, as in
    onnxruntime, which only ever runs the taken branch: a guard that no binding satisfies,
    naming the error, and outputs shaped like the other branch's (never computed)."""
    body = Graph()
    body.share_fresh_names(g)
    what = f"the {label} branch cannot run for these input shapes ({error})"
    body.guards.append(Guard(Size(0), "==", Size(1), g.where, what))
    for v in like.outputs:
        dims = [d if d.is_fixed else Size(0) for d in like[v].shape.dims]
        body.add_output(body.full(0, Shape(tuple(dims)), like[v].dtype))
    return body


# -- shared by Loop and Scan ------------------------------------------------------------------------
def _declared(vi: onnx.ValueInfoProto, ctx: NodeContext) -> tuple[Shape, DType]:
    """A fixed-size formal input of a body (iteration number, condition) as declared."""
    tt = vi.type.tensor_type
    dt = onnx_dtype(tt.elem_type, f"subgraph input '{vi.name}'") if tt.elem_type else DType.I64
    dims = [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else []
    if any(d != 1 for d in dims):
        ctx.unsupported(f"subgraph input '{vi.name}' must have one element, declared {dims}")
    return Shape.of(*dims), dt


def _stable_body(
    ctx: NodeContext,
    sub: onnx.GraphProto,
    before: list[tuple[str, Shape, DType]],
    state: list[tuple[str, Shape, DType]],
    after: list[tuple[str, Shape, DType]],
    first_state_output: int,
) -> tuple[Graph, list[Value], set[str], list[set[int]]]:
    """The body loaded as a graph whose state inputs (loop-carried values) keep their shapes
    from one step to the next: first with the initial shapes; where an output differs, again
    with fresh symbols on those axes. Returns (body, captures, body-local symbols, the changing
    axes of each state value)."""
    g = ctx.graph
    changing: list[set[int]] = [set() for _ in state]
    local: set[str] = set()
    for _attempt in range(2):
        formals = list(before)
        for (name, shape, dt), axes in zip(state, changing, strict=True):
            dims = list(shape.dims)
            for a in axes:
                dims[a] = g.fresh_symbol(f"{ctx.op_type.lower()}_state")
                local |= dims[a].symbols
            formals.append((name, Shape(tuple(dims)), dt))
        formals += after
        body, caps = ctx.loader.subgraph(sub, formals, ctx)
        grew = False
        for j, (_, _, dt) in enumerate(state):
            v_in = body.inputs[len(before) + j]
            v_out = body.outputs[first_state_output + j]
            si, so = body[v_in].shape, body[v_out].shape
            if body[v_out].dtype != dt:
                ctx.unsupported(f"state {j}: the body returns {body[v_out].dtype}, takes {dt}")
            if si.rank != so.rank:
                ctx.unsupported(f"state {j}: the body changes its rank ({si} -> {so})")
            for a, (x, y) in enumerate(zip(si.dims, so.dims, strict=True)):
                if x != y and a not in changing[j]:
                    changing[j].add(a)
                    grew = True
        if not grew:
            return body, caps, local | set(body.runtime_symbols), changing
    ctx.unsupported("the body's state shapes do not settle")


def _outer_shape(g: Graph, shape: Shape, local: set[str], hint: str) -> Shape:
    return Shape(tuple(d if _free(d, local) else g.fresh_symbol(hint) for d in shape.dims))


def _tensor(ctx: NodeContext, r: Result, what: str) -> Value:
    if isinstance(r, Seq):
        ctx.unsupported(f"{what} is a sequence")
    return ctx.loader.as_value(r)


def _stack(ctx: NodeContext, parts: list[Result], axis: int, what: str) -> Value:
    g = ctx.graph
    vals = [_tensor(ctx, p, what) for p in parts]
    return g.concat([g.view(v, g[v].shape.insert(axis, 1)) for v in vals], axis)


def _small_enough(steps: int, sub: onnx.GraphProto) -> bool:
    return 0 < steps <= MAX_UNROLL_STEPS and steps * max(1, len(sub.node)) <= MAX_UNROLL_NODES


# -- Loop -------------------------------------------------------------------------------------------
def _stays_true(sub: onnx.GraphProto) -> bool:
    """The body's condition output is its condition input (passed through or an Identity of
    it) or a constant true: unrolling needs no condition checks."""
    cond_in, cond_out = sub.input[1].name, sub.output[0].name
    if cond_in == cond_out:
        return True
    for node in sub.node:
        if cond_out in node.output:
            if node.op_type == "Identity" and node.input[0] == cond_in:
                return True
            if node.op_type == "Constant" and node.attribute:
                t = node.attribute[0]
                if t.type == onnx.AttributeProto.TENSOR:
                    arr = onnx.numpy_helper.to_array(t.t)
                    return arr.size == 1 and bool(arr.reshape(-1)[0])
            return False
    return False


@onnx_op("Loop")
def loop(ctx: NodeContext) -> list[Result]:
    sub = ctx.attr_graph("body")
    if sub is None or len(sub.input) < 2 or not sub.output:
        ctx.unsupported(
            "the body must take (iteration, condition, state...) and return a condition"
        )
    n_state = len(sub.input) - 2
    n_scan = len(sub.output) - 1 - n_state
    if n_scan < 0 or ctx.num_inputs - 2 != n_state:
        ctx.unsupported(
            f"{ctx.num_inputs - 2} initial values, {n_state} body state inputs, "
            f"{len(sub.output) - 1} body outputs"
        )
    m_known = ctx.input_known(0) if ctx.has_input(0) else None
    trip = None
    if m_known is not None and not m_known.is_symbolic:
        trip = int(m_known.data.reshape(-1)[0])
    cond_known = _known_condition(ctx, 1) if ctx.has_input(1) else True
    if cond_known is False:  # the body never runs
        if n_scan:
            ctx.unsupported("a loop that never runs, with scan outputs")
        return [ctx.raw_input(2 + j) for j in range(n_state)]
    init = [ctx.raw_input(2 + j) for j in range(n_state)]
    if trip is not None and cond_known is True and _stays_true(sub) and _small_enough(trip, sub):
        return _unrolled_loop(ctx, sub, trip, init, n_state)
    appended = _appended_sequences(sub, init)
    if appended:
        return _loop_with_appends(ctx, sub, init, n_state, n_scan, m_known, cond_known, appended)
    return _dynamic_loop(ctx, sub, init, n_state, n_scan, m_known, cond_known)


def _appended_sequences(sub: onnx.GraphProto, init: list[Result]) -> dict[int, onnx.NodeProto]:
    """Loop-carried sequences that start empty and only grow by one SequenceInsert at the end
    per iteration (TorchScript's list.append): state index -> that node. Each is a scan output
    in disguise."""
    out: dict[int, onnx.NodeProto] = {}
    for j, r in enumerate(init):
        if not (isinstance(r, Seq) and not r.items and r.stacked is None):
            continue
        name_in, name_out = sub.input[2 + j].name, sub.output[1 + j].name
        makers = [n for n in sub.node if name_out in n.output]
        users = [n for n in sub.node if name_in in n.input]
        if (
            len(makers) == 1
            and makers[0].op_type == "SequenceInsert"
            and list(makers[0].input[:1]) == [name_in]
            and (len(makers[0].input) < 3 or not makers[0].input[2])
            and users == makers
            and sum(o.name == name_out for o in sub.output) == 1
        ):
            out[j] = makers[0]
    return out


def _loop_with_appends(
    ctx: NodeContext,
    sub: onnx.GraphProto,
    init: list[Result],
    n_state: int,
    n_scan: int,
    m_known: Known | None,
    cond_known: bool | None,
    appended: dict[int, onnx.NodeProto],
) -> list[Result]:
    """The loop with each appended sequence turned into a scan output of the appended tensor;
    the sequence after the loop is that stack (`Seq.stacked`)."""
    body = onnx.GraphProto()
    body.CopyFrom(sub)
    keep = [j for j in range(n_state) if j not in appended]
    del body.input[:]
    body.input.extend([sub.input[0], sub.input[1], *(sub.input[2 + j] for j in keep)])
    del body.output[:]
    body.output.extend([sub.output[0], *(sub.output[1 + j] for j in keep)])
    body.output.extend(sub.output[1 + n_state :])
    for maker in appended.values():
        body.output.append(onnx.ValueInfoProto(name=maker.input[1]))
    drop = {id(n) for n in appended.values()}
    nodes = [n for n in sub.node if id(n) not in drop]
    del body.node[:]
    body.node.extend(nodes)
    outs = _dynamic_loop(
        ctx, body, [init[j] for j in keep], len(keep), n_scan + len(appended), m_known, cond_known
    )
    finals = dict(zip(keep, outs[: len(keep)], strict=True))
    stacks = outs[len(keep) :]
    scans, extra = stacks[:n_scan], stacks[n_scan:]
    for (j, _), stack in zip(appended.items(), extra, strict=True):
        v = _tensor(ctx, stack, f"appended sequence {j}")
        finals[j] = Seq((), ctx.graph[v].dtype, stacked=v)
    return [finals[j] for j in range(n_state)] + list(scans)


def _unrolled_loop(
    ctx: NodeContext, sub: onnx.GraphProto, trip: int, init: list[Result], n_state: int
) -> list[Result]:
    it_shape, _ = _declared(sub.input[0], ctx)
    cond_shape, _ = _declared(sub.input[1], ctx)
    state = list(init)
    scans: list[list[Result]] = []
    for i in range(trip):
        bound: dict[str, Result] = {
            sub.input[0].name: Known(np.full(it_shape.fixed_dims(), i, np.int64), DType.I64),
            sub.input[1].name: Known(np.full(cond_shape.fixed_dims(), True), DType.BOOL),
        }
        bound.update({vi.name: r for vi, r in zip(sub.input[2:], state, strict=True)})
        outs = ctx.loader.inline_graph(sub, ctx, bound)
        state = outs[1 : 1 + n_state]
        scans.append(outs[1 + n_state :])
    stacked = [
        _stack(ctx, [s[j] for s in scans], 0, f"scan output {j}") for j in range(len(scans[0]))
    ]
    return [*state, *stacked]


def _dynamic_loop(
    ctx: NodeContext,
    sub: onnx.GraphProto,
    init: list[Result],
    n_state: int,
    n_scan: int,
    m_known: Known | None,
    cond_known: bool | None,
) -> list[Result]:
    g = ctx.graph
    init_v = [_tensor(ctx, r, f"loop-carried value {j}") for j, r in enumerate(init)]
    it_shape, _ = _declared(sub.input[0], ctx)
    cond_shape, _ = _declared(sub.input[1], ctx)
    fixed = [
        (sub.input[0].name, it_shape, DType.I64),
        (sub.input[1].name, cond_shape, DType.BOOL),
    ]
    state = [(vi.name, g[v].shape, g[v].dtype) for vi, v in zip(sub.input[2:], init_v, strict=True)]
    body, caps, local, changing = _stable_body(ctx, sub, fixed, state, [], 1)
    args: list[Value] = []
    has_m = ctx.has_input(0)
    if has_m:
        m = ctx.input(0)
        args.append(g.view(g.cast(m, DType.I64) if g[m].dtype != DType.I64 else m, [1]))
    has_cond = ctx.has_input(1)
    if has_cond:
        c = ctx.input(1)
        args.append(g.view(g.cast(c, DType.BOOL) if g[c].dtype != DType.BOOL else c, [1]))
    args += init_v + caps
    shapes: list[Shape] = []
    for (_, shape, _), axes in zip(state, changing, strict=True):
        shapes.append(
            Shape(tuple(g.fresh_symbol("loop") if a in axes else d for a, d in enumerate(shape)))
        )
    if m_known is not None and cond_known is True and _stays_true(sub):
        iters = m_known.sizes()[0]  # the trip count, known (maybe symbolic) at load time
    else:
        iters = g.fresh_symbol("loop_iterations")
    for j in range(n_scan):
        out = body.outputs[1 + n_state + j]
        shapes.append(_outer_shape(g, body[out].shape, local, "loop").insert(0, iters))
    dtypes = [t for _, _, t in state] + [
        body[body.outputs[1 + n_state + j]].dtype for j in range(n_scan)
    ]
    outs = g.dynamic("loop", args, (body, has_m, has_cond, n_state, n_scan), shapes, dtypes)
    return results(ctx, outs)


# -- Scan -------------------------------------------------------------------------------------------
@onnx_op("Scan")
def scan(ctx: NodeContext) -> list[Result]:
    g = ctx.graph
    if ctx.opset < 9:
        ctx.unsupported("Scan-8 (batched, with sequence_lens) is not supported; use opset 9+")
    sub = ctx.attr_graph("body")
    n_in = ctx.attr_int("num_scan_inputs")
    n_state = ctx.num_inputs - n_in
    if sub is None or n_state < 0 or len(sub.input) != ctx.num_inputs:
        ctx.unsupported(
            f"the body takes {len(sub.input) if sub else 0} inputs, the node gives {ctx.num_inputs}"
        )
    n_out = len(sub.output) - n_state
    if n_out < 0:
        ctx.unsupported(f"the body returns {len(sub.output)} values for {n_state} states")
    xs = [ctx.input(n_state + j) for j in range(n_in)]
    for j, x in enumerate(xs):
        if g[x].rank == 0:  # ctx.axis takes axis 0 of a scalar (as Concat and Gather may)
            ctx.unsupported(f"scan input {j} is a scalar: it has no axis to scan")
    in_axes_raw = ctx.attr_ints("scan_input_axes", [0] * n_in) or []
    in_rev = [bool(d) for d in ctx.attr_ints("scan_input_directions", [0] * n_in) or []]
    out_axes_raw = ctx.attr_ints("scan_output_axes", [0] * n_out) or []
    out_rev = [bool(d) for d in ctx.attr_ints("scan_output_directions", [0] * n_out) or []]
    if (
        len(in_axes_raw) != n_in
        or len(in_rev) != n_in
        or len(out_axes_raw) != n_out
        or len(out_rev) != n_out
    ):
        ctx.unsupported("scan axes/directions do not match the scan inputs and outputs")
    in_axes = [ctx.axis(a, g[x].rank) for a, x in zip(in_axes_raw, xs, strict=True)]
    if not xs:
        ctx.unsupported("a Scan without scan inputs")
    length = g[xs[0]].shape[in_axes[0]]
    for x, a in zip(xs[1:], in_axes[1:], strict=True):
        length = g.guard_equal(length, g[x].shape[a], "Scan: the scan inputs' lengths")
    init = [ctx.raw_input(j) for j in range(n_state)]
    slices = [g[x].shape.remove(a) for x, a in zip(xs, in_axes, strict=True)]
    steps = length.fixed_value()
    if steps is not None and _small_enough(steps, sub):
        state = list(init)
        per_step: list[list[Result]] = []
        for t in range(steps):
            bound = {vi.name: r for vi, r in zip(sub.input[:n_state], state, strict=True)}
            for vi, x, a, r, sh in zip(
                sub.input[n_state:], xs, in_axes, in_rev, slices, strict=True
            ):
                bound[vi.name] = g.view(g.slice_raw(x, a, steps - 1 - t if r else t, 1, 1), sh)
            outs = ctx.loader.inline_graph(sub, ctx, bound)
            state = outs[:n_state]
            per_step.append(outs[n_state:])
        stacked = []
        for j in range(n_out):
            parts = [p[j] for p in per_step]
            if out_rev[j]:
                parts = parts[::-1]
            rank = len(parts[0].shape) if isinstance(parts[0], Known) else None
            r = rank if rank is not None else g[_tensor(ctx, parts[0], "scan output")].rank
            stacked.append(_stack(ctx, parts, ctx.axis(out_axes_raw[j], r + 1), "scan output"))
        return [*state, *stacked]
    init_v = [_tensor(ctx, r, f"state {j}") for j, r in enumerate(init)]
    fixed = [
        (vi.name, sh, g[x].dtype) for vi, sh, x in zip(sub.input[n_state:], slices, xs, strict=True)
    ]
    state_f = [
        (vi.name, g[v].shape, g[v].dtype) for vi, v in zip(sub.input[:n_state], init_v, strict=True)
    ]
    body, caps, local, changing = _stable_body(ctx, sub, [], state_f, fixed, 0)
    shapes: list[Shape] = []
    for (_, shape, _), axes in zip(state_f, changing, strict=True):
        shapes.append(
            Shape(tuple(g.fresh_symbol("scan") if a in axes else d for a, d in enumerate(shape)))
        )
    out_axes = []
    for j in range(n_out):
        out = body.outputs[n_state + j]
        ax = ctx.axis(out_axes_raw[j], body[out].rank + 1)
        out_axes.append(ax)
        shapes.append(_outer_shape(g, body[out].shape, local, "scan").insert(ax, length))
    dtypes = [t for _, _, t in state_f] + [
        body[body.outputs[n_state + j]].dtype for j in range(n_out)
    ]
    params = (body, n_state, n_in, tuple(in_axes), tuple(in_rev), tuple(out_axes), tuple(out_rev))
    outs = g.dynamic("scan", [*init_v, *xs, *caps], params, shapes, dtypes)
    return results(ctx, outs)
