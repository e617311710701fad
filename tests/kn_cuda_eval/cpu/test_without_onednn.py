"""The CPU backend without oneDNN, proved on every CI run: the GPU image has no `onednn-cpu-gomp`,
and any machine may lack it. A fresh interpreter with the library hidden (`KN_ONEDNN=0`, read by
`kn_cuda_eval.cpu.onednn.load_dnnl`) runs a convolution model and a GEMM model through
`Device.cpu()` against the reference executor: the convolutions run as the emulator's step, the
GEMMs with NumPy, one log line says why, and libdnnl is never mapped. (The whole suite runs that
way with `KN_ONEDNN=0 bash tests/run_tests.sh`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.paths import ROOT

SCRIPT = r"""
import json, logging, sys
from pathlib import Path

warnings = []


class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger("kn_cuda_eval").addHandler(Keep(logging.WARNING))

from kn_cuda_eval.cpu import onednn
from kn_runtime import Device
from tests.kn_cuda_eval.corpus import cases
from tests.kn_cuda_eval.helpers import assert_close

calls = {}
for name in ("resnet18_ts", "bert_ts"):  # convolutions; GEMMs (and split attention)
    for graph, feed, _ in cases(name):
        prepared = Device.cpu(threads=2).prepare(graph)
        want = Device.cpu(reference=True).prepare(graph).eval(feed)
        for k, (a, b) in enumerate(zip(prepared.eval(feed), want, strict=True)):
            assert_close(a, b, f"{name} output {k}")
        for row in prepared.profile(feed).rows:
            calls.setdefault(row.kind, set()).add(row.call)
maps = Path("/proc/self/maps").read_text()
print(json.dumps({
    "reason": onednn.available(),
    "calls": {k: sorted(v) for k, v in calls.items()},
    "warnings": warnings,
    "dnnl_mapped": "libdnnl" in maps,
}))
"""


def test_device_cpu_without_onednn_matches_the_reference() -> None:
    env = {**os.environ, "KN_ONEDNN": "0", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert "KN_ONEDNN='0'" in got["reason"], got["reason"]
    assert not got["dnnl_mapped"], "libdnnl was loaded although hidden"
    calls = got["calls"]
    assert calls["conv"] == ["numpy"], calls  # the emulator's convolution
    assert calls["matmul"] == ["numpy matmul"], calls  # np.matmul on the arena views
    assert not any("onednn" in c for cs in calls.values() for c in cs), calls
    notes = [w for w in got["warnings"] if "oneDNN is not usable" in w]
    assert len(notes) == 1 and "KN_ONEDNN" in notes[0], got["warnings"]
