"""The Responses API's translator (api/responses_api.py) fuzzed: a hostile or odd body is a 4xx
OpenAI error object naming what is wrong, never a 500, never a hang; a body it takes becomes a
chat request whose messages keep the input's order, and whose Response echo is JSON. Then the
same kind of bodies through the whole in-process middle layer (tests/edge/inproc.py), streamed
and not, with Qwen 3's real chat template rendering what the translator made."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from api.errors import ApiError
from api.responses_api import parse_responses_request
from api.schemas import omitted_part
from tests.edge.inproc import JSON, MODEL, request
from tests.edge.strategies import json_values, nasty_text
from tests.edge.templated import edge_loop

from .test_responses_api import QwenEngine

MODELS = (MODEL,)

# an image or a file, well-formed or not (Codex's view_image and MCP tools put images in the history)
media = st.fixed_dictionaries({"type": st.sampled_from(["input_image", "input_file"])},
                              optional={k: st.one_of(nasty_text, json_values) for k in ("image_url", "file_id", "file_data", "file_url", "detail", "filename")})  # fmt: skip
image = st.fixed_dictionaries({"type": st.just("input_image"), "image_url": st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "https://x.test/a.png"])},
                              optional={"detail": st.sampled_from(["auto", "low", "high", "original"])})  # fmt: skip
parts = st.one_of(
    nasty_text,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": nasty_text}),
            st.fixed_dictionaries({"type": st.sampled_from(["input_image", "input_file", "refusal", "summary_text", "x"])}, optional={"text": json_values, "refusal": json_values}),
            media,
            image,
            json_values,
        ),
        max_size=3,
    ),
    json_values,
)
item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]), "content": parts}, optional={"type": st.sampled_from(["message", "x"]), "id": json_values, "status": json_values}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": nasty_text, "name": st.sampled_from(["get_weather", "f", "", "a b"]), "arguments": st.one_of(nasty_text, json_values)}, optional={"id": json_values}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.one_of(nasty_text, json_values), "output": parts}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": json_values}, optional={"content": st.one_of(st.lists(st.fixed_dictionaries({"type": st.just("reasoning_text"), "text": nasty_text}), max_size=2), json_values), "encrypted_content": json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["item_reference", "web_search_call", "local_shell_call", "custom_tool_call"])}),
    st.fixed_dictionaries({"type": st.just("custom_tool_call")}, optional={"call_id": st.one_of(nasty_text, json_values), "name": st.sampled_from(["apply_patch", "", "a b"]),
                                                                            "input": st.one_of(nasty_text, json_values), "status": json_values}),
    st.fixed_dictionaries({"type": st.just("custom_tool_call_output"), "call_id": st.one_of(nasty_text, json_values)}, optional={"output": parts}),
    json_values,
)
grammar = st.fixed_dictionaries({"type": st.sampled_from(["text", "grammar", "x"])}, optional={"syntax": st.sampled_from(["lark", "regex", "x"]), "definition": st.one_of(nasty_text, json_values)})
tool = st.one_of(
    st.fixed_dictionaries({"type": st.just("custom"), "name": st.sampled_from(["apply_patch", "", "a b"])}, optional={"format": st.one_of(grammar, json_values), "description": st.one_of(nasty_text, json_values)}),
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["get_weather", "f", "", "a b"])},
                          optional={"parameters": st.one_of(st.just({"type": "object", "properties": {}}), json_values), "strict": json_values, "description": json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "file_search", "mcp", "custom", "local_shell"])}),
    json_values,
)  # fmt: skip
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "instructions": st.one_of(nasty_text, json_values),
    "tools": st.one_of(st.lists(tool, max_size=3), json_values),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "x"]), st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "allowed_tools", "web_search"])},
                             optional={"name": json_values, "mode": json_values, "tools": json_values}), json_values),  # fmt: skip
    "parallel_tool_calls": json_values,
    "text": st.one_of(st.fixed_dictionaries({}, optional={"format": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "x"])},
                      optional={"name": json_values, "schema": st.one_of(st.just({"type": "object"}), json_values), "strict": json_values}), json_values), "verbosity": json_values}), json_values),  # fmt: skip
    "max_output_tokens": st.one_of(st.integers(-3, 8), json_values),
    "reasoning": st.one_of(st.fixed_dictionaries({}, optional={"effort": json_values, "summary": json_values}), json_values),
    "temperature": json_values,
    "top_p": json_values,
    "metadata": json_values,
    "store": json_values,
    "user": json_values,
    "include": json_values,
    "truncation": json_values,
    "top_logprobs": json_values,
    "max_tool_calls": json_values,
    "background": json_values,
    "previous_response_id": json_values,
    "conversation": json_values,
    "stream_options": json_values,
    "n": json_values,
    "messages": json_values,
}


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL if draw(st.integers(0, 9)) else draw(json_values)}
    if draw(st.integers(0, 9)):
        body["input"] = draw(st.one_of(nasty_text, st.lists(item, max_size=4), json_values))
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        body[name] = draw(FIELDS[name])
    return body


WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
text_part = st.fixed_dictionaries({"type": st.just("input_text"), "text": nasty_text})
seen_part = st.one_of(text_part, image)  # a user's text, or an image it attached


@st.composite
def turns(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation as clients send it back: user turns, earlier replies' reasoning, text and
    calls, and the calls' outputs, with hostile strings in them."""
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        items.append({"role": draw(st.sampled_from(["user", "developer", "system"])), "content": draw(st.one_of(nasty_text, st.lists(seen_part, min_size=1, max_size=2)))})
        if draw(st.booleans()):
            items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": draw(nasty_text)}]})
        if draw(st.booleans()):
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": draw(nasty_text), "annotations": []}]})
        for k in range(draw(st.integers(0, 2))):
            call_id = draw(nasty_text) or f"call_{k}"
            items.append({"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": draw(st.one_of(nasty_text, json_values.map(json.dumps)))})
            items.append({"type": "function_call_output", "call_id": call_id, "output": draw(st.one_of(nasty_text, st.lists(seen_part, max_size=2)))})
        if draw(st.booleans()):  # a custom (freeform) tool's call and output, as Codex sends apply_patch's back
            items.append({"type": "custom_tool_call", "call_id": "ctc_1", "name": "apply_patch", "input": draw(nasty_text), "status": "completed"})
            items.append({"type": "custom_tool_call_output", "call_id": "ctc_1", "output": draw(nasty_text)})
    items.append({"role": "user", "content": draw(nasty_text)})
    return items


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "input": draw(st.one_of(nasty_text, turns()))}
    if draw(st.booleans()):
        body["instructions"] = draw(nasty_text)
    if draw(st.booleans()):
        body["tools"] = [WEATHER] + draw(st.sampled_from([[], [APPLY_PATCH]]))
        choices = ["auto", "none", "required", {"type": "function", "name": "get_weather"}]
        body["tool_choice"] = draw(st.sampled_from(choices + [{"type": "custom", "name": "apply_patch"}] if len(body["tools"]) > 1 else choices))
    if draw(st.integers(0, 3)) == 0:
        body["text"] = {"format": draw(st.sampled_from([{"type": "json_object"}, {"type": "json_schema", "name": "w", "schema": {"type": "object"}}]))}
    if draw(st.booleans()):
        body["reasoning"] = {"effort": draw(st.sampled_from(["low", "high"])), "summary": draw(st.sampled_from([None, "auto"]))}
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(bodies(), near_valid_bodies()), strict=st.booleans())
def test_any_body_is_a_request_or_a_4xx_naming_a_field(body: dict[str, Any], strict: bool) -> None:
    try:
        req, asked = parse_responses_request(json.dumps(body).encode(), models=MODELS, strict=strict)
    except ApiError as exc:
        assert exc.status in (400, 404), exc
        assert exc.message and (exc.param is None or isinstance(exc.param, str))
        if exc.param:
            # the Responses body's own names, never those of the chat body it was translated to
            chat_names = tuple(k for k in ("messages", "response_format", "max_completion_tokens", "reasoning_effort") if k not in body)
            assert not exc.param.startswith(chat_names), exc
        return
    assert req.endpoint == "chat" and req.messages and req.n == 1 and not req.prompts
    json.dumps(asked.echo)  # the Response's echo is JSON
    if strict:
        assert req.ignored == []
    # every image or file the request was served with stands in the prompt, and is named
    sent_parts = [part for it in body.get("input") or [] if isinstance(it, dict) and it.get("role") != "assistant"
                  for key in ("content", "output") if isinstance(it.get(key), list) for part in it[key] if isinstance(part, dict)]  # fmt: skip
    for kind, what in (("input_image", "image"), ("input_file", "file")):
        if any(part.get("type") == kind for part in sent_parts):
            event(f"served with an {kind}")
            assert not strict and f"input.{kind}" in req.ignored and any(omitted_part(what) in m["content"] for m in req.messages), (body, req.messages)
        else:
            assert f"input.{kind}" not in req.ignored
    # the input's text reaches the prompt in order: each user message's content is a message
    sent = json.loads(json.dumps(body))  # (a surrogate pair in JSON is one character)
    if isinstance(sent.get("input"), str):
        assert req.messages[-1] == {"role": "user", "content": sent["input"]}


