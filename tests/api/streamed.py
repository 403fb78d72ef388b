"""A streamed chat reply put back together as the openai client's stream helpers do: the tests
of tool-call streaming compare it with the reply built whole."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from api.responses import Reply
from scheduler.link.messages import Delta, Done


@dataclass
class Streamed:
    content: str | None = None  # None: no chunk carried content (an empty string is content)
    reasoning: str | None = None  # delta.reasoning_content put together (None: none came)
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"id", "name", "arguments"} by index
    finish_reason: str | None = None
    fragments: list[int] = field(default_factory=list)  # per call: how many chunks carried argument text

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(c["name"], c["arguments"]) for c in self.calls]

    def view(self) -> dict[str, Any]:
        """What the client reads: reasoning, content (None for none or empty), calls as (name,
        arguments), finish reason; the same shape as :func:`whole_view`'s."""
        return {"reasoning": self.reasoning, "content": self.content or None, "calls": self.pairs, "finish_reason": self.finish_reason}


def whole_view(choice: dict[str, Any]) -> dict[str, Any]:
    """:meth:`Streamed.view` of an unstreamed chat completion's choice."""
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return {"reasoning": message.get("reasoning_content"), "content": message["content"] or None, "calls": calls, "finish_reason": choice["finish_reason"]}


def said(reply: Any, stream: bool) -> dict[str, Any]:
    """The view of a 200 chat reply of the in-process middle layer (tests/edge/inproc.py), its
    stream's frames put together (ended by ``[DONE]``, no error frame among them)."""
    assert reply.status == 200, reply.body
    if not stream:
        return whole_view(reply.json()["choices"][0])
    frames = reply.sse_data()
    assert frames and frames[-1] == "[DONE]", frames[-3:]
    chunks = [json.loads(data) for data in frames[:-1]]
    assert not [c for c in chunks if "error" in c], chunks
    return assemble(chunks).view()


def assemble(chunks: list[dict[str, Any]]) -> Streamed:
    out = Streamed()
    calls: dict[int, dict[str, Any]] = {}
    frags: dict[int, int] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content") is not None:
                out.reasoning = (out.reasoning or "") + delta["reasoning_content"]
            if delta.get("content") is not None:
                out.content = (out.content or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                fn = call.get("function", {})
                entry = calls.setdefault(call["index"], {"id": call.get("id"), "name": "", "arguments": ""})
                entry["name"] += fn.get("name") or ""
                entry["arguments"] += fn.get("arguments") or ""
                frags[call["index"]] = frags.get(call["index"], 0) + bool(fn.get("arguments"))
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
    out.calls = [calls[i] for i in sorted(calls)]
    out.fragments = [frags[i] for i in sorted(frags)]
    return out


def stream_reply(pieces: list[str], tools: list[dict[str, Any]], *, fmt: str = "hermes", reason: str = "stop", stop_word: str | None = None, **reply: Any) -> Streamed:
    """The chat reply of ``pieces`` (the model's text as the worker streams it) offered ``tools``,
    streamed and assembled; ``stop_word``: the stop string that ended it, if one did;
    ``reply``: more of the Reply's options (tool_choice, ...)."""
    return assemble(streamed_chunks(Reply("chat", "m", tools=tools, tool_format=fmt, **reply), pieces, reason, stop_word))


def whole_reply(text: str, tools: list[dict[str, Any]], reason: str, stop_word: str | None = None, **reply: Any) -> dict[str, Any]:
    """:func:`stream_reply`'s unstreamed counterpart: the reply built whole from ``text`` (one
    delta) and its ending ``reason``, as content, calls and finish_reason."""
    built = Reply("chat", "m", tools=tools, **reply)
    built.add(Delta("j", text))
    view = whole_view(built.body(Done("j", reason, stop_word=stop_word), None)["choices"][0])
    return {"content": view["content"], "calls": view["calls"], "finish_reason": view["finish_reason"]}


def streamed_chunks(reply: Reply, pieces: list[str], reason: str = "stop", stop_word: str | None = None) -> list[dict[str, Any]]:
    """The chunks ``reply`` streams for ``pieces`` and its ending ``reason`` (and ``stop_word``)."""
    return [c for p in pieces for c in reply.delta_chunks(Delta("j", p))] + reply.final_chunks(Done("j", reason, stop_word=stop_word), None)


# cut points for :func:`cut_at`, a Hypothesis strategy
CUTS = st.lists(st.integers(min_value=0, max_value=400), max_size=12)


def cut_at(text: str, cuts: list[int]) -> list[str]:
    """``text`` in pieces, cut at each of ``cuts`` (taken modulo its length + 1: any list of
    integers a Hypothesis test draws is a split of it); empty pieces kept (a stream may carry one)."""
    at = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
