"""`kn-generate`: stream text from an LLM folder, then print the speed and the peak memory.

    kn-generate                                   # the shipped tiny random-weight model
    kn-generate ~/qwen2-0.5b-onnx --prompt "Once upon a time" --max-new-tokens 128 --device cpu

Flags not given take the folder's suggestions (generation_config.json, genai's `search`), else
greedy decoding. Bad input ends with one line on stderr (`kn-generate: error: ...`), status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kn_graph._cli import OneLineParser, run_tool
from kn_runtime.generate.folder import SearchDefaults
from kn_runtime.generate.generator import TINY_LLM, load_generator

__all__ = ["build_parser", "main", "peak_rss_mib"]

DEFAULT_PROMPT = "Once upon a time"


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="kn-generate", description=__doc__.split("\n")[0])
    ap.add_argument("folder", nargs="?", type=Path, help=f"an LLM folder (default: {TINY_LLM})")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None, help="0: greedy (default)")
    ap.add_argument("--top-k", type=int, default=None, help="0: off")
    ap.add_argument("--top-p", type=float, default=None, help="1.0: off")
    ap.add_argument("--repetition-penalty", type=float, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "best"])
    return ap


def peak_rss_mib() -> float | None:
    """The process's peak resident memory (VmHWM of /proc/self/status), MiB; None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _sampling(args: object, d: SearchDefaults) -> dict[str, float | int]:
    """Flags given win; then the folder's suggestions (when it samples); then greedy."""
    sample = bool(d.do_sample)
    pick = {
        "temperature": (getattr(args, "temperature", None), d.temperature if sample else 0.0, 0.0),
        "top_k": (getattr(args, "top_k", None), d.top_k if sample else None, 0),
        "top_p": (getattr(args, "top_p", None), d.top_p if sample else None, 1.0),
        "repetition_penalty": (
            getattr(args, "repetition_penalty", None),
            d.repetition_penalty,
            1.0,
        ),
        "max_new_tokens": (getattr(args, "max_new_tokens", None), d.max_new_tokens, 64),
    }
    return {k: next(v for v in vals if v is not None) for k, vals in pick.items()}


def run(argv: list[str] | None) -> None:
    from kn_runtime.device import Device

    args = build_parser().parse_args(argv)
    device = {"cpu": Device.cpu, "cuda": Device.cuda, "best": Device.best}[args.device]()
    gen = load_generator(args.folder, device)
    print(f"model: {gen.spec.folder} ({gen.spec.layout}) on {device}", file=sys.stderr)
    stream = gen.stream(
        args.prompt, seed=args.seed, stop=args.stop, **_sampling(args, gen.spec.defaults)
    )  # type: ignore[arg-type]
    sys.stdout.write(args.prompt)
    for event in stream:
        sys.stdout.write(event.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    result = stream.result
    assert result is not None
    t = result.timing
    rss = peak_rss_mib()
    print(
        f"finish: {result.finish_reasons[0]}, {len(result.ids[0])} tokens\n"
        f"prefill: {t.prompt_tokens} tokens in {t.prefill_s:.3f} s "
        f"({t.prefill_tokens_per_s:.1f} tokens/s)\n"
        f"decode: {t.decode_tokens} tokens in {t.decode_s:.3f} s "
        f"({t.decode_tokens_per_s:.1f} tokens/s)\n"
        f"time to first token: {t.time_to_first_token_s:.3f} s\n"
        f"peak memory (VmHWM): {'n/a' if rss is None else f'{rss:.0f} MiB'}"
    )


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 on success, 2 on a bad folder or argument (one line on stderr), 130 on
    Ctrl-C."""
    return run_tool("kn-generate", lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
