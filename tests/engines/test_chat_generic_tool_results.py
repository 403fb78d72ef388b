"""Tool results rendered in the generic format (a template that does not know tools) for a model
whose template insists that user and model turns alternate, as Gemma's, Llama 2's and early
Mistral's do (``raise_exception("Conversation roles must alternate ...")``).

Each tool result became a user turn of its own, so the results of two parallel calls were two
user turns in a row: the template raised and the agent's next turn was refused with a 400
("The chat template rejected the messages"), though the same history with one call went through.
Consecutive results are one user turn, each in its ``<tool_response>`` block, as Qwen's and
Hermes' own templates write them."""

from __future__ import annotations

import json
from typing import Any

from scheduler.engines.chat import compile_chat_template, generic_tool_messages, render_chat_template, template_inputs

# google/gemma-3-*-it's chat template (text parts), as the model ships it: no tools
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{ message['content'] | trim }}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

TOOLS = [{"name": "weather", "description": "", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def _call(call_id: str, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": city})}}


def _history(cities: list[str]) -> list[dict[str, Any]]:
    """An agent's next turn after the model called ``weather`` once per city, in parallel."""
    return [
        {"role": "user", "content": "Weather in " + " and ".join(cities) + "?"},
        {"role": "assistant", "content": "", "tool_calls": [_call(f"c{i}", c) for i, c in enumerate(cities)]},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": f"sunny in {c}"} for i, c in enumerate(cities)),
    ]


def _render(messages: list[dict[str, Any]], tools: Any = TOOLS) -> str:
    msgs, extra = template_inputs(messages, tools, GEMMA3, None, native_ok=True)
    return render_chat_template(compile_chat_template(GEMMA3), msgs, bos_token="<bos>", eos_token="<eos>", **extra)


def test_the_results_of_parallel_calls_render_under_a_template_whose_turns_must_alternate() -> None:
    text = _render(_history(["Paris", "Oslo"]))
    # every result reaches the model, in the order of the calls, in one user turn after the call
    assert text.index("sunny in Paris") < text.index("sunny in Oslo")
    assert text.count("<tool_response>") == 2
    after_call = text[text.index("</tool_call>") :]
    assert after_call.count("<start_of_turn>user") == 1
    assert text.endswith("<start_of_turn>model\n")


def test_without_tools_offered_the_history_of_parallel_calls_still_renders() -> None:
    """The follow-up turn with no ``tools`` (or ``tool_choice`` none) still renders its history."""
    text = _render(_history(["Paris", "Oslo", "Rome"]), tools=None)
    assert all(f"sunny in {c}" in text for c in ("Paris", "Oslo", "Rome"))


def test_one_result_and_results_apart_are_each_their_own_turn() -> None:
    messages = [
        *_history(["Paris"]),
        {"role": "assistant", "content": "", "tool_calls": [_call("c9", "Oslo")]},
        {"role": "tool", "tool_call_id": "c9", "content": "sunny in Oslo"},
    ]
    out = generic_tool_messages(messages, None)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user"]
    assert out[2]["content"] == "<tool_response>\nsunny in Paris\n</tool_response>"
    assert "sunny in Oslo" in _render(messages)


def test_a_user_turn_right_after_the_results_renders_under_a_template_whose_turns_must_alternate() -> None:
    """The client writes more after the results before the model answers them (an agent that
    adds a reminder, a person who interjects): OpenAI takes ``tool`` then ``user``, but the
    results' user turn and the client's were two user turns in a row, and Gemma 3's template
    refused the request with a 400."""
    messages = [*_history(["Paris", "Oslo"]), {"role": "user", "content": "Thanks. And tomorrow?"}]
    text = _render(messages)
    # the results, then the client's text, in the one user turn after the call
    after_call = text[text.index("</tool_call>") :]
    assert after_call.count("<start_of_turn>user") == 1
    assert after_call.index("sunny in Oslo") < after_call.index("Thanks. And tomorrow?")
    assert text[text.index("Thanks. And tomorrow?") :].count("<start_of_turn>") == 1  # then the model's turn
    out = generic_tool_messages(messages, None)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
