"""Kernels compiled by the tests are cached under pytest's cache dir (compiled once per distinct
kernel; a fresh CI clone compiles each once), and the session ends with a kernel summary."""

from __future__ import annotations

import os

import pytest

from tests.kn_cuda_eval.helpers import STATS


def pytest_configure(config: pytest.Config) -> None:
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    if "KN_KERNEL_CACHE" not in os.environ and cache is not None:
        os.environ["KN_KERNEL_CACHE"] = str(cache.mkdir("kn_kernels"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not STATS.kernels:
        return
    top = sorted(STATS.kernels.items(), key=lambda kv: -max(kv[1][:2]))[:5]
    terminalreporter.write_line(
        f"kn_cuda_eval: {len(STATS.kernels)} distinct generated kernels compiled with NVRTC for sm_80 and sm_90; "
        "most registers (sm_80/sm_90, spill bytes): "
        + ", ".join(f"{n} {r80}/{r90} {sp}" for n, (r80, r90, sp) in top)
    )
