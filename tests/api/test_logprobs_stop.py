"""Logprobs beside a stop string: one entry per token of the text the client gets, never entries
for the stop string's tokens, streamed or not (api.responses.Reply)."""

from __future__ import annotations

from typing import Any

import pytest

from api.responses import Reply
from scheduler.link.messages import Delta, Done


def entry(text: str) -> dict[str, Any]:
    raw = list(text.encode("utf-8"))
    return {"token_id": 1, "bytes": raw, "logprob": -0.5, "top": [{"token_id": 1, "bytes": raw, "logprob": -0.5}]}


# What the worker sends for "1, 2, 3, 4," -> " 5, 6" with stop " 6" (seen on the real model):
# the entries of " " come while its text is held back as the start of the stop string, and the
# reply ends on the "6" that completes it. The client got " 5," and the entries of " ", "5",
# "," and " ": one token past its text.
EVENTS = [
    Delta("j", "", logprobs=[entry(" ")]),
    Delta("j", " 5", logprobs=[entry("5")]),
    Delta("j", ",", logprobs=[entry(",")]),
    Delta("j", "", logprobs=[entry(" ")]),
]
DONE = Done("j", "stop", stop_word=" 6")


def entry_tokens(endpoint: str, logprobs: dict[str, Any]) -> list[str]:
    return list(logprobs["tokens"]) if endpoint == "completions" else [t["token"] for t in logprobs["content"]]


def replied(endpoint: Any, events: list[Delta], done: Done) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reply to ``events``: its choice unstreamed, and its frames streamed."""
    whole = Reply(endpoint, "m", logprobs=True)
    for event in events:
        whole.add(event)
    streamed = Reply(endpoint, "m", logprobs=True)
    frames = streamed.first_chunks()
    for event in events:
        frames += streamed.delta_chunks(event)
    return whole.body(done, None)["choices"][0], frames + streamed.final_chunks(done, None)


def streamed_tokens(endpoint: Any, frames: list[dict[str, Any]]) -> list[str]:
    return [t for f in frames for c in f["choices"] if c.get("logprobs") for t in entry_tokens(endpoint, c["logprobs"])]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_stop_strings_tokens_have_no_logprobs_streamed_or_not(endpoint: Any) -> None:
    body, frames = replied(endpoint, EVENTS, DONE)
    text = body["text"] if endpoint == "completions" else body["message"]["content"]
    assert text == " 5,"
    assert "".join(entry_tokens(endpoint, body["logprobs"])) == text
    assert streamed_tokens(endpoint, frames) == entry_tokens(endpoint, body["logprobs"])
    if endpoint == "completions":
        offsets = [o for f in frames for c in f["choices"] if c.get("logprobs") for o in c["logprobs"]["text_offset"]]
        assert offsets == body["logprobs"]["text_offset"] == [0, 1, 2]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_without_a_stop_string_every_tokens_entry_comes(endpoint: Any) -> None:
    """A token whose text the worker held (a character's first bytes, a possible stop string's
    start) and that the reply then ended on (max_tokens) still has its entry."""
    events = [Delta("j", "a", logprobs=[entry("a")]), Delta("j", "", logprobs=[entry(" ")]), Delta("j", " ", logprobs=[])]
    body, frames = replied(endpoint, events, Done("j", "length"))
    assert entry_tokens(endpoint, body["logprobs"]) == ["a", " "]
    assert streamed_tokens(endpoint, frames) == ["a", " "]
