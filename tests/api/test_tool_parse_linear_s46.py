"""Hostile replies in tool mode cost work in proportion to their length, not its square: the
reply parser (``parse_tool_calls``, every format) and the streamed reply (``Reply``), which run on
the web process's event loop, where one request's long reply stalled every other request's.

Work is counted, not timed: the characters copied out of the reply (slices of it, or the held text
a delta is appended to), which a quadratic path makes grow with the square of the length."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.responses import MAX_CALL_HEAD, MAX_PARSED_CALLS, Reply, parse_tool_calls
from scheduler.link.messages import Delta, Done
from tests.api.streamed import stream_reply

TOOLS = [{"name": "get_weather"}]
NAMES = ["get_weather"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class _Counted(str):
    """A reply's text that counts the characters copied out of it by slicing."""

    copied = 0

    def __getitem__(self, key: Any) -> str:
        out = str.__getitem__(self, key)
        _Counted.copied += len(out)
        return out


def _copied_parsing(text: str, fmt: str) -> tuple[int, int]:
    _Counted.copied = 0
    _content, calls = parse_tool_calls(_Counted(text), NAMES, fmt=fmt)
    return _Counted.copied, len(calls)


def test_a_reply_of_many_generic_calls_is_parsed_in_linear_work() -> None:
    # 20,000 blocks (~1.4 MB): each block's leading whitespace was found by stripping a copy of
    # the rest of the reply, ~10^10 characters in all (tens of seconds on the event loop)
    for fmt in ("hermes", "llama3", "mistral"):
        text = CALL * 20_000
        copied, calls = _copied_parsing(text, fmt)
        assert calls == 20_000
        assert copied <= 4 * len(text), (fmt, copied, len(text))


def test_a_mistral_array_of_many_calls_reads_at_most_the_bound() -> None:
    one = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    content, calls = parse_tool_calls("[TOOL_CALLS][" + ", ".join([one] * 10_000) + "]", NAMES, fmt="mistral")
    assert len(calls) == MAX_PARSED_CALLS and content is None
    assert all(json.loads(c["function"]["arguments"]) == {"city": "Paris"} for c in calls)


HOSTILE = [
    ("mistral", "[TOOL_CALLS]"),  # a Mistral call opened, then text without end
    ("mistral", "[TOOL_CALLS][{"),
    ("llama3", "{"),  # a Llama 3.x reply opening with an object
    ("llama3", "<|python_tag|>"),
    ("hermes", "<tool_call>{"),  # a generic block whose head never comes
    ("mistral", "<tool_call>{"),
    ("hermes", '<tool_call>{"name": "not_offered", "arguments": {'),  # a head naming no tool
]


class _Piece(str):
    """A delta's text that counts the characters of held text it is appended to."""

    copied = 0

    def __radd__(self, other: str) -> str:
        _Piece.copied += len(other)
        return str(other) + str(self)


def _stream(fmt: str, opening: str, deltas: int, piece: str = "abcdefgh") -> tuple[int, dict[str, Any]]:
    _Piece.copied = 0
    reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt)
    frames = reply.delta_chunks(Delta("j", opening))
    for _ in range(deltas):
        frames += reply.delta_chunks(Delta("j", _Piece(piece)))
    frames += reply.final_chunks(Done("j", "length"), None)
    content = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"])
    return _Piece.copied, {"content": content, "calls": sum(len(f["choices"][0]["delta"].get("tool_calls") or []) for f in frames if f["choices"])}


def test_a_long_held_reply_is_streamed_in_linear_work() -> None:
    # 5,000 deltas: the held text (a call maybe opened, parsed at the end) was rebuilt as one
    # string on every delta, ~10^8 characters here, minutes of event loop for a long reply
    deltas = 5_000
    for fmt, opening in HOSTILE:
        copied, got = _stream(fmt, opening, deltas)
        assert copied <= deltas * 2 * MAX_CALL_HEAD, (fmt, opening, copied)
        # and nothing is lost: no call, the whole text as content, as unstreamed
        assert got == {"content": opening + "abcdefgh" * deltas, "calls": 0}, (fmt, opening)


FRAGMENTS = st.sampled_from(
    ["[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<tool_call>", "</tool_call>", "{", "}", "[", "]", ",", " ", "\n",
     '"name": ', '"arguments": ', '"parameters": ', '"get_weather"', '"other"', "get_weather", "1", CALL]
)  # fmt: skip


