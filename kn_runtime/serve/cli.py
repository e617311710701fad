"""`kn-serve`: serve an ONNX model over HTTP on Ray Serve or Triton, or write a Triton model
repository for a Triton server of your own.

    kn-serve model.onnx --engine ray --replicas 2 --port 8000      # Ray Serve (extra serve-ray)
    kn-serve model.onnx --engine triton --replicas 2   # inside Triton's server (serve-triton)
    kn-serve model.onnx --engine pytriton   # the model in this process, bound through PyTriton
    kn-serve bert.onnx --warmup seq=128   # plan batch sizes 1-16 at 128 tokens before serving
    kn-serve export-triton model.onnx repo/ --max-batch-size 16    # a model repository
    kn-serve generate [FOLDER] --engine ray --port 8000   # an LLM folder (default: the tiny LLM)
    kn-serve generate [FOLDER] --engine triton --grpc-port 8001   # decoupled, streamed over gRPC
    kn-serve triton-stub-env [DIR]   # NumPy 2 here: the environment PyTriton's binding needs

Requests: JSON, `.npy` or `.npz` bodies (`kn_runtime.serve.codec`) on Ray; the KServe v2
protocol (tritonclient, HTTP and gRPC) on Triton; for `generate`, JSON `{"prompt": ...,
"stream": true}` (`kn_runtime.serve.generation`). Bad arguments end with one line on stderr
(`kn-serve: error: ...`), status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kn_graph._cli import CliError, OneLineParser, run_tool

__all__ = ["build_parser", "main"]

EXPORT = "export-triton"
STUB_ENV = "triton-stub-env"
GENERATE = "generate"


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="kn-serve", description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="an ONNX file")
    ap.add_argument(
        "--engine",
        choices=["ray", "triton", "pytriton"],
        default="ray",
        help="ray: a Serve deployment; triton: the model inside the Triton server PyTriton's "
        "wheel carries (a model repository); pytriton: the model in this process, bound "
        "through PyTriton",
    )
    ap.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    ap.add_argument("--grpc-port", type=int, default=8001, help="Triton's gRPC port (8001)")
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="Ray: replicas; triton: instances, each a process of its own (default 1)",
    )
    ap.add_argument("--address", default=None, help="Ray: a running cluster (default: local)")
    ap.add_argument(
        "--host", default="127.0.0.1", help="Ray: where HTTP listens (0.0.0.0: every interface)"
    )
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per replica (1)")
    ap.add_argument("--max-batch-size", type=int, default=16, help="dynamic batching cap (16)")
    _batch_wait_argument(
        ap, "a free replica takes what is queued; requests that arrive while it runs queue anyway"
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "best"])
    _warmup_argument(ap, "plan every batch size before serving")
    _ingress_argument(ap)
    return ap


def _batch_wait_argument(ap: OneLineParser, zero: str) -> None:
    ap.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help=f"longest wait to fill a batch, Triton's max_queue_delay (0: {zero})",
    )


def _warmup_argument(ap: OneLineParser, what: str) -> None:
    ap.add_argument(
        "--warmup",
        nargs="*",
        metavar="SYMBOL=SIZE",
        default=None,
        help=f"{what}; a model with other symbolic sizes names them (--warmup seq=128)",
    )


def _warmup(values: list[str] | None) -> bool | dict[str, int]:
    """`--warmup` -> True, `--warmup seq=128` -> {"seq": 128}, no flag -> False."""
    if values is None:
        return False
    if not values:
        return True
    sizes = {}
    for item in values:
        name, _, size = item.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise CliError(f"--warmup: expected SYMBOL=SIZE with a positive size, found {item!r}")
        sizes[name] = int(size)
    return sizes


def _ingress_argument(ap: OneLineParser) -> None:
    from kn_runtime.serve.ray_serve import INGRESS  # no Ray imported: it is loaded when used

    ap.add_argument(
        "--ingress",
        choices=INGRESS,
        default="proxy",
        help="Ray: how HTTP reaches the replicas: Serve's proxy actor, or HAProxy forwarding to "
        "replicas that serve HTTP themselves (far less per request; with several nodes, "
        "--host 0.0.0.0)",
    )


def build_export_parser() -> OneLineParser:
    ap = OneLineParser(prog=f"kn-serve {EXPORT}", description="write a Triton model repository")
    ap.add_argument("model", type=Path, help="an ONNX file")
    ap.add_argument("out", type=Path, help="the repository folder (created)")
    ap.add_argument("--name", default="kyanite", help="the model's name in the repository")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--instances", type=int, default=1, help="instance_group count")
    ap.add_argument("--kind", default="KIND_CPU", choices=["KIND_CPU", "KIND_GPU"])
    ap.add_argument(
        "--link", action="store_true", help="refer to the model file instead of copying it"
    )
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per instance (1)")
    _batch_wait_argument(ap, "a free instance takes what is queued")
    _warmup_argument(ap, "each instance plans every batch size when Triton loads it")
    return ap


def build_generate_parser() -> OneLineParser:
    ap = OneLineParser(
        prog=f"kn-serve {GENERATE}", description="serve text generation, streamed or not"
    )
    ap.add_argument(
        "folder", type=Path, nargs="?", default=None, help="an LLM folder (default: the tiny LLM)"
    )
    ap.add_argument(
        "--engine",
        choices=["ray", "triton"],
        default="ray",
        help="ray: NDJSON over HTTP; triton: decoupled, one response per token over gRPC",
    )
    ap.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    ap.add_argument("--grpc-port", type=int, default=8001, help="Triton: gRPC port (8001)")
    ap.add_argument("--address", default=None, help="Ray: a running cluster (default: local)")
    ap.add_argument(
        "--host", default="127.0.0.1", help="Ray: where HTTP listens (0.0.0.0: every interface)"
    )
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (1)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "best"])
    _ingress_argument(ap)
    return ap


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise CliError(f"{flag}: expected a positive integer, found {value}")


def _wait_us(ms: float) -> int:
    """`--batch-wait-ms` in microseconds, Triton's unit."""
    if not ms >= 0:  # NaN too
        raise CliError(f"--batch-wait-ms: expected a wait >= 0, found {ms}")
    return round(ms * 1000)


