"""Response builders (api.responses, api.errors): shapes checked against the official openai SDK.

Two levels: the SDK's pydantic types (``model_validate``), and the SDK client itself reading our
bytes over an in-process ``httpx.MockTransport`` (streams, ``[DONE]``, mid-stream errors, HTTP
errors), so "the openai package parses it" is tested end to end without a network.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from api import errors
from api.errors import ApiError
from api.responses import (
    SSE_DONE,
    chat_chunk,
    chat_completion,
    chat_usage_chunk,
    completion_chunk,
    completion_usage_chunk,
    json_bytes,
    model_list,
    model_object,
    new_id,
    sse_error,
    sse_event,
    text_completion,
    usage_dict,
)
from tests.api.streamed import assemble, cut_at, stream_reply, whole_view

CREATED = 1_700_000_000


@contextmanager
def sdk_client(
    respond: Callable[[httpx.Request], httpx.Response],
) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` whose HTTP requests are answered by ``respond`` in-process."""
    http = httpx.Client(transport=httpx.MockTransport(respond))
    with openai.OpenAI(
        api_key="sk-test", base_url="http://test/v1", http_client=http, max_retries=0
    ) as client:
        yield client


def sse_response(*events: bytes) -> Callable[[httpx.Request], httpx.Response]:
    body = b"".join(events)
    return lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Callable[
    [httpx.Request], httpx.Response
]:
    return lambda request: httpx.Response(
        status, content=json_bytes(obj), headers={"content-type": "application/json", **(headers or {})}
    )


# -- ids, usage, created -----------------------------------------------------------------------


@pytest.mark.parametrize(("endpoint", "prefix"), [("chat", "chatcmpl-"), ("completions", "cmpl-")])
def test_new_id_has_the_openai_prefix_and_24_random_hex_chars(endpoint: Any, prefix: str) -> None:
    ids = {new_id(endpoint) for _ in range(100)}
    assert len(ids) == 100
    for i in ids:
        assert re.fullmatch(re.escape(prefix) + "[0-9a-f]{24}", i)


def test_new_id_rejects_an_unknown_endpoint() -> None:
    with pytest.raises(ValueError):
        new_id("embeddings")  # type: ignore[arg-type]


def test_usage_dict_totals_and_reports_cached_tokens() -> None:
    assert usage_dict(10, 5, cached_tokens=4) == {
        "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert usage_dict(3, 0)["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize(
    "build",
    [
        lambda c: chat_completion("chatcmpl-x", "m", c, "t", "stop", None),
        lambda c: chat_chunk("chatcmpl-x", "m", c, content="t"),
        lambda c: chat_usage_chunk("chatcmpl-x", "m", c, usage_dict(1, 1)),
        lambda c: text_completion("cmpl-x", "m", c, "t", "stop", None),
        lambda c: completion_chunk("cmpl-x", "m", c, "t"),
        lambda c: completion_usage_chunk("cmpl-x", "m", c, usage_dict(1, 1)),
        lambda c: model_object("m", c),
    ],
    ids=["chat", "chat-chunk", "chat-usage", "text", "text-chunk", "text-usage", "model"],
)
def test_created_is_now_when_not_given_and_kept_when_given(
    build: Callable[[int | None], dict[str, Any]],
) -> None:
    before = int(time.time())
    now = build(None)["created"]
    assert isinstance(now, int) and before <= now <= int(time.time())
    assert build(CREATED)["created"] == CREATED


# -- chat --------------------------------------------------------------------------------------


def test_chat_completion_parses_as_openai_chat_completion() -> None:
    body = chat_completion("chatcmpl-abc", "smollm2", CREATED, "Hello!", "stop", usage_dict(12, 3, 8))
    parsed = ChatCompletion.model_validate(body)
    assert parsed.id == "chatcmpl-abc" and parsed.object == "chat.completion"
    assert parsed.created == CREATED and parsed.model == "smollm2"
    assert len(parsed.choices) == 1
    choice = parsed.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop" and choice.logprobs is None
    assert choice.message.role == "assistant" and choice.message.content == "Hello!"
    assert choice.message.refusal is None and choice.message.tool_calls is None
    assert parsed.usage is not None
    usage = parsed.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 3, 15)
    assert parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.prompt_tokens_details.cached_tokens == 8
    assert parsed.system_fingerprint is None


def test_chat_completion_is_exactly_this_shape() -> None:
    assert chat_completion("chatcmpl-a", "m", CREATED, "x", "length", None) == {
        "id": "chatcmpl-a", "object": "chat.completion", "created": CREATED, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x", "refusal": None},
                     "logprobs": None, "finish_reason": "length"}],
        "usage": None, "system_fingerprint": None,
    }


@pytest.mark.parametrize(
    ("kwargs", "delta"),
    [({"role": "assistant", "content": ""}, {"role": "assistant", "content": ""}),
     ({"content": "tok"}, {"content": "tok"}),
     ({"finish_reason": "length"}, {}),
     ({}, {})],
    ids=["first", "text", "final", "empty"],
)
def test_chat_chunk_delta_holds_only_the_given_keys(kwargs: dict[str, Any], delta: dict[str, Any]) -> None:
    body = chat_chunk("chatcmpl-a", "m", CREATED, **kwargs)
    assert body["object"] == "chat.completion.chunk"
    assert body["choices"] == [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": kwargs.get("finish_reason")}
    ]
    assert "usage" not in body
    parsed = ChatCompletionChunk.model_validate(body)
    assert parsed.choices[0].delta.model_dump(exclude_unset=True) == delta
    assert parsed.choices[0].finish_reason == kwargs.get("finish_reason")


def test_chat_chunk_with_include_usage_carries_null_usage() -> None:
    body = chat_chunk("chatcmpl-a", "m", CREATED, content="x", include_usage=True)
    assert "usage" in body and body["usage"] is None
    assert ChatCompletionChunk.model_validate(body).usage is None


