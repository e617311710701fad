"""Bad LLM folders and prompts get our errors saying what to do; the tokenizer without the
`tokenizers` package; the layouts read from config files; `kn-generate` as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import ArgumentTypeError, ArgumentValueError, ModelFolderError
from kn_runtime import Device, load_generator
from kn_runtime.generate import TINY_LLM
from kn_runtime.generate.folder import read_folder
from kn_runtime.generate.tokenizer import CharTokenizer, HFTokenizer

ROOT = Path(__file__).resolve().parents[2]
REF = Device.cpu(reference=True)


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "llm"
    shutil.copytree(TINY_LLM, folder)
    return folder


@pytest.mark.parametrize(
    ("missing", "message"),
    [("tokenizer.json", "no tokenizer.json"), ("model.onnx", "no model.onnx or decoder_model")],
)
def test_a_folder_missing_a_file_says_which(tmp_path: Path, missing: str, message: str) -> None:
    folder = _copy(tmp_path)
    (folder / missing).unlink()
    with pytest.raises(ModelFolderError, match=message):
        load_generator(folder, REF)


def test_an_unknown_layout_says_what_a_folder_holds(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelFolderError, match=r"unknown layout.*weights\.bin.*optimum-cli"):
        load_generator(tmp_path, REF)
    with pytest.raises(ModelFolderError, match="not a folder"):
        load_generator(tmp_path / "nowhere", REF)


def test_a_model_with_inputs_of_no_known_role_is_an_unknown_layout(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])
    extra = helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["B", "S"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "S", 64])
    nodes = [
        helper.make_node("Add", ["input_ids", "token_type_ids"], ["s"]),
        helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["f", "axes"], ["u"]),
        helper.make_node("Expand", ["u", "shape"], ["logits"]),
    ]
    inits = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [2]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, 64]),
    ]
    graph = helper.make_graph(nodes, "g", [ids, extra], [logits], inits)
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx"
    )
    with pytest.raises(ModelFolderError, match="unknown layout, input 'token_type_ids'"):
        load_generator(folder, REF)


def test_a_prompt_longer_than_the_context_says_so(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    config = json.loads((folder / "config.json").read_text()) | {"max_position_embeddings": 6}
    (folder / "config.json").write_text(json.dumps(config))
    gen = load_generator(folder, REF)
    with pytest.raises(
        ArgumentValueError, match=r"7 tokens but the model's context is 6 .*shorten"
    ):
        gen.generate(["Hi", "Goodbye"])
    assert gen.generate("Hello!", max_new_tokens=3).finish_reasons == ("context",)


def test_a_tokenizer_larger_than_the_logits_is_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    for i, ch in enumerate("0123456789"):
        data["model"]["vocab"][ch] = 64 + i
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ModelFolderError, match="74 tokens but the model's logits have 64"):
        load_generator(folder, REF)


def test_bad_prompts_and_arguments_are_our_errors() -> None:
    gen = load_generator(None, REF)
    with pytest.raises(ArgumentValueError, match="outside the vocabulary"):
        gen.generate([1, 2, 99])
    with pytest.raises(ArgumentTypeError, match="prompt"):
        gen.generate([])
    with pytest.raises(ArgumentValueError, match="max_new_tokens"):
        gen.generate("Hi", max_new_tokens=0)
    with pytest.raises(ArgumentTypeError, match="stop"):
        gen.generate("Hi", stop=[1])  # type: ignore[list-item]
    with pytest.raises(ArgumentValueError, match="encodes to no tokens"):
        gen.generate("")


def test_the_character_tokenizer_without_tokenizers_matches_tokenizers() -> None:
    path = TINY_LLM / "tokenizer.json"
    mine = CharTokenizer.from_json(json.loads(path.read_text()))
    theirs = HFTokenizer(path)
    assert mine is not None and mine.vocab_size == theirs.vocab_size == 64
    text = 'Hello, World!\n it\'s 42 "quoted" - ok; done: yes?'
    assert mine.encode(text) == theirs.encode(text)
    ids = theirs.encode(text)
    assert mine.decode(ids) == theirs.decode(ids) == text.replace("42", "")


def test_genai_and_generation_config_files_are_read(tmp_path: Path) -> None:
    genai = {
        "model": {
            "bos_token_id": 1,
            "eos_token_id": [2, 7],
            "pad_token_id": 0,
            "context_length": 2048,
            "vocab_size": 64,
            "decoder": {
                "filename": "decoder.onnx",
                "head_size": 8,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "inputs": {"input_ids": "input_ids", "past_key_names": "past_key_values.%d.key"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key"},
            },
        },
        "search": {"do_sample": True, "temperature": 0.6, "top_k": 5, "max_length": 4096},
    }
    (tmp_path / "genai_config.json").write_text(json.dumps(genai))
    with pytest.raises(ModelFolderError, match=r"no decoder\.onnx"):
        read_folder(tmp_path)
    for name in ("decoder.onnx", "tokenizer.json"):
        (tmp_path / name).write_bytes(b"")
    spec = read_folder(tmp_path)
    assert (spec.layout, spec.eos_token_ids, spec.context_length) == ("genai", (2, 7), 2048)
    assert (spec.kv_heads, spec.head_dim, spec.defaults.top_k) == (2, 8, 5)
    assert spec.names["past_key_names"] == "past_key_values.%d.key"
    hf = _copy(tmp_path)
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": 5, "top_p": 0.9}))
    spec = read_folder(hf)
    assert (spec.layout, spec.eos_token_ids, spec.defaults.top_p, spec.context_length) == (
        "hf",
        (5,),
        0.9,
        512,
    )


def test_kn_generate_streams_the_default_model_and_reports_speed() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kn_runtime.generate.cli",
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("Hi") and len(lines[0]) == 2 + 4
    for key in ("prefill:", "decode:", "time to first token:", "peak memory (VmHWM):"):
        assert any(line.startswith(key) for line in lines), key
    assert "tokens/s" in run.stdout


def test_kn_generate_on_a_bad_folder_is_one_line_and_status_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kn_runtime.generate.cli", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("kn-generate: error:") and run.stderr.count("\n") == 1
