"""The Codex CLI against ``POST /v1/responses`` (api/responses_api.py), in-process: the bodies
Codex builds (codex-rs: a developer message and the user's ``input_text`` parts, its ``shell``
function tool, its ``apply_patch`` tool, which is a *custom* (freeform) tool with a Lark grammar
for GPT-5 models and wherever ``include_apply_patch_tool`` is set, ``web_search``, ``reasoning``,
``include``, ``prompt_cache_key``) and what its stream parser needs: every
``response.output_item.done`` item one its ``ResponseItem`` reads (a custom tool's call as a
``custom_tool_call`` with its ``input``), ``response.completed`` with ``response.id`` and the
usage's five fields; and a turn it got from here sent back as its history (the items verbatim,
or as Codex serializes them: no ids, ``function_call_output``/``custom_tool_call_output``) is no
400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.rendering import render_chat
from api.responses_api import custom_input, parse_responses_request, responses_to_chat
from tests.api.test_responses_api import THOUGHT, QwenEngine, raw_stream, run, streamed
from tests.edge.inproc import JSON, MODEL, request
from tests.edge.templated import TEMPLATES, edge_loop
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

# Codex's tools, in the shapes codex-rs sends (client_common.rs ToolSpec: Function, Freeform, WebSearch)
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                                         "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
                        "required": ["command"], "additionalProperties": False}}  # fmt: skip
GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\n'
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
               "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}  # fmt: skip
WEB_SEARCH = {"type": "web_search"}
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\n*** End Patch\n"
PATCH_CALL = "<tool_call>\n" + json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}) + "\n</tool_call>"
SHELL_CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": ["cat", "hello.txt"]}}\n</tool_call>'


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    yield from edge_loop(QwenEngine, lane_ctx=8192)


def codex_body(user_text: str, **extra: Any) -> dict[str, Any]:
    """A turn as Codex sends it (codex-rs ResponsesApiRequest)."""
    return {
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>cwd=/w</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": user_text}]},
        ],
        "tools": [SHELL, APPLY_PATCH, WEB_SEARCH], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53",
        **extra,
    }  # fmt: skip


def done_items(wire: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [d["item"] for name, d in wire if name == "response.output_item.done"]


def as_codex_sends(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as Codex serializes it back in its next request (codex-rs protocol
    models.rs ResponseItem: ``id`` is skip_serializing on messages, reasoning and function
    calls; a custom call keeps its ``status``; output_text parts are ``{type, text}``)."""
    kind = item["type"]
    if kind == "message":
        return {"type": "message", "role": item["role"], "content": [{"type": p["type"], "text": p["text"]} for p in item["content"]]}
    if kind == "reasoning":
        return {"type": "reasoning", "summary": item["summary"], "content": item["content"], "encrypted_content": None}
    if kind == "function_call":
        return {"type": "function_call", "name": item["name"], "arguments": item["arguments"], "call_id": item["call_id"]}
    assert kind == "custom_tool_call"
    return {"type": "custom_tool_call", "status": item["status"], "call_id": item["call_id"], "name": item["name"], "input": item["input"]}


