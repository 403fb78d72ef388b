"""An image in an agent's history does not break every later turn of its session.

Codex CLI's ``view_image`` puts an ``input_image`` part into the conversation (and an MCP tool's
output can hold one); Claude Code's Read tool gives a PNG back as an ``image`` block in a
``tool_result``, and a user can paste a picture. The models served here read no images, and
these agents send their whole history again every turn: a 400 for the image refused that turn
and every one after it. On the agent APIs (``/v1/responses``, ``/v1/messages`` and their count
routes) a well-formed image now stands in the prompt as one line telling the model an image was
there (api.schemas.omitted_part), and is named in ``x-superfluid-ignored-params``; under
``--strict-params`` it is the 400 it was; a part that is no well-formed image is a 400 naming
its field; the chat route still refuses images. Driven by the unmodified ``openai`` and
``anthropic`` packages through the in-process middle layer (tests/edge/inproc.py), the web
side's vocabulary the engine's, so that a count route's count is the generating route's
``usage``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from django.test import override_settings

from api.anthropic import to_chat_body
from api.errors import ApiError
from api.responses_api import responses_to_chat
from api.schemas import omitted_part
from tests.api.test_anthropic_messages_s48 import client, model_of, rendered
from tests.api.test_responses_api import run
from tests.edge.inproc import JSON, MODEL, request
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE_OMITTED = omitted_part("image")
HEADER = "x-superfluid-ignored-params"


@pytest.fixture
def qwen(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """Qwen 2.5's template (Hermes tool calls), the web side's vocabulary the engine's."""
    yield from model_of("qwen2.5-7b-instruct.jinja", monkeypatch)


# -- the Responses API (Codex CLI) ----------------------------------------------------------------

VIEW_IMAGE = {"type": "function", "name": "view_image", "description": "Attach a local image to the conversation.", "strict": False,
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}  # fmt: skip


