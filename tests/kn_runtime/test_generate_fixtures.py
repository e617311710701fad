"""Generation on the LLM fixture folders (tests/models/llm: Optimum exports of tiny Llama, Qwen2
and GPT-2, an older merged Optimum decoder, onnxruntime-genai builder folders in fp32 and int4
with GroupQueryAttention and MatMulNBits): greedy continuations equal the stored onnxruntime ones
token for token, for one prompt and for a left-padded batch of two."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kn_runtime import Device, load_generator
from tests.paths import MODELS

LLM = MODELS / "llm"
FOLDERS = sorted(json.loads((LLM / "manifest.json").read_text())["folders"])


@pytest.mark.parametrize("name", FOLDERS)
def test_greedy_64_tokens_equal_onnxruntime(name: str) -> None:
    ref = np.load(LLM / name / "reference.npz")
    gen = load_generator(LLM / name, Device.cpu(reference=True))
    r = gen.generate([ref["prompt_ids"][0].tolist()], max_new_tokens=64)
    np.testing.assert_array_equal(np.array(r.ids[0]), ref["tokens"][0])
    # a left-padded batch: each row as onnxruntime's loop over the same export continues it (for
    # the genai folders that loop, not og.Generator, whose padded row differs: the manifest)
    key = "batch_tokens_ort_loop" if "batch_tokens_ort_loop" in ref else "batch_tokens"
    mask = ref["batch_mask"]
    rows = [ref["batch_ids"][i][mask[i] == 1].tolist() for i in range(2)]
    r = gen.generate(rows, max_new_tokens=64)
    for i in range(2):
        np.testing.assert_array_equal(np.array(r.ids[i]), ref[key][i], err_msg=f"row {i}")


@pytest.mark.parametrize("name", ["llama_optimum", "qwen2_genai", "qwen2_genai_int4"])
def test_the_cpu_backend_continues_like_onnxruntime(name: str) -> None:
    """Device.cpu(), 64 tokens (a plan per padded past length: three here)."""
    ref = np.load(LLM / name / "reference.npz")
    r = load_generator(LLM / name, Device.cpu()).generate(
        [ref["prompt_ids"][0].tolist()], max_new_tokens=64
    )
    np.testing.assert_array_equal(np.array(r.ids[0]), ref["tokens"][0])


@pytest.mark.parametrize("name", ["llama_optimum", "qwen2_genai", "qwen2_genai_int4"])
def test_decode_steps_bucket_the_past_into_few_bindings(name: str) -> None:
    """A model with position_ids and attention_mask, or whose GroupQueryAttention counts each
    row's positions and keys from the mask's row sums (onnxruntime-genai's folders), gets its
    past padded to multiples of 32 (masked zeros after it): 40 new tokens after the prompt bind
    past lengths 0 (prefill), 32 and 64 only, and the tokens are those of the unpadded decode
    and of onnxruntime."""
    ref = np.load(LLM / name / "reference.npz")
    prompt = [ref["prompt_ids"][0].tolist()]
    assert len(prompt[0]) < 32
    runs = {}
    for bucket in (1, 32):
        gen = load_generator(LLM / name, Device.cpu(reference=True))
        assert gen.model.bucket == 32  # the default: padding is exact for these
        gen.model.bucket = bucket
        seen: set[int] = set()
        inner = gen.model.prepared.eval

        def record(feed: dict, inner=inner, seen=seen) -> list:  # type: ignore[no-untyped-def]
            seen.add(feed["past_key_values.0.key"].shape[2])
            return inner(feed)

        gen.model.prepared.eval = record  # type: ignore[method-assign]
        runs[bucket] = (gen.generate(prompt, max_new_tokens=40).ids[0], seen)
    assert runs[32][1] == {0, 32, 64}
    assert len(runs[1][1]) == 40
    assert runs[1][0] == runs[32][0] == tuple(ref["tokens"][0][:40].tolist())


@pytest.mark.parametrize("name", FOLDERS)
def test_outputs_are_trimmed_to_what_a_step_reads(name: str) -> None:
    """The Optimum exports' logits come out for the last position only, computed by an LM-head
    product over one row per batch entry (not S; also the genai int4 folder's packed head), and their presents as the new positions
    only, so the cache appends; GroupQueryAttention's presents (genai) and a merged decoder's
    (one graph per branch value) stay whole and replace the cache. Tokens: the test above."""
    from kn_graph.ops import BlockQuantMatMul, MatMul, View

    gen = load_generator(LLM / name, Device.cpu(reference=True))
    graph = gen.model.prepared.graph if name != "llama_optimum_merged" else None
    optimum = name.endswith("_optimum")
    assert gen.model.appends == optimum
    if graph is None:
        return
    outs = dict(zip(graph.output_names, graph.outputs, strict=True))
    logits = graph[outs[gen.model.signature.logits]]
    ids = graph[graph.inputs[graph.input_names.index("input_ids")]].shape
    assert str(logits.shape[1]) == "1" and logits.shape[0] == ids[0]
    if optimum:  # view(matmul(view(h[:, -1:]), W)): the product has B rows
        assert isinstance(logits.op, View) and isinstance(graph[logits.op.x].op, MatMul)
        assert graph[logits.op.x].shape[1] == ids[0]
    if name.endswith("_int4"):  # the 4-bit LM head's product, still packed, over B rows
        head = graph[logits.op.x]  # type: ignore[attr-defined]
        assert isinstance(head.op, BlockQuantMatMul) and head.shape[0] == ids[0]
    for p in gen.model.signature.past:
        length = graph[outs[p.present]].shape[2]
        assert (length == ids[1]) == optimum, (p.present, length)


def test_the_cache_appends_in_place() -> None:
    """A generation's cache buffers are allocated when the capacity runs out (doubling), not
    per token: 70 tokens after a 19-token prompt see three (empty for the prefill, 64
    positions, then 128), and every step is fed views of them."""
    ref = np.load(LLM / "llama_optimum" / "reference.npz")
    gen = load_generator(LLM / "llama_optimum", Device.cpu(reference=True))
    bases: set[int] = set()
    inner = gen.model.prepared.eval

    def record(feed: dict) -> list:  # type: ignore[type-arg]
        past = feed["past_key_values.0.key"]
        assert past.base is not None  # a view of the cache's buffer, not a copy
        bases.add(past.base.__array_interface__["data"][0])
        return inner(feed)

    gen.model.prepared.eval = record  # type: ignore[method-assign]
    r = gen.generate([ref["prompt_ids"][0].tolist()], max_new_tokens=70)
    assert r.ids[0][:64] == tuple(ref["tokens"][0].tolist())
    assert len(bases) == 3, bases


def test_padded_lengths_grow_with_the_context() -> None:
    """Multiples of 32 up to 128 positions, then of a quarter of the largest power of two not
    above the past: at most four bindings per doubling, none padding by a quarter or more."""
    from kn_runtime.generate.model import padded_length

    assert [padded_length(p, 32) for p in (1, 19, 32, 33, 127, 129)] == [32, 32, 32, 64, 128, 160]
    assert [padded_length(p, 32) for p in (512, 513, 640, 641, 2000)] == [512, 640, 640, 768, 2048]
    assert padded_length(37, 1) == 37
    for past in range(1, 5000):
        got = padded_length(past, 32)
        assert past <= got and (got - past < 32 or got - past < past / 4), past
    # a 512-token prompt's 128 decode steps meet two past lengths, not five
    assert {padded_length(p, 32) for p in range(512, 640)} == {512, 640}


def test_the_cache_stays_in_the_arena() -> None:
    """On the CPU backend the past is placed at the head of each attention's concat buffer
    (`PlanSettings.inputs_in_concat`): no step of a decode plan copies a past input, and after
    the first step of a padded length a decode step copies only its small inputs into the arena,
    the cache never (the arena's views are fed back, and only each step's new position is
    written into them). The tokens are onnxruntime's (a second generation interleaved with the
    first would find the arena taken and copy the past in again: also checked)."""
    from kn_cuda_eval.planning import steps as st

    ref = np.load(LLM / "qwen2_optimum" / "reference.npz")
    prompt = ref["prompt_ids"][0].tolist()
    gen = load_generator(LLM / "qwen2_optimum", Device.cpu())
    model = gen.model
    past = [p.name for p in model.signature.past]
    loads: list[tuple[int, int, int]] = []  # (past length fed, bytes loaded, one past's bytes)
    inner = model.prepared.eval

    def record(feed: dict) -> list:  # type: ignore[type-arg]
        outs = inner(feed)
        ex = model.prepared.resident_executor(feed)
        assert ex is not None and set(past) <= ex.kept_inputs
        loads.append((feed[past[0]].shape[2], ex.loaded_bytes, feed[past[0]].nbytes))
        return outs

    model.prepared.eval = record  # type: ignore[method-assign]
    r = gen.generate([prompt], max_new_tokens=40)
    np.testing.assert_array_equal(np.array(r.ids[0]), ref["tokens"][0][:40])
    decode = loads[1:]
    firsts = {n for n, *_ in decode}
    for k, (n, loaded, one) in enumerate(decode):
        if k and decode[k - 1][0] == n:  # a later step of the same padded length
            assert loaded < one, (k, n, loaded, one)
    assert sum(loaded < one for _, loaded, one in decode) == len(decode) - len(firsts)
    # the decode plan: no step reads a past input to copy it
    feed_shapes = {"B": 1, "past_sequence_length": decode[-1][0], "sequence_length": 1}
    ex = model.prepared.executor(feed_shapes)
    views = [ex.plan.inputs[ex.plan.input_names.index(n)] for n in past]
    for s in ex.plan.steps:
        if isinstance(s, st.Copy | st.Elementwise):
            assert not any(v in views for v in s.reads()), s.describe()
