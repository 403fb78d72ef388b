"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``; api/anthropic.py)
driven by the unmodified ``anthropic`` SDK through the in-process middle layer
(tests/edge/inproc.py: the real ASGI application, the worker around a scripted engine whose
chat template is a real model's), over an httpx transport into the application.

The model writes what its prompt's script says (tests/edge/test_stream_equivalence.script):
text, a Hermes ``<tool_call>`` (Qwen 2.5's template) or ``<think>`` reasoning (Qwen 3's)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from django.test import override_settings

from api.anthropic import parse_messages_request
from api.errors import ApiError
from api.rendering import render_chat
from keys.credentials import digest_of
from keys.runtime import Key, Policy
from scheduler.engines.chat import compile_chat_template, render_chat_template
from tests.edge.inproc import CLIENT, JSON, MODEL, SimWorker, application, attached, request
from tests.edge.templated import TEMPLATES, edge_loop, engine_of
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(**options: Any) -> anthropic.AsyncAnthropic:
    """The SDK, its HTTP going into the ASGI application (no server, no network)."""
    transport = httpx.ASGITransport(app=application(), client=CLIENT)
    http = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000")
    options.setdefault("api_key", "sk-anything")
    return anthropic.AsyncAnthropic(base_url="http://127.0.0.1:8000", max_retries=0, http_client=http, **options)


class ByteVocab:
    """The web side's vocabulary (/apply-template, count_tokens) of the scripted engine: its
    chat template, one byte a token."""

    def __init__(self, source: str) -> None:
        self.source = source

    def template_parts(self) -> tuple[str, str, str]:
        return self.source, "", ""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return list(text.encode("utf-8"))


def model_of(template_file: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """The middle layer around the scripted engine rendering its prompts with ``template_file``
    (as the llama.cpp engine renders them), the web side's vocabulary the same."""
    from api import views

    class Engine(engine_of(template_file)):  # type: ignore[misc,valid-type]
        def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
            return render_chat_template(compile_chat_template(self.chat_template), messages, bos_token="", eos_token="", **extra)

    async def vocab(model: str | None = None) -> ByteVocab:
        return ByteVocab(Engine.template)

    monkeypatch.setattr(views, "_vocab", vocab)
    yield from edge_loop(Engine, lane_ctx=4096)


@pytest.fixture
def qwen(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """A model with Qwen 2.5's template: Hermes tool calls, no reasoning."""
    yield from model_of("qwen2.5-7b-instruct.jinja", monkeypatch)


@pytest.fixture
def thinker(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """A model with Qwen 3's template: <think> reasoning, Hermes tool calls."""
    yield from model_of("Qwen-Qwen3-0.6B.jinja", monkeypatch)


def run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(coro)


async def create(**kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_tokens", 256)
    async with client() as sdk:
        return await sdk.messages.create(**kwargs)


async def streamed(**kwargs: Any) -> tuple[Any, list[Any]]:
    """(the SDK's final message of a stream, the stream's events)."""
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_tokens", 256)
    events = []
    async with client() as sdk, sdk.messages.stream(**kwargs) as stream:
        async for event in stream:
            events.append(event)
        return await stream.get_final_message(), events


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- text ---------------------------------------------------------------------------------------


def test_a_text_reply_is_a_message(qwen: asyncio.AbstractEventLoop) -> None:
    message = run(qwen, create(messages=user("Hi " + script("Hello there!"))))
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello there!")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == len("Hello there!")  # (one byte a token)
    assert message.usage.input_tokens > 0


def test_a_streamed_reply_is_the_same_message(qwen: asyncio.AbstractEventLoop) -> None:
    plain = run(qwen, create(messages=user("Hi " + script("Hello there!"))))
    final, events = run(qwen, streamed(messages=user("Hi " + script("Hello there!"))))
    assert [(b.type, b.text) for b in final.content] == [("text", "Hello there!")]
    assert (final.stop_reason, final.stop_sequence) == ("end_turn", None)
    assert final.usage.output_tokens == plain.usage.output_tokens
    # (the second prompt is read from the prefix cache: input_tokens are those that were not)
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == plain.usage.input_tokens
    assert final.usage.cache_read_input_tokens > 0
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds


def test_the_system_prompt_and_earlier_turns_reach_the_template(qwen: asyncio.AbstractEventLoop) -> None:
    """``system`` as text blocks (cache_control ignored) is the chat's system turn; the earlier
    turns are the conversation, in order."""
    mark = script("Noted.")
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Answer in French."}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "First question."}]},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": [{"type": "text", "text": "Second " + mark, "cache_control": {"type": "ephemeral"}}]},
    ]
    counted = run(qwen, count(messages=messages, system=system))
    message = run(qwen, create(messages=messages, system=system))
    assert message.content[0].text == "Noted."
    assert message.usage.input_tokens == counted  # the prompt count_tokens renders is the one run
    prompt = run(qwen, rendered(messages=messages, system=system))
    assert prompt.startswith("<|im_start|>system\nYou are terse.\nAnswer in French.<|im_end|>\n")
    assert prompt.index("First question.") < prompt.index("First answer.") < prompt.index("Second ")


async def count(**body: Any) -> int:
    body.setdefault("model", MODEL)
    async with client() as sdk:
        return int((await sdk.messages.count_tokens(**body)).input_tokens)


async def rendered(**body: Any) -> str:
    """The prompt a Messages body renders to (the chat it is translated to, through /apply-template)."""
    from api.anthropic import to_chat_body

    chat, _ = to_chat_body({"model": MODEL, "max_tokens": 1, **body})
    chat.pop("max_tokens")
    reply = await request("POST", "/apply-template", json.dumps(chat).encode(), JSON)
    assert reply.status == 200, reply.body
    return str(reply.json()["prompt"])


# -- tools --------------------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_is_a_tool_use_block_and_its_result_goes_back(qwen: asyncio.AbstractEventLoop, stream: bool) -> None:
    ask = user("Weather in Paris? " + script("Let me check.\n" + CALL))
    if stream:
        message, events = run(qwen, streamed(messages=ask, tools=[WEATHER]))
        deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        assert json.loads("".join(deltas)) == {"city": "Paris"}
        starts = [e.index for e in events if e.type == "content_block_start"]
        assert starts == [0, 1]  # the text's block, then the call's
    else:
        message = run(qwen, create(messages=ask, tools=[WEATHER]))
    assert [b.type for b in message.content] == ["text", "tool_use"]
    text, call = message.content
    assert text.text == "Let me check."
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    # the agent's next turn: the call as it came, its result (text blocks), the model answers
    follow = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "Sunny, 21 C"}]}]},
    ]
    follow[0] = {"role": "user", "content": "Weather in Paris? " + script("It is sunny.")}
    answer = run(qwen, create(messages=follow, tools=[WEATHER]))
    assert [(b.type, b.text) for b in answer.content] == [("text", "It is sunny.")]
    assert answer.stop_reason == "end_turn"
    prompt = run(qwen, rendered(messages=follow, tools=[WEATHER]))
    assert '"city": "Paris"' in prompt and "<tool_response>\nSunny, 21 C\n</tool_response>" in prompt


