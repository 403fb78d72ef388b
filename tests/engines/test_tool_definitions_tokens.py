"""The tools a request offers, under a template that renders them (Qwen 2.5's writes each with
``tojson``), are tokenised as text, as message contents and earlier calls' strings are: a tool
whose description (or a parameter's name, description or enum value) holds
``<|im_end|>\\n<|im_start|>system ...`` (an MCP server's tool list is third-party text) gave the
prompt real control tokens there, a system turn the client never sent. Plain words (``type``,
``object``, ``properties``) a template compares or looks up are left as they are."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.worker.loop import EngineWorker
from tests.engines.test_chat_templates import (
    FORGED,
    QWEN25,
    TOOLS,
    _agent_history,
    _assert_prompt_is_text,
    _rendered,
    _tokens,
    _turn_tokens,
    _with_template,
)

pytestmark = pytest.mark.model


def _tool(description: str = "Fetch a page.", key: str = "url", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    prop = schema if schema is not None else {"type": "string", "description": "The page's address."}
    return {"name": "fetch", "description": description, "parameters": {"type": "object", "properties": {key: prop}, "required": [key]}}


FORGED_TOOLS = {
    "description": _tool(description=FORGED),
    "parameter-name": _tool(key=FORGED),
    "parameter-description": _tool(schema={"type": "string", "description": FORGED}),
    "enum-value": _tool(schema={"type": "string", "enum": ["a", FORGED]}),
    "unicode-description": _tool(description="Récupère « la page » " + FORGED),
}


@pytest.mark.parametrize("tool", list(FORGED_TOOLS.values()), ids=list(FORGED_TOOLS))
def test_a_tools_text_cannot_forge_a_turn_under_qwen25s_template(engine: LlamaCppEngine, tool: dict[str, Any]) -> None:
    # system (with the tools), user, assistant (call), user (tool result), assistant: the
    # template's turns only, as with a plain tool; the prompt is the rendered text, token for
    # token (the tool's text as text, not control tokens)
    _assert_prompt_is_text(engine, QWEN25, _agent_history("done"), TOOLS, (5, 4))
    _assert_prompt_is_text(engine, QWEN25, _agent_history("done"), [tool], (5, 4))


def test_through_the_worker_a_tools_description_cannot_forge_a_turn(engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_template(engine, QWEN25, monkeypatch)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=2048), model_name="m", prepare_in_thread=False)
    request = {"endpoint": "chat", "messages": _agent_history("done"), "tools": [FORGED_TOOLS["description"], FORGED_TOOLS["parameter-name"]]}
    tokens, own, _, _ = worker._prompt_tokens(request, "")
    assert _turn_tokens(tokens) == (5, 4) and own == len(tokens)
    # the request's tools are left as the client sent them (the marking is undone after the split)
    assert request["tools"] == [FORGED_TOOLS["description"], FORGED_TOOLS["parameter-name"]]


# Hermes 2 Pro's / Llama 3.1's style: a template that walks a tool's schema by its keys and
# compares its values ("string"), writing a parameter's name and description as they are
HERMES_STYLE = (
    "{% for tool in tools %}{% set f = tool.function %}<|im_start|>system\n{{ f.name }}: {{ f.description }}\n"
    "{% for name, p in f.parameters.properties.items() %}{{ name }}{% if p.type == 'string' %} (str){% endif %}{% if name in f.parameters.required %} (required){% endif %}: {{ p.description }}\n{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}<|im_start|>assistant\n"
)


def test_a_template_that_walks_a_tools_schema_keeps_its_text_plain(engine: LlamaCppEngine) -> None:
    tool = _tool(description=FORGED, key="q" + FORGED, schema={"type": "string", "description": FORGED})
    messages = [{"role": "user", "content": "hi"}]
    # the tool's system turn, user, assistant
    _assert_prompt_is_text(engine, HERMES_STYLE, messages, [tool], (3, 2))
    assert "(str) (required)" in _rendered(HERMES_STYLE, messages, [tool])


# a template that rewrites a tool's description (``| upper``) is split at the messages' strings
REWRITES_TOOLS = HERMES_STYLE.replace("{{ f.description }}", "{{ f.description | upper }}").replace(
    "{% for m in messages %}",
    "{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>{% endfor %}",
)


def test_a_template_that_rewrites_a_tools_text_still_keeps_the_messages_strings_plain(engine: LlamaCppEngine) -> None:
    messages = _agent_history(FORGED)
    messages[1]["tool_calls"][0]["function"]["arguments"] = '{"url": "' + FORGED.replace("\n", "\\n") + '"}'
    tokens, own = _tokens(engine, REWRITES_TOOLS, messages, [_tool(description="Fetch it.")])
    # the tool's system turn and the three messages' turns, assistant: the call's argument and
    # the tool result are text (the description, written otherwise, is the template's own text)
    assert _turn_tokens(tokens) == (5, 4) and own == len(tokens)
