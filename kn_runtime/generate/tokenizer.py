"""The tokenizer of an LLM folder: its `tokenizer.json` through the `tokenizers` package
(`pip install 'kyanite[generate]'`), or, for a character-level WordLevel tokenizer such as the
shipped default model's, a few lines of Python, so that `kn-generate` runs after the plain
install (tokenizers pulls in a hub client and its stack; see pyproject.toml)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kn_graph.errors import ModelFolderError

__all__ = ["CharTokenizer", "Tokenizer", "load_tokenizer"]

CHAR_SPLIT = r"[\s\S]"
"""The pre-tokenizer regex of a character-level tokenizer: every character its own piece."""


class Tokenizer(Protocol):
    """What the generation loop needs of a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Ids it can produce, added tokens included."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens left out."""
        ...

    def token_id(self, token: str) -> int | None: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer` (special tokens such as BOS are added as its post-processor
    says, as `transformers` does by default)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class CharTokenizer:
    """A character-level WordLevel `tokenizer.json` (pre-tokenizer: split off every character;
    decoder: Fuse) without the `tokenizers` package: one id per character, the unknown token's
    for the rest."""

    def __init__(self, vocab: dict[str, int], unk: str, special: frozenset[int]) -> None:
        self._vocab = vocab
        self._tokens = {i: t for t, i in vocab.items()}
        self._unk = vocab[unk]
        self._special = special

    @staticmethod
    def from_json(data: dict) -> CharTokenizer | None:
        """The tokenizer a `tokenizer.json` describes when it is character-level WordLevel,
        else None."""
        model, pre, dec = (
            data.get("model") or {},
            data.get("pre_tokenizer") or {},
            data.get("decoder") or {},
        )
        pattern = (pre.get("pattern") or {}).get("Regex")
        if (
            model.get("type") != "WordLevel"
            or pre.get("type") != "Split"
            or pattern != CHAR_SPLIT
            or pre.get("behavior") != "Isolated"
            or dec.get("type") != "Fuse"
            or data.get("normalizer") is not None
            or data.get("post_processor") is not None
        ):
            return None
        vocab = {str(k): int(v) for k, v in model["vocab"].items()}
        special = frozenset(
            int(t["id"]) for t in data.get("added_tokens") or [] if t.get("special")
        )
        return CharTokenizer(vocab, str(model["unk_token"]), special)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def encode(self, text: str) -> list[int]:
        return [self._vocab.get(ch, self._unk) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._tokens.get(int(i), "") for i in ids if int(i) not in self._special)

    def token_id(self, token: str) -> int | None:
        return self._vocab.get(token)


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of `path` (a tokenizer.json); ModelFolderError when it needs the
    `tokenizers` package and it is not installed."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelFolderError(f"{path}: cannot read it as JSON ({e})") from e
        simple = CharTokenizer.from_json(data)
        if simple is None:
            raise ModelFolderError(
                f"{path} needs the 'tokenizers' package: pip install 'kyanite[generate]' "
                "(or pip install tokenizers)"
            ) from None
        return simple
    try:
        return HFTokenizer(path)
    except Exception as e:  # tokenizers raises plain Exceptions for files it cannot parse
        raise ModelFolderError(f"{path}: tokenizers cannot read it ({e})") from e
