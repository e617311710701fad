#!/usr/bin/env bash
# Run on a machine with network access before a GPU check: puts the pure-Python diffusers wheel
# (the GPU machine has torch and transformers but no diffusers, and no network) into
# benchmarks/wheels/, which git ignores; the device tool carries it with carry=["benchmarks/wheels"].
# diffusers 0.42.1 is the version the fixtures were made with; its runtime needs (requests,
# filelock, numpy, huggingface_hub>=1.32, safetensors, regex, Pillow) are on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
mkdir -p wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: -d wheels diffusers==0.42.1
ls -l wheels
