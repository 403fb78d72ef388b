"""The typed link messages: what both ends send, on the wire and back."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.link import messages as m

EXAMPLES: list[m.Message] = [
    m.Submit(id="j1", request={"endpoint": "chat", "messages": [{"role": "user", "content": "é <|im_end|>"}]}, qos=0, priority=-7, pin_prefix=True, resume_text="so far", resume_tokens=3),
    m.Cancel(id="j1"),
    m.Config(class_lanes={"background": 1}),
    m.Hello(model="sim", engine="sim", n_lanes=2, lane_ctx=512, pid=42),
    m.Accepted(id="j1", prompt_tokens=12),
    m.Rejected(id="j1", reason=m.CONTEXT_LENGTH_EXCEEDED, detail="too long", param="messages"),
    m.Delta(id="j1", text="hello", tokens=5),
    m.Done(id="j1", finish_reason="length", usage={"prompt_tokens": 1, "completion_tokens": 2}, timing={"ttft_ms": 1.5}, serial={"serial_band": "normal"}),
    m.Error(id="j1", reason=m.ENGINE_CRASHED, detail="twice"),
    m.Snapshot(state={"lanes": [], "lanes_active": 0}),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda msg: msg.type)
def test_every_message_crosses_the_wire_unchanged(message: m.Message) -> None:
    line = m.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert m.decode(line) == message


def test_the_worker_is_not_sent_the_key_and_done_does_not_echo_class_or_priority() -> None:
    assert "key" not in {f.name for f in dataclasses.fields(m.Submit)}
    assert not {"class", "priority"} & {f.name for f in dataclasses.fields(m.Done)}


def test_a_decoder_ignores_fields_it_does_not_know_and_fills_defaults() -> None:
    """Ends a version apart still understand each other (a fleet upgraded one process at a time)."""
    got = m.decode(json.dumps({"type": "submit", "id": "j", "request": {}, "from_a_newer_web_side": "k1"}).encode())
    assert got == m.Submit(id="j", request={})


@pytest.mark.parametrize("line", [b"[]", b"{}", b'{"type": "nope"}', b'{"type": "delta"}', b"not json", b'"\xff"'])
def test_what_is_not_a_message_is_a_value_error(line: bytes) -> None:
    with pytest.raises(ValueError):
        m.decode(line)


@given(st.text(), st.text())
def test_any_text_either_encodes_and_comes_back_or_is_an_encode_error(prompt: str, stop: str) -> None:
    message = m.Submit(id="j", request={"prompt": prompt, "stop": [stop]})
    try:
        line = m.encode(message)
    except m.EncodeError:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in prompt + stop)
        return
    assert m.decode(line) == message


def test_a_lone_surrogate_or_a_nan_is_an_encode_error() -> None:
    with pytest.raises(m.EncodeError):
        m.encode(m.Submit(id="j", request={"messages": [{"role": "user", "content": "\ud800"}]}))
    with pytest.raises(m.EncodeError):
        m.encode(m.Submit(id="j", request={"temperature": float("nan")}))