def test_chat_usage_chunk_has_no_choices_and_the_usage() -> None:
    body = chat_usage_chunk("chatcmpl-a", "m", CREATED, usage_dict(4, 2))
    parsed = ChatCompletionChunk.model_validate(body)
    assert parsed.choices == [] and parsed.object == "chat.completion.chunk"
    assert parsed.usage is not None and parsed.usage.total_tokens == 6


def test_openai_sdk_reads_a_chat_completion_response() -> None:
    body = chat_completion("chatcmpl-a", "smollm2", CREATED, "Hi there", "stop", usage_dict(5, 2))
    with sdk_client(json_response(body)) as client:
        got = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}])
    assert got.choices[0].message.content == "Hi there"
    assert got.usage is not None and got.usage.total_tokens == 7


def test_openai_sdk_reads_a_chat_stream_with_usage_until_done() -> None:
    cid, model = "chatcmpl-s", "smollm2"
    events = [
        sse_event(chat_chunk(cid, model, CREATED, role="assistant", content="", include_usage=True)),
        sse_event(chat_chunk(cid, model, CREATED, content="Hel", include_usage=True)),
        sse_event(chat_chunk(cid, model, CREATED, content="lo\n\"wörld\"", include_usage=True)),
        sse_event(chat_chunk(cid, model, CREATED, finish_reason="stop", include_usage=True)),
        sse_event(chat_usage_chunk(cid, model, CREATED, usage_dict(5, 3))),
        SSE_DONE,
        # Anything after [DONE] must be ignored by the client.
        sse_event(chat_chunk(cid, model, CREATED, content="junk")),
    ]
    with sdk_client(sse_response(*events)) as client:
        chunks = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert len(chunks) == 5
    assert all(c.id == cid and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello\n\"wörld\""
    assert chunks[3].choices[0].finish_reason == "stop"
    assert chunks[4].choices == [] and chunks[4].usage is not None and chunks[4].usage.completion_tokens == 3


# -- completions -------------------------------------------------------------------------------


def test_text_completion_parses_as_openai_completion() -> None:
    body = text_completion("cmpl-abc", "smollm2", CREATED, " there", "length", usage_dict(4, 16))
    parsed = Completion.model_validate(body)
    assert (parsed.id, parsed.object) == ("cmpl-abc", "text_completion")
    assert (parsed.created, parsed.model) == (CREATED, "smollm2")
    assert len(parsed.choices) == 1
    assert parsed.choices[0].text == " there" and parsed.choices[0].index == 0
    assert parsed.choices[0].finish_reason == "length" and parsed.choices[0].logprobs is None
    assert parsed.usage is not None and parsed.usage.total_tokens == 20


def test_completion_chunk_uses_the_text_completion_object_name() -> None:
    body = completion_chunk("cmpl-a", "m", CREATED, "tok")
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"text": "tok", "index": 0, "logprobs": None, "finish_reason": None}]
    assert "usage" not in body
    assert completion_chunk("cmpl-a", "m", CREATED, "", "stop")["choices"][0]["finish_reason"] == "stop"
    assert completion_chunk("cmpl-a", "m", CREATED, "x", include_usage=True)["usage"] is None


def test_completion_usage_chunk_has_no_choices_and_the_usage() -> None:
    parsed = Completion.model_validate(completion_usage_chunk("cmpl-a", "m", CREATED, usage_dict(2, 2, 1)))
    assert parsed.choices == [] and parsed.object == "text_completion"
    assert parsed.usage is not None and parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.prompt_tokens_details.cached_tokens == 1