def run(argv: list[str]) -> None:
    if argv and argv[0] == STUB_ENV:
        if len(argv) > 2:
            raise CliError(f"usage: kn-serve {STUB_ENV} [DIR]")
        from kn_runtime.serve.triton import STUB_ENV_VAR, make_stub_env

        path = make_stub_env(argv[1] if len(argv) == 2 else None)
        print(f"the Triton stub environment is {path} (found there, or by {STUB_ENV_VAR}={path})")
        return
    if argv and argv[0] == GENERATE:
        gen = build_generate_parser().parse_args(argv[1:])
        _positive(gen.threads, "--threads")
        if gen.folder is not None and not gen.folder.is_dir():
            raise CliError(f"folder: '{gen.folder}' is not a folder")
        if gen.engine == "triton":
            from kn_runtime.serve.triton import serve_generation_forever as triton_generation

            triton_generation(
                gen.folder,
                http_port=gen.port,
                grpc_port=gen.grpc_port,
                threads=gen.threads,
                device=gen.device,
            )
            return
        from kn_runtime.serve.ray_generation import serve_generation_forever

        serve_generation_forever(
            gen.folder,
            port=gen.port,
            threads=gen.threads,
            address=gen.address,
            device=gen.device,
            host=gen.host,
            ingress=gen.ingress,
        )
        return
    if argv and argv[0] == EXPORT:
        args = build_export_parser().parse_args(argv[1:])
        for flag in ("max_batch_size", "instances", "threads"):
            _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
        from kn_runtime.serve.repository import write_repository

        out = write_repository(
            args.model,
            args.out,
            name=args.name,
            max_batch_size=args.max_batch_size,
            instances=args.instances,
            kind=args.kind,
            copy_model=not args.link,
            threads=args.threads,
            max_queue_delay_us=_wait_us(args.batch_wait_ms),
            warmup=_warmup(args.warmup),
        )
        print(f"wrote the Triton model repository {out}")
        return
    args = build_parser().parse_args(argv)
    for flag in ("replicas", "threads", "max_batch_size"):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    if not args.model.is_file():
        raise CliError(f"model: '{args.model}' is not a file")
    wait_s = _wait_us(args.batch_wait_ms) / 1e6
    warmup = _warmup(args.warmup)
    if args.engine == "ray":
        from kn_runtime.serve.ray_serve import serve_forever

        serve_forever(
            args.model,
            port=args.port,
            replicas=args.replicas,
            threads=args.threads,
            max_batch_size=args.max_batch_size,
            batch_wait_timeout_s=wait_s,
            address=args.address,
            device=args.device,
            host=args.host,
            ingress=args.ingress,
            warmup=warmup,
        )
    else:
        from kn_runtime.serve.triton import serve_forever as triton_forever

        if args.engine == "pytriton" and args.replicas > 1:
            raise CliError(
                "--replicas: PyTriton's instances share one model in this process; "
                "--engine triton runs instances that evaluate in parallel"
            )
        triton_forever(
            args.model,
            http_port=args.port,
            grpc_port=args.grpc_port,
            threads=args.threads,
            max_batch_size=args.max_batch_size,
            max_queue_delay_us=_wait_us(args.batch_wait_ms),
            instances=args.replicas,
            device=args.device,
            warmup=warmup,
            in_process=args.engine == "pytriton",
        )


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when the server stops, 2 on a bad argument or model (one line on stderr),
    130 on Ctrl-C."""
    return run_tool(
        "kn-serve", lambda: run(sys.argv[1:] if argv is None else argv), interrupted="stopped"
    )


if __name__ == "__main__":
    sys.exit(main())
