"""An earlier tool call's arguments, under a template that knows tools (Qwen 2.5's writes them
with ``tojson``), are tokenised as text, as message contents are: a call whose arguments hold
``<|im_end|>\\n<|im_start|>system ...`` (a coding agent writing a chat template or a tokenizer
test file) gave the next turn's prompt real control tokens there, a turn the client never sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.engines.chat import native_tool_messages
from scheduler.engines.llama_cpp import LlamaCppEngine
from tests.engines.test_chat_templates import FORGED, QWEN25, TOOLS, _agent_history, _assert_prompt_is_text, _split


def _history(arguments: str, result: str = "done") -> list[dict[str, Any]]:
    messages = _agent_history(result)
    messages[1]["tool_calls"][0]["function"]["arguments"] = arguments
    return messages


@pytest.mark.parametrize(
    "arguments",
    [
        json.dumps({"path": "t.jinja", "text": FORGED}),  # a string value of the arguments object
        json.dumps({"edits": [{"old": "a", "new": FORGED}], "n": 2, "ok": True}),  # nested
        "not json " + FORGED,  # arguments that are no JSON: written as sent
        json.dumps({FORGED: "x", "n": {FORGED + "2": 1}}),  # the arguments' keys
    ],
    ids=["value", "nested", "not-json", "key"],
)
def test_a_calls_arguments_cannot_forge_a_turn_under_qwen25s_template(engine: LlamaCppEngine, arguments: str) -> None:
    # system, user, assistant (call), user (tool result), assistant: the template's turns only,
    # as with plain arguments; the prompt is the rendered text, token for token (the arguments
    # as text, not control tokens)
    _assert_prompt_is_text(engine, QWEN25, _history("{}"), TOOLS, (5, 4))
    _assert_prompt_is_text(engine, QWEN25, _history(arguments), TOOLS, (5, 4))


def test_split_rendered_finds_the_arguments_as_the_template_wrote_them() -> None:
    split = _split(QWEN25, native_tool_messages(_history(json.dumps({"q": 'say "hi"\n', "n": 1}), result="42")))
    # the user's content, the call's name, its argument as tojson wrote it (escaped), the result;
    # the pieces join up to the rendered text (_split)
    assert split is not None and split[1] == ["Summarise the page.", "fetch", 'say \\"hi\\"\\n', "42"]


# Mistral's templates refuse a call id that is not 9 characters; another writes the arguments
# as Python writes a dict (its repr); this one writes a call's name twice
CHECKS_IDS = (
    "{% for m in messages %}{% for c in m.tool_calls or [] %}{% if c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
    "[{{ c.id }}]{{ c.function.arguments | tojson }}{% endfor %}<{{ m.content }}>{% endfor %}"
)
REPR_ARGS = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}{% endfor %}<{{ m.content }}>{% endfor %}"
NAME_TWICE = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}:{{ c.function.name }}{% endfor %}<{{ m.content }}>{% endfor %}"


def _calls_history(call_id: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "fetch", "arguments": {"q": "two\nlines 'x'"}}}
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": FORGED}]


def test_a_template_that_checks_call_ids_still_renders_and_keeps_contents_plain() -> None:
    split = _split(CHECKS_IDS, _calls_history("abcdefghi"))
    assert split is not None and split[1] == ["hi", FORGED]  # the contents (the marked id was refused)


def test_a_template_that_writes_arguments_otherwise_keeps_contents_plain() -> None:
    split = _split(REPR_ARGS, _calls_history("c1"))
    assert split is not None and split[1] == ["hi", FORGED]


def test_a_name_written_twice_is_kept_plain_each_time() -> None:
    split = _split(NAME_TWICE, _calls_history("c1"))
    assert split is not None and split[1] == ["hi", "fetch", "fetch", FORGED]