def test_codexs_freeform_apply_patch_is_served_and_its_call_is_a_custom_tool_call(loop: asyncio.AbstractEventLoop) -> None:
    """A custom tool was left out of the prompt (only named as ignored): the model could not
    call Codex's ``apply_patch`` and Codex could not edit a file. It is offered as a function
    of one string, and the call comes back as OpenAI's ``custom_tool_call`` with the patch as
    its ``input``, which Codex's apply_patch handler takes."""
    wire = raw_stream(loop, **codex_body("Create hello.txt. " + script(THOUGHT + PATCH_CALL)))
    names = [name for name, _ in wire]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert all(d["type"] == name for name, d in wire) and [d["sequence_number"] for _, d in wire] == list(range(len(wire)))
    items = done_items(wire)
    assert [item["type"] for item in items] == ["reasoning", "custom_tool_call"]
    call = items[1]
    assert (call["name"], call["input"], call["status"]) == ("apply_patch", PATCH, "completed")
    assert call["call_id"] and call["id"].startswith("ctc_")
    # the input is also streamed as OpenAI streams it: a delta, then done, before the item's done
    assert [d["input"] for name, d in wire if name == "response.custom_tool_call_input.done"] == [PATCH]
    assert "".join(d["delta"] for name, d in wire if name == "response.custom_tool_call_input.delta") == PATCH
    assert "response.function_call_arguments.delta" not in names
    completed = wire[-1][1]["response"]
    assert completed["id"].startswith("resp_") and completed["output"][1] == call
    assert set(completed["usage"]) == {"input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"}
    assert completed["usage"]["input_tokens_details"]["cached_tokens"] >= 0 and completed["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert [t["type"] for t in completed["tools"]] == ["function", "custom", "web_search"]


def test_the_model_is_told_the_custom_tools_input_and_grammar() -> None:
    chat, ignored, asked = responses_to_chat(codex_body("hi"))
    (fn,) = [t["function"] for t in chat["tools"] if t["function"]["name"] == "apply_patch"]
    assert fn["parameters"]["required"] == ["input"] and fn["parameters"]["properties"]["input"]["type"] == "string"
    assert "FREEFORM" in fn["description"] and GRAMMAR.strip() in fn["description"]
    assert asked.custom == {"apply_patch"} and "tools.custom" not in ignored and "tools.web_search" in ignored


def test_a_non_streamed_custom_call_reads_in_the_openai_client(loop: asyncio.AbstractEventLoop) -> None:
    body = codex_body("Create hello.txt. " + script(PATCH_CALL))
    del body["include"], body["reasoning"]
    got = run(loop, lambda c: c.responses.create(model=MODEL, **body))
    (call,) = got.output
    assert (call.type, call.name, call.input, call.status) == ("custom_tool_call", "apply_patch", PATCH, "completed")
    forced = run(loop, lambda c: c.responses.create(model=MODEL, **{**body, "tool_choice": {"type": "custom", "name": "apply_patch"}}))
    assert forced.output[0].type == "custom_tool_call" and forced.tool_choice.name == "apply_patch"
    # the client's stream accumulates the custom call's input from its delta events
    events, final = streamed(loop, **{**body, "input": "Create hello.txt. " + script(THOUGHT + PATCH_CALL)})
    assert final.output[-1].type == "custom_tool_call" and final.output[-1].input == PATCH


@pytest.mark.parametrize("shape", ["verbatim", "as_codex_sends"])
def test_a_turn_from_here_is_sendable_back_as_history(loop: asyncio.AbstractEventLoop, shape: str) -> None:
    """Codex keeps every ``response.output_item.done`` item and sends it back in the next
    request, with its tools' outputs: a custom call's as ``custom_tool_call_output``, a function
    call's as ``function_call_output`` (a string, or ``input_text`` parts). None of it is a 400,
    and the model reads the calls and their outputs as a chat's tool turn."""
    text = THOUGHT + "I will add the file, then read it.\n\n" + PATCH_CALL + "\n" + SHELL_CALL
    first = codex_body("Create hello.txt and show it. " + script(text), parallel_tool_calls=True)
    items = done_items(raw_stream(loop, **first))
    # (in the order they are done, which Codex keeps: the message is done at the end of the reply)
    assert [item["type"] for item in items] == ["reasoning", "custom_tool_call", "message", "function_call"]
    sent = items if shape == "verbatim" else [as_codex_sends(item) for item in items]
    patch, shell = items[1], items[3]
    asked = codex_body("Create hello.txt and show it. " + script("Done: hello.txt says hello."))["input"]  # (the script marker read is the first)
    history = asked + sent + [
        {"type": "custom_tool_call_output", "call_id": patch["call_id"], "output": "Success. Updated the following files:\nA hello.txt\n"},
        {"type": "function_call_output", "call_id": shell["call_id"], "output": [{"type": "input_text", "text": "Hello, world!"}]},
    ]  # fmt: skip
    again = raw_stream(loop, **{**first, "input": history})
    assert again[-1][0] == "response.completed"
    assert [item["content"][0]["text"] for item in done_items(again) if item["type"] == "message"] == ["Done: hello.txt says hello."]
    chat, _, _ = responses_to_chat({**first, "input": history})
    turn = chat["messages"][2]  # (after the system turn, the instructions and the developer message in one, and the user's)
    assert turn["role"] == "assistant" and turn["content"] == "I will add the file, then read it."
    assert turn["reasoning_content"] == "The user greets me."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn["tool_calls"]] == [
        ("apply_patch", {"input": PATCH}), ("shell", {"command": ["cat", "hello.txt"]})]  # fmt: skip
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in chat["messages"][3:5]] == [
        ("tool", patch["call_id"], "Success. Updated the following files:\nA hello.txt\n"), ("tool", shell["call_id"], "Hello, world!")]  # fmt: skip


