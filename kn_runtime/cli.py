"""`kn-run`: load an ONNX model, optimize it when the optimizer is available, run it on random or
given inputs, and print output shapes, a checksum, and three times: prepare (planning, compiled C
steps, oneDNN primitives and packed weights, or CUDA kernels: what onnxruntime's session creation
does), the first evaluation, and the steady state (the median of later evaluations: a few, or
--runs with --bench); on a CUDA device also the difference from the CPU executor, and with
--profile the time of every step (of every segment and host point, for a graph with
data-dependent ops).

    kn-run                       # the embedded default model
    kn-run model.onnx --batch 4 --bench
    kn-run model.onnx --dim seq=77 --input input_ids=ids.npy
    kn-run model.onnx --device cuda --profile
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

from kn_graph._cli import CliError, OneLineParser, load_npy, parse_int
from kn_graph.binding import bind_inputs
from kn_graph.dtype import DType
from kn_graph.errors import KnError, OnnxImportError, StaticInputRequiredError
from kn_graph.graph import Graph
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.shape import BATCH, infer_symbols
from kn_runtime.device import Device
from kn_runtime.prepared import PreparedGraph

__all__ = ["default_model_path", "main", "random_inputs"]

DEFAULT_MODEL = "resnet_tiny.onnx"


def default_model_path() -> Path:
    """The small model that ships inside the package (used when no model is given)."""
    return Path(str(resources.files("kn_runtime") / "models" / DEFAULT_MODEL))


def random_inputs(graph: Graph, bindings: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Inputs for a smoke run: normal floats; integer inputs are small non-negative ids (masks,
    named '*mask*', are all ones) so that embedding lookups stay in range."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        info = graph[v]
        shape = info.shape.eval(bindings)
        name = info.debug_name.lower()
        if info.dtype.is_float:
            a = rng.standard_normal(shape).astype(info.dtype.np)
        elif info.dtype.is_bool:
            a = np.ones(shape, bool)
        elif "mask" in name:
            a = np.ones(shape, info.dtype.np)
        else:
            a = rng.integers(0, 10, size=shape).astype(info.dtype.np)
        out.append(a)
    return out


def _parse_kv(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise CliError(f"{what} must look like name=value, found '{it}'")
        if k in out:
            raise CliError(f"{what} gives '{k}' twice")
        out[k] = v
    return out


def _given_inputs(args: argparse.Namespace) -> dict[str, np.ndarray]:
    return {k: load_npy(v, f"--input {k}") for k, v in _parse_kv(args.input, "--input").items()}


def _dims(args: argparse.Namespace) -> dict[str, int]:
    dims = {k: parse_int(v, f"--dim {k}") for k, v in _parse_kv(args.dim, "--dim").items()}
    if args.batch is not None:
        dims[BATCH] = parse_int(str(args.batch), "--batch", 0, 2**20)
    return dims


def _declared_inputs(
    loaded: ValueSpecializedModel, dims: dict[str, int], skip: set[str]
) -> dict[str, np.ndarray]:
    """Random inputs of the declared ONNX shapes (named dims from `dims`, batch axes as B,
    else 1) for a model loaded per input shape."""
    from kn_graph.onnx.context import onnx_dtype
    from kn_graph.onnx.loader import DEFAULT_BATCH_AXES

    rng = np.random.default_rng(0)
    out = {}
    for inp in loaded.model.graph.input:
        if inp.name not in loaded.input_names or inp.name in skip:
            continue
        tt = inp.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            else:
                name = BATCH if d.dim_param in DEFAULT_BATCH_AXES else d.dim_param
                shape.append(dims.get(d.dim_param, dims.get(name, 1)))
        dt = onnx_dtype(tt.elem_type, f"input '{inp.name}'")
        a = rng.standard_normal(shape) if dt.is_float else np.zeros(shape)
        out[inp.name] = a.astype(dt.np)
    return out


def _optimize(graph: Graph, device: Device | None) -> tuple[Graph, bool]:
    """The graph optimized with `device`'s settings (what `prepare` would use: QDQ fusion on the
    CPU backend), or as it is without a device."""
    if device is None:
        return graph, False
    try:
        mod = importlib.import_module("kn_graph.optimizer")
    except ImportError:
        return graph, False
    return mod.optimize(graph, device.optimizer_settings()), True


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(
        prog="kn-run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model", nargs="?", help="ONNX model (default: the embedded tiny model)")
    ap.add_argument("--batch", default=None, help="batch size B (default 1)")
    ap.add_argument(
        "--dim", action="append", default=[], metavar="NAME=N", help="bind another size symbol"
    )
    ap.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", help="input data"
    )
    ap.add_argument(
        "--device",
        default="best",
        choices=["cpu", "cpu-reference", "cpu-fast", "cuda", "best"],
        help="cpu (the default of best without a GPU): the plan on the host (compiled C, "
        "oneDNN); cpu-reference: the NumPy reference executor; cpu-fast: the same as cpu",
    )
    ap.add_argument("--threads", type=int, help="intra-op threads of --device cpu")
    ap.add_argument(
        "--bench",
        action="store_true",
        help="time --runs evaluations after the first (default: a few, within about a second)",
    )
    ap.add_argument("--runs", default="10", help="evaluations timed with --bench (default 10)")
    ap.add_argument("--no-optimize", action="store_true", help="run the graph as loaded")
    ap.add_argument("--print-graph", action="store_true", help="print the graph")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="print the time of every step (CPU backend and CUDA; a graph with data-dependent ops: "
        "of every segment and host point), of the median of 5 profiled evaluations",
    )
    ap.add_argument(
        "--no-check", action="store_true", help="on CUDA, skip the comparison with the CPU executor"
    )
    ap.add_argument("--tf32", action="store_true", help="on CUDA, let F32 GEMMs/convs use TF32")
    ap.add_argument(
        "--no-cuda-graphs", action="store_true", help="on CUDA, launch step by step every time"
    )
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except KnError as e:
        print(f"kn-run: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    path = Path(args.model) if args.model else default_model_path()
    given = _given_inputs(args)
    dims = _dims(args)
    runs = parse_int(args.runs, "--runs", 1, 10**6)
    device = _device(args)
    loaded, graph, given = _load(path, given, dims, None if args.no_optimize else device)
    if args.print_graph:
        print(graph)
    symbols = set().union(*(graph[v].shape.symbols for v in graph.inputs))
    _check_names(graph, loaded, symbols, dims, given)
    inputs = _inputs(graph, dims, given)
    bindings = bind_inputs(graph, inputs)[1]
    # a batch size given to prepare fixes the only free symbol: the plan is made (and compiled)
    # there, as onnxruntime makes its session, so the first evaluation is an evaluation; other
    # symbols (and data-dependent sizes) are bound per call, so their first evaluation plans
    lazy = sorted(symbols - {BATCH})
    if graph.has_dynamic:
        lazy.append("data-dependent sizes")
    batch = bindings.get(BATCH) if BATCH in symbols and not lazy else None
    t0 = time.perf_counter()
    prepared = device.prepare(
        graph, batch, settings=_settings(device, args), optimize=not args.no_optimize
    )
    t_prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = prepared.eval(inputs)
    t_first = time.perf_counter() - t0
    _print_run(device, graph, inputs, bindings, outputs)
    print(f"prepare: {t_prepare * 1e3:.2f} ms")
    note = f"  (planned for this binding: {', '.join(lazy)} bound per call)" if lazy else ""
    print(f"first evaluation: {t_first * 1e3:.2f} ms{note}")
    _print_steady(
        _steady_times(prepared, inputs, runs if args.bench else None, None if lazy else t_first)
    )
    if (device.kind != "cpu" or device.fast) and not args.no_check:
        ref = Device.cpu(reference=True).prepare(graph).eval(inputs)
        print(f"difference from the CPU executor: {_difference(outputs, ref)}")
    if args.profile:
        _print_profile(device, prepared, inputs)
    return 0


def _load(
    path: Path, given: dict[str, np.ndarray], dims: dict[str, int], optimize_for: Device | None
) -> tuple[Graph | ValueSpecializedModel, Graph, dict[str, np.ndarray]]:
    """The model as loaded, the graph to run (specialized to the given values of a model whose
    shapes depend on them, optimized unless told not to) and the given inputs that graph takes;
    prints the load line."""
    t0 = time.perf_counter()
    loaded = load_onnx(path)
    if isinstance(loaded, ValueSpecializedModel):
        graph = _specialized(loaded, given, dims)
        given = {k: v for k, v in given.items() if k not in loaded.value_inputs}
    else:
        graph = loaded
    t_load = time.perf_counter() - t0
    n_loaded = len(graph)
    t0 = time.perf_counter()
    graph, optimized = _optimize(graph, optimize_for)
    t_opt = time.perf_counter() - t0
    line = f"model: {path.name}  load {t_load * 1e3:.1f} ms, {n_loaded} values"
    if optimized:
        line += f"  -> optimized {len(graph)} values in {t_opt * 1e3:.1f} ms"
    print(line, flush=True)
    return loaded, graph, given


def _specialized(
    loaded: ValueSpecializedModel, given: dict[str, np.ndarray], dims: dict[str, int]
) -> Graph:
    """Shapes decided by the values of some inputs (those must be given) or loaded per input
    shape (the others are made up from the declared shapes, as for any model)."""
    feed = dict(given)
    if loaded.by_shape:
        feed.update(_declared_inputs(loaded, dims, skip=set(given)))
    try:
        return loaded.specialize(feed)
    except (StaticInputRequiredError, OnnxImportError):
        raise KnError(
            f"the model's shapes depend on the values of inputs {loaded.value_inputs}: give "
            "them with --input NAME=FILE.npy"
        ) from None


def _device(args: argparse.Namespace) -> Device:
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads: expected >= 1, found {args.threads}")
    devices = {
        "cpu": lambda: Device.cpu(args.threads),
        "cpu-reference": lambda: Device.cpu(reference=True),
        "cpu-fast": lambda: Device.cpu(args.threads),
        "cuda": Device.cuda,
        "best": Device.best,
    }
    return devices[args.device]()


def _check_names(
    graph: Graph,
    loaded: Graph | ValueSpecializedModel,
    symbols: set[str],
    dims: dict[str, int],
    given: dict[str, np.ndarray],
) -> None:
    """--dim names size symbols of the model, --input names its inputs."""
    declared = {
        d.dim_param
        for i in (loaded.model.graph.input if isinstance(loaded, ValueSpecializedModel) else [])
        for d in i.type.tensor_type.shape.dim
    }  # a model loaded per shape has used them already
    stray = sorted(set(dims) - symbols - declared - {BATCH})
    if stray:
        raise CliError(
            f"--dim names {stray}, which are not size symbols of the model ({sorted(symbols)})"
        )
    unknown = sorted(set(given) - set(graph.input_names))
    if unknown:
        raise CliError(
            f"--input names {unknown}, which are not inputs of the model ({graph.input_names})"
        )


def _inputs(graph: Graph, dims: dict[str, int], given: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The given inputs, random ones for the others: symbols come from --batch/--dim, then from
    the shapes of given inputs, else default to 1."""
    given_inputs = [
        (n, v) for n, v in zip(graph.input_names, graph.inputs, strict=True) if n in given
    ]
    solved = infer_symbols(
        [graph[v].shape for _, v in given_inputs],
        [given[n].shape for n, _ in given_inputs],
        [f"input '{n}'" for n, _ in given_inputs],
        dict(dims),
    )
    bindings = {s: 1 for v in graph.inputs for s in graph[v].shape.symbols} | solved
    inputs = random_inputs(graph, bindings)
    for i, name in enumerate(graph.input_names):
        if name in given:
            inputs[i] = given[name]
    return inputs


