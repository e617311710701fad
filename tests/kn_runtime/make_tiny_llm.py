"""Makes `kn_runtime/models/tiny_llm/`, the default model of `kn-generate`: the fixture
`tests/models/kv_llm_dynamo.onnx` (a 2-layer decoder with random weights and rotary positions,
vocab 64, one token per step with past_key_* / past_value_* inputs, made by
tests/models/make_models.py), a character-level `tokenizer.json` (WordLevel over 63 characters
and `<unk>`) and a `config.json`. Run from the repository root (needs `tokenizers`):

    python tests/kn_runtime/make_tiny_llm.py
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "kn_runtime" / "models" / "tiny_llm"
SOURCE = ROOT / "tests" / "models" / "kv_llm_dynamo.onnx"

CHARACTERS = "\n " + string.ascii_lowercase + string.ascii_uppercase + ".,!?'-:;\""
"""The 63 characters of the vocabulary (ids 1..63; `<unk>` is id 0)."""

CONFIG = {
    "model_type": "kn_tiny_lm",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "hidden_size": 32,
    "head_dim": 8,
    "vocab_size": 64,
    "max_position_embeddings": 512,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": 0,
}


def tokenizer_json() -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    assert len(CHARACTERS) == 63 and len(set(CHARACTERS)) == 63
    vocab = {"<unk>": 0} | {ch: i + 1 for i, ch in enumerate(CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<unk>"])
    return tok.to_str(pretty=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE, OUT / "model.onnx")
    (OUT / "tokenizer.json").write_text(tokenizer_json() + "\n", encoding="utf-8")
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