clean_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    turns=st.lists(st.tuples(st.sampled_from(["user", "developer", "output"]), st.lists(st.one_of(clean_text.map(lambda t: {"type": "input_text", "text": t}), image), max_size=3)), min_size=1, max_size=4),
    strict=st.booleans(),
)  # fmt: skip
def test_each_image_of_a_history_stands_omitted_in_its_place(turns: list[tuple[str, list[dict[str, Any]]]], strict: bool) -> None:
    """A history holding images (in a message, or in a tool's output) is served, each image a
    line in its place in its turn's text, the header naming them once; under --strict-params it
    is refused where the first one is."""
    items: list[dict[str, Any]] = []
    for i, (kind, content) in enumerate(turns):
        if kind == "output":
            items += [{"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": f"c{i}", "output": content}]
        else:
            items.append({"type": "message", "role": kind, "content": content})
    body = {"model": MODEL, "input": [*items, {"role": "user", "content": "Go on."}]}
    images = [i for i, item in enumerate(body["input"]) for part in item.get("content") or item.get("output") or [] if isinstance(part, dict) and part["type"] == "input_image"]
    try:
        req, _ = parse_responses_request(json.dumps(body).encode(), models=MODELS, strict=strict)
    except ApiError as exc:
        assert strict and images and exc.code == "unsupported_content", exc
        assert exc.param == f"input[{images[0]}]." + ("output" if body["input"][images[0]]["type"] == "function_call_output" else "content")
        return
    assert not (strict and images)
    said = [m["content"] for m in req.messages if m["role"] != "assistant"]
    meant: list[tuple[str, str]] = []  # (kind, text): the developer turns that open it are one, as are user turns in a row
    for kind, text in [(kind, "\n".join(omitted_part("image") if p["type"] == "input_image" else p["text"] for p in content)) for kind, content in turns] + [("user", "Go on.")]:
        if meant and kind == meant[-1][0] == "developer" and len(meant) == 1:
            meant[-1] = (kind, "\n\n".join(t for t in (meant[-1][1], text) if t))
        elif meant and kind == meant[-1][0] == "user":
            meant[-1] = (kind, "\n".join(t for t in (meant[-1][1], text) if t))
        else:
            meant.append((kind, text))
    assert said == [text for _, text in meant]
    assert req.ignored == (["input.input_image"] if images else [])