def _settings(device: Device, args: argparse.Namespace) -> object:
    """The CUDA executor's settings from --no-cuda-graphs and --tf32 (None elsewhere)."""
    if device.kind != "cuda":
        return None
    from kn_cuda_eval.cuda.device import ExecutorSettings

    return ExecutorSettings(cuda_graphs=not args.no_cuda_graphs, tf32=args.tf32)


def _print_run(
    device: Device,
    graph: Graph,
    inputs: list[np.ndarray],
    bindings: dict[str, int],
    outputs: list[np.ndarray],
) -> None:
    """The device, the inputs and their bindings, and each output's shape and checksums."""
    sym = ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
    print(
        f"device: {device}  inputs: "
        + ", ".join(
            f"{n} {DType.from_np(a.dtype)}{list(a.shape)}"
            for n, a in zip(graph.input_names, inputs, strict=True)
        )
        + (f"  ({sym})" if sym else "")
    )
    for name, a in zip(graph.output_names, outputs, strict=True):
        a64 = a.astype(np.float64)
        checksum = float(np.sum(a64)) if a.size else 0.0
        mean_abs = float(np.mean(np.abs(a64))) if a.size else 0.0
        print(
            f"output {name}: {DType.from_np(a.dtype)}{list(a.shape)}  sum={checksum:.6g}  "
            f"mean_abs={mean_abs:.6g}"
        )