def test_a_failed_tool_result_says_so_and_a_tool_choice_forces_a_call(qwen: asyncio.AbstractEventLoop) -> None:
    follow = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True}, {"type": "text", "text": "Try again."}]},
    ]
    prompt = run(qwen, rendered(messages=follow, tools=[WEATHER]))
    assert "<tool_response>\nError: no such city\n</tool_response>" in prompt
    assert prompt.index("</tool_response>") < prompt.index("Try again.")  # the results first, then the user's text
    forced = run(qwen, create(messages=user("Go " + script(CALL)), tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}))
    assert [b.type for b in forced.content] == ["tool_use"] and forced.stop_reason == "tool_use"
    none = run(qwen, create(messages=user("Go " + script("No tools.")), tools=[WEATHER], tool_choice={"type": "none"}))
    assert [b.type for b in none.content] == ["text"]


# -- thinking -----------------------------------------------------------------------------------

THOUGHT = "<think>\nTwo and two.\n</think>\n\nIt is 4."


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_a_thinking_block_first(thinker: asyncio.AbstractEventLoop, stream: bool) -> None:
    ask = user("2+2? " + script(THOUGHT))
    thinking = {"type": "enabled", "budget_tokens": 1024}
    if stream:
        message, events = run(thinker, streamed(messages=ask, thinking=thinking))
        assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
    else:
        message = run(thinker, create(messages=ask, thinking=thinking))
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking.strip() == "Two and two." and message.content[0].signature == ""
    assert message.content[1].text == "It is 4."


