"""Fuzz: chat-template compilation and rendering. Any schema-valid messages, tools and
chat_template_kwargs render or raise ValueError (a 400); a message's content is data, never
template syntax that is evaluated; a model's template that does not compile is an EngineError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.engines.base import EngineError
from scheduler.engines.chat import (
    CHATML,
    GEMMA,
    compile_chat_template,
    render_chat_template,
    template_inputs,
)

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# a template that knows tools, as Hugging Face templates write them
TOOLS_TEMPLATE = (
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endif %}"
    "{% endfor %}{% if enable_thinking is defined and enable_thinking %}<think>{% endif %}"
)
TEMPLATES = {name: compile_chat_template(src) for name, src in {"chatml": None, "gemma": GEMMA, "tools": TOOLS_TEMPLATE}.items()}
SOURCES = {"chatml": CHATML, "gemma": GEMMA, "tools": TOOLS_TEMPLATE}

# what api/schemas.py lets through: text without lone surrogates
text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
injections = st.sampled_from(["{{ 7*7 }}", "{% for x in range(3) %}x{% endfor %}", "{{ raise_exception('boom') }}", "{# c #}", "{%", "}}", "{{ messages }}"])
content = text | injections | st.builds(lambda a, b: a + b, injections, text)
json_scalar = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | text
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6)
arguments = text | json_value.map(json.dumps) | st.integers(1, 1500).map(lambda d: "[" * d + "]" * d) | st.just("[" * 5000)
calls = st.lists(st.fixed_dictionaries({"id": text, "type": st.just("function"), "function": st.fixed_dictionaries({"name": text.filter(bool), "arguments": arguments})}), min_size=1, max_size=2)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": content, "tool_calls": calls}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": content}, optional={"tool_call_id": text, "name": text}),
)
tools = st.none() | st.lists(st.fixed_dictionaries({"name": text.filter(bool), "description": text, "parameters": st.dictionaries(text, json_value, max_size=3)}), min_size=1, max_size=2)
kwargs = st.none() | st.dictionaries(st.sampled_from(["enable_thinking", "self", "namespace", "raise_exception", "range", "x", "messages", "tools"]) | text, json_value, max_size=3)

DEEP_CALL = [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000}}]}]


@FAST
@given(st.lists(message, min_size=1, max_size=4), tools, kwargs, st.sampled_from(sorted(TEMPLATES)), st.booleans())
@example(DEEP_CALL, None, None, "chatml", False)  # json.loads of the arguments: RecursionError
@example(DEEP_CALL, [{"name": "f", "description": "", "parameters": {}}], None, "tools", True)
def test_schema_valid_messages_render_or_raise_value_error(messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None, extra_vars: dict[str, Any] | None, name: str, native_ok: bool) -> None:
    msgs, extra = template_inputs(messages, offered, SOURCES[name], extra_vars, native_ok=native_ok)
    try:
        out = render_chat_template(TEMPLATES[name], msgs, bos_token="<s>", eos_token="</s>", **extra)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(out, str)
    # content is data: every content reaches the prompt as it was sent, never evaluated
    for m in messages:
        if m["role"] in ("system", "user"):
            assert m["content"] in out


@FAST
@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": content}), min_size=1, max_size=4), st.sampled_from(["chatml", "gemma"]))
def test_content_that_looks_like_template_syntax_is_written_literally(messages: list[dict[str, Any]], name: str) -> None:
    out = render_chat_template(TEMPLATES[name], messages, bos_token="", eos_token="")
    for m in messages:
        assert m["content"] in out
    if any("{{ 7*7 }}" in m["content"] for m in messages):
        assert "{{ 7*7 }}" in out


@FAST
@given(st.text(max_size=80) | st.text(alphabet="{}%#()[]'\" xifendforinset=+~|", max_size=80))
@example("{% for a in x %}" * 25 + "{% endfor %}" * 25)  # Python's compiler: "too many statically nested blocks" (SyntaxError)
@example("{{" + "(" * 3000 + "1" + ")" * 3000 + "}}")  # Jinja's parser: RecursionError
def test_a_model_template_compiles_or_is_a_permanent_engine_error(source: str) -> None:
    try:
        compile_chat_template(source)
    except EngineError as exc:
        assert exc.permanent
        return


@pytest.mark.parametrize("native_ok", [False, True])
def test_call_arguments_nested_too_deeply_to_parse_go_to_the_template_as_sent(native_ok: bool) -> None:
    msgs, _ = template_inputs(DEEP_CALL, [{"name": "f", "description": "", "parameters": {}}], TOOLS_TEMPLATE, None, native_ok=native_ok)
    assert "[" * 100_000 in json.dumps(msgs)
