#!/usr/bin/env bash
# The one prepared GPU check (about 5-6 minutes): (a) versions of the GPU stack (first the
# cuda-pathfinder, nvidia-cudnn-*, nvidia-cublas, nvidia-cuda-nvrtc and CuPy wheels and the
# driver), (b) every test of the CUDA planner and executor on the device (KN_REQUIRE_CUDA=1: a
# missing GPU fails instead of skipping; every planner test also runs its plans on the GPU, with
# and without CUDA graphs, and on the fake device with CUDA-graph capture),
# (c) benchmarks/gpu_vs_peers.py; the short table is printed last.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from the repository root
#
# From a session with the device tool: first `bash benchmarks/fetch_wheels.sh` here (network),
# then run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/wheels"], timeout_s=480),
# and append $OUT/results_section.md (with the test summary) to benchmarks/RESULTS.md.
#
# Runs with the machine's python3 and the repository on PYTHONPATH (nothing installed). A
# diffusers wheel in benchmarks/wheels/ (benchmarks/fetch_wheels.sh) is used when diffusers is
# missing there. Every stage has its own time limit and the script goes on after a failure.
# Files land in $OUT (the device tool brings them back; a temporary folder without it):
# check.log (everything), pytest.log, bench.jsonl, bench_table.md, results_section.md,
# versions.json, profiles.txt, errors.txt. On a machine without a GPU it runs to the end and
# reports "no CUDA device" everywhere.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/kn_gpu_check.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export KN_KERNEL_CACHE=${KN_KERNEL_CACHE:-/tmp/kn_kernels}
TESTS_S=${TESTS_S:-130}
BENCH_S=${BENCH_S:-240}
START=$(date +%s)
stage() { echo; echo "=== $1 ($(( $(date +%s) - START )) s) ==="; }

main() {

stage "versions"
date -u +"%Y-%m-%d %H:%M:%S UTC"
# first the GPU stack's wheels (no CUDA call needed) and the driver: cuda-pathfinder >= 1.7 finds
# cuDNN (older ones raise DynamicLibUnknownError), the wheels' majors must match the driver's
timeout -k 5 30 "$PY" - <<'PYEOF' 2>&1 || true
import importlib.metadata as md
want = ("cuda-pathfinder", "nvidia-cudnn", "nvidia-cublas", "nvidia-cuda-nvrtc", "cupy")
found = sorted(
    (d.metadata["Name"].lower(), d.version)
    for d in md.distributions()
    if d.metadata["Name"] and d.metadata["Name"].lower().startswith(want)
)
for prefix in want:
    hits = [f"{n} {v}" for n, v in found if n.startswith(prefix)]
    print(f"{prefix:>20}: {', '.join(hits) if hits else 'not installed'}")
PYEOF
echo "$(printf '%20s' driver): $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
uname -m
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3 || true
timeout -k 5 60 "$PY" -m kn_cuda_eval.device
timeout -k 5 60 "$PY" - <<'EOF' 2>&1 || true
import importlib, platform
print(f"{'python':>20}: {platform.python_version()}")
for m in ("numpy", "scipy", "onnx", "onnxruntime", "torch", "transformers", "diffusers", "pytest", "xdist"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:>20}: {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m:>20}: missing ({type(e).__name__})")
try:
    import onnxruntime as ort
    print(f"{'ort providers':>20}: {', '.join(ort.get_available_providers())}")
except Exception:
    pass
EOF

stage "tests (KN_REQUIRE_CUDA=1, limit ${TESTS_S} s)"
XDIST=""
if "$PY" -c "import xdist" 2>/dev/null; then XDIST="-n 8"; fi
KN_REQUIRE_CUDA=1 timeout -k 10 "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider $XDIST \
    tests/cuda_eval kn_cuda_eval kn_runtime -rfEs --durations=5 -W ignore::DeprecationWarning \
    > "$OUT/pytest.log" 2>&1
TEST_RC=$?
tail -n 40 "$OUT/pytest.log"
TEST_LINE=$(grep -E "(passed|failed|error)" "$OUT/pytest.log" | tail -n 1)
[ "$TEST_RC" -eq 124 ] && TEST_LINE="TIMED OUT after ${TESTS_S} s; last: ${TEST_LINE}"

stage "gpu_vs_peers (limit ${BENCH_S} s)"
timeout -k 10 "$BENCH_S" "$PY" benchmarks/gpu_vs_peers.py --out "$OUT" --budget $((BENCH_S - 25)) \
    --runs 20 --seconds 1.0 --profile --no-final-table
BENCH_RC=$?

stage "summary"
echo "tests: rc=$TEST_RC  $TEST_LINE  (KN_REQUIRE_CUDA=1: without a GPU every device check fails)"
echo "benchmark: rc=$BENCH_RC  (files in $OUT)"
if [ -f "$OUT/bench.jsonl" ]; then
    "$PY" benchmarks/gpu_vs_peers.py --table-from "$OUT/bench.jsonl" || cat "$OUT/bench_table.md"
else
    echo "no benchmark rows were written"
fi
echo "total $(( $(date +%s) - START )) s"
}

main 2>&1 | tee -a "$OUT/check.log"
