"""Real-size LLM folders for `benchmarks/llm_generate.py`, made once into a cache folder outside
the repository (never committed): a Qwen2-0.5B-configured model with random weights, exported
the way people export it, fp32 and 4-bit.

    /work/venv-opt/bin/python benchmarks/_llm_models.py [--cache /work/bigmodels]

(`/work/venv-opt`: transformers 4.57 + optimum-onnx, how to make it is in
tests/models/make_llm_models.py's docstring.) Folders:

* `qwen2_0.5b_optimum/`: `optimum.exporters.onnx.main_export(task="text-generation-with-past")`
  of `Qwen2ForCausalLM(Qwen2Config(...0.5B...))` — 24 layers, hidden 896, 14 heads, 2 KV
  heads, intermediate 4864, vocab 151936, tied embeddings, rope theta 1e6 — random weights
  (seed 0) with the final norm scaled so greedy decoding is decided by wide margins; plus the
  tiny fixtures' byte-level BPE `tokenizer.json` (512 tokens: the benchmark feeds ids).
* `qwen2_0.5b_optimum_4bit/`: the same `model.onnx` through onnxruntime's
  `MatMulNBitsQuantizer` (4 bits, block 32, symmetric): every MatMul with constant weights
  becomes com.microsoft MatMulNBits.
* `qwen2_0.5b_genai/` and `qwen2_0.5b_genai_int4/`: the same random-weight model (seed 0, final
  norm scaled, the same tokenizer files) saved with `save_pretrained` and exported by
  onnxruntime-genai's model builder, as tests/models/make_llm_models.py's `export_genai` runs it:
  `python -m onnxruntime_genai.models.builder -i <hf> -o <folder> -p fp32|int4 -e cpu -c <tmp>`
  (`genai_config.json`, GroupQueryAttention; int4: MatMulNBits). The builder runs in
  `/work/venv-genai` (onnxruntime-genai 0.18 + transformers 5, made as that docstring says), so
  these two folders can be made from either venv, e.g. without venv-opt:

    /work/venv-genai/bin/python benchmarks/_llm_models.py --only qwen2_0.5b_genai \
        --only qwen2_0.5b_genai_int4

`--only NAME` (repeatable) makes only those folders; without it, every missing folder is made.
A folder that exists (its model file is there) is kept; a genai folder is built under
`<name>.partial` and renamed when the builder has finished.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN2_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "pad_token_id": 2,
}
NORM_SCALE = 30.0  # logits std ~0.3 at the 0.02 init -> ~9: argmaxes far above float noise
FP32 = "qwen2_0.5b_optimum"
INT4 = "qwen2_0.5b_optimum_4bit"
GENAI = {"qwen2_0.5b_genai": "fp32", "qwen2_0.5b_genai_int4": "int4"}  # name: builder -p
GENAI_PYTHON = "/work/venv-genai/bin/python"
NAMES = (FP32, INT4, *GENAI)


def save_hf(hf: Path) -> None:
    """The random-weight Qwen2-0.5B-configured model (seed 0, final norm x NORM_SCALE) and the
    tiny fixtures' tokenizer, saved with `save_pretrained` into `hf`."""
    import torch
    import transformers as tf

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from make_llm_models import BOS, EOS, PAD, train_tokenizer

    torch.manual_seed(0)
    model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**QWEN2_05B)).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(NORM_SCALE)
    model.save_pretrained(hf)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(add_bos=False),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
    )
    fast.save_pretrained(hf)


def export_fp32(out: Path) -> None:
    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        save_hf(hf)
        main_export(str(hf), output=str(out), task="text-generation-with-past", device="cpu")


def export_genai(hf: Path, out: Path, precision: str) -> None:
    """onnxruntime-genai's model builder over the saved HF folder, in GENAI_PYTHON (as
    tests/models/make_llm_models.py's `export_genai`), into `<out>.partial`, then renamed; the
    tokenizer files the builder does not write are copied from the HF folder."""
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from make_llm_models import copy_tokenizer

    part = out.with_name(out.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    with tempfile.TemporaryDirectory() as cache:
        cmd = [GENAI_PYTHON, "-m", "onnxruntime_genai.models.builder"]
        cmd += ["-i", str(hf), "-o", str(part), "-p", precision, "-e", "cpu", "-c", cache]
        subprocess.run(cmd, check=True)
    copy_tokenizer(hf, part)
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)


def quantize_4bit(src: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src / "model.onnx"))
    q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
    q.process()
    onnx.save_model(
        q.model.model,
        str(out / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx_data",
    )
    for f in src.iterdir():
        if f.suffix == ".json" or f.name.endswith(".txt"):
            shutil.copy(f, out / f.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument(
        "--only", action="append", choices=NAMES, help="make only this folder (repeatable)"
    )
    args = ap.parse_args()
    want = set(args.only or NAMES)
    fp32, int4 = args.cache / FP32, args.cache / INT4
    if FP32 in want and not (fp32 / "model.onnx").exists():
        export_fp32(fp32)
        print("exported", fp32)
    if INT4 in want and not (int4 / "model.onnx").exists():
        quantize_4bit(fp32, int4)
        print("quantized", int4)
    todo = [n for n in GENAI if n in want and not (args.cache / n / "model.onnx").exists()]
    if todo:
        with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
            hf = Path(tmp) / "hf"
            save_hf(hf)  # once for both precisions
            for name in todo:
                export_genai(hf, args.cache / name, GENAI[name])
                print("exported", args.cache / name, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
