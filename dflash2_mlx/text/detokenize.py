"""Incremental detokenization and stop strings.

Text for each new token is the difference between decoding a short window with
and without it, so streaming costs O(window) per token and the joined stream
equals a full decode of the generated ids. (mlx-lm's streaming detokenizer
drops a leading space of the first segment, which breaks streamed code.)
"""

from typing import Sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context: Sequence[int] = ()):
        self._tokenizer = tokenizer
        # A few tokens of left context keep leading-space handling stable.
        self._tokens = list(context[-4:])
        self._prefix = 0
        self._read = len(self._tokens)

    def add(self, token: int) -> str:
        """Add one token; return the text it completes (may be '')."""
        self._tokens.append(token)
        decode = self._tokenizer.decode
        before = decode(self._tokens[self._prefix : self._read])
        after = decode(self._tokens[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an incomplete UTF-8 sequence: wait for more bytes
        self._prefix, self._read = self._read, len(self._tokens)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a trailing partial character)."""
        decode = self._tokenizer.decode
        before = decode(self._tokens[self._prefix : self._read])
        after = decode(self._tokens[self._prefix :])
        self._prefix = self._read = len(self._tokens)
        return after[len(before) :]


class StopMatcher:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        held = self._held + text
        found = [at for at in (held.find(stop) for stop in self.stops) if at >= 0]
        if found:  # cut at the earliest match, whatever the order of the stop strings
            self._held = ""
            return held[: min(found)], True
        keep = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(held)), 0, -1):
                if held.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
