#!/usr/bin/env bash
# The test command of README.md, runnable on a fresh Debian machine: installs Debian's graphviz
# when `dot` is missing, makes .venv, installs the package with its test extra, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v dot >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq graphviz >/dev/null
fi
# libgomp1: the OpenMP runtime the oneDNN wheel of the test extra links (gcc brings it; slim images lack it)
if ! ldconfig -p 2>/dev/null | grep -q "libgomp\.so\.1 "; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgomp1 >/dev/null
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# nvrtc: CI compiles every generated kernel; serve-*: the serving tests start the real engines
.venv/bin/python -m pip install -q -e ".[test,sd,nvrtc,serve-ray,serve-triton]"
# PyTriton's Python-backend stub reads NumPy 2 arrays as zeros: under NumPy 2 it runs in a venv
# of its own with NumPy 1 (kn_runtime/serve/triton.py), made once
.venv/bin/python -c 'import sys; from kn_runtime.serve.triton_stub import _stub_env as s; s(None)' \
    2>/dev/null || .venv/bin/kn-serve triton-stub-env >/dev/null
# One pytest-xdist worker per core, at most 4: most tests are one Python thread, so two workers
# fill CI's 2 cores (the CPU tests took 135 s on one worker, 68 s on two); each worker holds its
# own models and caches, hence the cap. KN_TEST_WORKERS=0 runs everything in-process.
WORKERS=${KN_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
# The workers share the cores: the passive wait policy (threads sleep after a region), not the
# spinning one auto may pick when a worker starts beside an idle one (test_wait_policy.py runs
# the active policy in processes of its own)
export KN_CPU_WAIT=${KN_CPU_WAIT:-passive}
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist loadgroup "$@"  # xdist_group: one worker per engine
