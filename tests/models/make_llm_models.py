#!/usr/bin/env python3
"""Developer-run generator of the text-generation fixtures in ``tests/models/llm/``.

NOT run by CI.  It makes tiny random-weight Llama-, Qwen2- and GPT-2-configured Hugging Face
models (2 layers, hidden 64, 4 heads, 2 KV heads where the architecture has them, vocab 512,
256 positions), a tiny byte-level BPE tokenizer trained on the fixed English text below, and
exports them with the tools people actually use, one folder per format:

* ``<arch>_optimum/``: Optimum's ONNX exporter (``optimum-onnx``), task
  ``text-generation-with-past`` -> ``model.onnx`` (``input_ids``, ``attention_mask``,
  ``position_ids``, ``past_key_values.{i}.key/value`` -> ``logits``, ``present.{i}.key/value``).
* ``llama_optimum_merged/``: the layout older Optimum releases wrote, ``decoder_model_merged.onnx``
  (Optimum's own ``merge_decoders`` of a no-past and a with-past export; ``use_cache_branch``
  input, one If).
* ``qwen2_genai/`` (fp32) and ``qwen2_genai_int4/``: onnxruntime-genai's model builder
  (``genai_config.json``, GroupQueryAttention, MatMulNBits for int4).

Every folder gets ``tokenizer.json``/``tokenizer_config.json``, the exporter's ``config.json`` /
``generation_config.json``, a ``README.md`` saying how it was made, and ``reference.npz``: greedy
continuations computed by onnxruntime (layout in ``NPZ_LAYOUT``).  ``manifest.json`` describes
every folder.  The random weights get an LM head scaled so that greedy decoding is decided by
margins far above float noise (the smallest top-1 minus top-2 margin is recorded).

Why its own venv: ``optimum-onnx`` 0.1.0 (the newest release) requires ``transformers<4.58``,
while ``/work/venv-fx`` has transformers 5.24 for make_models.py.  So this runs in
``/work/venv-opt``, a venv whose own site-packages hold transformers 4.57.6, optimum 2.1.0,
optimum-onnx 0.1.0, onnxruntime 1.32.0, onnxruntime-genai 0.18.0, and which falls through to
venv-fx's (torch 2.13 CPU, onnx) by a ``.pth`` file::

    /work/venv-fx/bin/python -m venv /work/venv-opt
    echo /work/venv-fx/lib/python3.11/site-packages > \
        /work/venv-opt/lib/python3.11/site-packages/zz_venv_fx.pth
    /work/venv-opt/bin/pip install --ignore-installed --no-deps transformers==4.57.6 \
        tokenizers==0.22.2 huggingface_hub==0.36.2 optimum==2.1.0 optimum-onnx==0.1.0 \
        requests certifi charset_normalizer urllib3 onnxruntime-genai==0.18.0
    /work/venv-opt/bin/pip install onnxruntime==1.32.0

and onnxruntime-genai's builder (0.18.0 imports transformers-5-only classes and needs ``onnx_ir``)
runs in ``/work/venv-genai``, likewise a venv falling through to venv-fx (transformers 5.24)::

    /work/venv-fx/bin/python -m venv /work/venv-genai
    echo /work/venv-fx/lib/python3.11/site-packages > \
        /work/venv-genai/lib/python3.11/site-packages/zz_venv_fx.pth
    /work/venv-genai/bin/pip install onnxruntime-genai==0.18.0 onnxruntime==1.32.0 onnx-ir==1.1.0

    /work/venv-opt/bin/python tests/models/make_llm_models.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_greedy import greedy_ort

GENAI_PYTHON = "/work/venv-genai/bin/python"
OUT = Path(__file__).resolve().parent / "llm"
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, MAX_POS = 512, 64, 2, 4, 2, 128, 256
NEW_TOKENS = 64
EOS, BOS, PAD = "<|endoftext|>", "<|bos|>", "<|pad|>"  # ids 0, 1, 2
PROMPT = "The quick brown fox jumps over the lazy dog because"
PROMPTS_BATCH = ["Once upon a time there was a little", "The weather today is"]
MIN_MARGIN = 0.005  # smallest top-1 minus top-2 logit accepted (float noise is ~1e-5)
LM_HEAD_SCALE = 50.0  # the 0.02-std init gives logits std ~0.15; x50 gives ~8: decisive argmaxes

NPZ_LAYOUT = {
    "prompt_ids": "[1, S] int64, tokenizer.json's encoding of manifest's prompt",
    "tokens": "[1, 64] int64, greedy new tokens (argmax of the last position's logits)",
    "prefill_logits": "[1, S, V] float32, logits of the first step (the whole prompt)",
    "margins": "[64] float32, top-1 minus top-2 logit of each step (min over rows)",
    "batch_ids": "[2, S2] int64, the two batch prompts, left-padded with pad_token_id",
    "batch_mask": "[2, S2] int64, 1 = token, 0 = left padding",
    "batch_tokens": "[2, 64] int64, greedy new tokens per row",
    "batch_prefill_logits": "[2, V] float32, logits of the first step at the last position",
    "batch_margins": "[64] float32, min over the two rows of the top-1 minus top-2 margin",
    "batch_tokens_ort_loop": "genai folders only: [2, 64] the plain onnxruntime loop's batch "
    "tokens (GroupQueryAttention with a left-padded prompt: the padded row differs from og's)",
}

TEXT = """\
The sun rose slowly over the quiet village, and the baker opened his shop before anyone else was
awake. He mixed flour, water and salt, and the smell of fresh bread soon filled the narrow street.
Children walked to school in small groups, talking about the games they would play after lessons.
Once upon a time there was a little fox who lived at the edge of a great forest. Every morning the
fox ran down to the river to drink, and every evening it returned to its den under the old oak tree.
The weather today is cold and clear, with a light wind from the north and no rain expected before
the weekend. Farmers are bringing in the last of the harvest, and the markets are full of apples,
pears and pumpkins. The quick brown fox jumps over the lazy dog because the dog is always asleep in
the warm afternoon light. A library is a place where people come to read, to learn and to think; its
shelves hold stories of kings and sailors, of cities and mountains, of numbers and stars.
Computers follow instructions written by programmers, one small step at a time, and a program that
works today may need care tomorrow when the world around it changes.
"""


def train_tokenizer(add_bos: bool) -> Tokenizer:
    """Byte-level BPE with VOCAB entries (3 specials, 256 bytes, merges) so that the tokenizer
    and the model agree on the vocabulary size; ``add_bos`` mirrors Llama's tokenizer, which
    prepends BOS (Qwen2's and GPT-2's do not)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS, BOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer vocab {tok.get_vocab_size()} != {VOCAB}: add text")
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 1)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def hf_model(arch: str, seed: int):
    """A random-weight transformers model of ``arch`` with the LM head scaled and its rows of the
    special tokens zeroed (for GPT-2 the head is tied to the token embedding, so the embedding is
    scaled instead)."""
    import transformers as tf

    torch.manual_seed(seed)
    ids = {"bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 2}
    match arch:
        case "llama" | "qwen2":
            cfg_cls = tf.LlamaConfig if arch == "llama" else tf.Qwen2Config
            cls = tf.LlamaForCausalLM if arch == "llama" else tf.Qwen2ForCausalLM
            cfg = cfg_cls(
                vocab_size=VOCAB,
                hidden_size=HIDDEN,
                intermediate_size=INTER,
                num_hidden_layers=LAYERS,
                num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS,
                max_position_embeddings=MAX_POS,
                tie_word_embeddings=False,
                **ids,
            )
            model = cls(cfg).eval()
            head = model.lm_head.weight
        case "gpt2":
            # GPT-2's head is tied to the token embedding: at the 0.02 init the current token's
            # own embedding dominates the last hidden state and greedy decoding repeats the
            # last prompt token forever; a 0.2 init gives varied continuations, and the final
            # LayerNorm's scale (not the shared embedding) sets the logits' size.
            cfg = tf.GPT2Config(
                vocab_size=VOCAB,
                n_embd=HIDDEN,
                n_layer=LAYERS,
                n_head=HEADS,
                n_positions=MAX_POS,
                initializer_range=0.2,
                **ids,
            )
            model = tf.GPT2LMHeadModel(cfg).eval()
            head = model.transformer.wte.weight
            with torch.no_grad():
                model.transformer.ln_f.weight.mul_(LM_HEAD_SCALE * 0.02 / 0.2)
        case _:
            raise ValueError(arch)
    with torch.no_grad():
        if arch != "gpt2":
            head.mul_(LM_HEAD_SCALE)
        head[:3] = 0.0  # eos, bos, pad: logit 0, far below the top, so never generated
    return model


def save_hf(arch: str, seed: int, tok: Tokenizer, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    hf_model(arch, seed).save_pretrained(folder)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left"
    )
    fast.save_pretrained(folder)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).exists() and not (dst / name).exists():
            shutil.copy(src / name, dst / name)


