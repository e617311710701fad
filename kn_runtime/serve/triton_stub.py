"""The environment PyTriton's Python-backend stub runs in (see `kn_runtime.serve.triton`): this
interpreter's libpython first on the loader's path, and under NumPy 2 a venv of this Python with
NumPy 1 (`kn-serve triton-stub-env`), checked before a server starts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kn_graph.errors import KnError

__all__ = [
    "PIP_ADVICE",
    "STUB_ENV_VAR",
    "STUB_PACKAGES",
    "TritonUnavailableError",
    "default_stub_env",
    "make_stub_env",
]

log = logging.getLogger(__name__)

PIP_ADVICE = "pip install 'kyanite[serve-triton]' (nvidia-pytriton, tritonclient[http,grpc])"
STUB_ENV_VAR = "KN_TRITON_STUB_ENV"
STUB_PACKAGES = ("numpy<2", "pyzmq")
"""What PyTriton's proxy needs inside the stub (its `_PROXY_REQUIRED_MODULES`), NumPy 1."""


class TritonUnavailableError(KnError):
    """PyTriton (or tritonclient) is not installed, or its server cannot run this model here;
    the message says what to install or set."""


def _numpy2() -> bool:
    return int(np.__version__.split(".")[0]) >= 2


# -- the stub's environment ---------------------------------------------------------------------


def default_stub_env() -> Path:
    """Where `start` looks for the stub's environment when `KN_TRITON_STUB_ENV` is unset."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kyanite" / f"triton-stub-{sys.version_info[0]}.{sys.version_info[1]}"


def _libpython_dir() -> str | None:
    """The folder of this interpreter's `libpython3.X.so.1.0` (None: a static build, whose stub
    can only use the system's library of the same version)."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    if libdir and soname and (Path(libdir) / soname).exists():
        return str(libdir)
    return None


def _probe(python: Path) -> dict[str, Any]:
    """Version, base prefix and package versions of another interpreter."""
    code = (
        "import json, sys\n"
        "out = {'version': list(sys.version_info[:3]), 'base_prefix': sys.base_prefix}\n"
        "for m in ('numpy', 'zmq'):\n"
        "    try:\n"
        "        out[m] = __import__(m).__version__\n"
        "    except Exception as e:\n"
        "        out[m] = None\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise TritonUnavailableError(f"the stub environment's {python} fails: {done.stderr[-400:]}")
    return json.loads(done.stdout)


def _stub_env(stub_env: str | os.PathLike[str] | None) -> Path | None:
    """The environment the stub runs in: None (this one) when this NumPy works there, else a
    checked venv of this Python with NumPy 1 (TritonUnavailableError saying how to make it)."""
    given = stub_env if stub_env is not None else os.environ.get(STUB_ENV_VAR)
    if given is None and not _numpy2():
        return None
    path = Path(given) if given else default_stub_env()
    python = path / "bin" / "python3"
    if not python.exists():
        raise TritonUnavailableError(
            f"PyTriton's Python-backend stub is built for NumPy 1: with NumPy {np.__version__} "
            "in its environment every input reaches the model as zeros and every output comes "
            f"back empty. Give the stub an environment of its own (no {python}): "
            f"`kn-serve triton-stub-env {path}` (a venv "
            f"of this Python with {' and '.join(STUB_PACKAGES)}), or set {STUB_ENV_VAR} to one, "
            "or install numpy<2 here"
        )
    got = _probe(python)
    problems = []
    if got["version"] != list(sys.version_info[:3]) or not os.path.samefile(
        got["base_prefix"], sys.base_prefix
    ):
        problems.append(
            f"it is a venv of Python {'.'.join(map(str, got['version']))} at "
            f"{got['base_prefix']}, not of this Python {sys.version.split()[0]} at "
            f"{sys.base_prefix} (the stub runs this Python's libpython)"
        )
    if got["numpy"] is None or int(got["numpy"].split(".")[0]) >= 2:
        problems.append(f"it needs numpy<2, found {got['numpy']}")
    if got["zmq"] is None:
        problems.append("it needs pyzmq")
    if problems:
        raise TritonUnavailableError(
            f"the stub environment {path}: {'; '.join(problems)} "
            f"(`kn-serve triton-stub-env {path}` makes one)"
        )
    return path


def make_stub_env(path: str | os.PathLike[str] | None = None) -> Path:
    """Create the stub's environment: a venv of this Python with numpy<2 and pyzmq (pip, so
    this needs the package index once). Returns its folder."""
    target = Path(path) if path is not None else default_stub_env()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(target)], check=True)
    pip = [str(target / "bin" / "python3"), "-m", "pip", "install", "--quiet", *STUB_PACKAGES]
    subprocess.run(pip, check=True)
    _stub_env(target)
    return target


@contextlib.contextmanager
def _server_environment(stub_env: Path | None) -> Iterator[None]:
    """While PyTriton starts `tritonserver` (it copies os.environ then): this interpreter's
    libpython first on LD_LIBRARY_PATH, the stub's environment as PyTriton's Python-backend
    environment."""
    import pytriton.server.triton_server as ts

    old_ld = os.environ.get("LD_LIBRARY_PATH")
    libdir = _libpython_dir()
    old_env = ts.get_triton_python_backend_python_env
    try:
        if libdir is not None:
            os.environ["LD_LIBRARY_PATH"] = libdir + (f":{old_ld}" if old_ld else "")
        else:
            log.info("a static Python: the Triton stub loads the system's libpython%s.%s",
                     *sys.version_info[:2])  # fmt: skip
        if stub_env is not None:
            ts.get_triton_python_backend_python_env = lambda: stub_env
        yield
    finally:
        ts.get_triton_python_backend_python_env = old_env
        if old_ld is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = old_ld