def test_openai_sdk_reads_a_completion_stream() -> None:
    cid, model = "cmpl-s", "smollm2"
    events = [
        sse_event(completion_chunk(cid, model, CREATED, "Once", include_usage=True)),
        sse_event(completion_chunk(cid, model, CREATED, " upon", include_usage=True)),
        sse_event(completion_chunk(cid, model, CREATED, "", "length", include_usage=True)),
        sse_event(completion_usage_chunk(cid, model, CREATED, usage_dict(3, 2))),
        SSE_DONE,
    ]
    with sdk_client(sse_response(*events)) as client:
        chunks = list(client.completions.create(model=model, prompt="x", stream=True,
                                                stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once upon"
    assert chunks[2].choices[0].finish_reason == "length"
    assert chunks[3].usage is not None and chunks[3].usage.total_tokens == 5


def test_openai_sdk_reads_a_completion_response() -> None:
    body = text_completion("cmpl-a", "smollm2", CREATED, "!", "stop", usage_dict(1, 1))
    with sdk_client(json_response(body)) as client:
        got = client.completions.create(model="smollm2", prompt="x")
    assert got.choices[0].text == "!" and got.choices[0].finish_reason == "stop"


# -- SSE encoding ------------------------------------------------------------------------------


def test_sse_event_is_one_compact_data_line() -> None:
    assert sse_event({"a": [1, 2], "b": "x"}) == b'data: {"a":[1,2],"b":"x"}\n\n'


def test_sse_event_keeps_newlines_inside_the_json_and_non_ascii_as_utf8() -> None:
    event = sse_event({"t": "a\nb\r\n\u00e9\u4e16"})
    assert event.count(b"\n") == 2 and event.endswith(b"\n\n")
    assert "é世".encode() in event
    assert json.loads(event[len(b"data: "):]) == {"t": "a\nb\r\n\u00e9\u4e16"}


def test_sse_event_survives_a_lone_surrogate() -> None:
    event = sse_event({"t": "ok\ud800"})
    assert json.loads(event[len(b"data: "):].decode("utf-8"))["t"].startswith("ok")


def test_sse_done_is_the_openai_sentinel() -> None:
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_sse_error_is_the_error_envelope() -> None:
    err = errors.engine_unavailable("engine crashed")
    assert json.loads(sse_error(err)[len(b"data: "):]) == {
        "error": {"message": "engine crashed", "type": "server_error", "param": None,
                  "code": "engine_unavailable"}
    }


def test_openai_sdk_raises_on_a_mid_stream_error_event() -> None:
    events = [
        sse_event(chat_chunk("chatcmpl-e", "m", CREATED, role="assistant", content="")),
        sse_error(errors.server_error("engine died")),
        SSE_DONE,
    ]
    with sdk_client(sse_response(*events)) as client:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(openai.APIError, match="engine died") as info:
            list(stream)
    assert info.value.type == "server_error"


# -- models ------------------------------------------------------------------------------------


def test_model_object_parses_as_openai_model_and_keeps_extras() -> None:
    body = model_object("smollm2", CREATED, context_length=8192)
    assert body == {"id": "smollm2", "object": "model", "created": CREATED, "owned_by": "superfluid",
                    "context_length": 8192}
    parsed = Model.model_validate(body)
    assert (parsed.id, parsed.object, parsed.created) == ("smollm2", "model", CREATED)
    assert parsed.owned_by == "superfluid"
    assert model_object("x", CREATED, owned_by="me")["owned_by"] == "me"


def test_openai_sdk_lists_models() -> None:
    body = model_list(model_object(m, CREATED) for m in ("a", "b"))
    assert body["object"] == "list"
    with sdk_client(json_response(body)) as client:
        assert [m.id for m in client.models.list()] == ["a", "b"]


def test_empty_model_list() -> None:
    assert model_list([]) == {"object": "list", "data": []}


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "status", "type_", "param", "code"),
    [
        (errors.invalid_request("bad", "temperature", "invalid_value"), 400, "invalid_request_error",
         "temperature", "invalid_value"),
        (errors.invalid_request("bad"), 400, "invalid_request_error", None, None),
        (errors.model_not_found("gpt-9"), 404, "invalid_request_error", "model", "model_not_found"),
        (errors.context_length_exceeded("too long"), 400, "invalid_request_error", "messages",
         "context_length_exceeded"),
        (errors.context_length_exceeded("too long", param="prompt"), 400, "invalid_request_error", "prompt",
         "context_length_exceeded"),
        (errors.request_too_large(1024), 413, "invalid_request_error", None, "request_too_large"),
        (errors.engine_unavailable("busy"), 503, "server_error", None, "engine_unavailable"),
        (errors.server_error("oops"), 500, "server_error", None, None),
        (errors.method_not_allowed("GET"), 405, "invalid_request_error", None,
         "method_not_allowed"),
        (errors.not_found("/v1/nope"), 404, "invalid_request_error", None, "not_found"),
    ],
    ids=["invalid", "invalid-bare", "model", "context-chat", "context-prompt", "too-large", "unavailable",
         "server", "method", "route"],
)
def test_error_helpers_build_consistent_envelopes(
    err: ApiError, status: int, type_: str, param: str | None, code: str | None
) -> None:
    assert isinstance(err, Exception)
    assert err.status == status
    assert err.body() == {"error": {"message": err.message, "type": type_, "param": param, "code": code}}
    assert str(err) == err.message and err.message


def test_model_not_found_uses_openai_wording() -> None:
    assert errors.model_not_found("x").message == (
        "The model `x` does not exist or you do not have access to it."
    )


def test_request_too_large_mentions_the_limit() -> None:
    assert "1024" in errors.request_too_large(1024).message


def test_not_found_uses_openai_invalid_url_wording() -> None:
    assert errors.not_found("/v1/nope", "POST").message == "Invalid URL (POST /v1/nope)"
    assert errors.not_found("/v1/nope").message == "Invalid URL (/v1/nope)"


def test_method_not_allowed_sets_the_allow_header_defaulting_to_post() -> None:
    assert errors.method_not_allowed("GET").headers == {"Allow": "POST"}
    err = errors.method_not_allowed("PUT", ["GET", "OPTIONS"], path="/v1/models")
    assert err.headers == {"Allow": "GET, OPTIONS"}
    assert "PUT" in err.message and "/v1/models" in err.message


@pytest.mark.parametrize(("retry_after", "header"), [(None, None), (2, "2"), (0.2, "1"), (0, "0")])
def test_engine_unavailable_retry_after_header_is_whole_seconds_rounded_up(
    retry_after: float | None, header: str | None
) -> None:
    assert errors.engine_unavailable("busy", retry_after=retry_after).headers.get("Retry-After") == header


def test_headers_default_to_empty_and_are_not_shared() -> None:
    a, b = errors.server_error(), errors.server_error()
    assert a.headers == {} and a.headers is not b.headers


@pytest.mark.parametrize(
    ("err", "exc"),
    [
        (errors.invalid_request("bad temperature", "temperature", "invalid_value"), openai.BadRequestError),
        (errors.model_not_found("gpt-9"), openai.NotFoundError),
        (errors.server_error("oops"), openai.InternalServerError),
        (errors.engine_unavailable("busy", retry_after=1), openai.InternalServerError),
        (errors.request_too_large(10), openai.APIStatusError),
    ],
)
def test_openai_sdk_maps_error_responses_to_its_exceptions(
    err: ApiError, exc: type[openai.APIStatusError]
) -> None:
    with sdk_client(json_response(err.body(), err.status, err.headers)) as client:
        with pytest.raises(exc) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    got = info.value
    assert got.status_code == err.status
    assert (got.code, got.param, got.type) == (err.code, err.param, err.type)
    assert err.message in got.message


# -- tool calls, logprobs, ignored parameters (api.responses.Reply) ----------------------------

from api.responses import Reply, chat_logprobs, completion_logprobs, ignored_params_value, parse_tool_calls  # noqa: E402
from scheduler.link.messages import Delta, Done  # noqa: E402


def _call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_tool_calls_are_parsed_out_of_the_generic_format() -> None:
    content, calls = parse_tool_calls(_call("f", '{"x": 1}') + "\n" + _call("g", "{}"), ["f", "g"])
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize(
    "text",
    ["plain answer", _call("h", "{}"), _call("f", "[1]"), "<tool_call>" + "[" * 5000, _call("f", "[" * 5000 + "]" * 5000)],
    ids=["text", "unoffered-function", "arguments-not-an-object", "nested-too-deep-cut", "nested-too-deep"],
)
def test_text_that_is_not_a_well_formed_call_stays_content(text: str) -> None:
    content, calls = parse_tool_calls(text, ["f"])
    assert calls == [] and content == text.strip()