def test_thinking_turns_the_templates_thinking_on_and_off_and_earlier_thinking_is_kept(thinker: asyncio.AbstractEventLoop) -> None:
    on = run(thinker, rendered(messages=user("Hi"), thinking={"type": "enabled", "budget_tokens": 2048}))
    off = run(thinker, rendered(messages=user("Hi"), thinking={"type": "disabled"}))
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "They greet me.", "signature": "x"}, {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Again"},
    ]
    assert "Hello!" in run(thinker, rendered(messages=history))
    with override_settings(SUPERFLUID_PREFILL_ASSISTANT=False):  # (else a prefill, its text continued)
        with_reasoning = run(thinker, rendered(messages=history[:2]))
    assert "They greet me." in with_reasoning  # Qwen 3 writes the last turn's reasoning


# -- stop sequences, max_tokens -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_reply_naming_it(qwen: asyncio.AbstractEventLoop, stream: bool) -> None:
    ask = user("Go " + script("one two END three"))
    make = streamed(messages=ask, stop_sequences=["END", "XYZ"]) if stream else create(messages=ask, stop_sequences=["END", "XYZ"])
    message = run(qwen, make)
    message = message[0] if stream else message
    assert message.content[0].text == "one two "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_cuts_the_reply(qwen: asyncio.AbstractEventLoop, stream: bool) -> None:
    ask = user("Go " + script("a long reply indeed"))
    message = run(qwen, streamed(messages=ask, max_tokens=6) if stream else create(messages=ask, max_tokens=6))
    message = message[0] if stream else message
    assert message.content[0].text == "a long"
    assert (message.stop_reason, message.stop_sequence, message.usage.output_tokens) == ("max_tokens", None, 6)


# -- errors -------------------------------------------------------------------------------------


def test_a_failure_after_the_stream_began_is_an_error_event(qwen: asyncio.AbstractEventLoop) -> None:
    """The SDK raises on Anthropic's ``event: error``; the stream never ends as if whole."""
    ask = user("Go " + script("abcdefgh", fail_at=4))

    async def go() -> tuple[list[Any], BaseException]:
        events: list[Any] = []
        async with client() as sdk:
            with pytest.raises(anthropic.APIStatusError) as info:
                async with sdk.messages.stream(model=MODEL, max_tokens=64, messages=ask) as stream:
                    async for event in stream:
                        events.append(event)
        return events, info.value

    events, error = run(qwen, go())
    assert events[0].type == "message_start" and "message_stop" not in [e.type for e in events]
    assert isinstance(error.body, dict) and error.body["type"] == "error"
    # (the scripted engine's failure is a job's grammar too slow, a 400's reason)
    assert error.body["error"]["type"] == "invalid_request_error" and "failed" in error.body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({"messages": "hi"}, 400, "invalid_request_error", "messages"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "role"),
        # (a well-formed image or document stands omitted or is read: tests/api/test_agent_images_s49.py)
        ({"messages": [{"role": "user", "content": [{"type": "image", "media_type": "image/png", "data": "AA=="}]}]}, 400, "invalid_request_error", "'messages[0].content[0].source'"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "zip", "data": "x"}}]}]}, 400, "invalid_request_error", "'messages[0].content[0].source.type'"),
        # a source type that is no string (an array, an object) was a TypeError, a 500
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": ["base64"], "data": "AA=="}}]}]}, 400, "invalid_request_error", "'messages[0].content[0].source.type'"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {"type": {}}}]}]}]}, 400, "invalid_request_error", "source.type'"),
        ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}, 400, "invalid_request_error", "'image'"),
        ({"messages": [{"role": "user", "content": [{"type": "search_result", "source": "x"}]}]}, 400, "invalid_request_error", "'search_result'"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error", "server tool"),
        ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, 400, "invalid_request_error", "input_schema"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, 400, "invalid_request_error", "nope"),
        ({"stop_sequences": "END"}, 400, "invalid_request_error", "stop_sequences"),
        ({"stop_sequences": ["x"] * 17}, 400, "invalid_request_error", "'stop_sequences'"),
        ({"tools": [{"name": "f", "input_schema": []}]}, 400, "invalid_request_error", "tools[0].input_schema"),
        ({"max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
        ({"thinking": {"type": "sometimes"}}, 400, "invalid_request_error", "thinking.type"),
        ({"model": "nope"}, 404, "not_found_error", "nope"),
    ],
)
def test_bad_requests_are_anthropic_errors(qwen: asyncio.AbstractEventLoop, body: dict[str, Any], status: int, kind: str, words: str) -> None:
    full = {"model": MODEL, "max_tokens": 16, "messages": user("hi"), **body}
    reply = run(qwen, request("POST", "/v1/messages", json.dumps(full).encode(), JSON))
    assert reply.status == status, reply.body
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and words in error["error"]["message"], error
    assert error["request_id"] == reply.headers["x-request-id"]

    async def sdk() -> BaseException:
        async with client() as c:
            with pytest.raises(anthropic.APIStatusError) as info:
                await c.messages.create(**full)
        return info.value

    raised = run(qwen, sdk())
    assert raised.status_code == status and isinstance(raised, anthropic.BadRequestError if status == 400 else anthropic.NotFoundError)