def test_custom_tools_bad_shapes_are_400s_naming_them(loop: asyncio.AbstractEventLoop) -> None:
    cases = [
        ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}, "tools[0].format.syntax"),
        ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark"}}, "tools[0].format.definition"),
        ({**APPLY_PATCH, "format": {"type": "json"}}, "tools[0].format.type"),
        ({**APPLY_PATCH, "name": "bad name"}, "tools[0].name"),
    ]
    for tool, param in cases:
        body = {"model": MODEL, "input": "hi", "tools": [tool]}
        reply = loop.run_until_complete(request("POST", "/v1/responses", json.dumps(body).encode(), JSON))
        assert reply.status == 400 and json.loads(reply.body)["error"]["param"] == param, reply.body
    with pytest.raises(openai.BadRequestError) as caught:
        run(loop, lambda c: c.responses.create(model=MODEL, input=[{"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch"}]))
    assert caught.value.param == "input[0].input"


def test_what_codex_sends_and_is_not_honoured_is_named(loop: asyncio.AbstractEventLoop) -> None:
    """docs/api.md's list: Codex's encrypted-reasoning ``include``, ``reasoning.summary``,
    ``text.verbosity``, ``client_metadata`` and ``web_search`` are named, the turn served."""
    body = {"model": MODEL, **codex_body("Hi " + script("Hello.")), "text": {"verbosity": "low"}, "client_metadata": {"x-codex-installation-id": "i"}}
    reply = loop.run_until_complete(request("POST", "/v1/responses", json.dumps(body).encode(), JSON))
    assert reply.status == 200, reply.body
    named = set(reply.headers["x-superfluid-ignored-params"].split(", "))
    assert named == {"include", "reasoning.summary", "text.verbosity", "client_metadata", "tools.web_search"}


@given(text=st.text())
def test_a_custom_calls_input_is_the_string_the_model_gave(text: str) -> None:
    assert custom_input(json.dumps({"input": text})) == text
    assert custom_input(json.dumps({"patch": text})) == text  # (the one string, under another name)
    assert custom_input(json.dumps(text)) == text
    cut = json.dumps({"input": text})[:-2]  # a call cut short: its arguments as they are
    assert custom_input(cut) == cut


class TemplateVocab:
    """The web side's vocabulary of a model with one of tests/api/templates_s46's chat templates."""

    def __init__(self, template_file: str) -> None:
        self.source = (TEMPLATES / template_file).read_text()

    def template_parts(self) -> tuple[str, str, str]:
        return self.source, "<s>", "</s>"


def test_codexs_instructions_and_developer_message_are_one_system_turn() -> None:
    """Codex sends its instructions and then a developer message before the conversation: two
    system messages in a row, which Qwen 3.5's template refused ("System message must be at the
    beginning"), a 400 on every turn. They are one system message, the texts in order; a
    developer message later in the conversation stays where it was."""
    body = codex_body("Hi", model=MODEL)
    request, _ = parse_responses_request(json.dumps(body).encode(), models=[MODEL])
    prompt = render_chat(TemplateVocab("qwen3.5-4b.jinja"), request.to_wire()).text
    assert prompt.index("You are Codex") < prompt.index("<permissions>workspace-write") < prompt.index("<environment_context>")
    body["input"] += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
                      {"type": "message", "role": "developer", "content": "<permissions>read-only</permissions>"},
                      {"type": "message", "role": "user", "content": "Again"}]  # fmt: skip
    request, _ = parse_responses_request(json.dumps(body).encode(), models=[MODEL])
    assert request.messages is not None
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "system", "user"]
    assert request.messages[0]["content"] == "You are Codex, a coding agent.\n\n<permissions>workspace-write</permissions>"
    assert request.messages[3]["content"] == "<permissions>read-only</permissions>"


@pytest.mark.parametrize("template_file", ["gemma-2-2b-it.jinja", "mistral-small-3.2-24b-instruct-2506.jinja", "ministral-3-14b-reasoning-2512.jinja"])
def test_codexs_user_messages_in_a_row_are_one_user_turn(template_file: str) -> None:
    """Codex sends its environment context and then the user's prompt as two user messages (its
    AGENTS.md before them as a third): the templates whose turns must alternate (Gemma 2's,
    Mistral's) refused that, a 400 on every turn. They are one user turn, a line apart."""
    body = codex_body("Fix the bug.", model=MODEL)
    request, _ = parse_responses_request(json.dumps(body).encode(), models=[MODEL])
    assert request.messages is not None
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.messages[1]["content"] == "<environment_context>cwd=/w</environment_context>\nFix the bug."
    prompt = render_chat(TemplateVocab(template_file), request.to_wire()).text
    assert prompt.index("<permissions>workspace-write") < prompt.index("<environment_context>") < prompt.index("Fix the bug.")