@pytest.mark.parametrize(
    ("text", "reason", "expected"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1', "stop", (None, [("f", '{"x": 1')], "stop")),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', "stop", (None, [("f", '{"x": 1}')], "stop")),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool', "stop", (None, [("f", '{"x": 1}')], "stop")),
        ('<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>', "stop", ("} trailing</tool_call>", [("f", "{}")], "stop")),
        ('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call> then', "stop", ("then", [("f", '{"x": NaN}')], "stop")),
        (_call("f", "{}") + '\n<tool_call>{"name": "f", "arguments": {"x": 1}}', "stop", (None, [("f", "{}"), ("f", '{"x": 1}')], "stop")),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}', "length", (None, [("f", '{"x": 1}')], "length")),
        ('<tool_call>{"name": "f", "argu', "stop", ('<tool_call>{"name": "f", "argu', [], "stop")),
    ],
    ids=["open-at-stop", "no-closing-at-stop", "closing-cut-at-stop", "junk-after-arguments", "arguments-no-json", "second-unclosed", "no-closing-at-length", "head-cut"],
)
def test_a_call_whose_head_came_is_a_call_however_it_ends_streamed_or_not(text: str, reason: str, expected: tuple) -> None:
    """Once a call's head (an offered name, then its arguments' ``{``) has come, the stream has
    sent the call: unstreamed, the same reply is that call too, its arguments as far as they
    came, and finishes ``tool_calls`` only where every call is whole (arguments that parse, the
    block closed). It was the block's raw markup as content, unless max_tokens had cut it."""
    whole = Reply("chat", "m", tools=[{"name": "f"}])
    whole.add(Delta("j", text))
    view = whole_view(whole.body(Done("j", reason), None)["choices"][0])  # type: ignore[arg-type]
    assert (view["content"], view["calls"], view["finish_reason"]) == expected
    for size in (1, 3, len(text)):
        got = stream_reply([text[i : i + size] for i in range(0, len(text), size)], [{"name": "f"}], reason=reason)
        assert (got.content or None, got.pairs, got.finish_reason) == expected, size


def _events(*texts: str) -> list[Delta]:
    return [Delta("j", t) for t in texts]


def test_non_streamed_tool_reply_has_tool_calls_and_finish_reason_tool_calls() -> None:
    reply = Reply("chat", "m", tools=[{"name": "f"}], tool_choice="required")
    for e in _events("<tool_", 'call>\n{"name": "f", "arguments": {"a": "b"}}\n</tool_call>'):
        reply.add(e)
    body = reply.body(Done("j", "stop"), None)  # type: ignore[arg-type]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": "b"}


def test_streamed_tool_reply_sends_text_until_a_call_may_begin_then_openai_shaped_deltas() -> None:
    reply = Reply("chat", "m", tools=[{"name": "f"}])
    assert reply.first_chunks() == []  # the role comes with the first frame: text or a call?
    sent = [c for e in _events("Let me check. <tool", '_call>\n{"name": "f", "arguments": {}}\n</tool_call>') for c in reply.delta_chunks(e)]
    assert sent.pop(0)["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # text
    assert sent[0]["choices"][0]["delta"] == {"content": "Let me check."}  # the space waits: a call may follow
    deltas = [c["choices"][0]["delta"]["tool_calls"] for c in sent[1:]]
    assert deltas[0][0]["function"] == {"name": "f", "arguments": ""} and deltas[0][0]["id"].startswith("call_")
    assert deltas[1][0] == {"index": 0, "function": {"arguments": "{}"}}
    final = reply.final_chunks(Done("j", "stop"), None)
    assert len(final) == 1 and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


def _stream(reply: Reply, pieces: list[str], reason: str = "stop") -> tuple[list[dict], list[dict]]:
    """(content and tool-call chunks as deltas, the final chunks) of a streamed reply."""
    sent = [c for e in _events(*pieces) for c in reply.delta_chunks(e)]
    return sent, reply.final_chunks(Done("j", reason), None)


def _assembled(chunks: list[dict]) -> tuple[str, list[tuple[str, str]], list[int]]:
    """(content, [(name, arguments)], how many chunks carried argument text per call), as the
    openai client's stream helpers accumulate them."""
    got = assemble(chunks)
    return got.content or "", got.pairs, got.fragments


LONG_CALL = '<tool_call>\n{"name": "f", "arguments": {"city": "Paris \\"centre\\" {x}", "days": [1, 2, {"a": "}"}]}}\n</tool_call>'


def test_arguments_stream_as_they_are_generated_and_add_up_to_the_non_streamed_string() -> None:
    tokens = [LONG_CALL[i : i + 3] for i in range(0, len(LONG_CALL), 3)]
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), tokens)
    content, calls, frags = _assembled(sent + final)
    whole = Reply("chat", "m", tools=[{"name": "f"}])
    for e in _events(LONG_CALL):
        whole.add(e)
    body = whole.body(Done("j", "stop"), None)  # type: ignore[arg-type]
    expected = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert content == "" and calls == [("f", expected)] and frags[0] > 5
    assert json.loads(expected) == {"city": 'Paris "centre" {x}', "days": [1, 2, {"a": "}"}]}
    # the head went out before the arguments were complete
    first_args = next(i for i, c in enumerate(sent) if c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments"))
    assert first_args < len(tokens) // 2 and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


@given(cuts=st.lists(st.integers(min_value=1, max_value=len(LONG_CALL) * 2 + 20), max_size=30), text_before=st.sampled_from(["", "Sure. ", "a < b "]))
@settings(max_examples=200, deadline=None)
def test_however_the_text_is_cut_the_stream_adds_up_to_the_non_streamed_reply(cuts: list[int], text_before: str) -> None:
    content, calls, message, final = _streamed_and_whole(text_before + LONG_CALL + "\n" + LONG_CALL.replace('"f"', '"g"'), cuts)
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert content.strip() == (message["content"] or "") and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


def _streamed_and_whole(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], dict[str, Any], list[dict[str, Any]]]:
    """``text`` streamed in pieces cut at ``cuts`` (tools f and g): the content and calls the
    stream adds up to, the unstreamed reply's message, and the stream's final chunks."""
    pieces = [piece for piece in cut_at(text, cuts) if piece]
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}, {"name": "g"}]), pieces)
    content, calls, _ = _assembled(sent + final)
    whole = Reply("chat", "m", tools=[{"name": "f"}, {"name": "g"}])
    for e in _events(text):
        whole.add(e)
    message = whole.body(Done("j", "stop"), None)["choices"][0]["message"]  # type: ignore[arg-type]
    return content, calls, message, final


