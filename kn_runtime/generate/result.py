"""What a generation gives back: per-token events while it runs (`TokenEvent`), and at the end
the ids, text and finish reason of every row with the timing (`GenerationResult`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FINISH_REASONS", "GenerationResult", "Timing", "TokenEvent"]

FINISH_REASONS = ("eos", "stop", "length", "context", "cancelled")
"""Why a row ended: an end-of-sequence token, a stop string, `max_new_tokens`, the model's
context length, or its reader went away (`BatchedStream.cancel`, a served request whose client
left)."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token of one row: its id and the text it releases (possibly empty: part
    of a character, or text that may begin a stop string); `finish` is set on a row's last
    event (its finish reason). A finished row sends no more events."""

    row: int
    token_id: int
    text: str
    finish: str | None = None


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall times of one generation. Prefill: the prompt's forward pass (every row);
    decode: the steps after the first token."""

    prompt_tokens: int
    """Real (unpadded) prompt tokens over all rows."""
    prefill_s: float
    time_to_first_token_s: float
    """From the call to the first token chosen (tokenizing and the prefill included)."""
    decode_tokens: int
    """Tokens emitted by the steps after the first, over all rows."""
    decode_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """`ids[r]` are row r's generated ids (an ending eos included), `texts[r]` their text (up
    to a stop string, special tokens left out), `finish_reasons[r]` one of FINISH_REASONS."""

    prompt_ids: tuple[tuple[int, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    finish_reasons: tuple[str, ...]
    timing: Timing

    @property
    def text(self) -> str:
        """The first row's text (a single prompt's answer)."""
        return self.texts[0]
