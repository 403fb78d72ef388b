"""Chat templates rendered as Hugging Face renders them (the templates are written for that)."""

from __future__ import annotations

import json

from scheduler.engines.chat import compile_chat_template, render_chat_template, template_inputs

# the tool parts of a Qwen2.5-style template, which knows tools and writes them with tojson
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>\n'
    "{% endfor %}{% else %}{{ message.role }}: {{ message.content }}\n{% endif %}"
    "{% endfor %}"
)


def test_tools_and_call_arguments_reach_a_tools_template_as_json_in_their_own_order_unescaped() -> None:
    """Jinja's own ``tojson`` is for HTML: it sorted keys and wrote ``'``, ``<``, ``>``, ``&``
    and non-ASCII as ``\\u`` escapes, so the model saw its tools and earlier calls unlike the
    JSON it was trained on (and unlike what the reply's grammar asks it to write)."""
    tool = {"name": "weather", "description": "Today's <b>forecast</b> & wind in °C", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
    arguments = {"city": "Zürich", "days": 2}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    msgs, extra = template_inputs(messages, [tool], TOOLS_TEMPLATE, None, native_ok=True)
    text = render_chat_template(compile_chat_template(TOOLS_TEMPLATE), msgs, bos_token="", eos_token="", **extra)
    assert json.dumps({"type": "function", "function": tool}, ensure_ascii=False) in text
    assert '"arguments": {"city": "Zürich", "days": 2}}</tool_call>' in text


def test_tojson_takes_the_arguments_hugging_face_templates_pass() -> None:
    template = compile_chat_template("{{ messages[0].content | tojson(indent=2) }}|{{ messages[0].content | tojson(separators=(',', ':')) }}")
    rendered = render_chat_template(template, [{"role": "user", "content": {"b": 1, "a": [1, 2]}}], bos_token="", eos_token="")
    assert rendered == '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}|{"b":1,"a":[1,2]}'


def test_a_template_that_breaks_out_of_a_loop_compiles() -> None:
    """Hugging Face loads templates with Jinja's loop controls; without them ``{% break %}`` was
    a syntax error, and every chat request to such a model was refused."""
    template = compile_chat_template("{% for m in messages %}{% if m.role == 'stop' %}{% break %}{% endif %}{{ m.content }}{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "stop", "content": ""}, {"role": "user", "content": "b"}]
    assert render_chat_template(template, messages, bos_token="", eos_token="") == "a"
