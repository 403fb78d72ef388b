"""llama-server's routes added this session (api/native_embeddings.py, api/llama_routes.py) and
Anthropic's Messages API (api/anthropic.py) under hostile and unusual bodies, through the
in-process middle layer (tests/edge/inproc.py): a clear 4xx in the route's own error shape,
never a 500."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.test_llama_server_aliases_s48 import embedding_engine, post
from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("norm", [2**31, 10**308, 10**400])
async def test_an_embd_normalize_beyond_llama_servers_int_is_a_400_not_a_500(norm: int) -> None:
    """llama-server reads embd_normalize as an int; a p-norm's p beyond a float's range made the
    reply's normalisation raise (a 500, after the worker had embedded the input)."""
    async with attached(SimWorker()) as (link, _rt):
        seen = embedding_engine(link)
        reply = await request("POST", "/embedding", post(content="hello", embd_normalize=norm), JSON)
        largest = await request("POST", "/embedding", post(content="hello", embd_normalize=2**31 - 1), JSON)
    assert reply.status == 400 and reply.is_error_object(), reply.body
    assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == ("embd_normalize", "invalid_value")
    assert len(seen) == 1  # the refused request never reached the engine
    assert largest.status == 200, largest.body
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(largest.json()[0]["embedding"][0], [0.6 / 0.8, -1.0, 0.0], strict=True))


@pytest.mark.parametrize(
    ("method", "body", "status"),
    [
        ("POST", b"{", 400),
        ("POST", json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404),
        ("PUT", b"{}", 405),
    ],
)
async def test_count_tokens_errors_carry_the_request_id_as_v1_messages_errors_do(method: str, body: bytes, status: int) -> None:
    """Anthropic's error object names the request (``request_id``, its X-Request-Id), as
    /v1/messages' errors do; count_tokens' had none."""
    async with attached(SimWorker()):
        reply = await request(method, "/v1/messages/count_tokens", body, JSON)
    assert reply.status == status, reply.body
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"].endswith("error")
    assert error["request_id"] == reply.headers["x-request-id"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("depth", [900, 930, 960, 985])
async def test_a_tool_use_input_nested_as_deep_as_json_allows_is_answered_not_a_500(path: str, depth: int) -> None:
    """An earlier call's ``input`` nested as deeply as the body's parser takes: count_tokens
    re-encoded it as the chat's arguments from deeper in the stack and raised RecursionError (a
    500 in the OpenAI shape); it is counted, or refused in Anthropic's error object."""
    deep = '{"a":' * depth + "1" + "}" * depth
    turns = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "DEEP"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
    ]
    body = json.dumps({"model": "sim", "max_tokens": 4, "messages": turns}).replace('"DEEP"', deep)
    async with attached(SimWorker(lane_ctx=16384)):
        reply = await request("POST", path, body.encode(), JSON)
    assert reply.status < 500, reply.body
    if reply.status >= 400:
        assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "invalid_request_error", reply.body


@pytest.mark.parametrize(("field", "value"), [("content", [10**9]), ("content", [[1, 2], [10**9]]), ("input", [10**9])])
async def test_a_token_id_outside_the_vocabulary_is_named_in_the_field_it_came_in(field: str, value: list[Any]) -> None:
    """The worker refuses a token id outside the vocabulary naming 'input'; /embedding's text in
    ``content`` had the error name a field the client never sent (docs/api.md: an error in the
    text names the field it came in)."""
    async with attached(SimWorker()) as (link, _rt):
        embedding_engine(link)
        reply = await request("POST", "/embedding", post(**{field: value}), JSON)
    assert reply.status == 400 and reply.is_error_object(), reply.body
    error = reply.json()["error"]
    assert error["param"] == field and f"'{field}'" in error["message"], error


def test_any_embd_normalize_is_a_vector_or_a_400() -> None:
    """Fuzzed with the engine embedding (the reply's normalisation runs): any JSON value of
    embd_normalize, however large, is normalised vectors or a 400 naming it, never a 500."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.edge.inproc import attached_loop

    sim = SimWorker()
    with attached_loop(sim) as loop:
        embedding_engine(sim.transport)

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(norm=st.integers() | st.integers(-(10**400), 10**400) | st.floats(allow_nan=False, allow_infinity=False) | st.booleans() | st.none())
        def check(norm: Any) -> None:
            reply = loop.run_until_complete(request("POST", "/embedding", post(content="hi", embd_normalize=norm), JSON))
            assert reply.status in (200, 400), reply.body
            if reply.status == 400:
                assert reply.json()["error"]["param"] == "embd_normalize", reply.body
            else:
                assert all(math.isfinite(v) for v in reply.json()[0]["embedding"][0])

        check()


# -- /v1/messages: the unstreamed message is the streamed one -----------------------------------

@pytest.fixture
def qwen(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """The middle layer around a scripted engine with Qwen 2.5's template (Hermes calls)."""
    from tests.api.test_anthropic_messages_s48 import model_of

    yield from model_of("qwen2.5-7b-instruct.jinja", monkeypatch)


_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("written", ["Before. " + _CALL + " After.", _CALL + "\nAfter", "A" + _CALL + "B" + _CALL + "C"])
def test_text_after_a_call_is_where_the_model_wrote_it_streamed_or_not(written: str, qwen: asyncio.AbstractEventLoop) -> None:
    """A reply with text after a call: the stream gives text, tool_use, text (as written); the
    unstreamed message joined the texts into one block before the calls, so the SDK's
    get_final_message() and messages.create() gave different messages (docs/api.md: the same)."""
    from tests.api.test_anthropic_messages_s48 import WEATHER, create, run, streamed, user
    from tests.edge.test_stream_equivalence import script

    def blocks(message: Any) -> list[tuple[str, Any]]:
        return [(b.type, b.text if b.type == "text" else b.input) for b in message.content]

    whole = run(qwen, create(max_tokens=400, messages=user("w " + script(written)), tools=[WEATHER]))
    final, _events = run(qwen, streamed(max_tokens=400, messages=user("w " + script(written)), tools=[WEATHER]))
    assert blocks(whole) == blocks(final)
    assert [kind for kind, _ in blocks(whole)][-1] == "text" and whole.stop_reason == final.stop_reason == "tool_use"