# members after the arguments (some models add an id): the unstreamed parse ignores them
EXTRA_MEMBERS_CALL = '<tool_call>\n{"name": "g", "arguments": {"x": 1}, "id": "c1", "meta": {"t": "}</tool_call>"}}\n</tool_call>'


@given(cuts=st.lists(st.integers(min_value=1, max_value=len(EXTRA_MEMBERS_CALL) * 2 + 20), max_size=30), text_after=st.sampled_from(["", " Done.", "\n" + LONG_CALL]))
@settings(max_examples=200, deadline=None)
def test_a_call_with_members_after_its_arguments_streams_as_the_non_streamed_reply_has_it(cuts: list[int], text_after: str) -> None:
    """Its closing was sent as content (``, "id": "c1", ...}</tool_call>``) where the unstreamed
    reply has the call and no content."""
    content, calls, message, _final = _streamed_and_whole(EXTRA_MEMBERS_CALL + text_after, cuts)
    assert calls[0] == ("g", '{"x": 1}')
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert content.strip() == (message["content"] or "")


_PARTS = ["<tool_call>", "</tool_call>", "<tool", "_call>", "{", "}", "[", "]", '"', "\\", ":", ",", " ", "\n",
          '"name"', '"arguments"', '"f"', '"h"', "x", "1", '<tool_call>{"name": "', '", "arguments": {']


@given(parts=st.lists(st.sampled_from(_PARTS), max_size=60), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20))
@settings(max_examples=300, deadline=None)
def test_hostile_text_in_tool_mode_never_breaks_the_stream_and_loses_no_text(parts: list[str], cuts: list[int]) -> None:
    """Whatever the model writes, cut wherever: the stream ends with one finish_reason, and the
    text it sends (content plus call arguments) holds every character but the call markup; with
    no streamed call, the content is exactly what the unstreamed reply gives."""
    text = "".join(parts)
    pieces = [piece for piece in cut_at(text, cuts) if piece]
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), pieces)
    content, calls, _ = _assembled(sent + final)
    assert [c["choices"][0]["finish_reason"] for c in sent + final if c["choices"][0]["finish_reason"]] == [final[-1]["choices"][0]["finish_reason"]]
    if final[-1]["choices"][0]["finish_reason"] == "tool_calls":  # what the client then parses, parses
        assert calls and all(isinstance(json.loads(a), dict) for _, a in calls)
    whole = Reply("chat", "m", tools=[{"name": "f"}])
    for e in _events(text):
        whole.add(e)
    choice = whole.body(Done("j", "stop"), None)["choices"][0]  # type: ignore[arg-type]
    message = choice["message"]
    if not calls:  # (tool mode: the content's leading whitespace is none of it)
        assert content == text.lstrip() and "tool_calls" not in message
    else:
        assert all(name == "f" for name, _ in calls)
        assert len(content) + sum(len(a) for _, a in calls) <= len(text)
        # the same calls unstreamed (a call whose head went out is one, however it ends), the
        # same content and finish_reason
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == calls
        assert content == (message["content"] or "")
        assert final[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


@given(parts=st.lists(st.sampled_from([*_PARTS, LONG_CALL, LONG_CALL]), max_size=30), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20))
@settings(max_examples=300, deadline=None)
def test_hostile_text_in_legacy_functions_mode_streams_at_most_one_function_call(parts: list[str], cuts: list[int]) -> None:
    """The legacy reply, whatever the model writes and wherever it is cut: never a tool_calls
    delta, one function_call at most (its name once, then argument fragments), one
    finish_reason, and what the stream calls adds up to the unstreamed function_call."""
    text = "".join(parts)
    pieces = [piece for piece in cut_at(text, cuts) if piece]
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}], legacy_functions=True), pieces)
    deltas = [c["choices"][0]["delta"] for c in sent + final]
    assert not any("tool_calls" in d for d in deltas)
    streamed = [d["function_call"] for d in deltas if "function_call" in d]
    assert sum("name" in f for f in streamed) <= 1 and all("name" not in f for f in streamed[1:])
    reasons = [c["choices"][0]["finish_reason"] for c in sent + final if c["choices"][0]["finish_reason"]]
    assert reasons == [final[-1]["choices"][0]["finish_reason"]]
    assert (reasons == ["function_call"]) == bool(streamed)
    whole = Reply("chat", "m", tools=[{"name": "f"}], legacy_functions=True)
    for e in _events(text):
        whole.add(e)
    message = whole.body(Done("j", "stop"), None)["choices"][0]["message"]  # type: ignore[arg-type]
    assert "tool_calls" not in message
    assert streamed or not message.get("function_call")  # a call the unstreamed reply has, the stream sent
    if streamed and message.get("function_call"):
        assert streamed[0]["name"] == message["function_call"]["name"] == "f"
        assert "".join(f.get("arguments", "") for f in streamed) == message["function_call"]["arguments"]


def test_whitespace_between_and_after_streamed_calls_is_not_content() -> None:
    """Forced parallel calls are written with a newline between them: streamed, it came as
    content ("\\n"), where the unstreamed reply has none; text before a call kept its space."""
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    for text, expected in ((call + "\n" + call, ""), ("I will call. \n" + call + "\n", "I will call.")):
        sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), [text[i : i + 7] for i in range(0, len(text), 7)])
        content, calls, _ = _assembled(sent + final)
        assert (content, len(calls)) == (expected, text.count("<tool_call>")), text