def test_consecutive_calls_are_one_assistant_turn_with_its_reasoning() -> None:
    body = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Two cities."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
            {"role": "developer", "content": "Answer in one line."},
        ],
    }
    req, _ = parse_responses_request(json.dumps(body).encode(), models=MODELS)
    calls = [{"id": c, "type": "function", "function": {"name": "get_weather", "arguments": a}} for c, a in (("call_a", '{"city":"Paris"}'), ("call_b", '{"city":"Rome"}'))]
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "Two cities.", "tool_calls": calls},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_a"},
        {"role": "tool", "content": "rain", "tool_call_id": "call_b"},
        {"role": "system", "content": "Answer in one line."},
    ]


def test_text_format_and_reasoning_effort_reach_the_chat_request() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}},
            "reasoning": {"effort": "high"}, "max_output_tokens": 7, "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}  # fmt: skip
    req, asked = parse_responses_request(json.dumps(body).encode(), models=MODELS)
    assert req.response_format == {"type": "json_schema", "schema": schema, "strict": True}
    assert req.chat_template_kwargs == {"reasoning_effort": "high"} and req.max_tokens == 7
    assert [t["name"] for t in req.tools or []] == ["f"] and req.tool_choice == "required"
    assert asked.echo["text"]["format"]["name"] == "A" and asked.echo["reasoning"]["effort"] == "high"
    json_object, _ = parse_responses_request(json.dumps({"model": MODEL, "input": "x", "text": {"format": {"type": "json_object"}}}).encode(), models=MODELS)
    assert json_object.response_format == {"type": "json_object"}


# -- through the middle layer -----------------------------------------------------------------


@pytest.fixture(scope="module")
def edge() -> Iterator[asyncio.AbstractEventLoop]:
    yield from edge_loop(QwenEngine)


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.one_of(near_valid_bodies(), near_valid_bodies(), bodies()), stream=st.booleans())
def test_no_body_gets_a_500_or_a_hang_through_the_middle_layer(edge: asyncio.AbstractEventLoop, body: dict[str, Any], stream: bool) -> None:
    body = {**body, "stream": stream}
    if isinstance(body.get("max_output_tokens"), int) is False or body["max_output_tokens"] > 8:
        body["max_output_tokens"] = 4  # short replies: the fuzz is of the translation, not of generation
    reply = edge.run_until_complete(request("POST", "/v1/responses", json.dumps(body).encode(), JSON, timeout_s=20))
    event(f"status {reply.status}")
    assert reply.status < 500, reply.body[:300]
    if reply.status != 200:
        assert reply.is_error_object(), reply.body[:300]
    elif reply.headers["content-type"].startswith("text/event-stream"):
        last = reply.body.decode().rstrip().split("\n")[-1]
        assert json.loads(last[len("data: ") :])["type"] in ("response.completed", "response.incomplete")
    else:
        assert reply.json()["object"] == "response"
