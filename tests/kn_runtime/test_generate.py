"""Text generation (`kn_runtime.generate`) on the shipped tiny model: greedy tokens against an
onnxruntime loop over the same ONNX file (tests/kn_runtime/llm_reference.py), on the product CPU
backend and the reference executor; left-padded batches against rows run alone; stops; streams;
threads. Bad folders and prompts: tests/kn_runtime/test_generate_errors.py."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from kn_runtime import Device, Generator, load_generator
from kn_runtime.generate import TINY_LLM
from tests.kn_runtime.llm_reference import ort_greedy

DEVICES = {"cpu": lambda: Device.cpu(), "reference": lambda: Device.cpu(reference=True)}


@pytest.fixture(scope="module")
def generators() -> dict[str, Generator]:
    """One generator per device for the module: the CPU backend plans each past length once
    (a binding each) and keeps them for the next test."""
    return {name: load_generator(None, make(), max_bindings=128) for name, make in DEVICES.items()}


def _folder(tmp_path: Path, **config: object) -> Path:
    """A copy of the tiny model with config.json entries replaced."""
    folder = tmp_path / "llm"
    shutil.copytree(TINY_LLM, folder)
    data = json.loads((folder / "config.json").read_text()) | config
    (folder / "config.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_greedy_generation_equals_an_onnxruntime_loop_for_32_tokens(
    generators: dict[str, Generator], device: str
) -> None:
    gen = generators[device]
    prompt = gen.tokenizer.encode("Hi")
    # the CPU backend plans (and compiles) every past length of this model once: 12 tokens
    # keep CI's cold kernel cache quick; the reference executor checks all 32
    n = 12 if device == "cpu" else 32
    want = ort_greedy(TINY_LLM / "model.onnx", [prompt], n)[0].tolist()
    steps = gen.model.steps
    result = gen.generate(prompt, max_new_tokens=n)
    assert list(result.ids[0]) == want
    assert result.finish_reasons == ("length",)
    assert result.text == gen.tokenizer.decode(want)
    # one evaluation per prompt token (this model takes one token a step) and per new token
    assert gen.model.steps - steps == len(prompt) + n - 1


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_a_left_padded_batch_gives_each_row_what_it_gives_alone(
    generators: dict[str, Generator], device: str
) -> None:
    gen = generators[device]
    prompts = ["Hello", "Hi"]
    both = gen.generate(prompts, max_new_tokens=8)
    for row, prompt in enumerate(prompts):
        alone = gen.generate(prompt, max_new_tokens=8)
        assert both.ids[row] == alone.ids[0], prompt
        assert both.texts[row] == alone.texts[0]
    ids = [gen.tokenizer.encode(p) for p in prompts]
    np.testing.assert_array_equal(np.array(both.ids), ort_greedy(TINY_LLM / "model.onnx", ids, 8))


def test_stream_events_add_up_to_the_result(generators: dict[str, Generator]) -> None:
    gen = generators["reference"]
    stream = gen.stream(["Hello", "Hi"], max_new_tokens=10)
    events = list(stream)
    assert stream.result is not None
    for row in (0, 1):
        mine = [e for e in events if e.row == row]
        assert [e.token_id for e in mine] == list(stream.result.ids[row])
        assert "".join(e.text for e in mine) == stream.result.texts[row]
        assert [e.finish for e in mine] == [None] * 9 + ["length"]


def test_a_stop_string_ends_the_row_before_it_and_is_never_streamed(
    generators: dict[str, Generator],
) -> None:
    gen = generators["reference"]
    full = gen.generate("Hello world", max_new_tokens=32).text
    stop = full[10:13]
    cut = full.find(stop)
    stream = gen.stream("Hello world", max_new_tokens=32, stop=["QQQQ", stop])
    pieces = "".join(e.text for e in stream)
    assert stream.result is not None
    assert stream.result.text == full[:cut] == pieces
    assert stream.result.finish_reasons == ("stop",)
    assert len(stream.result.ids[0]) == cut + len(stop)  # one character per token


def test_an_eos_id_ends_its_row_and_a_finished_row_emits_nothing(tmp_path: Path) -> None:
    ref = load_generator(None, Device.cpu(reference=True))
    free = ref.generate(["Hello", "Hi"], max_new_tokens=12).ids
    eos = free[0][4]
    gen = load_generator(_folder(tmp_path, eos_token_id=[eos, 999]), Device.cpu(reference=True))
    got = gen.generate(["Hello", "Hi"], max_new_tokens=12)
    for row in (0, 1):
        ends = [i for i, t in enumerate(free[row]) if t == eos]
        if ends:
            assert got.ids[row] == free[row][: ends[0] + 1]
            assert got.finish_reasons[row] == "eos"
        else:
            assert got.ids[row] == free[row] and got.finish_reasons[row] == "length"
    assert got.finish_reasons[0] == "eos" and len(got.ids[0]) <= 5


def test_the_context_length_ends_a_row(tmp_path: Path) -> None:
    gen = load_generator(_folder(tmp_path, max_position_embeddings=8), Device.cpu(reference=True))
    result = gen.generate("Hello", max_new_tokens=10)
    assert result.finish_reasons == ("context",) and len(result.ids[0]) == 3


def test_sampling_is_reproducible_by_seed(generators: dict[str, Generator]) -> None:
    gen = generators["reference"]
    kw = {"max_new_tokens": 12, "temperature": 1.2, "top_k": 20, "top_p": 0.95}
    a = gen.generate(["Hello", "Hi"], seed=5, **kw)  # type: ignore[arg-type]
    assert a.ids == gen.generate(["Hello", "Hi"], seed=5, **kw).ids  # type: ignore[arg-type]
    assert a.ids != gen.generate(["Hello", "Hi"], seed=6, **kw).ids  # type: ignore[arg-type]
    greedy = gen.generate(["Hello", "Hi"], max_new_tokens=12).ids
    assert a.ids != greedy


def test_concurrent_requests_on_one_generator_get_what_they_get_alone(
    generators: dict[str, Generator],
) -> None:
    gen = generators["reference"]
    prompts = ["Hello", "Hi there", "abc", "Once upon"]
    alone = [gen.generate(p, max_new_tokens=10).ids[0] for p in prompts]
    got: dict[int, tuple[int, ...]] = {}

    def serve(i: int) -> None:
        got[i] = gen.generate(prompts[i], max_new_tokens=10).ids[0]

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(prompts))] == alone


def test_timing_is_reported(generators: dict[str, Generator]) -> None:
    t = generators["reference"].generate("Hello", max_new_tokens=6).timing
    assert t.prompt_tokens == 5 and t.decode_tokens == 5
    assert 0 < t.prefill_s <= t.time_to_first_token_s
    assert t.decode_s > 0 and t.decode_tokens_per_s > 0 and t.prefill_tokens_per_s > 0


def _optimum_names(src: Path, dst: Path) -> None:
    """The tiny model with Optimum's names (`past_key_values.{i}.key`, `present.{i}.key`) and
    Optimum's extra inputs (`position_ids` [B, S], `use_cache_branch` [1] bool), unused here:
    the generator must find every role by name and feed them."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(src))
    rename = {}
    for i in range(2):
        for kv in ("key", "value"):
            rename[f"past_{kv}_{i}"] = f"past_key_values.{i}.{kv}"
            rename[f"present_{kv}_{i}"] = f"present.{i}.{kv}"
    for v in [*m.graph.input, *m.graph.output]:
        v.name = rename.get(v.name, v.name)
    for node in m.graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    m.graph.input.extend(
        [
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", 1]),
            helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
        ]
    )
    onnx.save(m, str(dst))


def test_optimum_names_and_inputs_are_found_by_name(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _optimum_names(TINY_LLM / "model.onnx", folder / "model.onnx")
    gen = load_generator(folder, Device.cpu(reference=True))
    sig = gen.model.signature
    assert (sig.position_ids, sig.use_cache_branch) == ("position_ids", "use_cache_branch")
    assert [p.present for p in sig.past] == [
        "present.0.key",
        "present.0.value",
        "present.1.key",
        "present.1.value",
    ]
    want = load_generator(None, Device.cpu(reference=True)).generate(["Hello", "Hi"], 6).ids
    assert gen.generate(["Hello", "Hi"], max_new_tokens=6).ids == want
