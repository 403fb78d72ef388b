"""A streamed event is one ``data:`` line for every line splitter a client may use. JSON escapes
CR and LF, but U+2028, U+2029 and U+0085 went out raw (``ensure_ascii=False``), and httpx's
``iter_lines()`` (as ``str.splitlines``, and requests' ``iter_lines(decode_unicode=True)``) ends a
line at each: a client reading the stream line by line got half an event, which is no JSON."""

from __future__ import annotations

import json

import pytest
from httpx._decoders import LineDecoder

from api import responses
from scheduler.link.messages import Delta
from tests.edge.inproc import JSON, SimWorker, attached, request

SEPARATORS = ["\u2028", "\u2029", "\x85"]


def data_lines(body: bytes) -> list[str]:
    """The ``data:`` payloads as a client splitting the stream with httpx's ``iter_lines`` reads them."""
    decoder = LineDecoder()
    lines = decoder.decode(body.decode("utf-8")) + decoder.flush()
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


@pytest.mark.parametrize("sep", SEPARATORS)
def test_a_text_delta_with_a_unicode_line_separator_is_one_line(sep: str) -> None:
    reply = responses.Reply("chat", "m")
    events = b"".join(reply.delta_events(Delta("j", f"a{sep}b")))  # the per-token template
    events += b"".join(responses.sse_event(f) for f in reply.delta_chunks(Delta("j", f"c{sep}d")))
    payloads = data_lines(events)
    assert [json.loads(p)["choices"][0]["delta"]["content"] for p in payloads] == [f"a{sep}b", f"c{sep}d"]


@pytest.mark.django_db(transaction=True)
async def test_a_streamed_echo_holding_a_line_separator_parses_line_by_line() -> None:
    prompt = "one\u2028two\u2029three\x85four"
    body = json.dumps({"model": "sim", "prompt": prompt, "echo": True, "stream": True, "max_tokens": 2}).encode()
    async with attached(SimWorker()):
        reply = await request("POST", "/v1/completions", body, JSON)
    assert reply.status == 200
    payloads = data_lines(reply.body)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]  # each line is a whole event
    assert chunks[0]["choices"][0]["text"] == prompt
