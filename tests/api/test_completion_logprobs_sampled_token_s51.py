"""Legacy completions ``logprobs``: each ``top_logprobs`` item holds the token itself beside its
alternatives, as OpenAI's legacy endpoint documents ("The API will always return the logprob of
the sampled token, so there may be up to logprobs+1 elements in the response") and vLLM answers.
Here ``logprobs: 0`` gave ``{}`` for every token, and a token sampled outside the top N (a
temperature above 0, or an echoed prompt's token) was missing from its own item, so a client
reading ``top_logprobs[i][tokens[i]]`` (or the most likely of an empty item) failed. Streamed or
not (api.responses.Reply)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from api.responses import Reply
from scheduler.link.messages import Delta, Done

_piece = st.sampled_from([b" the", b"He", b"llo", b"\xe2\x82", b"\xac", b" Paris", b"", b"!"])


@st.composite
def entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Worker entries of a reply: each token, its logprob, and up to N alternatives (which may
    or may not hold it)."""
    n = draw(st.integers(0, 3))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        raw = draw(_piece)
        top = [{"token_id": i, "bytes": list(draw(_piece)), "logprob": -float(i)} for i in range(n)]
        out.append({"token_id": 99, "bytes": list(raw), "logprob": -draw(st.floats(0, 30)), "top": top})
    return out


def frames_logprobs(reply: Reply, events: list[Delta], done: Done) -> dict[str, list[Any]]:
    frames = reply.first_chunks()
    for event in events:
        frames += reply.delta_chunks(event)
    frames += reply.final_chunks(done, None)
    got: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    for f in frames:
        for c in f["choices"]:
            for k in got:
                got[k] += (c.get("logprobs") or {}).get(k, [])
    return got


@given(entries())
def test_every_top_logprobs_item_holds_its_token_streamed_or_not(es: list[dict[str, Any]]) -> None:
    events = [Delta("j", bytes(e["bytes"]).decode("utf-8", "replace"), logprobs=[e]) for e in es]
    whole = Reply("completions", "m", logprobs=True)
    for event in events:
        whole.add(event)
    body = whole.body(Done("j", "length"), None)["choices"][0]["logprobs"]
    streamed = frames_logprobs(Reply("completions", "m", logprobs=True), events, Done("j", "length"))
    for lp in (body, streamed):
        assert len(lp["top_logprobs"]) == len(es)
        for e, token, alts in zip(es, lp["tokens"], lp["top_logprobs"], strict=True):
            assert token in alts and len(alts) <= len(e["top"]) + 1
            named = {bytes(t["bytes"]).decode("utf-8", "replace"): t["logprob"] for t in e["top"]}
            assert alts[token] == named.get(token, e["logprob"])  # an alternative's own where it is one
            assert all(alts[k] == v for k, v in named.items())
    assert streamed["top_logprobs"] == body["top_logprobs"]


def test_logprobs_zero_gives_the_token_alone() -> None:
    e = {"token_id": 7, "bytes": list(b" Paris"), "logprob": -0.25, "top": []}
    whole = Reply("completions", "m", logprobs=True)
    whole.add(Delta("j", " Paris", logprobs=[e]))
    assert whole.body(Done("j", "length"), None)["choices"][0]["logprobs"]["top_logprobs"] == [{" Paris": -0.25}]
