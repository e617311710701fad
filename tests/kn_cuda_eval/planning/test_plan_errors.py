"""Misuse and limits of the planner and the emulator: wrong argument types and values are typed
errors naming the argument; tensors no plan can address are a PlanError naming the value; an
arena (or a step's scratch) larger than the memory available is refused before allocating; a
plan is validated once before it runs."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, emulate, plan
from kn_cuda_eval.planning import emulator as emu
from kn_cuda_eval.planning import validate as val
from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.errors import ArgumentTypeError, ArgumentValueError, EvaluationError, PlanError
from tests.kn_cuda_eval.helpers import run_fake


def _graph() -> Graph:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
    g.add_output(g.relu(g.mul(x, 2.0)), "y")
    return g


def _stretched(shape: list[int], reduce: bool = False) -> Graph:
    """x [1] broadcast to `shape` plus one: an output (or a sum) of that size from one float."""
    g = Graph()
    x = g.input(Shape.of(1), DType.F32, "x")
    y = g.add(g.broadcast(g.view(x, Shape.of(*[1] * len(shape))), Shape.of(*shape)), 1.0)
    g.set_debug_name(y, "big")
    if reduce:
        g.add_output(g.reduce(y, list(range(len(shape))), ReduceOp.SUM), "s")
    else:
        g.add_output(y, "y")
    return g


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["x", None, 3, object()])
def test_plan_of_something_that_is_no_graph_is_a_type_error(bad: object) -> None:
    with pytest.raises(ArgumentTypeError, match="plan: graph must be a kn_graph Graph"):
        plan(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("batch", "error"),
    [
        ("1", ArgumentTypeError),
        (2.5, ArgumentTypeError),
        (True, ArgumentTypeError),
        (-1, ArgumentValueError),
    ],
)
def test_plan_checks_the_batch_size(batch: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="batch_size"):
        plan(_graph(), batch)  # type: ignore[arg-type]
    builtin = TypeError if error is ArgumentTypeError else ValueError
    with pytest.raises(builtin):  # the builtin convention holds too
        plan(_graph(), batch)  # type: ignore[arg-type]


def test_a_numpy_integer_batch_size_is_fine() -> None:
    assert plan(_graph(), np.int64(2)).inputs[0].shape == (2, 3)


@pytest.mark.parametrize(
    ("bindings", "error", "match"),
    [
        ([("B", 2)], ArgumentTypeError, "bindings must be a mapping"),
        ({"B": "2"}, ArgumentTypeError, r"bindings\['B'\] must be an int"),
        ({"B": 2.0}, ArgumentTypeError, r"bindings\['B'\] must be an int"),
        ({"B": -2}, ArgumentValueError, r"bindings\['B'\] must be >= 0"),
        ({3: 2}, ArgumentTypeError, "symbol names"),
    ],
)
def test_plan_checks_the_bindings(bindings: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        plan(_graph(), bindings=bindings)  # type: ignore[arg-type]


def test_plan_checks_the_settings() -> None:
    with pytest.raises(ArgumentTypeError, match="settings must be a PlanSettings"):
        plan(_graph(), 1, settings={"fuse_elementwise": False})  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match="max_kernel_ops must be >= 1"):
        PlanSettings(max_kernel_ops=0)
    with pytest.raises(ArgumentTypeError, match="fuse_conv must be a bool"):
        PlanSettings(fuse_conv=1)  # type: ignore[arg-type]


# -- sizes no plan can address --------------------------------------------------------------------
def test_a_tensor_beyond_what_a_plan_addresses_is_a_plan_error_naming_it() -> None:
    g = _stretched([2**31, 2**31, 2])  # 2^65 bytes: once an OverflowError in the packer
    with pytest.raises(PlanError, match=r"%\d+ big f32\[2147483648,2147483648,2\]: .* \(32 EiB\)"):
        plan(g)
    with pytest.raises(PlanError, match=r"256 TiB"):
        plan(_stretched([2**24, 2**23, 2]))  # exactly 2^48 bytes


def test_a_huge_input_is_a_plan_error_too() -> None:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 2**40), DType.F64, "x")
    g.add_output(g.relu(x), "y")
    with pytest.raises(PlanError, match=r"%0 x f64\[65536,1099511627776\]"):
        plan(g, 2**16)


def test_a_tib_tensor_plans_and_the_emulator_refuses_it_before_allocating() -> None:
    p = plan(_stretched([2**22, 2**21]))  # 32 TiB: plannable, not emulatable
    p.validate()
    with pytest.raises(EvaluationError, match=r"needs 32,768 GiB for the arena, have [\d.,]+ GiB"):
        emulate(p, [np.ones(1, np.float32)])


def test_the_emulator_checks_the_arena_against_available_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = _stretched([1024, 1024])  # a 4 MiB output
    p = plan(g)
    x = [np.ones(1, np.float32)]
    assert float(emulate(p, x)[0][5, 7]) == 2.0
    monkeypatch.setattr(emu, "available_bytes", lambda: 2**21)
    with pytest.raises(EvaluationError, match=r"needs 0\.00391 GiB for the arena, have 0\.00195"):
        emulate(p, x)


def test_a_step_whose_scratch_exceeds_memory_is_refused_naming_the_step() -> None:
    # a sum over a 1 TiB broadcast: the arena is tiny, the prologue's temporaries are not
    p = plan(_stretched([2**20, 2**18], reduce=True))
    assert p.arena_size < 4096
    with pytest.raises(EvaluationError, match=r"step 0 \(reduce .*\) needs about [\d,]+ GiB of"):
        emulate(p, [np.ones(1, np.float32)])


# -- validation, once ---------------------------------------------------------------------------
def test_emulator_and_executor_validate_each_plan_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = val.validate_plan
    monkeypatch.setattr(val, "validate_plan", lambda p: (calls.append(p), real(p))[1])
    p = plan(_graph(), 2)
    x = np.ones((2, 3), np.float32)
    for _ in range(3):
        emulate(p, [x])
    run_fake(p, [x])
    assert calls == [p]
    q = plan(_graph(), 2)  # another plan: validated on its own
    run_fake(q, [x])
    assert calls == [p, q]