def _print_steady(times: list[float]) -> None:
    if times:
        print(
            f"time per evaluation: {statistics.median(times) * 1e3:.2f} ms "
            f"(median of {len(times)} after the first)"
        )
    else:
        print(
            f"time per evaluation: not timed (the first took over {QUICK_BUDGET_S:g} s: use --bench)"
        )


def _print_profile(device: Device, prepared: PreparedGraph, inputs: list[np.ndarray]) -> None:
    if device.kind == "cpu" and not device.fast:
        print(
            "kn-run: --profile times device steps; the reference executor has none (use "
            "--device cpu or cuda)",
            file=sys.stderr,
        )
    else:  # one profiled evaluation can land on a descheduled core: the median of a few
        runs = sorted(
            (prepared.profile(inputs) for _ in range(PROFILE_RUNS)), key=lambda p: p.total_ms
        )
        print(runs[len(runs) // 2])


PROFILE_RUNS = 5
"""Profiled evaluations of --profile; the one with the median total is printed."""


QUICK_RUNS = 5
"""Evaluations timed after the first without --bench, while they take QUICK_BUDGET_S seconds or
less in all (none when the first took longer)."""
QUICK_BUDGET_S = 1.0


def _steady_times(
    prepared: PreparedGraph, inputs: list[np.ndarray], runs: int | None, t_first: float | None
) -> list[float]:
    """Seconds of evaluations after the first: `runs` of them (--bench), else a few quick ones
    (up to QUICK_RUNS within QUICK_BUDGET_S), so that a plain run shows the steady state of a
    small model without keeping a large one busy. `t_first` None: the first evaluation also
    planned, so it says nothing of the cost of the next (at least one is timed)."""
    if runs is None and t_first is not None and t_first > QUICK_BUDGET_S:
        return []
    times: list[float] = []
    for _ in range(QUICK_RUNS if runs is None else runs):
        t0 = time.perf_counter()
        prepared.eval(inputs)
        times.append(time.perf_counter() - t0)
        if runs is None and sum(times) > QUICK_BUDGET_S:
            break
    return times


def _difference(got: list[np.ndarray], ref: list[np.ndarray]) -> str:
    """The worst output's max |difference| / max |reference| (exact comparison for integers)."""
    worst = 0.0
    for a, b in zip(got, ref, strict=True):
        if a.size == 0:
            continue
        if b.dtype.kind != "f":
            if not np.array_equal(a, b):
                return "integer outputs differ"
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if not np.array_equal(np.isnan(a64), np.isnan(b64)):
            return "NaN positions differ"
        fin = np.isfinite(b64)
        scale = max(float(np.max(np.abs(b64[fin]), initial=0.0)), 1e-30)
        worst = max(worst, float(np.max(np.abs(a64[fin] - b64[fin]), initial=0.0)) / scale)
    return f"max |d| / max |ref| = {worst:.3g}"


if __name__ == "__main__":
    sys.exit(main())
