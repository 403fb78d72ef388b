"""Token ids to client text: UTF-8-safe incremental detokenisation and stop strings.

A token may end in the middle of a UTF-8 character, and a stop string may span tokens, so text
is held back until it is known to be complete and not the start of a stop string. Nothing a
client receives is ever taken back.

Stop strings are matched as the text arrives, one Knuth-Morris-Pratt automaton per string, so a
token costs the same whatever the client's stop strings and however much text is held. (Scanning
the held text again at every token cost the square of its length: a long stop string that the
output followed for thousands of characters held the tick thread, every lane's, for seconds at
the token that broke the match.)

``n_indent`` (llama-server's, on ``POST /infill``): a line after a new line whose first character
that is not a space or a tab comes after fewer than ``n_indent`` spaces and tabs ends the text
at that character, as llama-server's ``process_token`` erases ``generated_text`` from it (the new
line and the indentation stay; an empty line is under-indented too: its new line is such a
character). The first line, the rest of the cursor's, is never checked. Since the indentation
stays whatever follows it, nothing is held for this rule: it is decided at that one character.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable


class _StopMatcher:
    """One stop string, matched character by character (Knuth-Morris-Pratt). ``state``: the
    length of the longest suffix of the text fed so far that is a proper prefix of the stop
    string. Its tables are computed only as far as a match has reached, so a long stop string
    costs what the text has matched of it, not its length."""

    __slots__ = ("stop", "fail", "skip", "state")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.fail = [0]  # fail[i]: the length of the longest proper border of stop[: i + 1]
        # skip[q]: where a mismatch in state q goes, past the borders whose next character is
        # stop[q] too (they would mismatch as well): a character costs O(log len(stop)) steps at
        # most, where plain failure links walk back a whole run ("xxx...x" then "y")
        self.skip = [0]
        self.state = 0

    def feed(self, char: str) -> bool:
        """Advance by one character; True when the stop string ends with it."""
        stop, skip, q = self.stop, self.skip, self.state
        while q and stop[q] != char:
            q = skip[q]
        if stop[q] == char:
            q += 1
        if q == len(stop):
            self.state = 0  # the stream stops here
            return True
        if q >= len(skip):
            self._grow(q)
        self.state = q
        return False

    def _grow(self, q: int) -> None:
        """The tables for every state up to ``q`` (< len(stop))."""
        stop, fail, skip = self.stop, self.fail, self.skip
        while len(skip) <= q:
            s = len(skip)
            while len(fail) < s:
                i, k = len(fail), fail[-1]
                while k and stop[i] != stop[k]:
                    k = skip[k]
                fail.append(k + 1 if stop[i] == stop[k] else k)
            f = fail[s - 1]
            skip.append(skip[f] if f and stop[f] == stop[s] else f)


class TextStream:
    def __init__(
        self, token_bytes: Callable[[int], bytes], stop: list[str] | None = None, resumed: str = "", *, n_indent: int = 0
    ) -> None:
        """``resumed``: the text a lost worker had sent already (a job submitted again goes on
        after it): a stop string that began in it and ends in the new text stops the stream, and
        a line whose indentation began in it is checked as a whole. ``n_indent`` > 0: the text
        ends at a line indented less (the module's docstring)."""
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [_StopMatcher(s) for s in (stop or []) if s]
        longest = max((len(matcher.stop) for matcher in self._stop), default=0)
        for char in resumed[1 - longest :] if longest > 1 else "":
            for matcher in self._stop:
                matcher.feed(char)  # (a whole one in it cannot be: the lost worker stopped there)
        self._held = ""  # decoded text not yet emitted because it may begin a stop string
        self.stopped = False  # a stop string matched; the stream emits nothing more
        self.stop_word: str | None = None  # ... the one that did (the first in the text)
        # ... or a limit ended it (llama-server's stop_type "limit"): an under-indented line, or
        # the worker's time limit (``limit()``)
        self.limited = False
        self._n_indent = n_indent
        # the spaces and tabs so far of a line whose indentation is not decided yet (the text
        # ends in them, after a new line); None on the first line and once the line's first other
        # character came
        self._indent: int | None = None
        line = resumed[resumed.rfind("\n") + 1 :] if "\n" in resumed else None
        if n_indent > 0 and line is not None and not line.strip(" \t"):
            self._indent = len(line)  # the sent text ends in a line's indentation: it goes on
        self.emitted_chars = 0
        # The tokens whose text went out: whole, or, once a stop string matched, in part ("x;"
        # with stop ";"). Their logprobs entries go with it, and their count is what a job
        # submitted again after its worker was lost goes on after (Delta.tokens): a token whose
        # text was held (a possible stop string's start, a character's first bytes) is generated
        # again by the next worker, after the text that did go out.
        self.tokens_out = 0
        # each pushed token not yet out: (its first character's index, the characters decoded
        # once it was pushed, whether its bytes ended a character)
        self._not_out: deque[tuple[int, int, bool]] = deque()

    def push(self, token: int) -> str:
        """Add one generated token; return the text that may be sent now."""
        if self.stopped:
            return ""  # (no text, nor entry: it is not out)
        new = self._decoder.decode(self._token_bytes(token))
        first = self.emitted_chars + len(self._held)  # the characters decoded before it
        self._not_out.append((first, first + len(new), not self._decoder.getstate()[0]))
        text = self._release(new, final=False)
        self._count_out()
        return text

    def flush(self) -> str:
        """The generation ended: return whatever is still held (incomplete bytes become U+FFFD)."""
        if self.stopped:
            return ""
        text = self._release(self._decoder.decode(b"", final=True), final=True)
        self.tokens_out += len(self._not_out)
        self._not_out.clear()
        return text

    def limit(self) -> str:
        """A limit ends the text here (llama-server's ``t_max_predict_ms``, which the worker
        checks): what is still held goes out, as at the end (a stop string it may begin can no
        longer complete), and nothing after it."""
        text = self.flush()
        if not self.stopped:
            self.stopped = self.limited = True
        return text

    def _indent_cut(self, new: str) -> int:
        """Feed ``new`` to the ``n_indent`` rule: the index in ``new`` of the character where an
        under-indented line is cut (the stream's state stops there), or -1."""
        count, i, end = self._indent, 0, len(new)
        while i < end:
            if count is None:  # up to the next new line, nothing to check
                i = new.find("\n", i)
                if i < 0:
                    break
                count, i = 0, i + 1
                continue
            char = new[i]
            if char == " " or char == "\t":
                count += 1
                i += 1
                continue
            if count < self._n_indent:
                self._indent = None
                return i
            count = None  # indented enough; a new line here begins the next one (not passed over)
        self._indent = count
        return -1

    def _count_out(self) -> None:
        emitted, not_out = self.emitted_chars, self._not_out
        if self.stopped:  # the text before the stop went out: every token with a character in it
            while not_out and not_out[0][0] < emitted:
                not_out.popleft()
                self.tokens_out += 1
            not_out.clear()
            return
        whole = seen = 0  # out whole: up to the last token ending a character whose text went out
        for _first, decoded, ends_character in not_out:
            if decoded > emitted:
                break
            seen += 1
            if ends_character:
                whole = seen
        for _ in range(whole):
            not_out.popleft()
        self.tokens_out += whole

    def _release(self, new: str, *, final: bool) -> str:
        text = self._held + new
        base = len(self._held)
        # where an under-indented line is cut, in ``text``: the held text was checked already
        cut = self._indent_cut(new) if self._n_indent > 0 else -1
        if cut >= 0:
            cut += base
        if self._stop:
            # where the first occurrence of a stop string in ``text`` begins: each one ends in
            # ``new``, since ``_held`` is no longer than the longest match in progress
            start = -1
            word: str | None = None
            for matcher in self._stop:
                # no match in progress: nothing can begin before the stop string's first character
                first = new.find(matcher.stop[0]) if matcher.state == 0 else 0
                for i in range(first, len(new)) if first >= 0 else ():
                    if matcher.feed(new[i]):
                        begins = max(0, base + i + 1 - len(matcher.stop))  # < 0: it began in ``resumed``
                        if start < 0 or begins < start:
                            start, word = begins, matcher.stop
                        break
            # the earlier ends the text; a stop string that begins at the cut is what ended it
            if start >= 0 and (cut < 0 or start <= cut):
                self.stopped = True
                self.stop_word = word
                self._held = ""
                return self._emit(text[:start])
            if not final and cut < 0:
                keep = min(max(matcher.state for matcher in self._stop), len(text))
                self._held = text[len(text) - keep :] if keep else ""
                return self._emit(text[: len(text) - keep])
        self._held = ""
        if cut >= 0:
            self.stopped = self.limited = True
            return self._emit(text[:cut])
        return self._emit(text)

    def _emit(self, text: str) -> str:
        self.emitted_chars += len(text)
        return text
