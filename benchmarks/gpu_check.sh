#!/usr/bin/env bash
# The one prepared GPU check, at most TOTAL_S = 510 s in all (the device tool allows 600 s per
# call; a fresh machine has a cold kernel cache, so the tests compile every kernel): (a) versions
# of the GPU stack (first the cuda-pathfinder, nvidia-cudnn-*, nvidia-cublas, nvidia-cuda-nvrtc
# and CuPy wheels and the driver), (b) every test of the CUDA planner and executor on the device
# (KN_REQUIRE_CUDA=1: a missing GPU fails instead of skipping; every planner test also runs its
# plans on the GPU, with and without CUDA graphs, and on the fake device with CUDA-graph
# capture), (c) benchmarks/gpu_vs_peers.py; the benchmark table, then the stage table, last.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from the repository root
#
# From a session with the device tool: first `bash benchmarks/fetch_wheels.sh` here (network),
# then run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/wheels"], timeout_s=570),
# and append $OUT/results_section.md (with the test summary) to benchmarks/RESULTS.md.
#
# Stage limits in seconds, each also cut to what is left of TOTAL_S (kill grace included), so
# the stages never sum past it: VERSIONS_S=45; TESTS_S=240 (with pytest-timeout, one hung test
# stops after TEST_TIMEOUT_S=90 instead of the stage); the benchmark gets the rest, at most
# BENCH_S=210, less SUMMARY_S=15 kept for the tables. The test stage runs the device tests only
# (`-m cuda`: every CPU test runs in CI; on 2 busy cores the host-kernel tests alone took 7
# minutes, which would eat the device time). The image has no onednn-cpu-gomp: CPU-backend code
# the device tests touch takes the NumPy fallback, as `KN_ONEDNN=0` makes it elsewhere.
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
TOTAL_S=${TOTAL_S:-510}
VERSIONS_S=${VERSIONS_S:-45}
TESTS_S=${TESTS_S:-240}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-90}
BENCH_S=${BENCH_S:-210}
LLM_S=${LLM_S:-30}
SUMMARY_S=${SUMMARY_S:-15}
KILL_S=3  # grace between TERM and KILL, counted in every limit below
START=$(date +%s)
now() { echo $(( $(date +%s) - START )); }
# limit WANT [KEEP] [END]: WANT seconds, or fewer so that KEEP seconds and the kill grace remain
# before END (seconds since the start; TOTAL_S when not given); at least 1
limit() {
    local left=$(( ${3:-$TOTAL_S} - $(now) - ${2:-0} - KILL_S ))
    local n=$(( $1 < left ? $1 : left ))
    echo $(( n > 1 ? n : 1 ))
}
ROWS=()
STAGE_T0=0
stage() { STAGE_T0=$(now); echo; echo "=== $1 (${STAGE_T0} s) ==="; }
# done_stage NAME LIMIT RESULT: a row of the stage table, printed last
done_stage() {
    ROWS+=("$(printf '| %-12s | %5s | %5s | %s |' "$1" "$2" "$(( $(now) - STAGE_T0 ))" "$3")")
}