@pytest.mark.parametrize(
    "pieces",
    [["<tool_call>\n{\"name\": \"h\", ", "\"arguments\": {}}\n</tool_call>"],  # not an offered function
     ["<tool_call>\n{\"x\": 1}", " and more"],  # no call at all
     ["<tool_call>\n{\"name\": \"f\\_g\", \"arguments\": {", "}}\n</tool_call>"]],  # a name JSON cannot read
    ids=["unoffered-function", "no-call", "invalid-escape-in-the-name"],
)
def test_a_block_that_is_no_call_streams_as_text_at_the_end(pieces: list[str]) -> None:
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), pieces)
    content, calls, _ = _assembled(sent + final)
    assert calls == [] and content == "".join(pieces) and final[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_call_with_arguments_before_its_name_is_sent_at_the_end() -> None:
    text = '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>'
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), [text[:20], text[20:]])
    assert sent == []
    assert _assembled(final)[1] == [("f", '{"a": 1}')] and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_streamed_call_cut_by_max_tokens_ends_with_finish_reason_length() -> None:
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), ['<tool_call>\n{"name": "f", "arguments": {"a": ', '"b'], "length")
    assert _assembled(sent + final)[1] == [("f", '{"a": "b')] and final[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "pieces",
    [['<tool_call>\n{"name": "f", "arguments": {"city": "Paris", "'],  # a stop string cut it open
     ['<tool_call>\n{"name": "f", "arguments": {x}}\n</tool_call>'],  # closed, but no JSON
     ['<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>'],  # Python's JSON, not JSON
     ['<tool_call>\n{"name": "f", "arguments": {"x": -Infinity}}\n</tool_call>']],
    ids=["cut-open", "not-json", "nan", "infinity"],
)
def test_a_streamed_call_that_is_not_whole_finishes_stop_not_tool_calls(pieces: list[str]) -> None:
    """tool_calls tells the client to parse the arguments: the openai package's stream helper
    raised JSONDecodeError on a call a stop string had cut. Unstreamed, the same text is content
    and the reply finishes stop."""
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), pieces)
    assert _assembled(sent + final)[1] and final[-1]["choices"][0]["finish_reason"] == "stop"
    whole = Reply("chat", "m", tools=[{"name": "f"}])
    for e in _events("".join(pieces)):
        whole.add(e)
    assert whole.body(Done("j", "stop"), None)["choices"][0]["finish_reason"] == "stop"  # type: ignore[arg-type]


def test_text_after_a_streamed_calls_arguments_that_is_no_closing_is_content() -> None:
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), ['<tool_call>{"name": "f", "arguments": {}', "} trailing"])
    content, calls, _ = _assembled(sent + final)
    assert calls == [("f", "{}")] and content == "} trailing"


def test_streamed_text_that_only_looked_like_a_call_is_sent_at_the_end() -> None:
    reply = Reply("chat", "m", tools=[{"name": "f"}])
    sent = [c for e in _events("a <tool", "box> b") for c in reply.delta_chunks(e)]
    final = reply.final_chunks(Done("j", "length"), None)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in sent + final)
    assert text == "a <toolbox> b" and final[-1]["choices"][0]["finish_reason"] == "length"