def codex_history(last: str) -> list[dict[str, Any]]:
    """A Codex session after it viewed a screenshot (codex-rs: view_image's output, then the
    image as an ``input_image`` of a user message) and an MCP tool answered with an image,
    then the user's ``last`` turn."""
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}
    return [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What does shot.png show?"}]},
        {"type": "function_call", "name": "view_image", "arguments": '{"path": "shot.png"}', "call_id": "call_view"},
        {"type": "function_call_output", "call_id": "call_view", "output": "attached local image path"},
        {"type": "message", "role": "user", "content": [image]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A login form."}]},
        {"type": "function_call", "name": "browser_screenshot", "arguments": "{}", "call_id": "call_mcp"},
        {"type": "function_call_output", "call_id": "call_mcp", "output": [{"type": "input_text", "text": "Screenshot:"}, {**image, "detail": "auto"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": last}]},
    ]


def test_a_codex_history_with_a_viewed_image_answers_its_later_turns_and_names_the_image(qwen: asyncio.AbstractEventLoop) -> None:
    history = codex_history("Now fix the CSS. " + script("Fixed."))
    raw = run(qwen, lambda c: c.responses.with_raw_response.create(model=MODEL, input=history, tools=[VIEW_IMAGE]))
    assert raw.status_code == 200 and raw.parse().output_text == "Fixed."
    assert raw.headers[HEADER] == "input.input_image"
    # streamed, as Codex asks: the same header, the stream whole
    body = {"model": MODEL, "input": history, "tools": [VIEW_IMAGE], "stream": True}
    streamed = qwen.run_until_complete(request("POST", "/v1/responses", json.dumps(body).encode(), JSON))
    assert streamed.status == 200 and streamed.headers[HEADER] == "input.input_image"
    assert json.loads(streamed.sse_data()[-1])["type"] == "response.completed"
    # the model is told where an image was, in the turn that had it
    chat, _, _ = responses_to_chat({"model": MODEL, "input": history})
    said = [(m["role"], m["content"]) for m in chat["messages"]]
    assert ("user", IMAGE_OMITTED) in said and ("tool", "Screenshot:\n" + IMAGE_OMITTED) in said


def test_the_input_tokens_route_counts_what_the_turn_runs_and_names_the_image(qwen: asyncio.AbstractEventLoop) -> None:
    history = codex_history("Again. " + script("Ok."))
    counted = run(qwen, lambda c: c.responses.input_tokens.with_raw_response.count(model=MODEL, input=history, tools=[VIEW_IMAGE]))
    ran = run(qwen, lambda c: c.responses.create(model=MODEL, input=history, tools=[VIEW_IMAGE]))
    assert counted.parse().input_tokens == ran.usage.input_tokens > 0
    assert counted.headers[HEADER] == "input.input_image"
    files = [{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "file-1"}, {"type": "input_text", "text": "Sum it up."}]}]
    chat, ignored, _ = responses_to_chat({"model": MODEL, "input": files})
    assert chat["messages"][0]["content"] == omitted_part("file") + "\nSum it up." and ignored == ["input.input_file"]


def test_under_strict_params_an_input_image_is_still_a_400_naming_where_it_is(qwen: asyncio.AbstractEventLoop) -> None:
    history = codex_history("Again.")
    with override_settings(SUPERFLUID_STRICT_PARAMS=True):
        with pytest.raises(openai.BadRequestError) as caught:
            run(qwen, lambda c: c.responses.create(model=MODEL, input=history))
        assert (caught.value.param, caught.value.code) == ("input[4].content", "unsupported_content")
        with pytest.raises(openai.BadRequestError) as counted:
            run(qwen, lambda c: c.responses.input_tokens.count(model=MODEL, input=history))
        assert counted.value.param == "input[4].content"
        only_output = [item for i, item in enumerate(history) if i != 4]
        with pytest.raises(openai.BadRequestError) as in_output:
            run(qwen, lambda c: c.responses.create(model=MODEL, input=only_output))
        assert (in_output.value.param, in_output.value.code) == ("input[6].output", "unsupported_content")


@pytest.mark.parametrize(
    ("part", "param", "code"),
    [
        ({"type": "input_image"}, "input[0].content[0].image_url", "missing_required_parameter"),
        ({"type": "input_image", "image_url": None, "file_id": None, "detail": "high"}, "input[0].content[0].image_url", "missing_required_parameter"),
        ({"type": "input_image", "image_url": {"url": "http://x/y.png"}}, "input[0].content[0].image_url", "invalid_type"),
        ({"type": "input_image", "file_id": 7}, "input[0].content[0].file_id", "invalid_type"),
        ({"type": "input_image", "image_url": "http://x/y.png", "detail": 1}, "input[0].content[0].detail", "invalid_type"),
        ({"type": "input_file", "filename": "a.pdf"}, "input[0].content[0].file_data", "missing_required_parameter"),
        ({"type": "input_file", "file_data": "data:application/pdf;base64,AA==", "filename": ["a.pdf"]}, "input[0].content[0].filename", "invalid_type"),
    ],
)
def test_a_part_that_is_no_well_formed_image_or_file_is_a_400_naming_its_field(part: dict[str, Any], param: str, code: str) -> None:
    for strict in (False, True):
        with pytest.raises(ApiError) as caught:
            responses_to_chat({"model": MODEL, "input": [{"role": "user", "content": [part]}]}, strict=strict)
        # (under --strict-params every image is refused, as a part the route cannot serve)
        assert (caught.value.param, caught.value.code) == ((param, code) if not strict else ("input[0].content", "unsupported_content"))
    with pytest.raises(ApiError) as in_output:
        responses_to_chat({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c", "output": [part]}]})
    assert in_output.value.param == param.replace("input[0].content[0]", "input[0].output[0]")


def test_the_chat_route_still_refuses_an_image(qwen: asyncio.AbstractEventLoop) -> None:
    """llama-server's behaviour on /v1/chat/completions: out of this change's reach."""
    for part in ({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}, {"type": "input_image", "image_url": "http://x/y.png"}):
        body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]}
        reply = qwen.run_until_complete(request("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON))
        assert reply.status == 400 and reply.json()["error"]["code"] == "unsupported_content", reply.body


# -- Anthropic's Messages API (Claude Code) -------------------------------------------------------

PNG_BLOCK = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
READ = {"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}


def claude_code_history(last: str) -> list[dict[str, Any]]:
    """A Claude Code session after its Read tool read a PNG (a ``tool_result`` holding an
    ``image`` block) and the user pasted a picture, then the user's ``last`` turn."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "What is in shot.png?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_read", "name": "Read", "input": {"file_path": "/w/shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_read", "content": [PNG_BLOCK]}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A login form."}]},
        {"role": "user", "content": [PNG_BLOCK, {"type": "text", "text": "And this one?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "The same form, narrower."},
        {"role": "user", "content": last},
    ]


async def created_raw(**body: Any) -> Any:
    body.setdefault("model", MODEL)
    body.setdefault("max_tokens", 64)
    async with client() as sdk:
        return await sdk.messages.with_raw_response.create(**body)


async def counted_raw(**body: Any) -> Any:
    body.setdefault("model", MODEL)
    async with client() as sdk:
        return await sdk.messages.with_raw_response.count_tokens(**body)


def test_a_claude_code_history_with_a_read_png_answers_its_later_turns_and_names_the_image(qwen: asyncio.AbstractEventLoop) -> None:
    history = claude_code_history("Fix its CSS. " + script("Fixed."))
    counted = qwen.run_until_complete(counted_raw(messages=history, tools=[READ]))
    raw = qwen.run_until_complete(created_raw(messages=history, tools=[READ]))
    assert raw.status_code == 200 and raw.parse().content[0].text == "Fixed."
    assert raw.headers[HEADER] == "messages.image"
    usage = raw.parse().usage
    assert counted.parse().input_tokens == usage.input_tokens + usage.cache_read_input_tokens > 0
    assert counted.headers[HEADER] == "messages.image"
    prompt = qwen.run_until_complete(rendered(messages=history, tools=[READ]))
    assert f"<tool_response>\n{IMAGE_OMITTED}\n</tool_response>" in prompt
    assert f"{IMAGE_OMITTED}\nAnd this one?" in prompt


def test_a_text_document_is_read_and_a_pdf_stands_omitted() -> None:
    text_doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Line one."}, "title": "notes.txt"}
    content_doc = {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Part A."}, PNG_BLOCK]}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    messages = [
        {"role": "user", "content": [text_doc, content_doc, {"type": "text", "text": "Summarise."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.pdf"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [pdf]}]},
    ]
    chat, ignored = to_chat_body({"model": MODEL, "messages": messages})
    assert chat["messages"][0]["content"] == "\n".join(["Line one.", "Part A.", IMAGE_OMITTED, "Summarise."])
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": omitted_part("document")}
    assert ignored == ["messages.image", "messages.document"]
    # a text document is text the model reads: served under --strict-params too; an image or a
    # PDF is refused there, naming where it is
    strict_text, _ = to_chat_body({"model": MODEL, "messages": [{"role": "user", "content": [text_doc]}]}, strict=True)
    assert strict_text["messages"] == [{"role": "user", "content": "Line one."}]
    for refused, param in ((messages[:1], "messages[0].content[1].source.content[1]"), (messages[1:], "messages[1].content[0].content[0]")):
        with pytest.raises(ApiError) as caught:
            to_chat_body({"model": MODEL, "messages": refused}, strict=True)
        assert (caught.value.param, caught.value.code) == (param, "unsupported_content")


def test_under_strict_params_an_image_block_is_still_a_400_naming_where_it_is(qwen: asyncio.AbstractEventLoop) -> None:
    history = claude_code_history("Again.")
    with override_settings(SUPERFLUID_STRICT_PARAMS=True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            qwen.run_until_complete(created_raw(messages=history))
        with pytest.raises(anthropic.BadRequestError) as counted:
            qwen.run_until_complete(counted_raw(messages=history))
    for error in (caught.value, counted.value):
        assert isinstance(error.body, dict) and "'messages[2].content[0].content[0]'" in error.body["error"]["message"], error.body


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "image"}, "source"),
        ({"type": "image", "source": "data:image/png;base64,AA=="}, "source"),
        ({"type": "image", "source": {"type": "text", "data": "x"}}, "source.type"),
        ({"type": "image", "source": {"type": "base64", "data": PNG}}, "source.media_type"),
        ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ["x"]}}, "source.data"),
        ({"type": "image", "source": {"type": "url"}}, "source.url"),
        ({"type": "image", "source": {"type": "file", "file_id": 3}}, "source.file_id"),
        ({"type": "document", "source": {"type": "text"}}, "source.data"),
        ({"type": "document", "source": {"type": "content", "content": 5}}, "source.content"),
        ({"type": "document", "source": {"type": "content", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}}, "source.content[0]"),
    ],
)
def test_a_block_that_is_no_well_formed_image_or_document_is_a_400_naming_its_field(block: dict[str, Any], param: str) -> None:
    for messages, at in (
        ([{"role": "user", "content": [block]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [block]}]}], "messages[0].content[0].content[0]"),
    ):
        with pytest.raises(ApiError) as caught:
            to_chat_body({"model": MODEL, "messages": messages})
        assert caught.value.status == 400 and caught.value.param == f"{at}.{param}" and caught.value.param in caught.value.message
