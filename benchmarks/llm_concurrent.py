"""Concurrent generation requests on one model: continuous batching (`kn_runtime.generate.
Batcher`: the requests decoded together) against the same requests one after another (what
a server without it does with one model). Greedy; each request's tokens must equal the ones it
gets alone.

    .venv/bin/python benchmarks/llm_concurrent.py [--folder /work/bigmodels/qwen2_0.5b_optimum]
        [--requests 4] [--prompt 128] [--new 64] [--threads 2] [--rounds 2]

The folder is made by `benchmarks/_llm_models.py` (Qwen2-0.5B configuration, random weights).
Prompts: `--prompt` ids drawn with seed 0 for each request. Both ways run once first (plans and
compiled steps for every batch size met), then `--rounds` times each, alternating.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--folder", type=Path, default=Path("/work/bigmodels/qwen2_0.5b_optimum"))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not (args.folder / "model.onnx").exists():
        print(f"no model in {args.folder}: run benchmarks/_llm_models.py first")
        return 1

    import numpy as np

    from kn_runtime import Device, load_generator
    from kn_runtime.generate import Batcher

    gen = load_generator(args.folder, Device.cpu(threads=args.threads))
    rng = np.random.default_rng(0)
    n, new = args.requests, args.new
    prompts = [rng.integers(3, 500, args.prompt).tolist() for _ in range(n)]
    batcher = Batcher(gen, max_batch=n)

    def one_after_another() -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        out = [list(gen.generate([p], max_new_tokens=new).ids[0]) for p in prompts]
        return time.perf_counter() - t, out

    def concurrent() -> tuple[float, list[list[int]]]:
        out: list[list[int]] = [[] for _ in range(n)]

        def client(i: int) -> None:
            out[i] = [e.token_id for e in batcher.submit(prompts[i], max_new_tokens=new)]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t, out

    one_after_another()
    concurrent()
    print(
        f"{args.folder.name}: {n} requests x {new} tokens, prompt {args.prompt}, "
        f"{args.threads} threads"
    )
    print("| round | one after another s | tok/s | batched s | tok/s | speed-up | tokens equal |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for k in range(args.rounds):
        seq, alone = one_after_another()
        dt, got = concurrent()
        print(
            f"| {k + 1} | {seq:.2f} | {n * new / seq:.1f} | {dt:.2f} | {n * new / dt:.1f} | "
            f"{seq / dt:.2f}x | {got == alone} |",
            flush=True,
        )
    print(f"batched steps {batcher.steps}, largest batch {batcher.largest_batch}")
    batcher.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
