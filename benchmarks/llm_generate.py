"""Greedy generation with a real-size LLM folder: Kyanite's `load_generator` against
onnxruntime's own generation on the same folder.

* `-k fp32`, `-k 4bit` (the Optimum folders; the default): an onnxruntime loop with I/O binding
  that keeps the cache in place (onnxruntime-genai does not read Optimum folders, so the loop is
  onnxruntime's own: each step binds the previous step's `present.*` OrtValues as
  `past_key_values.*` — no copy of the cache through NumPy — and copies out only the logits).
* `-k genai_fp32`, `-k genai_int4` (onnxruntime-genai model-builder folders): onnxruntime-genai's
  `og.Generator` greedy search (`do_sample=False`, `min_length = max_length = prompt + new`,
  `append_tokens`, then `generate_next_token` until done), its session given the same threads
  by `og.Config.overlay` of `model.decoder.session_options` (`intra_op_num_threads`,
  `inter_op_num_threads` 1). That side runs under `/work/venv-genai/bin/python` (made as
  tests/models/make_llm_models.py's docstring says; onnxruntime-genai is not in .venv). Its
  prefill is `append_tokens` plus the first `generate_next_token` (which only picks the token),
  its decode the later `generate_next_token` calls (one forward step each).

    .venv/bin/python benchmarks/llm_generate.py [--cache /work/bigmodels]
        [-k fp32|4bit|genai_fp32|genai_int4 ...] [--prompt 512] [--new 128] [--threads 2]

The folders are made by `benchmarks/_llm_models.py` (Qwen2-0.5B configuration, random weights).
Each side runs in a subprocess of its own (`--side`), so its peak RSS (VmHWM) is its own: load,
a warm-up generation of the same lengths (ours: plans and compiled steps of every binding it
meets; onnxruntime: its first runs), then `--rounds` measured ones, the two sides taking turns
(this VM's speed drifts by tens of percent within minutes: one side measured after the other
compared two machines). Figures are the medians of the rounds; the decode ratio of each round
is printed too. Prompt: `--prompt` ids drawn from
the tokenizer's range (seed 0). Prints prefill tokens/s (the prompt's forward pass), decode
tokens/s (the steps after the first token), time to first token, peak RSS, whether the greedy
tokens are identical, and the ratios (ours/onnxruntime of throughput: >= 1.0 is as fast).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "fp32": "qwen2_0.5b_optimum",
    "4bit": "qwen2_0.5b_optimum_4bit",
    "genai_fp32": "qwen2_0.5b_genai",
    "genai_int4": "qwen2_0.5b_genai_int4",
}
PEER = {"fp32": "ort", "4bit": "ort", "genai_fp32": "genai", "genai_int4": "genai"}
"""The side each folder is compared with: `_ort`'s loop or `_genai`'s og.Generator."""
PEER_LABEL = {"ort": "onnxruntime", "genai": "onnxruntime-genai"}
GENAI_PYTHON = "/work/venv-genai/bin/python"
Runner = Callable[[], dict]
PAUSE_S = 1.0
"""Idle seconds before each measured generation: onnxruntime's intra-op threads spin for a while
after a run, and on 2 cores they took the other side's first steps (a round at 0.73x, the next
at 1.36x)."""


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _prompt(n: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(0).integers(3, 512, n).tolist()


def _ours(folder: Path, prompt: list[int], new: int, threads: int) -> tuple[float, Runner]:
    from kn_runtime import Device
    from kn_runtime.generate import load_generator

    gen = load_generator(folder, device=Device.cpu(threads=threads))
    t = time.perf_counter()
    gen.generate([prompt], max_new_tokens=new)
    warm = time.perf_counter() - t

    def run() -> dict:
        r = gen.generate([prompt], max_new_tokens=new)
        tm = r.timing
        return {
            "tokens": list(r.ids[0]),
            "prefill_tok_s": tm.prefill_tokens_per_s,
            "decode_tok_s": tm.decode_tokens_per_s,
            "ttft_s": tm.time_to_first_token_s,
        }

    return warm, run


def _ort(folder: Path, prompt: list[int], new: int, threads: int) -> tuple[float, Runner]:
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(
        str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in sess.get_inputs()}
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]

    def run() -> tuple[list[int], float, float, float]:
        t0 = time.perf_counter()
        ids = np.array([prompt], np.int64)
        mask = np.ones((1, len(prompt)), np.int64)
        cache = {
            p.name: ort.OrtValue.ortvalue_from_numpy(
                np.zeros((1, p.shape[1], 0, p.shape[3]), np.float32)
            )
            for p in pasts
        }
        out, prefill, decode = [], 0.0, 0.0
        ttft = 0.0
        for step in range(new):
            t = time.perf_counter()
            io = sess.io_binding()
            io.bind_cpu_input("input_ids", ids)
            io.bind_cpu_input("attention_mask", mask)
            if "position_ids" in names:
                pos = np.arange(mask.shape[1] - ids.shape[1], mask.shape[1], dtype=np.int64)
                io.bind_cpu_input("position_ids", pos[None])
            for n, v in cache.items():
                io.bind_ortvalue_input(n, v)
            io.bind_output("logits", "cpu")
            for n in cache:
                io.bind_output(n.replace("past_key_values", "present"), "cpu")
            sess.run_with_iobinding(io)
            vals = dict(zip([o.name for o in sess.get_outputs()], io.get_outputs(), strict=True))
            tok = int(np.argmax(vals["logits"].numpy()[0, -1]))
            dt = time.perf_counter() - t
            if step == 0:
                prefill, ttft = dt, time.perf_counter() - t0
            else:
                decode += dt
            out.append(tok)
            cache = {n: vals[n.replace("past_key_values", "present")] for n in cache}
            ids = np.array([[tok]], np.int64)
            mask = np.ones((1, mask.shape[1] + 1), np.int64)
        return out, prefill, decode, ttft

    return _warm_and_measured(run, len(prompt), new)


def _warm_and_measured(
    run: Callable[[], tuple[list[int], float, float, float]], prompt: int, new: int
) -> tuple[float, Runner]:
    """A peer's `run` (tokens, prefill s, decode s, time to first token s): the seconds of a
    first run, and the measured one's figures."""
    t = time.perf_counter()
    run()
    warm = time.perf_counter() - t

    def measured() -> dict:
        toks, prefill, decode, ttft = run()
        return {
            "tokens": toks,
            "prefill_tok_s": prompt / prefill,
            "decode_tok_s": (new - 1) / decode,
            "ttft_s": ttft,
        }

    return warm, measured