def test_every_reply_carries_its_id_as_anthropics_request_id_which_the_sdk_reads(qwen: asyncio.AbstractEventLoop) -> None:
    """Anthropic's API names a reply's id ``request-id``: the SDK's ``_request_id`` on a message
    and ``request_id`` on an error read that header (Claude Code shows it). Here it is the
    reply's ``x-request-id``, on a message, a stream, an error and the count route."""

    async def replies() -> tuple[Any, Any, BaseException, httpx.Response]:
        async with client() as sdk:
            message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=user("hi"))
            async with sdk.messages.stream(model=MODEL, max_tokens=8, messages=user("hi")) as stream:
                await stream.get_final_message()
                streamed = stream.request_id
            with pytest.raises(anthropic.APIStatusError) as info:
                await sdk.messages.create(model="nope", max_tokens=8, messages=user("hi"))
            counted = await sdk.messages.with_raw_response.count_tokens(model=MODEL, messages=user("hi"))
        return message, streamed, info.value, counted.http_response

    message, streamed, error, counted = run(qwen, replies())
    ids = [message._request_id, streamed, error.request_id, counted.headers.get("request-id")]
    assert all(ids) and len(set(ids)) == 4, ids
    assert counted.headers["request-id"] == counted.headers["x-request-id"]
    raw = run(qwen, request("POST", "/v1/messages", json.dumps({"model": MODEL, "max_tokens": 8, "messages": user("hi")}).encode(), JSON))
    assert raw.status == 200 and raw.headers["request-id"] == raw.headers["x-request-id"]
    bad = run(qwen, request("POST", "/v1/messages", b"{not json", JSON))
    assert bad.status == 400 and bad.headers["request-id"] == bad.headers["x-request-id"] == bad.json()["request_id"]


def test_bad_json_and_a_wrong_method_are_anthropic_errors(qwen: asyncio.AbstractEventLoop) -> None:
    junk = run(qwen, request("POST", "/v1/messages", b"{not json", JSON))
    get = run(qwen, request("GET", "/v1/messages"))
    count_get = run(qwen, request("GET", "/v1/messages/count_tokens"))
    for reply, status in ((junk, 400), (get, 405), (count_get, 405)):
        assert reply.status == status and reply.json()["type"] == "error", reply.body
        assert reply.json()["error"]["type"] == "invalid_request_error"


def test_max_tokens_may_be_left_out_as_llama_server_allows() -> None:
    from api.anthropic import DEFAULT_MAX_TOKENS, to_chat_body

    chat, _ = to_chat_body({"model": MODEL, "messages": user("hi")})
    assert chat["max_tokens"] == DEFAULT_MAX_TOKENS == 4096