main() {

stage "versions"
V_LIMIT=$(limit "$VERSIONS_S" $((TESTS_S + SUMMARY_S)))
V_END=$(( STAGE_T0 + V_LIMIT ))
date -u +"%Y-%m-%d %H:%M:%S UTC"
# first the GPU stack's wheels (no CUDA call needed) and the driver: cuda-pathfinder >= 1.7 finds
# cuDNN (older ones raise DynamicLibUnknownError), the wheels' majors must match the driver's
timeout -k "$KILL_S" "$(limit 10 0 "$V_END")" "$PY" - <<'PYEOF' 2>&1 || true
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
SMI=(timeout -k 1 "$(limit 5 0 "$V_END")" nvidia-smi)
echo "$(printf '%20s' driver): $("${SMI[@]}" --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
uname -m
"${SMI[@]}" --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3 || true
timeout -k "$KILL_S" "$(limit 15 0 "$V_END")" "$PY" -m kn_cuda_eval.cuda.device
timeout -k "$KILL_S" "$(limit 30 0 "$V_END")" "$PY" - <<'EOF' 2>&1 || true
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
done_stage versions "$V_LIMIT" "-"

T_LIMIT=$(limit "$TESTS_S" $((SUMMARY_S + 30)))  # the benchmark keeps 30 s at least
stage "tests (KN_REQUIRE_CUDA=1, limit ${T_LIMIT} s)"
XDIST=""
if "$PY" -c "import xdist" 2>/dev/null; then XDIST="-n 8"; fi
PER_TEST=""
if "$PY" -c "import pytest_timeout" 2>/dev/null; then PER_TEST="--timeout=${TEST_TIMEOUT_S}"; fi
KN_REQUIRE_CUDA=1 timeout -k "$KILL_S" "$T_LIMIT" "$PY" -m pytest -q -p no:cacheprovider $XDIST \
    $PER_TEST -m cuda tests -rfEs --durations=5 \
    -W ignore::DeprecationWarning > "$OUT/pytest.log" 2>&1
TEST_RC=$?
tail -n 40 "$OUT/pytest.log"
TEST_LINE=$(grep -E "(passed|failed|error)" "$OUT/pytest.log" | tail -n 1)
[ "$TEST_RC" -eq 124 ] && TEST_LINE="TIMED OUT after ${T_LIMIT} s; last: ${TEST_LINE}"
done_stage tests "$T_LIMIT" "rc=$TEST_RC ${TEST_LINE:-(no summary line)}"

L_LIMIT=$(limit "$LLM_S" $((SUMMARY_S + 30)))
stage "llm decode (limit ${L_LIMIT} s)"
timeout -k "$KILL_S" "$L_LIMIT" "$PY" - > "$OUT/llm.log" 2>&1 <<'PYEOF'
# decode tokens/s of the Qwen2-style fixture on the GPU (a warm run, then a measured one), the
# tokens against onnxruntime's stored ones; every decode step of a padded length one graph replay
import numpy as np
from kn_runtime import Device, load_generator
from tests.paths import MODELS
for name in ("qwen2_optimum", "qwen2_genai_int4"):
    folder = MODELS / "llm" / name
    ref = np.load(folder / "reference.npz")
    gen = load_generator(folder, Device.cuda())
    prompt = ref["prompt_ids"][0].tolist()
    gen.generate([prompt], max_new_tokens=64)
    r = gen.generate([prompt], max_new_tokens=64)
    t = r.timing
    same = r.ids[0] == tuple(ref["tokens"][0][:64].tolist())
    print(f"llm {name}: prefill {t.prefill_tokens_per_s:.0f} tok/s, decode "
          f"{t.decode_tokens_per_s:.1f} tok/s, ttft {t.time_to_first_token_s * 1e3:.1f} ms, "
          f"tokens {'= onnxruntime' if same else 'DIFFER'}")
PYEOF
LLM_RC=$?
cat "$OUT/llm.log" | tail -n 8
done_stage "llm decode" "$L_LIMIT" "rc=$LLM_RC $(grep -c '^llm ' "$OUT/llm.log") models"

B_LIMIT=$(limit "$BENCH_S" "$SUMMARY_S")
stage "gpu_vs_peers (limit ${B_LIMIT} s)"
B_BUDGET=$(( B_LIMIT > 50 ? B_LIMIT - 25 : B_LIMIT / 2 ))  # its own stop, before the timeout's
timeout -k "$KILL_S" "$B_LIMIT" "$PY" benchmarks/gpu_vs_peers.py --out "$OUT" \
    --budget "$B_BUDGET" --runs 20 --seconds 1.0 --profile --no-final-table
BENCH_RC=$?
done_stage gpu_vs_peers "$B_LIMIT" "rc=$BENCH_RC$([ "$BENCH_RC" -eq 124 ] && echo ' (timed out)')"

stage "summary"
echo "tests: rc=$TEST_RC  $TEST_LINE  (KN_REQUIRE_CUDA=1: without a GPU every device check fails)"
echo "benchmark: rc=$BENCH_RC  (files in $OUT)"
if [ -f "$OUT/bench.jsonl" ]; then
    timeout -k 1 "$(limit 10)" "$PY" benchmarks/gpu_vs_peers.py --table-from "$OUT/bench.jsonl" \
        || cat "$OUT/bench_table.md"
else
    echo "no benchmark rows were written"
fi
echo
echo "| stage        | limit |  took | result |"
echo "|--------------|-------|-------|--------|"
printf '%s\n' "${ROWS[@]}"
printf '| %-12s | %5s | %5s | %s |\n' total "$TOTAL_S" "$(now)" "seconds"
}

main 2>&1 | tee -a "$OUT/check.log"