def test_without_tools_markup_is_plain_text() -> None:
    reply = Reply("chat", "m", tools=[{"name": "f"}], tool_choice="none")
    reply.add(Delta("j", _call("f", "{}")))
    body = reply.body(Done("j", "stop"), None)  # type: ignore[arg-type]
    assert body["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in body["choices"][0]["message"]


ENTRIES = [
    {"token_id": 1, "bytes": list(b"He"), "logprob": -0.5, "top": [{"token_id": 1, "bytes": list(b"He"), "logprob": -0.5},
                                                                  {"token_id": 2, "bytes": [0xE2, 0x82], "logprob": -1.5}]},
    {"token_id": 3, "bytes": list(b"llo"), "logprob": -0.1, "top": []},
]


def test_chat_logprobs_shape() -> None:
    out = chat_logprobs(ENTRIES)
    assert [e["token"] for e in out["content"]] == ["He", "llo"]
    assert out["content"][0]["top_logprobs"][1] == {"token": "\ufffd", "logprob": -1.5, "bytes": [0xE2, 0x82]}


def test_completion_logprobs_shape_with_offsets() -> None:
    out = completion_logprobs(ENTRIES, offset=4)
    assert out == {"tokens": ["He", "llo"], "token_logprobs": [-0.5, -0.1],
                   "top_logprobs": [{"He": -0.5, "\ufffd": -1.5}, {"llo": -0.1}], "text_offset": [4, 6]}  # the token itself too


def test_text_offsets_count_a_character_split_across_tokens_once() -> None:
    # "é" (C3 A9) split over two tokens, then "x": the text is "éx", so "x" starts at 1; each
    # token's text alone made the offsets drift by one per split character
    split = [{"token_id": i, "bytes": list(b), "logprob": -0.1, "top": []} for i, b in enumerate((b"\xc3", b"\xa9", b"x"))]
    assert completion_logprobs(split)["text_offset"] == [0, 0, 1]
    assert completion_logprobs(split * 2, offset=3)["text_offset"] == [3, 3, 4, 5, 5, 6]


def test_ignored_params_header_never_echoes_unsafe_names() -> None:
    assert ignored_params_value(["mirostat", "dry_multiplier"]) == "mirostat, dry_multiplier"
    value = ignored_params_value(["x\r\nSet-Cookie: a=b", "é", "", "a" * 65, "ok.name-1"])
    assert value == "?, ?, ?, ?, ok.name-1"
    assert ignored_params_value(str(i) for i in range(100)).count(",") == 31


def test_a_reply_for_choice_k_puts_k_in_every_chunk_and_shares_the_request_id() -> None:
    head = Reply("chat", "m")
    reply = Reply("chat", "m", index=2, id=head.id, created=head.created)
    frames = reply.first_chunks() + reply.delta_chunks(Delta("j", "hi")) + reply.final_chunks(Done("j", "stop"), None)
    assert [f["choices"][0]["index"] for f in frames] == [2, 2, 2] and {f["id"] for f in frames} == {head.id}
    for f in frames:
        ChatCompletionChunk.model_validate(f)
    body = reply.body(Done("j", "length"), None)
    assert body["choices"][0]["index"] == 2 and body["choices"][0]["finish_reason"] == "length"


def test_echo_puts_the_prompt_first_and_its_scores_before_the_completions() -> None:
    first = {"token_id": 1, "bytes": list(b"Hi"), "logprob": None, "top": []}
    second = {"token_id": 2, "bytes": list(b" there"), "logprob": -1.5, "top": [{"token_id": 2, "bytes": list(b" there"), "logprob": -1.5}]}
    made = {"token_id": 3, "bytes": list(b"!"), "logprob": -0.1, "top": [{"token_id": 3, "bytes": list(b"!"), "logprob": -0.1}]}
    reply = Reply("completions", "m", echo="Hi there", logprobs=True)
    reply.prompt_logprobs = [first, second]
    reply.add(Delta("j", "!", 1, [made]))
    # a null first logprob is what OpenAI sends (the SDK's types say float, but it does not
    # validate replies: the e2e test reads this through the client)
    (choice,) = reply.body(Done("j", "stop"), None)["choices"]
    assert choice["text"] == "Hi there!"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Hi", " there", "!"] and lp["token_logprobs"] == [None, -1.5, -0.1]
    assert lp["top_logprobs"] == [None, {" there": -1.5}, {"!": -0.1}] and lp["text_offset"] == [0, 2, 8]
    streamed = Reply("completions", "m", echo="Hi there", logprobs=True)
    streamed.prompt_logprobs = [first, second]
    (chunk,) = streamed.first_chunks()
    assert chunk["choices"][0]["text"] == "Hi there" and chunk["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.5]
    (nxt,) = streamed.delta_chunks(Delta("j", "!", 1, [made]))
    assert nxt["choices"][0]["logprobs"]["text_offset"] == [8]


def test_with_parallel_tool_calls_false_a_reply_has_at_most_one_call_streamed_or_not() -> None:
    """OpenAI's parallel_tool_calls false promises at most one call; under tool_choice auto no
    grammar limits what the model writes, and a second call it wrote came back too."""
    call = '<tool_call>\n{"name": "f", "arguments": {"x": %d}}\n</tool_call>'
    text = "Checking. " + call % 1 + "\n" + call % 2
    for parallel, n in ((False, 1), (True, 2)):
        whole = Reply("chat", "m", tools=[{"name": "f"}], parallel_tool_calls=parallel)
        for e in _events(text):
            whole.add(e)
        message = whole.body(Done("j", "stop"), None)["choices"][0]["message"]  # type: ignore[arg-type]
        assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"x": 1}', '{"x": 2}'][:n]
        assert message["content"] == "Checking."
        for size in (5, 1000):  # streamed as the calls come, and as one held block parsed at the end
            sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}], parallel_tool_calls=parallel), [text[i : i + size] for i in range(0, len(text), size)])
            content, calls, _ = _assembled(sent + final)
            assert (content, [a for _, a in calls]) == ("Checking.", ['{"x": 1}', '{"x": 2}'][:n]), (parallel, size)


def test_a_legacy_functions_reply_is_one_function_call_streamed_or_not() -> None:
    """A request with the legacy ``functions`` gets the legacy reply: ``message.function_call``
    ({name, arguments}, no id or type), ``function_call`` deltas, ``finish_reason``
    ``function_call``, and one call at most (the legacy message holds one)."""
    call = '<tool_call>\n{"name": "f", "arguments": {"x": %d}}\n</tool_call>'
    text = "Checking. " + call % 1 + "\n" + call % 2
    whole = Reply("chat", "m", tools=[{"name": "f"}], legacy_functions=True)
    for e in _events(text):
        whole.add(e)
    choice = whole.body(Done("j", "stop"), None)["choices"][0]  # type: ignore[arg-type]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"] == {"name": "f", "arguments": '{"x": 1}'}
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] == "Checking."
    for size in (5, 1000):  # streamed as the call comes, and as one held block parsed at the end
        sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}], legacy_functions=True), [text[i : i + size] for i in range(0, len(text), size)])
        deltas = [c["choices"][0]["delta"] for c in sent + final]
        assert not any("tool_calls" in d for d in deltas)
        calls = [d["function_call"] for d in deltas if "function_call" in d]
        assert calls[0] == {"name": "f", "arguments": ""}
        assert "".join(c.get("arguments", "") for c in calls) == '{"x": 1}' and all("name" not in c for c in calls[1:])
        assert "".join(d.get("content") or "" for d in deltas) == "Checking."
        assert final[-1]["choices"][0]["finish_reason"] == "function_call"
    # without a call the reply is text, as with tools
    plain = Reply("chat", "m", tools=[{"name": "f"}], legacy_functions=True)
    plain.add(Delta("j", "Sunny."))
    choice = plain.body(Done("j", "stop"), None)["choices"][0]  # type: ignore[arg-type]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Sunny." and "function_call" not in choice["message"]


_PIECES = [b"He", b"llo", b"\n", b" wor", b"ld", b"\xc3", b"\xa9", b"!"]  # \xc3\xa9: an "é" split over two tokens


