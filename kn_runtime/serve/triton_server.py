"""The `tritonserver` binary of PyTriton's wheel run on a model repository: `launch_repository`
starts it (the Python backend's stub in this environment), `serve_repository_forever` is
`kn-serve --engine triton` (`triton.serve_forever`): the repository written to a temporary
folder, the server started, waited for, started again when it dies after serving, stopped on
Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from kn_graph.errors import ArgumentValueError
from kn_runtime.serve import triton_stub as tstub
from kn_runtime.serve.triton_stub import PIP_ADVICE, TritonUnavailableError

__all__ = ["MAX_RESTARTS", "RESTART_WINDOW_S", "launch_repository", "serve_repository_forever"]

log = logging.getLogger(__name__)


def _pytriton() -> ModuleType:
    """`pytriton.triton`, imported on first use so that `kn_runtime.serve` imports without it."""
    try:
        import pytriton.triton as pt
    except ImportError as exc:
        raise TritonUnavailableError(f"PyTriton is not installed ({exc}): {PIP_ADVICE}") from None
    return pt


def _check_ports(ports: dict[str, int | None]) -> None:
    """Each port free (as Triton binds it: all addresses, reuse allowed): PyTriton otherwise
    waits its whole startup timeout (120 s) for a server that exited at once."""
    for what, port in ports.items():
        if port is None:
            continue
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ArgumentValueError(f"{what}: expected a port number, found {port!r}")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as exc:
                raise TritonUnavailableError(f"{what} {port} is taken ({exc.strerror})") from None


def _instance_kind(device: str) -> tuple[str, list[int] | None]:
    """config.pbtxt's instance kind and GPUs for a server's `device` setting."""
    from kn_runtime.serve.loading import resolve_device

    if device == "best":
        device = "cpu" if resolve_device("best").kind == "cpu" else "cuda"
    if device == "cpu":
        return "KIND_CPU", None
    resolve_device(device)  # a bad name fails here, as it does in process
    index = device.partition(":")[2]
    return "KIND_GPU", [int(index)] if index else None


def _package_root() -> Path:
    """The folder that holds `kn_runtime`: model.py puts it on the stub's `sys.path`, so a
    checkout that is not installed serves too."""
    import kn_runtime

    return Path(kn_runtime.__file__).resolve().parents[1]


def serve_repository_forever(
    model_path: str | os.PathLike[str],
    *,
    http_port: int,
    grpc_port: int,
    metrics_port: int | None,
    name: str,
    device: str,
    ready_timeout_s: float = 900.0,
    **repository: Any,
) -> None:
    """`serve_forever`'s default: write the repository, start the server with its log beside
    it, say when the model is ready, wait for the server; Ctrl-C (which a terminal sends the
    server too) or SIGTERM stop it. A server that exits after it was ready is started again
    (MAX_RESTARTS), one that never gets ready is an error with its log's end."""
    from kn_runtime.serve.repository import write_repository

    _check_ports({"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port})
    kind, gpus = _instance_kind(device)
    work = Path(tempfile.mkdtemp(prefix="kn-serve-triton-"))
    try:
        write_repository(
            model_path,
            work / "repository",
            name=name,
            kind=kind,
            gpus=gpus,
            copy_model=False,
            python_path=_package_root(),
            **repository,
        )
        exits: list[float] = []  # when the server died after it had served
        while True:
            server_log = work / f"tritonserver-{len(exits)}.log"
            code = _run_server(
                work / "repository",
                server_log,
                name,
                ready_timeout_s,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
            )
            now = time.monotonic()
            exits = [t for t in exits if now - t < RESTART_WINDOW_S] + [now]
            if len(exits) > MAX_RESTARTS:
                raise TritonUnavailableError(
                    f"tritonserver exited {len(exits)} times in {RESTART_WINDOW_S:.0f} s, "
                    f"the last with status {code}:\n{_tail(server_log)}"
                )
            log.warning(
                "tritonserver exited with status %s; starting it again (its log ends:\n%s)",
                code,
                _tail(server_log, 1500),
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
"""`kn-serve --engine triton` starts a server that died after it had served again, up to
MAX_RESTARTS times within RESTART_WINDOW_S: Triton 2.51 does not restart a Python-backend
instance that dies (the restart was disabled in 24.06, triton-inference-server/server#7347),
and its next execution crashes the server (SIGSEGV, seen here when an instance was killed mid-
request; that request got a 500 "Stub process ... is not healthy" two seconds later)."""


def _run_server(
    repository: Path, server_log: Path, name: str, ready_timeout_s: float, **ports: Any
) -> int:
    """Start the server on `repository`, wait for `name`, serve until the server exits (return
    its status) or Ctrl-C / SIGTERM (raised, after stopping it). A server that does not get
    ready is an error (TritonUnavailableError)."""
    with server_log.open("wb") as out:
        proc = launch_repository(repository, stdout=out, **ports)
    try:
        _wait_ready(proc, ports["http_port"], name, server_log, ready_timeout_s)
        log.warning(
            "serving '%s' inside Triton: HTTP on port %d, gRPC on port %d (KServe v2; Ctrl-C "
            "stops)",
            name,
            ports["http_port"],
            ports["grpc_port"],
        )
        with _terminated_as_interrupt():
            return proc.wait()
    finally:
        _stop(proc)


def _tail(path: Path, size: int = 3000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-size:].decode(errors="replace")


def _wait_ready(
    proc: subprocess.Popen[bytes], port: int, name: str, server_log: Path, timeout_s: float
) -> None:
    """Until `GET /v2/models/<name>/ready` answers 200; a server that exits (a model that failed
    to load) or is not ready in `timeout_s` is an error with its log's end."""
    import http.client

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise TritonUnavailableError(
                f"tritonserver exited with status {proc.returncode} before '{name}' was ready:\n"
                f"{_tail(server_log)}"
            )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", f"/v2/models/{name}/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:  # not listening yet
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise TritonUnavailableError(
                f"'{name}' was not ready after {timeout_s:.0f} s:\n{_tail(server_log)}"
            )
        time.sleep(0.2)


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM (a process manager's stop) raises KeyboardInterrupt while waiting, as Ctrl-C
    does: both stop the server the same way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Ask the server to stop (SIGINT: it finishes what it runs, within its exit timeout);
    kill it when it does not."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _bundled_server() -> tuple[Path, Path]:
    """PyTriton's `tritonserver` folder and its shared libraries' folder."""
    _pytriton()
    from pytriton.utils.distribution import get_libs_path, get_root_module_path

    return get_root_module_path() / "tritonserver", Path(get_libs_path())


def launch_repository(
    repository: str | os.PathLike[str],
    *,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int | None = None,
    log_verbose: int = 0,
    exit_timeout_s: int = 30,
    stdout: Any = None,
) -> subprocess.Popen[bytes]:
    """Run PyTriton's bundled `tritonserver` on a model repository (Python backend; the stub
    runs in this environment, which needs kyanite) and return the process; stop it with
    `send_signal(SIGINT)` and `wait()`. Whether it is ready: tritonclient's `is_server_ready`."""
    dist, libs = _bundled_server()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonUnavailableError(f"PyTriton ships no Python-backend stub for Python {version}")
    work = Path(tempfile.mkdtemp(prefix="kn-triton-"))
    backend = work / "backends" / "python"
    backend.mkdir(parents=True)
    for f in (dist / "backends" / "python").iterdir():
        if f.is_file():
            (backend / f.name).symlink_to(f)
    (backend / "triton_python_backend_stub").symlink_to(stub)
    env = dict(os.environ)
    ld = [p for p in (tstub._libpython_dir(), str(libs), env.get("LD_LIBRARY_PATH")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    argv = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={Path(repository).resolve()}",
        f"--backend-directory={work / 'backends'}",
        f"--cache-directory={dist / 'caches'}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        *(
            ["--allow-metrics=false"]
            if metrics_port is None
            else [f"--metrics-port={metrics_port}"]
        ),
        f"--log-verbose={log_verbose}",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.STDOUT)
    weakref.finalize(proc, shutil.rmtree, work, True)
    return proc