def _body(fmt: str, text: str) -> dict[str, Any]:
    reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt)
    reply.add(Delta("j", text))
    message = reply.body(Done("j", "stop"), None)["choices"][0]["message"]
    return {"content": message["content"] or None, "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]}


def _streamed(fmt: str, pieces: list[str]) -> dict[str, Any]:
    got = stream_reply(pieces, TOOLS, fmt=fmt)
    return {"content": got.content or None, "calls": got.pairs}


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(["hermes", "llama3", "mistral"]),
    before=st.lists(FRAGMENTS, max_size=8),
    filler=st.sampled_from(["x", " ", '"', "{", "\\"]),
    after=st.lists(FRAGMENTS, max_size=8),
    size=st.integers(1, 64),
)
def test_fuzz_a_reply_held_past_a_heads_bound_streams_as_unstreamed(fmt: str, before: list[str], filler: str, after: list[str], size: int) -> None:
    # text held past MAX_CALL_HEAD is held to the end (no longer rescanned): the stream still
    # adds up to the unstreamed reply
    text = "".join(before) + filler * (MAX_CALL_HEAD + 50) + "".join(after)
    assert _streamed(fmt, [text[i : i + size] for i in range(0, len(text), size)]) == _body(fmt, text)


def _longest_string_kept(reply: Reply) -> int:
    """The longest string the reply keeps between deltas (lists of pieces are pieces): one that
    grows with the reply is copied whole each time a delta is added to it."""
    longest = 0
    for value in vars(reply).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                longest = max(longest, len(item))
    return longest


def test_a_long_streamed_call_or_whitespace_is_kept_in_pieces() -> None:
    # a streamed call's arguments and a reply of whitespace (held until text follows) were one
    # string each grown by every delta: ~3 s of event loop for 128k deltas, 4x the deltas ~14x
    opening = '<tool_call>{"name": "get_weather", "arguments": {"city": "'
    cases = [("hermes", opening, "abcdefgh"), ("hermes", "", "    "), ("llama3", "", " \n  "), ("mistral", "", "\t   ")]
    for fmt, first, piece in cases:
        reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt)
        reply.delta_chunks(Delta("j", first))
        for _ in range(2_000):
            reply.delta_chunks(Delta("j", piece))
        assert _longest_string_kept(reply) <= MAX_CALL_HEAD, (fmt, first)
        frames = reply.delta_chunks(Delta("j", '"}}</tool_call>' if first else "end")) + reply.final_chunks(Done("j", "stop"), None)
        if first:  # the call's arguments, whole
            args = "".join(c["function"].get("arguments") or "" for f in frames for c in f["choices"][0]["delta"].get("tool_calls") or [])
            assert args.endswith('"}') and frames[-1]["choices"][0]["finish_reason"] == "tool_calls"
        else:  # the text as content (in tool mode the content's leading whitespace is none of it)
            assert "".join(f["choices"][0]["delta"].get("content") or "" for f in frames) == "end"


def test_a_streamed_calls_long_closing_is_scanned_once(monkeypatch: Any) -> None:
    # what follows a streamed call's arguments (members such as an "id", then "}" and the closing
    # tag) was scanned from its start on every delta: 20 calls with 4,000-character tails took
    # ~3 s of event loop
    import api.responses as responses

    fed = [0]
    feed = responses._ArgsScanner.feed

    def counted(self: Any, text: str, start: int = 0, stop: int | None = None) -> int:
        fed[0] += len(text[start:stop])
        return feed(self, text, start, stop)

    monkeypatch.setattr(responses._ArgsScanner, "feed", counted)
    reply = Reply("chat", "m", tools=TOOLS)
    total = 0
    frames: list[dict[str, Any]] = []
    for _ in range(5):
        for piece in ['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "', *["abcd"] * 800, '"}</tool_call>']:
            total += len(piece)
            frames += reply.delta_chunks(Delta("j", piece))
    frames += reply.final_chunks(Done("j", "stop"), None)
    assert fed[0] <= 2 * total, (fed[0], total)
    calls = [c for f in frames for c in f["choices"][0]["delta"].get("tool_calls") or [] if c.get("id")]
    assert len(calls) == 5 and frames[-1]["choices"][0]["finish_reason"] == "tool_calls"


TAILS = st.lists(st.sampled_from([",", ' "id": ', '"x"', '"a}b"', "1", "{", "}", "[", "]", "\\", '"', " ", "\n", "</tool_call>", "</tool", "_call>", '"name": '] ), max_size=10)


@settings(max_examples=150, deadline=None)
@given(tail=TAILS, size=st.integers(1, 7))
def test_fuzz_a_streamed_calls_closing_streams_as_unstreamed(tail: list[str], size: int) -> None:
    # members after the arguments, then the call's end: a call unstreamed where they are JSON (a
    # streamed call whose closing never comes was sent already; it finishes "stop", as documented)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}' + "".join(tail) + "}\n</tool_call> after"
    body = _body("hermes", text)
    if body["calls"]:
        assert _streamed("hermes", [text[i : i + size] for i in range(0, len(text), size)]) == body