@given(pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12), holds=st.lists(st.floats(0, 1), min_size=12, max_size=12))
@settings(max_examples=200, deadline=None)
def test_streamed_completion_offsets_are_the_unstreamed_ones_however_the_text_is_held(pieces: list[bytes], holds: list[float]) -> None:
    """The worker sends a token's logprobs when it is sampled and its text when it is released:
    text that may begin a stop string is held, so a chunk can carry entries whose text comes in a
    later chunk. The streamed text_offset were counted from the text sent, so every entry after
    held text was placed too early; they are counted from the tokens now, as unstreamed."""
    import codecs

    entries = [{"token_id": i, "bytes": list(b), "logprob": -0.1, "top": []} for i, b in enumerate(pieces)]
    decoder, available = codecs.getincrementaldecoder("utf-8")("replace"), []
    text = ""
    for b in pieces:
        text += decoder.decode(b)
        available.append(len(text))
    released, deltas = 0, []
    for i, entry in enumerate(entries):  # the text released with each entry: never ahead of the tokens
        upto = len(text) if i == len(entries) - 1 else released + round(holds[i] * (available[i] - released))
        deltas.append(Delta("j", text[released:upto], i + 1, [entry]))
        released = upto
    streamed = Reply("completions", "m", logprobs=True)
    # an entry whose text has not come yet waits for it: the last ones come with the final chunk
    frames = [c for d in deltas for c in streamed.delta_chunks(d)] + streamed.final_chunks(Done("j", "stop"), None)
    offsets = [o for c in frames if c["choices"] and c["choices"][0].get("logprobs") for o in c["choices"][0]["logprobs"]["text_offset"]]
    whole = Reply("completions", "m", logprobs=True)
    for d in deltas:
        whole.add(d)
    lp = whole.body(Done("j", "stop"), None)["choices"][0]["logprobs"]  # type: ignore[arg-type]
    assert offsets == lp["text_offset"]
    assert whole.body(Done("j", "stop"), None)["choices"][0]["text"] == text  # type: ignore[arg-type]


_F = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


@pytest.mark.parametrize(
    "text",
    ['<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>\n' + _F, "I use the <tool_call> tag: " + _F],
    ids=["after-an-unoffered-function", "after-the-tag-in-prose"],
)
def test_a_call_after_a_block_that_is_no_call_is_still_a_call_streamed_or_not(text: str) -> None:
    """A block that is no call stays text, but a well-formed call after it was lost as text too."""
    content, calls = parse_tool_calls(text, ["f"])
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("f", '{"a": 1}')]
    assert content == text[: text.rindex("<tool_call>")].strip()
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), [text[i : i + 5] for i in range(0, len(text), 5)])
    assert _assembled(sent + final)[:2] == (content, [("f", '{"a": 1}')]) and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_call_in_the_same_chunk_as_text_after_a_streamed_calls_arguments_is_still_a_call() -> None:
    """Text after a streamed call's arguments that is no closing went out whole as content: a
    call later in the same chunk was sent as text, where cut otherwise it was a call."""
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), ['<tool_call>{"name": "f", "arguments": {}', "} oops " + _F])
    assert _assembled(sent + final)[:2] == ("} oops", [("f", "{}"), ("f", '{"a": 1}')])


def test_long_whitespace_before_a_streamed_calls_closing_tag_is_no_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}' + " " * 80 + "\n</tool_call>"
    sent, final = _stream(Reply("chat", "m", tools=[{"name": "f"}]), [text[i : i + 3] for i in range(0, len(text), 3)])
    assert _assembled(sent + final)[:2] == ("", [("f", '{"a": 1}')]) and final[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_reply_of_many_tags_that_hold_no_call_costs_a_bounded_number_of_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tag that holds no call is text and parsing goes on after it; a reply made of
    thousands (a prompt that has the model repeat them) would parse the rest of the text once a
    tag, on the event loop. Past MAX_MISSED_BLOCKS the rest is text."""
    from api import responses

    parses = 0
    real = json.JSONDecoder.raw_decode

    def counted(self: json.JSONDecoder, s: str, idx: int = 0) -> Any:
        nonlocal parses
        parses += 1
        return real(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted)
    text = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>' * 1000
    content, calls = responses.parse_tool_calls(text, {"f"})
    assert calls == [] and content == text
    assert parses <= 8 * responses.MAX_MISSED_BLOCKS  # a few per block tried (its members), not per tag (5,000)


_PIECES = ["Hello", "", " wor\nld", '"quoted" \\ back', "é中😀", "\ud800 lone", "\x00\x1f", "</tool_call>"]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize("model", ['m"odel\\ é', "\x00superfluid-text\x00"], ids=["plain", "marker"])
def test_a_streamed_text_delta_is_the_same_bytes_as_its_chunk_built_whole(endpoint: Any, include_usage: bool, index: int, model: str) -> None:
    """delta_events makes a plain text delta from a template encoded once per reply: every
    token's event is byte for byte the SSE event of the chunk delta_chunks builds, in order,
    and the reply's text is the same (what its final frames and body are made of); a model name
    holding the template's marker has every chunk built whole."""
    fast = Reply(endpoint, model, include_usage=include_usage, index=index, id="cmpl-x", created=7)
    whole = Reply(endpoint, model, include_usage=include_usage, index=index, id="cmpl-x", created=7)
    for i, text in enumerate(_PIECES):
        event = Delta("j", text, i + 1)
        assert fast.delta_events(event) == [sse_event(f) for f in whole.delta_chunks(event)]
    assert fast.text == whole.text
    assert fast.final_chunks(Done("j", "stop"), None) == whole.final_chunks(Done("j", "stop"), None)


@given(st.lists(st.text(max_size=12), max_size=8))
@settings(max_examples=60, deadline=None)
def test_streamed_text_deltas_carry_every_piece_in_order(pieces: list[str]) -> None:
    for endpoint in ("chat", "completions"):
        fast = Reply(endpoint, "m", id="x", created=1)  # type: ignore[arg-type]
        whole = Reply(endpoint, "m", id="x", created=1)  # type: ignore[arg-type]
        events = [e for i, p in enumerate(pieces) for e in fast.delta_events(Delta("j", p, i + 1))]
        assert events == [sse_event(f) for i, p in enumerate(pieces) for f in whole.delta_chunks(Delta("j", p, i + 1))]
        key = "content" if endpoint == "chat" else "text"
        got = [json.loads(e[len(b"data: ") :].decode())["choices"][0] for e in events]
        assert "".join(c["delta"][key] if endpoint == "chat" else c[key] for c in got) == "".join(pieces).encode("utf-8", "replace").decode()
