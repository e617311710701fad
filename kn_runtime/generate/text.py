"""The text of one generated row as it grows: what each new token adds (the streamed piece), and
where a stop string ends the row. Text is decoded from all the row's ids each time (a byte-level
tokenizer's character may take several tokens: a piece ending in U+FFFD waits for the rest), and
text that may be the start of a stop string is held back until it is known not to be one, so a
stream never shows a stop string or part of one."""

from __future__ import annotations

from collections.abc import Sequence

from kn_runtime.generate.tokenizer import Tokenizer

__all__ = ["RowText"]


class RowText:
    """One row's generated ids and text; `add` a token, get the piece it releases."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stops = tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.text = ""
        """The text so far, up to (not including) a stop string once one appeared."""
        self._emitted = 0
        self.stopped = False

    def add(self, token: int) -> str:
        """Take one generated token; the text it releases (maybe empty). Sets `stopped` when a
        stop string appears; the text then ends before it."""
        self.ids.append(token)
        text = self._tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a character cut in the middle: wait for its other bytes
            return ""
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self.text = text[:cut]
            return self._release(len(self.text))
        self.text = text
        return self._release(len(text) - self._held(text))

    def flush(self) -> str:
        """The text held back (the row ended without a stop string)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        piece = self.text[self._emitted : upto]
        self._emitted = max(self._emitted, upto)
        return piece

    def _first_stop(self, text: str) -> int | None:
        """Where the first stop string starts, searching only text that may hold a new one."""
        longest = max((len(s) for s in self._stops), default=0)
        start = max(0, self._emitted - longest)
        found = [i for s in self._stops if (i := text.find(s, start)) >= 0]
        return min(found) if found else None

    def _held(self, text: str) -> int:
        """The length of the longest end of `text` that starts a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
