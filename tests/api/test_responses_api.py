"""OpenAI's Responses API (``POST /v1/responses``, api/responses_api.py) through the unmodified
``openai`` client, in-process (the real ASGI application and worker code around the scripted
engine with Qwen 3's real chat template, tests/edge/templated.py): the client's
``responses.create``, ``.parse`` and ``.stream`` read what this server sends as they read
OpenAI's: text, reasoning, tool calls and a follow-up with their outputs, JSON schemas, a reply
cut at ``max_output_tokens``, errors before and after the stream began, and keys and class
headers as on the chat route."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from django.test import override_settings

from tests.edge.inproc import JSON, MODEL, application, request
from tests.edge.templated import TEMPLATES, TemplateEngine, edge_loop
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "http://127.0.0.1:8000"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
THOUGHT = "<think>\nThe user greets me.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class QwenEngine(TemplateEngine):
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    yield from edge_loop(QwenEngine)


def run(loop: asyncio.AbstractEventLoop, call: Any, headers: dict[str, str] | None = None) -> Any:
    """``call(client)`` (a coroutine function of an ``openai.AsyncOpenAI`` on the application) run."""

    async def go() -> Any:
        transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50002))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", http_client=http, max_retries=0, default_headers=headers)
            return await call(client)

    return loop.run_until_complete(go())


def create(loop: asyncio.AbstractEventLoop, **kwargs: Any) -> Any:
    return run(loop, lambda c: c.responses.create(model=MODEL, **kwargs))


def streamed(loop: asyncio.AbstractEventLoop, **kwargs: Any) -> tuple[list[Any], Any]:
    """``client.responses.stream(...)``: its events and its final response (None without one)."""

    async def go(c: openai.AsyncOpenAI) -> Any:
        async with c.responses.stream(model=MODEL, **kwargs) as s:
            events = [e async for e in s]
            try:
                return events, await s.get_final_response()
            except RuntimeError:  # no response.completed (incomplete, failed)
                return events, None

    return run(loop, go)


def raw_stream(loop: asyncio.AbstractEventLoop, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    """A stream's events as they are on the wire: (the ``event:`` line's name, the data)."""
    reply = loop.run_until_complete(request("POST", "/v1/responses", json.dumps({"model": MODEL, "stream": True, **body}).encode(), JSON))
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in reply.body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, block
        out.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return out


# -- text -------------------------------------------------------------------------------------


def test_a_text_reply_is_a_response_with_its_reasoning_and_message(loop: asyncio.AbstractEventLoop) -> None:
    got = create(loop, input="Say hi " + script(THOUGHT + "Hello there!"), instructions="Be brief.", metadata={"k": "v"}, temperature=0.5)
    assert got.output_text == "Hello there!"
    assert got.id.startswith("resp_") and got.object == "response" and got.status == "completed" and got.incomplete_details is None
    assert [item.type for item in got.output] == ["reasoning", "message"]
    reasoning, message = got.output
    assert [c.text for c in reasoning.content] == ["The user greets me."] and reasoning.summary == []
    assert message.id.startswith("msg_") and message.role == "assistant" and message.status == "completed"
    assert [(c.type, c.text, c.annotations) for c in message.content] == [("output_text", "Hello there!", [])]
    # the request's fields echoed back
    assert (got.instructions, got.metadata, got.temperature, got.model, got.tools, got.tool_choice) == ("Be brief.", {"k": "v"}, 0.5, MODEL, [], "auto")
    usage = got.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.input_tokens > 0
    assert usage.output_tokens == len((THOUGHT + "Hello there!").encode())  # the scripted engine: a byte a token
    assert usage.output_tokens_details.reasoning_tokens == len(THOUGHT.encode())
    assert usage.input_tokens_details.cached_tokens == 0


def test_a_plain_string_and_a_list_of_messages_are_the_same_prompt(loop: asyncio.AbstractEventLoop) -> None:
    marker = script("Same.")
    one = create(loop, input="Hi " + marker)
    two = create(loop, input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi " + marker}]}])
    assert one.output_text == two.output_text == "Same." and one.usage.input_tokens == two.usage.input_tokens


def test_the_stream_is_named_events_in_sequence_that_the_client_assembles(loop: asyncio.AbstractEventLoop) -> None:
    said = THOUGHT + "Hello there!"
    wire = raw_stream(loop, input="Say hi " + script(said))
    assert all(name == data["type"] for name, data in wire)
    assert [data["sequence_number"] for _, data in wire] == list(range(len(wire)))
    kinds = [name for name, _ in wire]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done"} <= set(kinds)  # fmt: skip
    assert "".join(d["delta"] for _, d in wire if d["type"] == "response.output_text.delta") == "Hello there!"
    assert "".join(d["delta"] for _, d in wire if d["type"] == "response.reasoning_text.delta") == "The user greets me."
    ids = {d["response"]["id"] for _, d in wire if "response" in d}
    assert len(ids) == 1

    events, final = streamed(loop, input="Say hi " + script(said))
    assert final.output_text == "Hello there!" and final.status == "completed"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.usage.output_tokens_details.reasoning_tokens == len(THOUGHT.encode())
    assert [e.snapshot for e in events if e.type == "response.output_text.delta"][-1] == "Hello there!"


# -- tools ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_then_its_output_in_a_follow_up(loop: asyncio.AbstractEventLoop, stream: bool) -> None:
    ask: list[Any] = [{"role": "user", "content": "Weather in Paris? " + script(CALL)}]
    if stream:
        events, got = streamed(loop, input=ask, tools=[WEATHER])
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        got = create(loop, input=ask, tools=[WEATHER])
    assert got.status == "completed" and got.output_text == ""
    (call,) = [item for item in got.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    assert call.call_id and call.id.startswith("fc_")
    assert got.tools[0].name == "get_weather" and got.tools[0].strict is True  # the Responses API's default
    # the client sends the call back with its output, as the Agents SDK and Codex do
    follow = ask + [item.model_dump(exclude_none=True) for item in got.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
    ]
    follow[0] = {"role": "user", "content": "Weather in Paris? " + script("It is sunny.")}
    again = create(loop, input=follow, tools=[WEATHER])
    assert again.output_text == "It is sunny."


def test_a_forced_call_and_two_calls_in_one_turn(loop: asyncio.AbstractEventLoop) -> None:
    two = CALL + "\n" + CALL.replace("Paris", "Rome")
    got = create(loop, input="Both? " + script(two), tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    assert [json.loads(i.arguments)["city"] for i in got.output if i.type == "function_call"] == ["Paris"]
    assert got.parallel_tool_calls is False and got.tool_choice.name == "get_weather"
    got = create(loop, input="Both? " + script(two), tools=[WEATHER], tool_choice="required")
    assert [json.loads(i.arguments)["city"] for i in got.output if i.type == "function_call"] == ["Paris", "Rome"]


# -- structured output ------------------------------------------------------------------------


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


def test_json_schema_text_format_and_the_clients_parse(loop: asyncio.AbstractEventLoop) -> None:
    got = run(loop, lambda c: c.responses.parse(model=MODEL, input="As JSON " + script('{"city": "Paris", "degrees": 21}'), text_format=Weather))
    assert got.output_parsed == Weather(city="Paris", degrees=21)
    assert got.text.format.type == "json_schema" and got.text.format.name == "Weather"


# -- cut short, refused, failed ---------------------------------------------------------------


def test_a_reply_cut_at_max_output_tokens_is_incomplete(loop: asyncio.AbstractEventLoop) -> None:
    got = create(loop, input="Long " + script("A long reply that goes on."), max_output_tokens=6)
    assert (got.status, got.incomplete_details.reason, got.output_text, got.max_output_tokens) == ("incomplete", "max_output_tokens", "A long", 6)
    assert got.output[0].status == "incomplete"
    wire = raw_stream(loop, input="Long " + script("A long reply that goes on."), max_output_tokens=6)
    assert wire[-1][0] == "response.incomplete"
    assert wire[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert wire[-1][1]["response"]["output"][0]["content"][0]["text"] == "A long"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        # (a well-formed image or file stands omitted: tests/api/test_agent_images_s49.py)
        ({"input": [{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]}, "input[0].content[0].image_url", "missing_required_parameter"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": ["x"]}]}]}, "input[0].content[0].file_url", "invalid_type"),
        ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input[0].content", "unsupported_content"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]}, "input[0].content", "unsupported_content"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
        ({"input": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "input[1].role", "invalid_value"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "invalid_value"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice", "invalid_value"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": False}}}, "text.format.schema", "invalid_value"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(loop: asyncio.AbstractEventLoop, fields: dict[str, Any], param: str, code: str) -> None:
    kwargs = {"input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        create(loop, **kwargs)
    assert (caught.value.param, caught.value.code) == (param, code), caught.value
    assert set(caught.value.body) == {"message", "type", "param", "code"}


def test_an_unknown_model_is_404_as_on_the_chat_route(loop: asyncio.AbstractEventLoop) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        run(loop, lambda c: c.responses.create(model="nope", input="hi"))
    assert caught.value.code == "model_not_found"


def test_parameters_not_honoured_are_named_and_refused_under_strict_params(loop: asyncio.AbstractEventLoop) -> None:
    kwargs: dict[str, Any] = {"input": "Hi " + script("Ok."), "include": ["reasoning.encrypted_content"], "truncation": "auto",
                              "reasoning": {"effort": "low", "summary": "auto"}, "store": True, "user": "u1", "service_tier": "auto"}  # fmt: skip
    raw = run(loop, lambda c: c.responses.with_raw_response.create(model=MODEL, **kwargs))
    assert raw.headers["x-superfluid-ignored-params"] == "include, truncation, reasoning.summary"
    got = raw.parse()
    assert got.output_text == "Ok." and got.store is False and got.user == "u1" and got.reasoning.effort == "low"
    with override_settings(SUPERFLUID_STRICT_PARAMS=True), pytest.raises(openai.BadRequestError) as caught:
        create(loop, **kwargs)
    assert (caught.value.param, caught.value.code) == ("include", "unknown_parameter")


def test_a_hosted_tool_is_left_out_and_named_as_llama_server_drops_it_and_refused_under_strict_params(loop: asyncio.AbstractEventLoop) -> None:
    """Codex sends ``{"type": "web_search"}`` beside its function tools where web search is on: a
    400 would stop every turn. The hosted tool is left out of the prompt (no reply here could call
    it), echoed as sent and named in x-superfluid-ignored-params; the function tool still serves."""
    hosted = [{"type": "web_search"}, {"type": "mcp", "server_label": "x", "server_url": "http://mcp.test"}]
    kwargs: dict[str, Any] = {"input": "Hi " + script("Ok."), "tools": [hosted[0], WEATHER, hosted[1]]}
    raw = run(loop, lambda c: c.responses.with_raw_response.create(model=MODEL, **kwargs))
    assert raw.headers["x-superfluid-ignored-params"] == "tools.web_search, tools.mcp"
    got = raw.parse()
    assert got.output_text == "Ok." and [t.type for t in got.tools] == ["web_search", "function", "mcp"]
    only_hosted = run(loop, lambda c: c.responses.create(model=MODEL, input="Hi " + script("Fine."), tools=hosted))
    assert only_hosted.output_text == "Fine."
    with override_settings(SUPERFLUID_STRICT_PARAMS=True), pytest.raises(openai.BadRequestError) as caught:
        create(loop, **kwargs)
    assert (caught.value.param, caught.value.code) == ("tools[0].type", "unsupported_value")


def test_a_failure_after_the_stream_began_ends_it_with_error_and_response_failed(loop: asyncio.AbstractEventLoop) -> None:
    wire = raw_stream(loop, input="Go " + script("Some text then a failure", fail_at=8))
    kinds = [name for name, _ in wire]
    assert kinds[-2:] == ["error", "response.failed"], kinds
    assert "response.output_text.delta" in kinds
    failed = wire[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"]
    assert [d["sequence_number"] for _, d in wire] == list(range(len(wire)))
    events, final = streamed(loop, input="Go " + script("Some text then a failure", fail_at=8))
    assert final is None and events[-1].type == "response.failed"


# -- keys and classes -------------------------------------------------------------------------


def test_the_class_header_and_request_id_come_back_as_on_the_chat_route(loop: asyncio.AbstractEventLoop) -> None:
    raw = run(loop, lambda c: c.responses.with_raw_response.create(model=MODEL, input="Hi " + script("Ok.")), headers={"x-superfluid-qos": "background"})
    assert raw.headers["x-superfluid-qos"] == "background" and raw.headers["x-request-id"]
    assert raw.parse().output_text == "Ok."


def test_keys_are_required_as_on_the_chat_route(loop: asyncio.AbstractEventLoop) -> None:
    with override_settings(SUPERFLUID_KEYS_REQUIRED=True), pytest.raises(openai.AuthenticationError) as caught:
        create(loop, input="hi")
    assert caught.value.status_code == 401


# -- a client that leaves ---------------------------------------------------------------------


async def test_a_client_that_leaves_a_stream_frees_its_lane_and_its_row_says_so() -> None:
    from asgiref.sync import sync_to_async
    from channels.testing import ApplicationCommunicator

    from activity import writer as activity_writer
    from activity.models import ActivityEntry
    from tests.edge.inproc import SimWorker, attached, scope

    sim = SimWorker(lanes=2, step_sleep_s=0.003)
    body = json.dumps({"model": MODEL, "input": "Go on and on.", "stream": True, "max_output_tokens": 400}).encode()
    async with attached(sim) as (link, _rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/responses", JSON))
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        assert (await comm.receive_output(20))["status"] == 200
        first = await comm.receive_output(20)
        assert first["body"].startswith(b"event: response.created\n")
        while sim.busy()[0] == 0:  # its job on a lane
            await asyncio.sleep(0.01)
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(5)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while sim.busy() != (0, 0):
            assert loop.time() < deadline, sim.busy()
            await asyncio.sleep(0.02)
        assert not link.inflight
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.values_list("endpoint", "status", "error_code", "completion_tokens"))
    assert [row[:3] for row in rows] == [("chat", 200, "client_disconnected")]
    assert rows[0][3] < 400  # its job stopped when its client left, not at its limit


def test_a_codex_shaped_turn_streams_its_call_to_response_completed(loop: asyncio.AbstractEventLoop) -> None:
    """The body the Codex CLI sends (a developer message, the user's turn as input_text parts, a
    shell function tool with ``strict: false``, reasoning effort and summary, ``store: false``,
    ``include`` of encrypted reasoning, a prompt cache key), and what it reads: the call in
    ``response.output_item.done``, then ``response.completed`` with the usage."""
    shell = {"type": "function", "name": "shell", "description": "Runs a command.", "strict": False,
             "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}}  # fmt: skip
    call = '<tool_call>\n{"name": "shell", "arguments": {"command": ["ls", "-la"]}}\n</tool_call>'
    wire = raw_stream(
        loop,
        instructions="You are a coding agent.",
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<environment_context>cwd=/x</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files. " + script(THOUGHT + call)}]},
        ],
        tools=[shell], tool_choice="auto", parallel_tool_calls=False, reasoning={"effort": "medium", "summary": "auto"},
        store=False, include=["reasoning.encrypted_content"], prompt_cache_key="6f1c0e5e-0000-4000-8000-000000000000",
    )  # fmt: skip
    done = [d["item"] for name, d in wire if name == "response.output_item.done"]
    assert [item["type"] for item in done] == ["reasoning", "function_call"]
    assert (done[1]["name"], json.loads(done[1]["arguments"])) == ("shell", {"command": ["ls", "-la"]})
    completed = wire[-1][1]["response"]
    assert wire[-1][0] == "response.completed" and completed["usage"]["output_tokens"] > 0
    assert completed["prompt_cache_key"] == "6f1c0e5e-0000-4000-8000-000000000000" and completed["store"] is False


def test_an_input_over_the_context_is_a_400_naming_the_input(loop: asyncio.AbstractEventLoop) -> None:
    """The worker's and the size check's word is on the chat's ``messages``: a Responses client
    sent ``input``, in ``param`` and in the message."""
    for kwargs in ({"input": "word " * 3000}, {"input": "hi", "max_output_tokens": 5000}, {"input": "x" * 400000}):
        with pytest.raises(openai.BadRequestError) as caught:
            create(loop, **kwargs)
        assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "input"), caught.value
        # (its words too: "tokens in the messages", "your messages holds" named what a Responses client never sent)
        assert "messages" not in caught.value.message and " input" in caught.value.message, caught.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_the_context_cuts_is_context_length_exceeded_not_incomplete(loop: asyncio.AbstractEventLoop, stream: bool) -> None:
    """No max_output_tokens and a reply longer than the lane's context (2048 tokens here): the
    context's end cuts it. ``incomplete`` would say max_output_tokens stopped it, and Codex
    sends such a turn again, to be cut again; OpenAI fails a Response that outgrows the
    window with ``context_length_exceeded``, which Codex answers by compacting its thread. A
    stream says it with ``error`` and ``response.failed``, keeping the output so far."""
    long = "word " * 600  # a token a byte: past the context
    if not stream:
        with pytest.raises(openai.BadRequestError) as caught:
            create(loop, input="Long " + script(long))
        assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "input"), caught.value
        assert "end of the model's context" in caught.value.message
        return
    wire = raw_stream(loop, input="Long " + script(long))
    names = [name for name, _ in wire]
    assert names[-2:] == ["error", "response.failed"] and "response.incomplete" not in names, names
    assert wire[-2][1]["code"] == "context_length_exceeded"
    failed = wire[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
    text = failed["output"][0]["content"][0]["text"]
    assert 1500 < len(text) < 2048 and long.startswith(text)
    # a max_output_tokens the context holds still ends incomplete, as OpenAI's
    wire = raw_stream(loop, input="Long " + script(long), max_output_tokens=100)
    assert wire[-1][0] == "response.incomplete" and wire[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_at_max_output_tokens_is_an_incomplete_item(loop: asyncio.AbstractEventLoop, stream: bool) -> None:
    cut = len(CALL) - 20  # in its arguments
    if stream:
        wire = raw_stream(loop, input="Weather? " + script(CALL), tools=[WEATHER], max_output_tokens=cut)
        assert wire[-1][0] == "response.incomplete"
        got = wire[-1][1]["response"]
    else:
        got = create(loop, input="Weather? " + script(CALL), tools=[WEATHER], max_output_tokens=cut).model_dump()
    assert got["status"] == "incomplete" and got["incomplete_details"] == {"reason": "max_output_tokens"}
    calls = [item for item in got["output"] if item["type"] == "function_call"]
    assert [(c["name"], c["status"]) for c in calls] == [("get_weather", "incomplete")]


def test_llama_servers_second_name_and_a_wrong_method(loop: asyncio.AbstractEventLoop) -> None:
    body = json.dumps({"model": MODEL, "input": "Hi " + script("Ok.")}).encode()
    reply = loop.run_until_complete(request("POST", "/responses", body, JSON))
    assert reply.status == 200 and reply.json()["output"][0]["content"][0]["text"] == "Ok."
    wrong = loop.run_until_complete(request("GET", "/v1/responses"))
    assert wrong.status == 405 and wrong.is_error_object()
    below = loop.run_until_complete(request("POST", "/responses/x", body, JSON))
    assert below.status == 404 and below.is_error_object()


async def test_a_keys_policy_picks_the_class_and_its_rate_limit_holds() -> None:
    """A key's default class and its requests per minute, as on the chat route: the second
    request over a limit of one a minute is 429, read by the client as RateLimitError."""
    from keys.credentials import digest_of
    from keys.runtime import Key, Policy
    from scheduler.core.qos import QosClass
    from tests.edge.inproc import SimWorker, attached

    secret = "sf-responses-0123456789"
    policy = Policy(name="bg", default_class=QosClass.BACKGROUND, max_class=QosClass.BACKGROUND, rate_limit_rpm=1)
    async with attached(SimWorker(), keys={digest_of(secret): Key(id=1, name="agent", digest=digest_of(secret), policy=policy)}):
        transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50003))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key=secret, http_client=http, max_retries=0)
            raw = await client.responses.with_raw_response.create(model=MODEL, input="Hi", max_output_tokens=3)
            assert raw.headers["x-superfluid-qos"] == "background" and raw.parse().object == "response"
            with pytest.raises(openai.RateLimitError):
                await client.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
