"""CLIP's byte-level BPE tokenizer, read from a model folder's `tokenizer/` files.

Stable Diffusion conditions on CLIP token ids, so the prompt must be split exactly as CLIP was
trained: NFC, whitespace collapsed, lowercase; pre-split into specials, contractions, letter runs,
single digits and punctuation runs; every piece as UTF-8 bytes mapped to printable characters,
`</w>` on the last one, then BPE merges by rank. `vocab.json` + `merges.txt` are read by the pure
Python code below; a folder with only `tokenizer.json` goes through the `tokenizers` package.
"""

from __future__ import annotations

import functools
import itertools
import json
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "BpeTokenizer",
    "HfTokenizer",
    "TextTokenizer",
    "bytes_to_unicode",
    "load_tokenizer",
    "pre_split",
]

START, END = "<|startoftext|>", "<|endoftext|>"
SPECIALS = (START, END)
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
MAX_MERGES = 49152 - 256 - 2
"""CLIP reads at most this many merges (its vocabulary has 49408 entries)."""
DEFAULT_MAX_LENGTH = 77


class TokenizerError(ValueError):
    """A tokenizer folder that cannot be read (missing or malformed files)."""


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's printable character for every byte: printable Latin-1 bytes stand for
    themselves, the others are moved to 256 and up, so no piece contains whitespace or controls."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def normalize(text: str) -> str:
    """NFC and lowercase, as CLIP's normalizer in `tokenizers` (it also collapses whitespace,
    which `pre_split` drops anyway)."""
    return unicodedata.normalize("NFC", text).lower()


def _kind(c: str) -> str:
    """'s'pace, 'l'etter (\\p{L}), 'n'umber (\\p{N}) or 'o'ther."""
    if c.isspace():
        return "s"
    cat = unicodedata.category(c)[0]
    return "l" if cat == "L" else "n" if cat == "N" else "o"


def pre_split(text: str) -> Iterator[str]:
    """CLIP's pre-split regex, written as a scanner over Unicode categories:
    `<|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|\\p{L}+|\\p{N}|[^\\s\\p{L}\\p{N}]+`."""
    i, n = 0, len(text)
    while i < n:
        k = _kind(text[i])
        if k == "s":
            i += 1
            continue
        hit = next((s for s in (*SPECIALS, *CONTRACTIONS) if text.startswith(s, i)), None)
        if hit is not None:
            j = i + len(hit)
        elif k == "n":
            j = i + 1
        else:
            j = i + 1
            while j < n and _kind(text[j]) == k:
                j += 1
        yield text[i:j]
        i = j


class TextTokenizer(Protocol):
    """What the pipeline needs: padded ids of one prompt."""

    max_length: int

    def tokenize(self, text: str) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...


