"""The CLIP BPE tokenizer on the shipped tiny vocabulary: known ids (computed with transformers'
CLIPTokenizer, i.e. the `tokenizers` library, by examples/make_tiny_sd.py --print-token-ids), the
same CLIP pipeline rebuilt with `tokenizers` on many prompts, and the tokenizer.json path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kn_runtime.sd import TINY_SD
from kn_runtime.sd.tokenizer import (
    BpeTokenizer,
    HfTokenizer,
    TokenizerError,
    load_tokenizer,
    pre_split,
)

TOKENIZER = TINY_SD / "tokenizer"

# fmt: off
KNOWN = {
    "a photograph of an astronaut riding a horse on mars":
        [912, 320, 586, 327, 524, 530, 716, 81, 891, 320, 888, 519, 76, 703, 913],
    "A Cat's  hat, in the style of Van Gogh!!":
        [912, 320, 750, 6, 338, 878, 267, 527, 549, 515, 88, 532, 524, 85, 530, 873, 0, 256, 913],
    "": [912, 913],
    "zebra 123 über-café 🙂":
        [912, 89, 68, 725, 320, 272, 273, 274, 127, 120, 65, 535, 268, 66, 64, 69, 127, 358, 172, 253, 247, 480, 913],
}
PROMPTS = [
    *KNOWN,
    "ugly, blurry, low quality, deformed",
    "Portrait photo of an OLD man with a beard; 50mm f/1.8 — studio light",
    "we're they'll I'd you've it's 'quoted' don't",
    "tabs\tand\nnewlines   and   spaces",
    "½ ² ٣ Ⅻ numbers, ÀÉÎÕÜ ß ﬁ",
    "日本語のテキスト 中文 한국어 Ελληνικά русский",
    "emoji 🐱‍👤 🇫🇷 ✨✨",
    "!!!??? ...,,, ___ --- @@@ ###",
]
# fmt: on


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    t = load_tokenizer(TOKENIZER)
    assert isinstance(t, BpeTokenizer)
    return t


def clip_tokenizers_reference():  # type: ignore[no-untyped-def]
    """CLIP's tokenizer as transformers builds it on the `tokenizers` library."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab = json.loads((TOKENIZER / "vocab.json").read_text(encoding="utf-8"))
    lines = (TOKENIZER / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    merges = [tuple(m.split()) for m in lines if m]
    t = tokenizers.Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token="<|endoftext|>",
        )
    )
    t.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    t.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(
                    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
                ),
                behavior="removed",
                invert=True,
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.RobertaProcessing(
        ("<|endoftext|>", vocab["<|endoftext|>"]),
        ("<|startoftext|>", vocab["<|startoftext|>"]),
        trim_offsets=False,
        add_prefix_space=False,
    )
    return t


def test_vocabulary_layout(tok: BpeTokenizer) -> None:
    """CLIP's layout: 256 byte symbols, the same with </w>, merges, then start and end last."""
    assert len(tok.vocab) == 914 and len(tok.ranks) == 400
    assert (tok.start_id, tok.end_id, tok.pad_id) == (912, 913, 913)
    assert tok.vocab["!"] == 0 and tok.vocab["!</w>"] == 256 and tok.max_length == 16


@pytest.mark.parametrize("prompt", list(KNOWN))
def test_known_ids(tok: BpeTokenizer, prompt: str) -> None:
    ids = KNOWN[prompt]
    assert [tok.start_id, *tok.tokenize(prompt), tok.end_id] == ids
    padded = tok.encode(prompt)
    assert len(padded) == 16 and padded[0] == 912 and padded[-1] == 913
    assert padded == ([*ids[:15], 913] if len(ids) > 16 else ids + [913] * (16 - len(ids)))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_same_ids_as_tokenizers_library(tok: BpeTokenizer, prompt: str) -> None:
    ref = clip_tokenizers_reference()
    assert [tok.start_id, *tok.tokenize(prompt), tok.end_id] == ref.encode(prompt).ids


def test_tokenizer_json_path(tok: BpeTokenizer, tmp_path: Path) -> None:
    """A folder with only tokenizer.json goes through `tokenizers` and gives the same ids."""
    clip_tokenizers_reference().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"model_max_length": 16, "pad_token": {"content": "<|endoftext|>"}}'
    )
    hf = load_tokenizer(tmp_path)
    assert isinstance(hf, HfTokenizer)
    for p in PROMPTS:
        assert hf.encode(p) == tok.encode(p)


def test_pre_split_follows_clip_regex() -> None:
    assert list(pre_split("it's a dog's 3d-art!! <|endoftext|>x")) == [
        "it",
        "'s",
        "a",
        "dog",
        "'s",
        "3",
        "d",
        "-",
        "art",
        "!!",
        "<|endoftext|>",
        "x",
    ]


def test_truncation_keeps_the_end_token(tok: BpeTokenizer) -> None:
    ids = tok.encode("a " * 40)
    assert len(ids) == 16 and ids[0] == 912 and ids[-1] == 913 and set(ids[1:-1]) == {320}


def test_missing_or_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="neither"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a": 0}')
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(TokenizerError, match="startoftext"):
        load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(TokenizerError, match="two symbols"):
        load_tokenizer(tmp_path)