def _genai(folder: Path, prompt: list[int], new: int, threads: int) -> tuple[float, Runner]:
    """onnxruntime-genai's greedy search (as tests/models/make_llm_models.py's `greedy_genai`),
    with the decoder session's threads set through an overlay of genai_config.json."""
    import numpy as np
    import onnxruntime_genai as og

    cfg = og.Config(str(folder))
    opts = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": opts}}}))
    model = og.Model(cfg)
    ids = np.array([prompt], np.int64)
    total = len(prompt) + new

    def run() -> tuple[list[int], float, float, float]:
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=total, min_length=total)
        gen = og.Generator(model, params)
        t = time.perf_counter()
        gen.append_tokens(ids)  # the prompt's forward pass
        gen.generate_next_token()  # picks the first token from its logits
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t2 = time.perf_counter()
        toks = [int(x) for x in gen.get_sequence(0)[len(prompt) :]]
        return toks, t1 - t, t2 - t1, t1 - t0

    return _warm_and_measured(run, len(prompt), new)


SIDES = {"ours": _ours, "ort": _ort, "genai": _genai}


def _side(args: argparse.Namespace) -> int:
    """One side in its own process: load and warm up, say READY, then one measured generation
    per `go` line on stdin (RESULT + JSON), until `quit` (then its peak RSS)."""
    folder = args.cache / FOLDERS[args.side[1]]
    prompt = _prompt(args.prompt)
    fn = SIDES[args.side[0]]
    warm, run = fn(folder, prompt, args.new, args.threads)
    print("READY " + json.dumps({"first_run_s": warm}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        time.sleep(PAUSE_S)  # the other side's pool may still spin after its turn
        print("RESULT " + json.dumps(run()), flush=True)
    print("PEAK " + json.dumps({"peak_rss_mb": _peak_rss_mb()}), flush=True)
    return 0


def _reply(p: subprocess.Popen, tag: str) -> dict:  # type: ignore[type-arg]
    """The JSON of the side's next line starting with `tag`."""
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise RuntimeError(f"the side process ended before {tag} (exit {p.wait()})")


def _compare(name: str, args: argparse.Namespace) -> tuple[dict, dict, list] | None:
    """Both sides loaded (one after the other), then `--rounds` measured generations taking
    turns (who goes first alternates), so a drift of the machine's speed hits both alike.
    Per side: the median of each figure; `pairs`: each round's (ours, the peer's)."""
    peer = PEER[name]
    procs = {}
    got: dict[str, dict] = {}
    for side in ("ours", peer):
        python = GENAI_PYTHON if side == "genai" else sys.executable
        cmd = [python, __file__, "--side", side, name, "--cache", str(args.cache)]
        cmd += ["--prompt", str(args.prompt), "--new", str(args.new)]
        cmd += ["--threads", str(args.threads)]
        procs[side] = p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
        )
        got[side] = {**_reply(p, "READY"), "runs": []}
    pairs = []
    for k in range(args.rounds):
        order = ("ours", peer) if k % 2 == 0 else (peer, "ours")
        for side in order:
            p = procs[side]
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            got[side]["runs"].append(_reply(p, "RESULT"))
        pairs.append((got["ours"]["runs"][-1], got[peer]["runs"][-1]))
    for side, p in procs.items():
        assert p.stdin is not None
        p.stdin.write("quit\n")
        p.stdin.flush()
        got[side].update(_reply(p, "PEAK"))
        p.wait()
    out = []
    for side in ("ours", peer):
        runs = got[side]["runs"]
        med = {k: statistics.median(r[k] for r in runs) for k in FIGURES}
        out.append(
            {
                **med,
                "tokens": runs[-1]["tokens"],
                "peak_rss_mb": got[side]["peak_rss_mb"],
                "first_run_s": got[side]["first_run_s"],
                "same": all(r["tokens"] == runs[0]["tokens"] for r in runs),
            }
        )
        r = out[-1]
        print(
            f"{name:10} {side:5} prefill {r['prefill_tok_s']:8.1f} tok/s  decode "
            f"{r['decode_tok_s']:6.2f} tok/s  ttft {r['ttft_s']:6.2f} s  peak RSS "
            f"{r['peak_rss_mb']:7.0f} MB  first run {r['first_run_s']:6.1f} s (median of "
            f"{len(runs)})",
            flush=True,
        )
    return out[0], out[1], pairs


FIGURES = ("prefill_tok_s", "decode_tok_s", "ttft_s")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("-k", dest="only", action="append", choices=sorted(FOLDERS))
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="measured generations per side")
    ap.add_argument("--side", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        return _side(args)
    rows = []
    for name in args.only or ["fp32", "4bit"]:
        if not (args.cache / FOLDERS[name] / "model.onnx").exists():
            print(f"{name}: no folder in {args.cache}: run benchmarks/_llm_models.py first")
            continue
        if PEER[name] == "genai" and not Path(GENAI_PYTHON).exists():
            print(f"{name}: no {GENAI_PYTHON} (see tests/models/make_llm_models.py's docstring)")
            continue
        o, t, pairs = _compare(name, args)
        same = o["tokens"] == t["tokens"] and o["same"] and t["same"]
        a_toks, b_toks = o["tokens"], t["tokens"]  # an eos may end a side's row early
        agree = next(
            (i for i, (a, b) in enumerate(zip(a_toks, b_toks, strict=False)) if a != b),
            None if len(a_toks) == len(b_toks) else min(len(a_toks), len(b_toks)),
        )
        rows.append((name, o, t, same, agree, pairs))
    print(
        f"\nQwen2-0.5B configuration, random weights; prompt {args.prompt} tokens, "
        f"{args.new} greedy tokens, {args.threads} threads each\n"
    )
    print("| model | side | prefill tok/s | decode tok/s | TTFT s | peak RSS MB | first run s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, o, t, _, _, _ in rows:
        for side, r in (("Kyanite", o), (PEER_LABEL[PEER[name]], t)):
            print(
                f"| {name} | {side} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
                f"{r['ttft_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['first_run_s']:.1f} |"
            )
    print()
    for name, o, t, same, agree, pairs in rows:
        per = ", ".join(f"{a['decode_tok_s'] / b['decode_tok_s']:.2f}" for a, b in pairs)
        print(
            f"{name}: prefill {o['prefill_tok_s'] / t['prefill_tok_s']:.2f}x, decode "
            f"{o['decode_tok_s'] / t['decode_tok_s']:.2f}x (per round: {per}), peak RSS "
            f"{o['peak_rss_mb'] / t['peak_rss_mb']:.2f}x of {PEER_LABEL[PEER[name]]}'s; greedy "
            "tokens " + ("identical" if same else f"differ from token {agree}")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
