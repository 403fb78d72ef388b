"""The worker's TextStream (scheduler/worker/output.py): stop strings matched as text arrives."""

from __future__ import annotations

import codecs
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.worker.output import TextStream


class NaiveStream:
    """The rule, written plainly: hold back what may begin a stop string; at the first stop
    string (the earliest that begins in the text so far), emit what comes before it and stop."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: list[str]) -> None:
        self.token_bytes = token_bytes
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self.text = ""  # everything decoded
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        return "" if self.stopped else self._release(self.decoder.decode(self.token_bytes(token)), final=False)

    def flush(self) -> str:
        return "" if self.stopped else self._release(self.decoder.decode(b"", final=True), final=True)

    def _release(self, new: str, final: bool) -> str:
        self.text += new
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            out, self.sent = self.text[self.sent : min(hits)], len(self.text)
            return out
        keep = 0
        if not final:
            keep = max((n for s in self.stop for n in range(1, len(s)) if self.text.endswith(s[:n])), default=0)
        end = max(self.sent, len(self.text) - keep)
        out, self.sent = self.text[self.sent : end], end
        return out


def byte_pieces(text: str, cuts: list[int]) -> list[bytes]:
    """The text cut into tokens of the given byte sizes, in turn (UTF-8 characters split too)."""
    data = text.encode()
    pieces: list[bytes] = []
    i = 0
    while i < len(data):
        n = cuts[len(pieces) % len(cuts)]
        pieces.append(data[i : i + n])
        i += n
    return pieces


ALPHABET = "ab\u00e9\u4e2d"  # repeats, and characters of two and three UTF-8 bytes


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=0, max_size=6), max_size=4),
    text=st.text(ALPHABET, max_size=40),
    cuts=st.lists(st.integers(1, 4), min_size=1, max_size=60),
)
def test_the_stream_releases_what_the_plain_rule_says_token_by_token(stops: list[str], text: str, cuts: list[int]) -> None:
    data = text.encode()
    pieces: list[bytes] = []  # the text cut into tokens of 1-4 bytes (UTF-8 characters split too)
    i = 0
    while i < len(data):
        n = cuts[len(pieces) % len(cuts)]
        pieces.append(data[i : i + n])
        i += n
    ours, plain = TextStream(pieces.__getitem__, stops), NaiveStream(pieces.__getitem__, stops)
    for token in range(len(pieces)):
        assert ours.push(token) == plain.push(token), (stops, pieces, token)
        assert ours.stopped == plain.stopped
    assert ours.flush() == plain.flush()


def test_output_that_follows_a_long_stop_string_and_breaks_off_is_released_whole() -> None:
    """What the stream holds while the output follows long stop strings comes out whole, and
    once, at the token that breaks the match. (What that token costs on the tick thread, every
    lane's, is measured by bench/stop_strings.py: with the held text scanned again at every
    token it was 1.5 s here at 128,000 characters; docs/benchmarks.md.)"""
    stops = ["x" * (50_000 + i) for i in range(4)]
    stream = TextStream(lambda t: b"xxxx" if t == 0 else b"y", stops)
    for _ in range(8_000):
        assert stream.push(0) == ""
    assert stream.push(1) == "x" * 32_000 + "y" and not stream.stopped
    assert stream.push(0) == "" and stream.flush() == "xxxx"  # held again: a stop string may begin there


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=1, max_size=4),
    text=st.text(ALPHABET, max_size=40),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=60),
)
def test_the_tokens_out_are_those_whose_text_went_out(stops: list[str], text: str, cuts: list[int]) -> None:
    """``tokens_out`` (their logprobs entries go out; a job submitted again goes on after them):
    while no stop string matched, the longest run of tokens whose bytes are whole characters of
    the text sent; at the stop, every token with a character before it."""
    pieces = byte_pieces(text, cuts)
    stream = TextStream(pieces.__getitem__, stops)
    sent = ""
    for token in range(len(pieces)):
        sent += stream.push(token)
        sent_bytes = sent.encode()
        if stream.stopped:
            # token k's first character: the whole characters in the tokens before it
            firsts = [len(b"".join(pieces[:k]).decode("utf-8", "ignore")) for k in range(token + 1)]
            assert stream.tokens_out == sum(1 for f in firsts if f < len(sent)), (stops, pieces, token)
            break
        whole = [k for k in range(token + 2) if sent_bytes.startswith(b"".join(pieces[:k])) and _whole_characters(b"".join(pieces[:k]))]
        assert stream.tokens_out == max(whole), (stops, pieces, token)


def _whole_characters(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
