"""From token ids to text deltas: never half a UTF-8 character, never part of a stop string.

Decoding token by token is wrong for byte-level BPE (a character may span tokens) and for
tokenizers that merge spaces, so the text of a window of recent tokens is decoded and only
what it adds beyond the already-emitted part is emitted, once it no longer ends in U+FFFD
(the mark of an incomplete character), as vLLM and TGI do. Text that could still turn into
a stop string is held back until it cannot."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextStream"]

#: Tokens kept before the read offset for context (spaces, merges) when decoding a window.
_CONTEXT_TOKENS = 5


class TextStream:
    """The text of one sequence's generated tokens, released step by step."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str], sent: Sequence[int] = ()) -> None:
        """``sent``: tokens of this completion generated (and their text sent) elsewhere, a
        resumed stream's: fed first, their text dropped, so what follows is released exactly
        as it would have been after them."""
        self._decode = decode
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text has been taken
        self._held = ""  # text taken but not yet emitted (a possible stop string's start)
        self.stopped = False
        """True once a stop string was found (the text ends before it)."""
        for token in sent:
            self.add(token)

    def add(self, token: int) -> str:
        """Add a generated token; return the text that can be emitted now (nothing once stopped)."""
        if self.stopped:
            return ""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # an incomplete character (or nothing new) so far
        self._held += after[len(before) :]
        self._read = len(self._ids)
        self._prefix = max(self._prefix, self._read - _CONTEXT_TOKENS)
        return self._release()

    def flush(self) -> str:
        """At the end of the stream: what is still held (an incomplete character decodes to U+FFFD)."""
        if self.stopped:
            return ""
        rest = self._decode(self._ids[self._prefix :])[len(self._decode(self._ids[self._prefix : self._read])) :]
        text, self._held = self._held + rest, ""
        self._read = len(self._ids)
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            return text[:cut]
        return text

    def _release(self) -> str:
        text = self._held
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_stop(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _stop_at(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _partial_stop(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that starts some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[-n:]):
                    best = n
                    break
        return best
