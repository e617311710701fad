"""The text-generation fixtures in tests/models/llm/ (made by tests/models/make_llm_models.py)
are consistent: every folder's files are the manifest's, its model loads in onnxruntime with the
I/O the manifest records, its tokenizer encodes the prompts to the stored ids with the model's
vocabulary size, and a plain onnxruntime greedy loop reproduces the stored continuations and
first-step logits.  onnxruntime only: the generation API's own tests compare our runtime with
these references."""

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from tests.paths import MODELS

sys.path.insert(0, str(MODELS))
from llm_greedy import greedy_ort

LLM = MODELS / "llm"
MANIFEST = json.loads((LLM / "manifest.json").read_text())
FOLDERS = MANIFEST["folders"]
DTYPES = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(bool)": "bool"}


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def folder(request):
    name = request.param
    entry = FOLDERS[name]
    sess = ort.InferenceSession(
        str(LLM / name / entry["model_file"]), providers=["CPUExecutionProvider"]
    )
    return name, entry, sess, dict(np.load(LLM / name / "reference.npz"))


def test_every_folder_is_in_the_manifest():
    on_disk = {p.name for p in LLM.iterdir() if p.is_dir()}
    assert on_disk == set(FOLDERS)
    assert set(FOLDERS) >= {"llama_optimum", "qwen2_optimum", "gpt2_optimum", "qwen2_genai"}


def test_files_match_the_manifest(folder):
    name, entry, _, ref = folder
    files = {p.name: p.stat().st_size for p in (LLM / name).iterdir()}
    assert files == entry["files"]
    assert sum(files.values()) < 3 * 2**20
    assert set(ref) == {k for k in MANIFEST["npz_layout"] if k in ref}
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= set(files)
    if entry["format"] == "genai":
        config = json.loads((LLM / name / "genai_config.json").read_text())["model"]
        assert config["vocab_size"] == entry["architecture"]["vocab"]
        assert config["eos_token_id"] == entry["tokens"]["eos_token_id"]
    else:
        config = json.loads((LLM / name / "config.json").read_text())
        assert config["vocab_size"] == entry["architecture"]["vocab"]
        assert config["model_type"] == entry["architecture"]["model_type"]


def test_io_matches_the_manifest(folder):
    name, entry, sess, _ = folder
    model = onnx.load(str(LLM / name / entry["model_file"]), load_external_data=False)
    for value, spec in [*zip(sess.get_inputs(), entry["inputs"].values(), strict=True)]:
        assert DTYPES[value.type] == spec["dtype"]
        assert [d if isinstance(d, int) else str(d) for d in value.shape] == spec["dims"]
    assert [i.name for i in sess.get_inputs()] == list(entry["inputs"])
    assert [o.name for o in sess.get_outputs()] == list(entry["outputs"])
    ops = {f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node}
    assert ops <= set(entry["op_types"])
    if entry["format"] == "genai":
        assert "com.microsoft::GroupQueryAttention" in ops
    if entry["architecture"]["precision"] == "int4":
        assert "com.microsoft::MatMulNBits" in ops
    if entry["format"] == "optimum_merged":
        assert "use_cache_branch" in entry["inputs"] and "If" in ops


def test_tokenizer_encodes_the_prompts(folder):
    name, entry, _, ref = folder
    tok = Tokenizer.from_file(str(LLM / name / "tokenizer.json"))
    assert tok.get_vocab_size() == entry["architecture"]["vocab"]
    ids = entry["tokens"]
    for token, key in [("<|endoftext|>", "eos_token_id"), ("<|bos|>", "bos_token_id")]:
        assert tok.token_to_id(token) == ids[key]
    np.testing.assert_array_equal(ref["prompt_ids"][0], tok.encode(entry["prompt"]).ids)
    assert (ref["prompt_ids"][0, 0] == ids["bos_token_id"]) == entry["tokenizer_adds_bos"]
    for row, mask, text in zip(
        ref["batch_ids"], ref["batch_mask"], entry["batch_prompts"], strict=True
    ):
        np.testing.assert_array_equal(row[mask == 1], tok.encode(text).ids)
        assert (row[mask == 0] == ids["pad_token_id"]).all() and mask[-1] == 1


def test_onnxruntime_loop_reproduces_the_reference(folder):
    """The stored continuations, 64 greedy tokens, for batch 1 and the left-padded batch 2;
    the genai folders' tokens come from og.Generator, which the manifest says agrees with the
    loop for batch 1; for batch 2 the loop's own tokens are stored beside them."""
    _, entry, sess, ref = folder
    head_dim, steps = entry["architecture"]["head_dim"], entry["reference"]["new_tokens"]
    ones = np.ones_like(ref["prompt_ids"])
    toks, first, margins = greedy_ort(sess, ref["prompt_ids"], ones, steps, head_dim)
    btoks, bfirst, _ = greedy_ort(sess, ref["batch_ids"], ref["batch_mask"], steps, head_dim)
    assert entry["reference"].get("ort_loop_agrees_batch1", True)
    np.testing.assert_array_equal(toks, ref["tokens"])
    np.testing.assert_array_equal(btoks, ref.get("batch_tokens_ort_loop", ref["batch_tokens"]))
    np.testing.assert_allclose(first, ref["prefill_logits"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bfirst[:, -1], ref["batch_prefill_logits"], rtol=1e-4, atol=1e-4)
    assert min(ref["margins"].min(), ref["batch_margins"].min()) > 1e-3
    assert np.isclose(margins.min(), entry["reference"]["min_margin"], atol=1e-4)
    assert ref["tokens"].shape == (1, steps) and ref["batch_tokens"].shape == (2, steps)
    assert len(np.unique(ref["tokens"])) > 4  # a real continuation, not one token repeated


def test_the_merged_export_continues_like_the_plain_one():
    """llama_optimum_merged is the same weights as llama_optimum in the If layout."""
    plain = np.load(LLM / "llama_optimum" / "reference.npz")
    merged = np.load(LLM / "llama_optimum_merged" / "reference.npz")
    np.testing.assert_array_equal(plain["tokens"], merged["tokens"])
    np.testing.assert_array_equal(plain["batch_tokens"], merged["batch_tokens"])
