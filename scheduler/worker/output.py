"""Token ids to client text: UTF-8-safe incremental detokenisation and stop strings.

A token may end in the middle of a UTF-8 character, and a stop string may span tokens, so text
is held back until it is known to be complete and not the start of a stop string. Nothing a
client receives is ever taken back.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class TextStream:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: list[str] | None = None) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in (stop or []) if s]
        self._held = ""  # decoded text not yet emitted because it may begin a stop string
        self.stopped = False  # a stop string matched; the stream emits nothing more
        self.emitted_chars = 0

    def push(self, token: int) -> str:
        """Add one generated token; return the text that may be sent now."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(self._token_bytes(token))
        return self._release(final=False)

    def flush(self) -> str:
        """The generation ended: return whatever is still held (incomplete bytes become U+FFFD)."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        text = self._held
        if self._stop:
            hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
            if hits:
                self.stopped = True
                self._held = ""
                return self._emit(text[: min(hits)])
            if not final:
                keep = self._longest_stop_prefix_suffix(text)
                self._held = text[len(text) - keep :] if keep else ""
                return self._emit(text[: len(text) - keep])
        self._held = ""
        return self._emit(text)

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def _emit(self, text: str) -> str:
        self.emitted_chars += len(text)
        return text
