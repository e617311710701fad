"""Reading an LLM folder: which layout it has, where its model and tokenizer are, and the numbers
the generation loop needs. Two layouts: a Hugging Face-style export with `config.json` (Optimum's
`model.onnx` or `decoder_model_merged.onnx`, or a plain `torch.onnx.export` with past inputs) and
an onnxruntime-genai builder folder (`genai_config.json` + its `model.onnx`). The model's input
and output names are read from the graph itself (`kn_runtime.generate.signature`); genai's name
templates, when given, only say which is which."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kn_graph.errors import ModelFolderError

__all__ = ["ModelSpec", "SearchDefaults", "read_folder"]

HF_MODEL_FILES = ("model.onnx", "decoder_model_merged.onnx")
"""The model file of a folder with `config.json`, first found first: Optimum names a decoder
with its cache `model.onnx` (since 1.14) or, merged with its no-cache twin under an If on
`use_cache_branch`, `decoder_model_merged.onnx` (older exports)."""

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where a `config.json` keeps the longest sequence the model was made for (Llama/Qwen2, GPT-2,
others)."""


@dataclass(frozen=True, slots=True)
class SearchDefaults:
    """What the folder suggests for sampling (`generation_config.json`, genai's `search`);
    None where it says nothing. `kn-generate` uses them for the flags not given."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """An LLM folder as read: `layout` is "hf" (config.json) or "genai" (genai_config.json).
    Sizes are None where the folder does not say (the graph's shapes then decide)."""

    folder: Path
    layout: str
    model_path: Path
    tokenizer_path: Path
    num_layers: int | None
    kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    context_length: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    names: Mapping[str, str] = field(default_factory=dict)
    """genai's `model.decoder.inputs` and `.outputs` merged (`input_ids`, `past_key_names`
    as a `%d` template, `present_key_names`, `logits`, ...); empty for the "hf" layout."""
    defaults: SearchDefaults = SearchDefaults()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFolderError(f"{path}: cannot read it as JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    """An eos id as configs spell it: an int, a list of ints or null."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _required(folder: Path, name: str, what: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise ModelFolderError(f"{folder}: no {name} ({what}); {_LAYOUTS}")
    return path


_LAYOUTS = (
    "an LLM folder is either an Optimum export (config.json, model.onnx or "
    "decoder_model_merged.onnx, tokenizer.json: `optimum-cli export onnx --task "
    "text-generation-with-past`) or an onnxruntime-genai builder folder (genai_config.json, "
    "model.onnx, tokenizer.json)"
)


def read_folder(folder: str | Path) -> ModelSpec:
    """The spec of an LLM folder; ModelFolderError naming the missing file otherwise."""
    root = Path(folder)
    if not root.is_dir():
        raise ModelFolderError(f"{root}: not a folder; {_LAYOUTS}")
    if (root / "genai_config.json").is_file():
        return _genai(root)
    if (root / "config.json").is_file():
        return _hf(root)
    found = sorted(p.name for p in root.iterdir())[:12]
    raise ModelFolderError(
        f"{root}: unknown layout, neither config.json nor genai_config.json (found {found}); "
        f"{_LAYOUTS}"
    )


def _hf(root: Path) -> ModelSpec:
    config = _read_json(root / "config.json")
    model = next((root / n for n in HF_MODEL_FILES if (root / n).is_file()), None)
    if model is None:
        split = (root / "decoder_with_past_model.onnx").is_file()
        hint = (
            " (a split decoder_model.onnx + decoder_with_past_model.onnx export: export again "
            "with a recent Optimum, which writes one model.onnx)"
            if split
            else ""
        )
        raise ModelFolderError(f"{root}: no {' or '.join(HF_MODEL_FILES)}{hint}; {_LAYOUTS}")
    tokenizer = _required(root, "tokenizer.json", "the tokenizer, as `tokenizers` saves it")
    gen = (
        _read_json(root / "generation_config.json")
        if (root / "generation_config.json").is_file()
        else {}
    )
    heads = _int(config.get("num_attention_heads", config.get("n_head")))
    hidden = _int(config.get("hidden_size", config.get("n_embd")))
    head_dim = _int(config.get("head_dim"))
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    context = next((int(config[k]) for k in CONTEXT_KEYS if config.get(k) is not None), None)
    eos = gen.get("eos_token_id", config.get("eos_token_id"))
    return ModelSpec(
        folder=root,
        layout="hf",
        model_path=model,
        tokenizer_path=tokenizer,
        num_layers=_int(config.get("num_hidden_layers", config.get("n_layer"))),
        kv_heads=_int(config.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        vocab_size=_int(config.get("vocab_size")),
        context_length=context,
        bos_token_id=_int(gen.get("bos_token_id", config.get("bos_token_id"))),
        eos_token_ids=_ids(eos),
        pad_token_id=_int(gen.get("pad_token_id", config.get("pad_token_id"))),
        defaults=SearchDefaults(
            do_sample=gen.get("do_sample"),
            temperature=gen.get("temperature"),
            top_k=gen.get("top_k"),
            top_p=gen.get("top_p"),
            repetition_penalty=gen.get("repetition_penalty"),
            max_new_tokens=gen.get("max_new_tokens"),
        ),
    )


def _genai(root: Path) -> ModelSpec:
    config = _read_json(root / "genai_config.json")
    model_cfg = config.get("model")
    decoder = model_cfg.get("decoder") if isinstance(model_cfg, dict) else None
    if not isinstance(model_cfg, dict) or not isinstance(decoder, dict):
        raise ModelFolderError(
            f"{root / 'genai_config.json'}: expected a 'model' object with a 'decoder' object "
            "(as onnxruntime-genai's model builder writes it)"
        )
    model = _required(root, str(decoder.get("filename", "model.onnx")), "the decoder")
    tokenizer = _required(root, "tokenizer.json", "the tokenizer, as `tokenizers` saves it")
    search = config.get("search") or {}
    names = {**(decoder.get("inputs") or {}), **(decoder.get("outputs") or {})}
    return ModelSpec(
        folder=root,
        layout="genai",
        model_path=model,
        tokenizer_path=tokenizer,
        num_layers=_int(decoder.get("num_hidden_layers")),
        kv_heads=_int(decoder.get("num_key_value_heads", decoder.get("num_attention_heads"))),
        head_dim=_int(decoder.get("head_size")),
        vocab_size=_int(model_cfg.get("vocab_size")),
        context_length=_int(model_cfg.get("context_length", search.get("max_length"))),
        bos_token_id=_int(model_cfg.get("bos_token_id")),
        eos_token_ids=_ids(model_cfg.get("eos_token_id")),
        pad_token_id=_int(model_cfg.get("pad_token_id")),
        names={str(k): str(v) for k, v in names.items()},
        defaults=SearchDefaults(
            do_sample=search.get("do_sample"),
            temperature=search.get("temperature"),
            top_k=search.get("top_k"),
            top_p=search.get("top_p"),
            repetition_penalty=search.get("repetition_penalty"),
        ),
    )
