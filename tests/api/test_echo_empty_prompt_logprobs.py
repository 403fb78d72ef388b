"""Completions ``echo`` + ``logprobs`` with a prompt whose text is empty (``prompt: ""`` on a
model that adds BOS, or token ids that spell nothing): the scored prompt tokens come back
streamed as they do unstreamed (api.responses.Reply)."""

from __future__ import annotations

from typing import Any

from api.responses import Reply
from scheduler.link.messages import Delta, Done

BOS = {"token_id": 1, "bytes": [], "logprob": None, "top": []}
MADE = {"token_id": 3, "bytes": list(b"Hi"), "logprob": -0.1, "top": [{"token_id": 3, "bytes": list(b"Hi"), "logprob": -0.1}]}


def test_an_empty_echo_streams_the_prompts_entries_as_the_whole_reply_has_them() -> None:
    whole = Reply("completions", "m", echo="", logprobs=True)
    whole.prompt_logprobs = [BOS]
    whole.add(Delta("j", "Hi", 1, [MADE]))
    body = whole.body(Done("j", "stop"), None)["choices"][0]
    streamed = Reply("completions", "m", echo="", logprobs=True)
    streamed.prompt_logprobs = [BOS]
    frames = streamed.first_chunks() + streamed.delta_chunks(Delta("j", "Hi", 1, [MADE])) + streamed.final_chunks(Done("j", "stop"), None)
    choices: list[dict[str, Any]] = [c for f in frames for c in f["choices"]]
    assert "".join(c["text"] for c in choices) == body["text"] == "Hi"
    lps = [c["logprobs"] for c in choices if c.get("logprobs")]
    assert [t for lp in lps for t in lp["tokens"]] == body["logprobs"]["tokens"]
    assert [v for lp in lps for v in lp["token_logprobs"]] == body["logprobs"]["token_logprobs"] == [None, -0.1]
    assert [o for lp in lps for o in lp["text_offset"]] == body["logprobs"]["text_offset"]


def test_without_logprobs_an_empty_echo_sends_no_empty_first_chunk() -> None:
    streamed = Reply("completions", "m", echo="")
    streamed.prompt_logprobs = []
    assert streamed.first_chunks() == []