# -- parameters the server does not honour ------------------------------------------------------


def test_unknown_fields_are_named_ignored_and_refused_when_strict(qwen: asyncio.AbstractEventLoop) -> None:
    async def go() -> Any:
        async with client() as sdk:
            return await sdk.messages.with_raw_response.create(
                model=MODEL, max_tokens=32, messages=user("Hi " + script("ok")), metadata={"user_id": "u1"},
                thinking={"type": "disabled"}, extra_body={"service_tier_x": "auto"},
                extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "anthropic-version": "2023-06-01"},
            )  # fmt: skip

    raw = run(qwen, go())
    assert raw.status_code == 200 and raw.parse().content[0].text == "ok"
    assert raw.headers["x-superfluid-ignored-params"] == "service_tier_x"
    with override_settings(SUPERFLUID_STRICT_PARAMS=True):
        body = {"model": MODEL, "max_tokens": 8, "messages": user("hi"), "service_tier_x": "auto"}
        strict = run(qwen, request("POST", "/v1/messages", json.dumps(body).encode(), JSON))
    assert strict.status == 400 and "service_tier_x" in strict.json()["error"]["message"]


def test_a_tools_unknown_key_is_named_and_its_cache_control_is_not() -> None:
    from api.anthropic import to_chat_body

    tool = {**WEATHER, "cache_control": {"type": "ephemeral"}, "defer_loading": True}
    chat, ignored = to_chat_body({"model": MODEL, "messages": user("hi"), "tools": [tool, tool]})
    assert ignored == ["tools.defer_loading"] and chat["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]
    with pytest.raises(ApiError) as err:
        to_chat_body({"model": MODEL, "messages": user("hi"), "tools": [tool]}, strict=True)
    assert err.value.param == "tools[0].defer_loading" and err.value.code == "unknown_parameter"


def test_an_unhonoured_thinking_budget_is_named() -> None:
    from api.anthropic import to_chat_body

    chat, ignored = to_chat_body({"model": MODEL, "messages": user("hi"), "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert ignored == ["thinking.budget_tokens"] and chat["chat_template_kwargs"] == {"enable_thinking": True}


# -- keys, classes ------------------------------------------------------------------------------

RESTRICTED, OPEN = "sf-restricted-0123456789", "sf-open-0123456789"


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_keys_classes_and_request_ids_as_on_the_chat_route() -> None:
    """``x-api-key`` (the SDK's, Claude Code's) is the key; a missing one is a 401
    authentication_error; a key's model rules hold; ``x-superfluid-qos`` picks the class, which
    the reply names, with its X-Request-Id."""
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=("other",)))
    everything = Key(id=2, name="open", digest=digest_of(OPEN), policy=Policy(name="q"))
    ask = {"model": MODEL, "max_tokens": 8, "messages": user("hi")}
    async with attached(SimWorker(), keys={restricted.digest: restricted, everything.digest: everything}):
        async with client(api_key="sf-not-a-key-0123456789") as sdk:
            with pytest.raises(anthropic.AuthenticationError) as wrong:
                await sdk.messages.create(**ask)  # type: ignore[arg-type]
        assert wrong.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        missing = await request("POST", "/v1/messages", json.dumps(ask).encode(), JSON)
        assert missing.status == 401 and missing.json()["error"]["type"] == "authentication_error"
        async with client(api_key=RESTRICTED) as sdk:
            with pytest.raises(anthropic.PermissionDeniedError):
                await sdk.messages.create(**ask)  # type: ignore[arg-type]
            with pytest.raises(anthropic.PermissionDeniedError):
                await sdk.messages.count_tokens(model=MODEL, messages=user("hi"))  # type: ignore[arg-type]
        async with client(api_key=OPEN) as sdk:
            raw = await sdk.messages.with_raw_response.create(**ask, extra_headers={"x-superfluid-qos": "background"})  # type: ignore[arg-type]
            assert (await sdk.messages.count_tokens(model=MODEL, messages=user("hi"))).input_tokens > 0  # type: ignore[arg-type]
        counted = await request("POST", "/v1/messages/count_tokens", json.dumps({"model": MODEL, "messages": user("hi")}).encode(), JSON)
    assert raw.status_code == 200 and raw.headers["x-superfluid-qos"] == "background" and raw.headers["x-request-id"]
    assert raw.parse().type == "message"
    assert counted.status == 401 and counted.json()["error"]["type"] == "authentication_error"


# -- count_tokens -------------------------------------------------------------------------------


def test_count_tokens_counts_the_rendered_prompt_with_its_tools(qwen: asyncio.AbstractEventLoop) -> None:
    plain = run(qwen, count(messages=user("What is the weather?")))
    tooled = run(qwen, count(messages=user("What is the weather?"), tools=[WEATHER]))
    assert 0 < plain < tooled
    ran = run(qwen, create(messages=user("What is the weather? " + script("x")), tools=[WEATHER]))
    marked = run(qwen, count(messages=user("What is the weather? " + script("x")), tools=[WEATHER]))
    assert ran.usage.input_tokens == marked
    bad = run(qwen, request("POST", "/v1/messages/count_tokens", json.dumps({"model": "nope", "messages": user("hi")}).encode(), JSON))
    assert bad.status == 404 and bad.json()["error"]["type"] == "not_found_error"


def test_count_tokens_reads_an_empty_model_as_none_given_as_messages_does(qwen: asyncio.AbstractEventLoop) -> None:
    """An empty ``model`` is no model (docs/api.md, 404 ``model_not_found``): a 400 naming it on
    both routes, as on the chat route. count_tokens answered 404 for a model named ``""``."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = json.dumps({"model": "", "max_tokens": 8, "messages": user("hi")}).encode()
        answer = run(qwen, request("POST", path, body, JSON))
        assert answer.status == 400, (path, answer.status)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and "model" in error["message"], (path, error)


# -- a client that leaves -----------------------------------------------------------------------


async def test_a_client_that_leaves_a_stream_frees_its_lane() -> None:
    from channels.testing import ApplicationCommunicator

    from tests.edge.inproc import scope

    # 400 tokens at 50 ms a step: 20 s, twice the time the lane is given to come free
    sim = SimWorker(lanes=1, step_sleep_s=0.05)
    body = {"model": MODEL, "max_tokens": 400, "messages": user("Write a long story."), "stream": True}
    async with attached(sim):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/messages", JSON))
        await comm.send_input({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
        start = await comm.receive_output(10)
        assert start["status"] == 200
        received = b""
        while received.count(b"event: content_block_delta") < 2:
            message = await comm.receive_output(10)
            assert message.get("more_body", False), received
            received += message.get("body", b"")
        assert received.startswith(b"event: message_start\ndata: ")
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(10)
        for _ in range(1000):
            if sim.busy() == (0, 0):
                break
            await asyncio.sleep(0.01)
        assert sim.busy() == (0, 0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_max_tokens_beyond_the_context_is_a_cap_the_context_lowers(stream: bool) -> None:
    """Claude Code asks max_tokens 32,000 of any model: a prompt that leaves less of the lane's
    context (here 512 tokens) is answered up to the context's end, as llama-server bounds
    n_predict; it was a 400 context_length_exceeded on every request. Its stop_reason is
    Anthropic's own for that, ``model_context_window_exceeded`` (the SDK knows it; Claude Code
    reads it as a full context, where ``max_tokens`` told it the 32,000 were spent). The chat
    route keeps OpenAI's refusal."""
    sim = SimWorker(lanes=1, lane_ctx=512)

    async def go() -> tuple[Any, Any]:
        async with attached(sim):
            ask = {"model": MODEL, "max_tokens": 32000, "messages": user("Tell me a long story.")}
            if stream:
                async with client() as sdk, sdk.messages.stream(**ask) as s:  # type: ignore[arg-type]
                    message = await s.get_final_message()
            else:  # (the SDK wants a stream for so many tokens)
                raw = await request("POST", "/v1/messages", json.dumps(ask).encode(), JSON)
                message = anthropic.types.Message.model_validate(raw.json())
            chat = await request("POST", "/v1/chat/completions", json.dumps({**ask, "messages": user("Tell me a long story.")}).encode(), JSON)
        return message, chat

    loop = asyncio.new_event_loop()
    try:
        message, chat = loop.run_until_complete(go())
    finally:
        loop.close()
    assert message.stop_reason == "model_context_window_exceeded"
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens + message.usage.output_tokens == 512
    assert chat.status == 400 and chat.json()["error"]["code"] == "context_length_exceeded"


