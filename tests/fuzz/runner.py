"""Run fuzz cases: build one from (seed, index), load it with `load_onnx`, evaluate what loads on
small inputs (some with edge values: INT_MIN, -1, 0, max, NaN, ±Inf) through the reference
executor `Device.cpu(reference=True)` and through the product `Device.cpu()` (the plan as C and
oneDNN), compare the two (`compare.difference`) and classify the outcome. Cases run in forked
worker processes (memory-limited) so that a hang is killed after a time limit and a crash is
seen as a dead worker instead of killing the run."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from kn_graph.errors import EvaluationError, KnError, ShapeMismatchError
from kn_graph.graph import Graph
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.onnx.context import onnx_dtype
from kn_graph.shape import Shape, Size, infer_symbols
from kn_runtime import Device
from tests.fuzz.cases import Case, args_case, eval_misuse, file_case
from tests.fuzz.compare import difference, graph_tolerance, localize, with_edge_values
from tests.fuzz.mutate import corrupt_bytes, mutate

__all__ = [
    "CORPORA",
    "FAILURES",
    "FIXTURES",
    "Outcome",
    "backend_models",
    "build_case",
    "run_case",
    "run_cases",
]

MODELS = Path(__file__).resolve().parent.parent / "models"
FIXTURES = sorted(MODELS.glob("*.onnx"), key=lambda p: p.stat().st_size)
"""The committed fixtures, smallest first."""

MEMORY_LIMIT = 4 << 30
"""Address space of a worker: a load or evaluation that needs more fails with MemoryError
(an internal error) instead of exhausting the machine."""

VALUE_LIMIT = 64 << 20
"""Evaluation is skipped (outcome "skipped") when an input or computed value would be larger:
the fuzzer looks for wrong behaviour, not for slow arithmetic on huge tensors."""

EDGE_CASES = 0.3
"""The fraction of cases whose inputs mix in edge values (`compare.with_edge_values`)."""

EDGE_FRACTIONS = (0.05, 0.25, 1.0)
"""How much of each input such a case replaces (one picked per case)."""

THREADS = 1
"""Intra-op threads of the product `Device.cpu(threads=...)` in the fuzzer: the workers share
the machine (`python -m tests.fuzz --threads N` sets it before the workers fork; they never
meet an OpenMP pool of their parent's)."""

FAILURES = ("internal", "hang", "crash", "disagree")
"""The outcome kinds that fail a run."""


@dataclass
class Outcome:
    """How one case ended. `kind`:
    - ran: both executors ran and agree; skipped: inputs or values over VALUE_LIMIT;
    - KnError: the reference raised one of our errors (`detail`: its class) and so did the
      product;
    - lenient: the reference raised one of our errors but the product returned outputs;
    - refused: the reference ran but the product refused the work for memory (its KnError);
    - disagree: the product's outputs differ from the reference's, or it raised a KnError
      where the reference ran (`detail` says which output, the error and the values, and the
      first value of the graph that differs: `compare.localize`);
    - round-off: the outputs differ, but only as the two executors' rounding amplified by an
      op whose operands agree (a division by a near-zero, an argmax of near-ties, a float ->
      int cast ...: `compare.localize`); floats are compared at the tolerance of the least
      precise float type in the graph (`compare.graph_tolerance`);
    - internal: an exception that is not a KnError (from either executor, `detail`: the
      traceback); hang: over the time limit; crash: the worker died.
    The kinds in FAILURES fail a run."""

    index: int
    kind: str
    detail: str
    description: list[str]
    seconds: float = 0.0

    @property
    def label(self) -> str:
        if self.kind in ("KnError", "lenient", "refused"):
            return f"{self.kind} {self.detail.splitlines()[0][:60]}"
        return self.kind


CORPORA = ("fixtures", "backend", "all")
"""Where the models to mutate come from: the committed fixtures, the ONNX backend node tests that
pass (one op each, with valid inputs: every handler gets fuzzed), or both (half each)."""

Source = tuple[str, bytes, dict[str, np.ndarray]]
"""A model to mutate: its name, its bytes and valid inputs by name."""

_fixture_cache: dict[Path, Source] = {}
_backend: list[Source] | None = None


def _fixture(path: Path) -> Source:
    hit = _fixture_cache.get(path)
    if hit is None:
        npz = path.with_suffix(".npz")
        feeds: dict[str, np.ndarray] = {}
        if npz.exists():
            with np.load(npz) as z:
                feeds = {k[4:]: z[k] for k in z.files if k.startswith("in0:")}
        hit = _fixture_cache[path] = (f"fixture {path.name}", path.read_bytes(), feeds)
    return hit


def backend_models() -> list[Source]:
    """The ONNX backend node tests in tests/onnx_backend/passing.txt, by name (generated once
    per process, ~8 s: call it before forking workers)."""
    global _backend
    if _backend is None:
        from tests.onnx_backend.runner import PASSING, _as_array, _graph_input_names, load_cases

        passing = set(PASSING.read_text().split())
        out: list[Source] = []
        for c in sorted(load_cases(), key=lambda c: c.name):
            if c.name not in passing or not c.data_sets:
                continue
            names = _graph_input_names(c.model)
            arrays = [_as_array(x) for x in c.data_sets[0][0]]
            feeds = {
                n: np.asarray(a)
                for n, a in zip(names, arrays, strict=False)
                if isinstance(a, np.ndarray | np.generic)
            }
            out.append((f"backend {c.name}", c.model.SerializeToString(), feeds))
        _backend = out
    return _backend


def _choose_fixture(rng: np.random.Generator, max_fixtures: int) -> Path:
    """Smaller fixtures more often (weight 1/rank): they load and run fastest."""
    pool = FIXTURES[:max_fixtures]
    w = np.array([1.0 / (i + 1) ** 0.7 for i in range(len(pool))])
    return pool[int(rng.choice(len(pool), p=w / w.sum()))]


def build_case(
    seed: int, index: int, workdir: Path, corpus: str = "all", max_fixtures: int = len(FIXTURES)
) -> Case:
    """Case `index` of the run with this seed (the same on every machine)."""
    rng = np.random.default_rng([seed, index])
    if corpus == "backend" or (corpus == "all" and rng.random() < 0.5):
        models = backend_models()
        name, data, feeds = models[int(rng.integers(len(models)))]
    else:
        name, data, feeds = _fixture(_choose_fixture(rng, max_fixtures))
    model = onnx.ModelProto.FromString(data)
    head = [name]
    r = rng.random()
    if r < 0.06:
        case = file_case(model, rng, workdir)
    elif r < 0.12:
        case = args_case(model, rng)
    else:
        desc = mutate(model, rng, int(rng.choice([1, 1, 1, 2, 2, 3])))
        if rng.random() < 0.1:
            blob, what = corrupt_bytes(model.SerializeToString(), rng)
            desc.append(f"bytes: {what}")
            case = Case(desc, lambda: load_onnx(blob))
        else:
            case = Case(desc, lambda: load_onnx(model), model=model)
        case.misuse_eval = rng.random() < 0.05
    case.description = head + case.description
    case.kwargs = {"feeds": feeds, "rng": rng}
    return case


# -- feeding what loads ---------------------------------------------------------------------------
def _inputs(loaded: Graph | ValueSpecializedModel) -> list[tuple[str, Shape, np.dtype]]:
    """Each input's name, (symbolic) shape and NumPy dtype."""
    if isinstance(loaded, Graph):
        names = loaded.input_names
        return [
            (n, loaded[v].shape, loaded[v].dtype.np)
            for n, v in zip(names, loaded.inputs, strict=True)
        ]
    out = []
    init = {t.name for t in loaded.model.graph.initializer}
    for inp in loaded.model.graph.input:
        if inp.name in init or inp.name in loaded.options.input_values:
            continue
        tt = inp.type.tensor_type
        dims = [
            Size(d.dim_value)
            if d.HasField("dim_value") and d.dim_value >= 0
            else Size.sym(f"{inp.name}_{k}")
            for k, d in enumerate(tt.shape.dim)
        ]
        out.append((inp.name, Shape(tuple(dims)), onnx_dtype(tt.elem_type, inp.name).np))
    return out


def _bindings(
    specs: list[tuple[str, Shape, np.dtype]], feeds: dict[str, np.ndarray]
) -> dict[str, int]:
    """Symbol values from the fixture's own inputs where they fit, else small ones."""
    bound: dict[str, int] = {}
    for name, shape, _ in specs:
        a = feeds.get(name)
        if a is None or a.ndim != shape.rank:
            continue
        with contextlib.suppress(KnError):
            bound = infer_symbols([shape], [a.shape], [name], bound)
    for _, shape, _ in specs:
        for s in sorted(shape.symbols):
            bound.setdefault(s, 2)
    return bound


def _feed(
    specs: list[tuple[str, Shape, np.dtype]],
    feeds: dict[str, np.ndarray],
    rng: np.random.Generator,
    edges: float = 0.0,
) -> dict[str, np.ndarray] | None:
    """Inputs of the declared shapes (None when one would exceed VALUE_LIMIT); with `edges`,
    about that fraction of every input's elements are edge values of its dtype."""
    bound = _bindings(specs, feeds)
    out: dict[str, np.ndarray] = {}
    for name, shape, dt in specs:
        try:
            dims = shape.eval(bound)
        except KnError:
            dims = tuple(2 for _ in shape)
        if any(d < 0 for d in dims) or math.prod(dims) * dt.itemsize > VALUE_LIMIT:
            return None
        given = feeds.get(name)
        if given is not None and given.shape == tuple(dims) and given.dtype == dt:
            out[name] = given
        elif dt.kind == "f":
            out[name] = rng.standard_normal(dims).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.random(dims) < 0.5
        else:
            out[name] = rng.integers(0, 4, dims).astype(dt)
        if edges:
            out[name] = with_edge_values(out[name], rng, edges)
    return out


def _too_big(graph: Graph, feed: dict[str, np.ndarray]) -> bool:
    """Whether some value of the graph would exceed VALUE_LIMIT at this binding."""
    try:
        bound = infer_symbols(
            [graph[v].shape for v in graph.inputs], [feed[n].shape for n in graph.input_names]
        )
        return any(
            math.prod(info.shape.eval(bound)) * info.dtype.size > VALUE_LIMIT
            for info in graph.value_infos()
        )
    except (KnError, KeyError):
        return False  # evaluation reports it


def _copied(inputs: Any) -> Any:
    """Fresh copies of the arrays in `inputs` (each executor gets its own)."""
    if isinstance(inputs, dict):
        return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    if isinstance(inputs, list):
        return [np.array(v) if isinstance(v, np.ndarray) else v for v in inputs]
    return inputs


def _run(device: Device, loaded: Any, inputs: Any) -> tuple[list[Any] | None, KnError | None]:
    """`device.prepare(loaded).eval(inputs)`: the outputs, or the KnError it raised."""
    try:
        return device.prepare(loaded).eval(inputs), None
    except KnError as e:
        return None, e


_MEMORY = re.compile(r"out of memory|\bmemory\b|\barena\b", re.IGNORECASE)


def _memory_refusal(e: KnError) -> bool:
    """Whether the product's error is it refusing work for memory (not a wrong answer)."""
    return isinstance(e.__cause__, MemoryError) or bool(_MEMORY.search(str(e)))


def _kn_detail(e: KnError) -> str:
    detail = type(e).__name__
    cause = e.__cause__
    if isinstance(e, EvaluationError | ShapeMismatchError) and (
        cause is not None and not isinstance(cause, KnError)
    ):
        detail += f" <- {type(cause).__name__}"  # an executor wrapping a NumPy error
    return detail


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


def _evaluate(case: Case, loaded: Any) -> tuple[str, str]:
    """Feed what loaded to both executors and compare: (kind, detail) as in `Outcome`."""
    feeds, rng = case.kwargs["feeds"], case.kwargs["rng"]
    if not isinstance(loaded, Graph | ValueSpecializedModel):
        raise TypeError(f"load_onnx returned {type(loaded).__name__}")
    specs = _inputs(loaded)
    edges = 0.0
    if rng.random() < EDGE_CASES:
        edges = float(rng.choice(EDGE_FRACTIONS))
        case.description.append(f"inputs: edge values in about {edges:.0%} of the elements")
    feed = _feed(specs, feeds, rng, edges)
    if feed is None:
        return "skipped", ""
    graph = loaded.specialize(feed) if isinstance(loaded, ValueSpecializedModel) else loaded
    if _too_big(graph, feed):
        return "skipped", ""
    inputs: Any = feed
    case.kwargs["feed"] = feed
    if case.misuse_eval:
        what, inputs = eval_misuse([s[0] for s in specs], feed, rng)
        case.description.append(what)
    want, want_error = _run(Device.cpu(reference=True), loaded, _copied(inputs))
    try:
        got, got_error = _run(Device.cpu(THREADS), loaded, _copied(inputs))
    except Exception:
        return "internal", "in Device.cpu() (the product):\n" + traceback.format_exc()
    if want_error is not None:
        if got_error is None:
            return (
                "lenient",
                f"{_kn_detail(want_error)}\nthe reference raised {_one_line(want_error)}",
            )
        return "KnError", _kn_detail(want_error)
    if got_error is not None:
        what = f"Device.cpu() raised {_one_line(got_error)} where the reference ran"
        if _memory_refusal(got_error):
            return "refused", f"{type(got_error).__name__} (memory)\n{what}"
        return "disagree", what
    diff = difference(got, want, graph_tolerance(graph))
    if diff is None:
        return "ran", ""
    try:
        where, round_off = localize(graph, {n: feed[n] for n in graph.input_names}, THREADS)
    except Exception as e:  # the outputs disagree either way: say so, and why this failed
        where, round_off = f"(localizing the difference failed: {_one_line(e)})", False
    detail = f"Device.cpu() against the reference: {diff}\n{where}"
    return ("round-off" if round_off else "disagree"), detail


def run_case(
    seed: int,
    index: int,
    workdir: Path,
    corpus: str = "all",
    max_fixtures: int = len(FIXTURES),
    save: Path | None = None,
) -> Outcome:
    """Build, load and evaluate one case in this process. `save`: a folder to write the mutated
    model (model.onnx) and the inputs it was fed (inputs.npz) to, for a reproduction."""
    start = time.perf_counter()
    case = Case([f"case {index}"], lambda: None)
    try:
        case = build_case(seed, index, workdir, corpus, max_fixtures)
        if save is not None and case.model is not None:
            save.mkdir(parents=True, exist_ok=True)
            onnx.save(case.model, save / "model.onnx")
        kind, detail = _evaluate(case, case.load())
    except KnError as e:
        kind, detail = "KnError", _kn_detail(e)
    except Exception:
        kind, detail = "internal", traceback.format_exc()
    feed = case.kwargs.get("feed")
    if save is not None and feed is not None:
        np.savez(save / "inputs.npz", **feed)
    return Outcome(index, kind, detail, case.description, time.perf_counter() - start)


# -- the worker pool ------------------------------------------------------------------------------
def _worker(conn: Connection, seed: int, corpus: str, max_fixtures: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    faulthandler.disable()  # a crash is reported by the parent (pytest enables it)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = Path(tempfile.mkdtemp(prefix="kn-fuzz-"))
    try:
        while True:
            index = conn.recv()
            if index is None:
                return
            workdir = root / str(index)
            workdir.mkdir()
            outcome = run_case(seed, index, workdir, corpus, max_fixtures)
            shutil.rmtree(workdir, ignore_errors=True)
            conn.send(outcome)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _Slot:
    """One worker process and the case it is running."""

    def __init__(self, seed: int, corpus: str, max_fixtures: int) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        args = (child, seed, corpus, max_fixtures)
        self.proc = ctx.Process(target=_worker, args=args, daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.started = 0.0

    def submit(self, index: int) -> None:
        self.index, self.started = index, time.perf_counter()
        self.conn.send(index)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def run_cases(
    seed: int,
    indices: range,
    workers: int = 2,
    timeout: float = 30.0,
    corpus: str = "all",
    max_fixtures: int = len(FIXTURES),
) -> list[Outcome]:
    """Run the cases in `workers` processes; a case over `timeout` seconds is a hang (its worker
    is killed and replaced), a worker that dies is a crash."""
    if corpus != "fixtures":
        backend_models()  # once, here: the forked workers inherit it

    def slot() -> _Slot:
        return _Slot(seed, corpus, max_fixtures)

    pending = list(indices)[::-1]
    slots = [slot() for _ in range(max(1, min(workers, len(pending))))]
    results: list[Outcome] = []
    try:
        for s in slots:
            if pending:
                s.submit(pending.pop())
        while any(s.index is not None for s in slots):
            busy = [s for s in slots if s.index is not None]
            now = time.perf_counter()
            left = min(s.started + timeout - now for s in busy)
            ready = wait([s.conn for s in busy], timeout=max(left, 0.01))
            for k, s in enumerate(slots):
                if s.index is None:
                    continue
                if s.conn in ready:
                    try:
                        results.append(s.conn.recv())
                    except (EOFError, OSError):
                        s.proc.join()
                        what = f"worker exit code {s.proc.exitcode}"
                        results.append(Outcome(s.index, "crash", what, []))
                        s.kill()
                        s = slots[k] = slot()
                elif time.perf_counter() - s.started > timeout:
                    results.append(Outcome(s.index, "hang", f"over {timeout} s", []))
                    s.kill()
                    s = slots[k] = slot()
                else:
                    continue
                s.index = None
                if pending:
                    s.submit(pending.pop())
    finally:
        for s in slots:
            with contextlib.suppress(OSError, ValueError):
                s.conn.send(None)
            s.proc.join(timeout=1)
            if s.proc.is_alive():
                s.kill()
    return sorted(results, key=lambda o: o.index)