class BpeTokenizer:
    """CLIP BPE from `vocab.json` (token -> id) and `merges.txt` (one `a b` pair per line)."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        pad_token: str = END,
    ) -> None:
        for tok in (*SPECIALS, pad_token):
            if tok not in vocab:
                raise TokenizerError(f"the vocabulary has no '{tok}' token")
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges[:MAX_MERGES])}
        self.max_length = max_length
        self.start_id, self.end_id, self.pad_id = vocab[START], vocab[END], vocab[pad_token]
        self._byte_char = bytes_to_unicode()
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def from_files(cls, vocab_path: Path, merges_path: Path, **kw: Any) -> BpeTokenizer:
        try:
            vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
            lines = merges_path.read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError) as e:
            raise TokenizerError(
                f"cannot read the tokenizer files in {vocab_path.parent}: {e}"
            ) from None
        merges: list[tuple[str, str]] = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip() or (lineno == 1 and line.startswith("#version")):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise TokenizerError(
                    f"{merges_path}:{lineno}: expected two symbols, found '{line}'"
                )
            merges.append((parts[0], parts[1]))
        if not isinstance(vocab, dict):
            raise TokenizerError(f"{vocab_path}: expected a JSON object of token -> id")
        return cls(vocab, merges, **kw)

    def bpe(self, piece: str) -> list[str]:
        """The BPE symbols of one pre-split piece (cached: prompts repeat words)."""
        if piece in SPECIALS:
            return [piece]
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word = [self._byte_char[b] for b in piece.encode("utf-8")]
        word[-1] += "</w>"
        while len(word) > 1:
            pairs = set(itertools.pairwise(word))
            best = min(pairs, key=lambda p: self.ranks.get(p, len(self.ranks)))
            if best not in self.ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self._cache[piece] = word
        return word

    def tokenize(self, text: str) -> list[int]:
        """Ids of the text, without start/end tokens or padding (unknown symbols -> the end id,
        CLIP's unk)."""
        return [
            self.vocab.get(s, self.end_id) for p in pre_split(normalize(text)) for s in self.bpe(p)
        ]

    def encode(self, text: str) -> list[int]:
        """`[start] + ids + [end]`, truncated and padded to `max_length` like diffusers does."""
        return pad_ids(
            self.tokenize(text), self.start_id, self.end_id, self.pad_id, self.max_length
        )


class HfTokenizer:
    """A `tokenizer.json` through the `tokenizers` package (for folders without vocab/merges)."""

    def __init__(
        self, path: Path, *, max_length: int = DEFAULT_MAX_LENGTH, pad_token: str = END
    ) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(
                f"{path} needs the 'tokenizers' package: pip install 'kyanite[sd]' "
                "(or a folder with vocab.json + merges.txt, read without it)"
            ) from None
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises its own Exception type
            raise TokenizerError(f"cannot read {path}: {e}") from None
        ids = [self.tok.token_to_id(t) for t in (START, END, pad_token)]
        if any(i is None for i in ids):
            raise TokenizerError(f"{path}: the vocabulary lacks {START}, {END} or '{pad_token}'")
        self.start_id, self.end_id, self.pad_id = (int(i) for i in ids)  # type: ignore[arg-type]
        self.max_length = max_length

    def tokenize(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return pad_ids(
            self.tokenize(text), self.start_id, self.end_id, self.pad_id, self.max_length
        )


def pad_ids(ids: list[int], start: int, end: int, pad: int, max_length: int) -> list[int]:
    body = ids[: max(0, max_length - 2)]
    out = [start, *body, end]
    return out + [pad] * (max_length - len(out))


def _special(cfg: dict[str, Any], key: str) -> str | None:
    v = cfg.get(key)
    if isinstance(v, dict):  # serialized AddedToken
        v = v.get("content")
    return v if isinstance(v, str) else None


def load_tokenizer(folder: Path, max_length: int | None = None) -> TextTokenizer:
    """The tokenizer of a `tokenizer/` folder: vocab.json + merges.txt, else tokenizer.json.
    `max_length` (the text encoder's sequence length when it is fixed) beats the config's."""
    if not folder.is_dir():
        raise TokenizerError(f"tokenizer folder {folder} does not exist")
    cfg: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        p = folder / name
        if p.is_file():
            try:
                cfg.update(json.loads(p.read_text(encoding="utf-8")))
            except ValueError as e:
                raise TokenizerError(f"{p} is not valid JSON: {e}") from None
    length = max_length or cfg.get("model_max_length")
    if not isinstance(length, int) or not 2 <= length <= 4096:  # HF writes 1e30 for "unlimited"
        length = DEFAULT_MAX_LENGTH
    pad = _special(cfg, "pad_token") or END
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return BpeTokenizer.from_files(
            folder / "vocab.json", folder / "merges.txt", max_length=length, pad_token=pad
        )
    if (folder / "tokenizer.json").is_file():
        return HfTokenizer(folder / "tokenizer.json", max_length=length, pad_token=pad)
    raise TokenizerError(f"{folder} has neither vocab.json + merges.txt nor tokenizer.json")