def test_a_body_over_the_bound_is_an_anthropic_413(qwen: asyncio.AbstractEventLoop) -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": user("x" * 4000)}).encode()
    with override_settings(SUPERFLUID_MAX_BODY_BYTES=1000):
        reply = run(qwen, request("POST", "/v1/messages", body, JSON))
    assert reply.status == 413 and reply.json()["error"]["type"] == "request_too_large", reply.body


def test_claude_codes_beta_query_reaches_both_routes(qwen: asyncio.AbstractEventLoop) -> None:
    """Claude Code posts to ``/v1/messages?beta=true`` (and count_tokens likewise)."""
    body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": user("Hi " + script("ok"))}).encode()
    reply = run(qwen, request("POST", "/v1/messages?beta=true", body, [*JSON, (b"anthropic-beta", b"claude-code-20250219")]))
    counted = run(qwen, request("POST", "/v1/messages/count_tokens?beta=true", body, JSON))
    assert reply.status == 200 and reply.json()["content"] == [{"type": "text", "text": "ok"}]
    assert counted.status == 200 and counted.json()["input_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_the_context_cannot_hold_is_worded_as_anthropic_words_it(stream: bool) -> None:
    """Claude Code compacts its conversation on Anthropic's ``prompt is too long: N tokens > M
    maximum`` (a 400 invalid_request_error); the chat route's wording was not that."""
    sim = SimWorker(lanes=1, lane_ctx=512)
    body = json.dumps({"model": MODEL, "max_tokens": 100, "messages": user("y" * 600), "stream": stream}).encode()

    async def go() -> Any:
        async with attached(sim):
            return await request("POST", "/v1/messages", body, JSON)

    loop = asyncio.new_event_loop()
    try:
        reply = loop.run_until_complete(go())
    finally:
        loop.close()
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    prompt = int(error["message"].split()[4])
    assert error["message"] == f"prompt is too long: {prompt} tokens > 512 maximum" and prompt > 600


@pytest.mark.parametrize("template_file", ["gemma-2-2b-it.jinja", "mistral-nemo-instruct-2407.jinja", "qwen2.5-7b-instruct.jinja"])
def test_consecutive_turns_of_a_role_are_one_turn_as_anthropic_combines_them(template_file: str) -> None:
    """Claude Code sends two user turns in a row (after an interrupted turn, a command's output, a
    hook's). Anthropic combines consecutive turns of a role; here they were two chat messages,
    which the templates whose turns must alternate (Gemma's, Mistral's) refused, a 400 on that
    turn and on every later one (the history is sent again). An assistant turn's pieces likewise."""
    class Vocab:
        def template_parts(self) -> tuple[str, str, str]:
            return (TEMPLATES / template_file).read_text(), "<s>", "</s>"

    messages = [
        {"role": "user", "content": "Fix the bug."},
        {"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look first.", "signature": "s"}]},
        {"role": "assistant", "content": "Which bug?"},
        {"role": "user", "content": "The one in a.py."},
    ]
    body = {"model": MODEL, "max_tokens": 64, "system": "Be brief.", "messages": messages}
    request = parse_messages_request(json.dumps(body).encode(), models=[MODEL])
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix the bug.\n[Request interrupted by user]"},
        {"role": "assistant", "content": "Which bug?", "reasoning_content": "Look first."},
        {"role": "user", "content": "The one in a.py."},
    ]
    prompt = render_chat(Vocab(), request.to_wire()).text
    assert prompt.index("Fix the bug.") < prompt.index("[Request interrupted by user]") < prompt.index("Which bug?") < prompt.index("The one in a.py.")
