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
    m.Delta(id="j1", text="hi", tokens=1, logprobs=[{"token_id": 7, "bytes": [104, 105], "logprob": -0.25, "top": []}]),
    m.Hello(model="smollm2", engine="llamacpp", n_lanes=8, lane_ctx=2048, pid=7, n_ctx_train=8192, n_vocab=49152),
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


@pytest.mark.parametrize("line", [b"[]", b"{}", b'{"type": "nope"}', b'{"type": "delta"}', b"not json",
     b'{"type": "cancel", "id": ["x"]}', b'{"type": "delta", "id": {"a": 1}, "text": "x"}', b'{"type": "done", "id": 7, "finish_reason": "stop"}', b'"\xff"', pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-too-deep")])
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


def test_a_message_longer_than_the_readers_bound_is_an_encode_error_for_its_job_alone() -> None:
    """The reader ends a connection on a line over MAX_LINE_BYTES (every job on it fails): an
    Accepted carrying the prompt logprobs of a ~43,000-token echo reached that. The sender
    refuses it instead, and the worker's sender turns it into that job's error."""
    from scheduler.worker.server import encode_or_error

    huge = m.Delta(id="j", text="x" * m.MAX_LINE_BYTES, tokens=1)
    with pytest.raises(m.EncodeError, match="at most"):
        m.encode(huge)
    error = m.decode(encode_or_error(huge))
    assert isinstance(error, m.Error) and error.id == "j" and error.reason == m.UNENCODABLE
    assert len(m.encode(m.Delta(id="j", text="x" * (m.MAX_LINE_BYTES - 100), tokens=1))) <= m.MAX_LINE_BYTES


def test_an_older_worker_s_hello_and_delta_leave_the_optional_fields_unset() -> None:
    hello = m.decode(b'{"type": "hello", "model": "m", "engine": "sim", "n_lanes": 1, "lane_ctx": 64, "pid": 1}')
    assert isinstance(hello, m.Hello) and hello.n_ctx_train is None and hello.n_vocab is None
    delta = m.decode(b'{"type": "delta", "id": "j", "text": "x", "tokens": 1}')
    assert isinstance(delta, m.Delta) and delta.logprobs is None


@pytest.mark.parametrize("reason", [m.UNSUPPORTED_PARAMETER, m.INVALID_VALUE])
def test_a_sampler_refusal_is_a_400_naming_its_parameter(reason: str) -> None:
    from api.link_errors import link_error

    err = link_error(m.Rejected(id="j", reason=reason, detail="'logit_bias' is not supported by the mlx engine.", param="logit_bias"))
    assert (err.status, err.code, err.param) == (400, reason, "logit_bias")
    assert "logit_bias" in err.message


def test_a_grammar_too_slow_is_a_400_the_client_can_read() -> None:
    """Mid-stream it is an error frame; before the first token, the request's status."""
    from api.link_errors import link_error

    err = link_error(m.Error(id="j", reason=m.GRAMMAR_TOO_SLOW, detail="The grammar took 5.2 s of masks"))
    assert (err.status, err.code, err.type) == (400, "grammar_too_slow", "invalid_request_error")
    assert "5.2 s" in err.message
