"""Logprobs of a reply holding bytes that are no UTF-8 (a byte token the model wrote alone, a
character's first byte followed by no continuation): the worker's text shows each as U+FFFD
(three bytes of text for one byte of token), and the entries must still follow the text the
client got, never the tokens of a stop string whose text was held back (api.responses.Reply)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.link.messages import Delta, Done
from scheduler.worker.output import TextStream

from .test_logprobs_stop import entry_tokens, replied, streamed_tokens


def _events(pieces: list[bytes], stop: list[str], reason: str = "length") -> tuple[list[Delta], Done]:
    """What the worker sends for these tokens (scheduler/worker/loop.py's _process and
    _finished): a delta a token, with the entries of the tokens whose text went out with it
    (``TextStream.tokens_out``)."""
    stream = TextStream(pieces.__getitem__, stop)
    events: list[Delta] = []
    entries = [{"token_id": token, "bytes": list(raw), "logprob": -0.5, "top": []} for token, raw in enumerate(pieces)]
    out = 0
    for token in range(len(pieces)):
        text = stream.push(token)
        events.append(Delta("j", text, logprobs=entries[out : stream.tokens_out]))
        out = stream.tokens_out
        if stream.stopped:
            return events, Done("j", "stop", stop_word=stream.stop_word)
    text = stream.flush()
    events.append(Delta("j", text, logprobs=entries[out : stream.tokens_out]))
    return events, Done("j", reason)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize(
    "pieces",
    [
        [b"\xff", b"X", b"Y"],  # a byte that is no UTF-8, then the stop string
        [b"a\xc3", b" ", b"X", b"Y"],  # a character's first byte cut off by what follows
        [b"\xf0\x9f", b"\xff\xfe", b"X", b"Y"],
    ],
)
def test_a_stop_strings_tokens_have_no_logprobs_after_text_that_is_no_utf8(endpoint: Any, pieces: list[bytes]) -> None:
    events, done = _events(pieces, ["XY"])
    assert done.stop_word == "XY"
    body, frames = replied(endpoint, events, done)
    text = body["text"] if endpoint == "completions" else body["message"]["content"]
    assert "X" not in text
    # one entry per token of the text: none for the stop string's "X", held back and never sent
    assert entry_tokens(endpoint, body["logprobs"]) == [bytes(p).decode("utf-8", "replace") for p in pieces[:-2]]
    assert streamed_tokens(endpoint, frames) == entry_tokens(endpoint, body["logprobs"])
