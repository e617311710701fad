"""Run the ONNX backend node test cases shipped inside the `onnx` package through our loader and
the CPU executor, with ONNX's own tolerances.

    python -m tests.onnx_backend.runner            # summary and failures by category
    python -m tests.onnx_backend.runner --update   # also rewrite passing.txt (it may only grow)
    python -m tests.onnx_backend.runner -k conv    # only tests whose name contains 'conv'

Categories: pass; unsupported (one of our exceptions, KnError); mismatch (wrong numbers, dtype or
shape: a silent wrong answer, must be zero); internal (any other exception: a bug, must be zero);
f16-ulp (an f16 result within 2 units in the last place of the reference but outside ONNX's
relative tolerance — not counted as a pass, listed for review); known-deviation (KNOWN_DEVIATIONS:
the reference itself is off, with the reason written down).
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from kn_graph.errors import KnError
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_runtime import Device

PASSING = Path(__file__).with_name("passing.txt")

KNOWN_DEVIATIONS = {
    "test_dft_inverse": "the reference is a float32 FFT whose rounding noise at exact zeros "
    "(1.9e-7) exceeds the test's atol of 1e-7; we compute in float64 (error 7e-16 there); "
    "onnxruntime fails every DFT test by more",
    "test_dft_inverse_opset19": "as test_dft_inverse",
}
"""Tests whose reference, not our result, is off; they count as neither pass nor mismatch."""


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # pass | unsupported | mismatch | internal
    detail: str = ""


def load_cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def _as_array(x: object) -> object:
    """Some cases store raw TensorProtos (types NumPy lacks); convert those NumPy can hold."""
    if isinstance(x, onnx.TensorProto):
        try:
            return numpy_helper.to_array(x)
        except Exception:
            return x
    return x


def _graph_input_names(model) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def run_case(case) -> Outcome:
    model = case.model
    names = _graph_input_names(model)
    if not case.data_sets:
        return Outcome(case.name, "unsupported", "no data sets")
    inputs, expected = (list(map(_as_array, xs)) for xs in case.data_sets[0])
    # rank-0 tensors are stored as NumPy scalars: they are tensors all the same
    inputs = [_tensor_or_list(a) for a in inputs]
    expected = [_tensor_or_list(a) for a in expected]
    if len(inputs) != len(names) or not all(_supported(a) for a in inputs):
        return Outcome(case.name, "unsupported", "inputs that are not tensors or sequences")
    if not all(_supported(a) for a in expected):
        return Outcome(case.name, "unsupported", "outputs that are not tensors or sequences")
    by_name = dict(zip(names, inputs, strict=True))
    try:
        # the public API, as a user calls it: no input values pinned by hand; a model whose
        # shapes depend on input values comes back as a ValueSpecializedModel, which prepare takes
        loaded = load_onnx(model)
        specialized = isinstance(loaded, ValueSpecializedModel)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = Device.cpu(reference=True).prepare(loaded).eval(by_name)
    except KnError as e:
        return Outcome(case.name, "unsupported", f"{type(e).__name__}: {e}")
    except Exception as e:  # a bug of ours: keep the place it happened
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return Outcome(
            case.name,
            "internal",
            f"{type(e).__name__}: {e} at {Path(tb.filename).name}:{tb.lineno}",
        )
    if len(outs) != len(expected):
        return Outcome(case.name, "mismatch", f"{len(outs)} outputs, expected {len(expected)}")
    outs, expected = _flatten(outs, expected)
    if outs is None:
        return Outcome(case.name, "mismatch", "a sequence output has the wrong length or kind")
    for i, (got, ref) in enumerate(zip(outs, expected, strict=True)):
        if got.dtype != ref.dtype or got.shape != ref.shape:
            return Outcome(
                case.name,
                "mismatch",
                f"output {i}: {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}",
            )
        if ref.dtype.kind in "fc":
            ok = np.allclose(got, ref, rtol=case.rtol, atol=case.atol, equal_nan=True)
        else:
            ok = np.array_equal(got, ref)
        if not ok and ref.dtype == np.float16 and _within_f16_ulps(got, ref, 2):
            return Outcome(
                case.name,
                "f16-ulp",
                f"output {i}: within 2 f16 ulps, outside ONNX's rtol={case.rtol}",
            )
        if not ok and case.name in KNOWN_DEVIATIONS:
            return Outcome(case.name, "known-deviation", KNOWN_DEVIATIONS[case.name])
        if not ok:
            err = np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))) if got.size else 0
            return Outcome(case.name, "mismatch", f"output {i}: max abs diff {err:.3g}")
    return Outcome(case.name, "pass", "specialized on input values" if specialized else "")


def _tensor_or_list(a: object) -> object:
    """Rank-0 tensors are stored as NumPy scalars; sequences as lists of arrays."""
    if isinstance(a, np.generic):
        return np.asarray(a)
    if isinstance(a, list):
        return [np.asarray(x) if isinstance(x, np.generic) else x for x in a]
    return a


def _supported(a: object) -> bool:
    return isinstance(a, np.ndarray) or (
        isinstance(a, list) and all(isinstance(x, np.ndarray) for x in a)
    )


def _flatten(outs: list, expected: list) -> tuple[list | None, list]:
    """Outputs and references with sequences expanded element by element (None: a sequence
    output came back with another length, or not as a list)."""
    got_flat, ref_flat = [], []
    for got, ref in zip(outs, expected, strict=True):
        if isinstance(ref, list):
            if not isinstance(got, list) or len(got) != len(ref):
                return None, expected
            got_flat += [np.asarray(g) for g in got]
            ref_flat += ref
        else:
            got_flat.append(got)
            ref_flat.append(ref)
    return got_flat, ref_flat


def _within_f16_ulps(got: np.ndarray, ref: np.ndarray, n: int) -> bool:
    """|got - ref| <= n units in the last place of ref, for f16 results whose reference was
    rounded differently (onnxruntime differs from these references by the same amount)."""
    ulp = np.spacing(np.abs(ref.astype(np.float16))).astype(np.float64)
    return bool(np.all(np.abs(got.astype(np.float64) - ref.astype(np.float64)) <= n * ulp))


def run_all(filter_: str | None = None) -> list[Outcome]:
    cases = [c for c in load_cases() if filter_ is None or filter_ in c.name]
    return [run_case(c) for c in cases]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-k", dest="filter", help="only tests whose name contains this")
    ap.add_argument("--update", action="store_true", help="rewrite passing.txt with the passes")
    ap.add_argument("-v", action="store_true", help="print every non-passing test")
    args = ap.parse_args(argv)
    outcomes = run_all(args.filter)
    counts = collections.Counter(o.status for o in outcomes)
    for o in outcomes:
        if o.status in ("mismatch", "internal") or (args.v and o.status != "pass"):
            print(f"{o.status:11s} {o.name}: {o.detail}")
    by_op = collections.Counter(
        o.detail.split(":")[0] for o in outcomes if o.status == "unsupported"
    )
    print(f"\n{len(outcomes)} tests: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.update and args.filter is None:
        old = set(PASSING.read_text().split()) if PASSING.exists() else set()
        new = {o.name for o in outcomes if o.status == "pass"}
        lost = sorted(old - new)
        if lost:
            print(f"refusing to update: {len(lost)} previously passing tests fail: {lost[:10]}")
            return 1
        PASSING.write_text("\n".join(sorted(new)) + "\n")
        print(f"wrote {len(new)} names to {PASSING}")
    del by_op
    return 0


if __name__ == "__main__":
    sys.exit(main())