def export_optimum(hf: Path, out: Path) -> str:
    """Optimum's CLI path (``optimum-cli export onnx --task text-generation-with-past``)."""
    from optimum.exporters.onnx import main_export

    main_export(str(hf), output=str(out), task="text-generation-with-past", device="cpu")
    return "model.onnx"


def export_optimum_merged(hf: Path, out: Path) -> str:
    """The layout of Optimum before 1.2x (``decoder_model_merged.onnx``): the no-past decoder
    (``use_past_in_inputs=False``, still returning ``present.*``) and the with-past decoder,
    exported by Optimum's ``export`` with its own ONNX configs and fused by Optimum's
    ``merge_decoders`` into one graph whose If on ``use_cache_branch`` picks the branch."""
    from optimum.exporters.onnx import export
    from optimum.exporters.tasks import TasksManager
    from optimum.onnx import merge_decoders
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf).eval()
    make_cfg = TasksManager.get_exporter_config_constructor(
        "onnx", model, task="text-generation-with-past", library_name="transformers"
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for past_in in (False, True):
            cfg = make_cfg(model.config, use_past=True, use_past_in_inputs=past_in)
            paths.append(Path(tmp, f"decoder{'_with_past' if past_in else ''}_model.onnx"))
            export(model, cfg, paths[-1], opset=cfg.DEFAULT_ONNX_OPSET)
        merge_decoders(paths[0], paths[1], save_path=out / "decoder_model_merged.onnx")
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return "decoder_model_merged.onnx"


def export_genai(hf: Path, out: Path, precision: str) -> str:
    """onnxruntime-genai's model builder, as its documentation runs it, in GENAI_PYTHON: the
    builder of 0.18 imports classes that only transformers 5 has (Qwen3_5...)."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [GENAI_PYTHON, "-m", "onnxruntime_genai.models.builder"]
        cmd += ["-i", str(hf), "-o", str(out), "-p", precision, "-e", "cpu", "-c", cache]
        subprocess.run(cmd, check=True)
    return "model.onnx"


# ---------------------------------------------------------------- reference generation


def greedy_genai(folder: Path, ids, steps):
    """onnxruntime-genai's own greedy search (``og.Generator``, do_sample False) over the folder
    for exactly ``steps`` new tokens; padding rows are recognised by genai's pad_token_id."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    total = ids.shape[1] + steps
    params.set_search_options(
        do_sample=False, max_length=total, min_length=total, batch_size=ids.shape[0]
    )
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    rows = [np.array(gen.get_sequence(r), np.int64)[ids.shape[1] :] for r in range(len(ids))]
    return np.stack(rows)


def encode_batch(tok: Tokenizer, texts):
    enc = [tok.encode(t).ids for t in texts]
    s = max(map(len, enc))
    ids = np.array([[2] * (s - len(e)) + e for e in enc], np.int64)
    mask = np.array([[0] * (s - len(e)) + [1] * len(e) for e in enc], np.int64)
    return ids, mask


def make_reference(folder: Path, onnx_file: str, tok: Tokenizer, genai: bool):
    """Computes reference.npz's arrays and the manifest's ``reference`` entry."""
    sess = ort.InferenceSession(str(folder / onnx_file), providers=["CPUExecutionProvider"])
    ids = np.array([tok.encode(PROMPT).ids], np.int64)
    bids, bmask = encode_batch(tok, PROMPTS_BATCH)
    toks, first, margins = greedy_ort(sess, ids, np.ones_like(ids), NEW_TOKENS, HIDDEN // HEADS)
    btoks, bfirst, bmargins = greedy_ort(sess, bids, bmask, NEW_TOKENS, HIDDEN // HEADS)
    info = {"tokens": "plain onnxruntime loop (greedy_ort)"}
    if genai:
        g1 = greedy_genai(folder, ids, NEW_TOKENS)
        g2 = greedy_genai(folder, bids, NEW_TOKENS)
        info = {
            "tokens": "onnxruntime-genai og.Generator greedy search (do_sample=False)",
            "ort_loop_agrees_batch1": bool(np.array_equal(g1, toks)),
            "ort_loop_agrees_batch2": bool(np.array_equal(g2, btoks)),
        }
        toks, btoks, ort_btoks = g1, g2, btoks
    solo = [
        greedy_ort(
            sess, r[m == 1][None], np.ones((1, int(m.sum())), np.int64), NEW_TOKENS, HIDDEN // HEADS
        )[0][0]
        for r, m in zip(bids, bmask, strict=True)
    ]
    # per row: does the batch's continuation equal the row's own unpadded batch-1 onnxruntime run
    info["batch_rows_match_unpadded_runs"] = [
        bool(np.array_equal(a, b)) for a, b in zip(solo, btoks, strict=True)
    ]
    if not (np.isfinite(first).all() and np.isfinite(bfirst).all() and np.isfinite(margins).all()):
        raise SystemExit(f"{folder.name}: non-finite logits")
    arrays = {
        "prompt_ids": ids,
        "tokens": toks.astype(np.int64),
        "prefill_logits": first.astype(np.float32),
        "margins": margins,
        "batch_ids": bids,
        "batch_mask": bmask,
        "batch_tokens": btoks.astype(np.int64),
        "batch_prefill_logits": bfirst[:, -1, :].astype(np.float32),
        "batch_margins": bmargins,
    }
    if genai:
        arrays["batch_tokens_ort_loop"] = ort_btoks.astype(np.int64)
    return arrays, info


# ---------------------------------------------------------------- folders and manifest

ONNX_TYPES = {1: "float32", 7: "int64", 9: "bool", 10: "float16", 6: "int32"}


def io_spec(path: Path):
    """Graph inputs/outputs: name -> {dtype, dims}, symbolic dims by their dim_param."""
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}

    def spec(v):
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"dtype": ONNX_TYPES.get(t.elem_type, str(t.elem_type)), "dims": dims}

    ins = {v.name: spec(v) for v in g.input if v.name not in inits}
    return ins, {v.name: spec(v) for v in g.output}


def op_types(path: Path):
    m = onnx.load(str(path), load_external_data=False)
    ops, todo = set(), [m.graph]
    while todo:
        g = todo.pop()
        for n in g.node:
            ops.add(f"{n.domain}::{n.op_type}" if n.domain else n.op_type)
            todo += [a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    return sorted(ops)


FOLDERS = {
    # name: (architecture, seed, exporter, format)
    "llama_optimum": ("llama", 11, "optimum", "optimum"),
    "qwen2_optimum": ("qwen2", 12, "optimum", "optimum"),
    "gpt2_optimum": ("gpt2", 13, "optimum", "optimum"),
    "llama_optimum_merged": ("llama", 11, "optimum_merged", "optimum_merged"),
    "qwen2_genai": ("qwen2", 12, "genai:fp32", "genai"),
    "qwen2_genai_int4": ("qwen2", 12, "genai:int4", "genai"),
}

HOW = {
    "optimum": "optimum.exporters.onnx.main_export(task='text-generation-with-past'), the same as "
    "`optimum-cli export onnx --task text-generation-with-past` (optimum {optimum}, optimum-onnx "
    "{optimum_onnx}, transformers {transformers}, torch {torch})",
    "optimum_merged": "Optimum's pre-1.2x layout: optimum.exporters.onnx.export of the no-past "
    "decoder (use_past_in_inputs=False) and of the with-past decoder, fused by "
    "optimum.onnx.merge_decoders into decoder_model_merged.onnx (input use_cache_branch, one If) "
    "(optimum {optimum}, optimum-onnx {optimum_onnx}, transformers {transformers}, torch {torch})",
    "genai": "python -m onnxruntime_genai.models.builder -i <hf folder> -o <this folder> -p "
    "{precision} -e cpu (onnxruntime-genai {genai}, transformers {transformers}, torch {torch})",
}


def versions():
    from importlib.metadata import version

    import onnxruntime_genai
    import optimum.version
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "optimum": optimum.version.__version__,
        "optimum_onnx": version("optimum-onnx"),
        "genai": onnxruntime_genai.__version__,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "tokenizers": version("tokenizers"),
    }


def export_folder(name: str, seed: int):
    """Exports ``name`` with weights from ``seed`` and computes its reference."""
    arch, _, exporter, fmt = FOLDERS[name]
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = train_tokenizer(add_bos=arch == "llama")
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        save_hf(arch, seed, tok, hf)
        match exporter.split(":"):
            case ["optimum"]:
                onnx_file = export_optimum(hf, out)
            case ["optimum_merged"]:
                onnx_file = export_optimum_merged(hf, out)
            case ["genai", precision]:
                onnx_file = export_genai(hf, out, precision)
            case _:
                raise ValueError(exporter)
        copy_tokenizer(hf, out)
    return onnx_file, *make_reference(out, onnx_file, tok, genai=fmt == "genai")


def make_folder(name: str, vers: dict) -> dict:
    """Exports ``name``, moving to the next seed (+1000) until every greedy step's top-1 minus
    top-2 margin is at least MIN_MARGIN, so that float noise cannot change a token."""
    arch, first_seed, exporter, fmt = FOLDERS[name]
    for seed in range(first_seed, first_seed + 20_000, 1000):
        onnx_file, arrays, ref = export_folder(name, seed)
        worst = min(arrays["margins"].min(), arrays["batch_margins"].min())
        special = min(arrays["tokens"].min(), arrays["batch_tokens"].min()) <= 2
        print(f"{name}: seed {seed} min margin {worst:.4g}, special token generated: {special}")
        if worst >= MIN_MARGIN and not special:
            break
    else:
        raise SystemExit(f"{name}: no seed gives margins >= {MIN_MARGIN}")
    out = OUT / name
    precision = exporter.split(":")[-1]
    how = HOW[fmt].format(precision=precision, **vers)
    np.savez(out / "reference.npz", **arrays)
    ins, outs = io_spec(out / onnx_file)
    head_dim = HIDDEN // HEADS
    entry = {
        "name": name,
        "format": fmt,
        "model_file": onnx_file,
        "how": how,
        "architecture": {
            "model_type": arch,
            "layers": LAYERS,
            "hidden": HIDDEN,
            "heads": HEADS,
            "kv_heads": HEADS if arch == "gpt2" else KV_HEADS,
            "head_dim": head_dim,
            "intermediate": 4 * HIDDEN if arch == "gpt2" else INTER,
            "vocab": VOCAB,
            "max_positions": MAX_POS,
            "precision": precision if fmt == "genai" else "fp32",
            "seed": seed,
            "lm_head_scale": LM_HEAD_SCALE,
        },
        "tokens": {"bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 2},
        "tokenizer_adds_bos": arch == "llama",
        "prompt": PROMPT,
        "batch_prompts": PROMPTS_BATCH,
        "inputs": ins,
        "outputs": outs,
        "op_types": op_types(out / onnx_file),
        "reference": {
            **ref,
            "logits_and_margins": "plain onnxruntime loop (greedy_ort)",
            "position_ids": "cumsum(attention_mask) - 1, padding positions 1",
            "new_tokens": NEW_TOKENS,
            "min_margin": float(arrays["margins"].min()),
            "min_margin_batch": float(arrays["batch_margins"].min()),
            "distinct_tokens": len(np.unique(arrays["tokens"])),
            "eos_in_tokens": bool(
                (arrays["tokens"] == 0).any() or (arrays["batch_tokens"] == 0).any()
            ),
        },
    }
    (out / "README.md").write_text(readme(name, entry))
    entry["files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    return entry


def readme(name: str, e: dict) -> str:
    a = e["architecture"]
    return (
        f"# {name}\n\nTiny random-weight {a['model_type']} ({a['layers']} layers, hidden "
        f"{a['hidden']}, {a['heads']} heads, {a['kv_heads']} KV heads, vocab {a['vocab']}, "
        f"{a['max_positions']} positions, seed {a['seed']}, LM head x{a['lm_head_scale']}) made by "
        f"`tests/models/make_llm_models.py` (not run by CI).\n\nExport: {e['how']}.\n\n"
        f"`tokenizer.json`: byte-level BPE trained with `tokenizers` on the script's fixed text "
        f"(vocab {a['vocab']}; ids 0 {EOS} = eos, 1 {BOS} = bos, 2 {PAD} = pad).\n\n"
        f"`reference.npz`: greedy continuations of {NEW_TOKENS} tokens ({e['reference']['tokens']});"
        f" layout in `tests/models/llm/manifest.json` (`npz_layout`). Random weights: the text "
        f"is gibberish.\n"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="folder names")
    args = ap.parse_args()
    names = args.only or list(FOLDERS)
    vers = versions()
    manifest_path = OUT / "manifest.json"
    old = json.loads(manifest_path.read_text())["folders"] if manifest_path.exists() else {}
    folders = {n: e for n, e in old.items() if n in FOLDERS}
    for name in names:
        folders[name] = make_folder(name, vers)
        r = folders[name]["reference"]
        print(
            f"{name}: {folders[name]['files']} min margin {r['min_margin']:.4f} "
            f"batch {r['min_margin_batch']:.4f} {r}"
        )
    manifest = {
        "generator": "tests/models/make_llm_models.py",
        "versions": vers,
        "npz_layout": NPZ_LAYOUT,
        "folders": {n: folders[n] for n in FOLDERS if n in folders},
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
