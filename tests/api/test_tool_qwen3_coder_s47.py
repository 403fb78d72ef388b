"""Tool calls in Qwen3-Coder's own format (also Qwen3.5's), which its templates
(templates_s46/qwen3-coder.jinja and qwen3.5-4b.jinja, llama.cpp's upstream copies) teach: a
``<function=name>`` block of ``<parameter=key>`` blocks inside ``<tool_call>`` (api/xml_tool_calls.py).

Before, a template holding ``<tool_call>`` was taken for Hermes' JSON format: such a model's calls
reached the client as content with finish_reason ``stop`` (a coding agent on it made no call).
The format is told from the template as llama.cpp's common/chat.cpp tells it, the values are
typed by the tool's schema as llama.cpp's common/parsers/qwen3-coder.cpp types them, streamed or
not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.responses import Reply, parse_tool_calls
from api.xml_tool_calls import value_json
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.chat import compile_chat_template, native_tool_messages, render_chat_template, tool_call_format
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Delta, Done
from scheduler.worker.loop import EngineWorker
from tests.api.streamed import stream_reply

from .test_tool_parse_linear_s46 import _Counted

TEMPLATES = Path(__file__).parent / "templates_s46"
QWEN3_CODER = (TEMPLATES / "qwen3-coder.jinja").read_text()
QWEN35 = (TEMPLATES / "qwen3.5-4b.jinja").read_text()
PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "where": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
        "anything": {},
    },
}
TOOLS = [
    {"name": "get_weather", "description": "The weather.", "parameters": PARAMS},
    {"name": "write_file", "description": "Write a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}},
]
NAMES = {t["name"]: t["parameters"] for t in TOOLS}


def call_text(name: str, **params: str) -> str:
    """A call as Qwen3-Coder writes it (the template's own rendering of an earlier call)."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_the_format_is_told_from_the_real_templates() -> None:
    assert tool_call_format(QWEN3_CODER) == "qwen3_coder"
    assert tool_call_format(QWEN35) == "qwen3_coder"
    # Qwen 2.5's <tool_call> holds JSON: still Hermes'; Llama 3.x's check is unchanged
    assert tool_call_format((TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()) == "hermes"
    assert tool_call_format((TEMPLATES / "llama-3.1-instruct.jinja").read_text()) == "llama3"
    # a template writing <tool_call><function= with no newline is another model's (llama.cpp's rule)
    other = QWEN3_CODER.replace("'\\n<tool_call>\\n<function=' + tool_call.name + '>\\n'", "'<tool_call><function=' ~ tool_call.name ~ '>'")
    assert other != QWEN3_CODER and tool_call_format(other) == "hermes"
    assert tool_call_format(QWEN3_CODER, native=False) == "hermes"  # the generic prompt teaches JSON


def _body(text: str, reason: str = "stop", fmt: str = "qwen3_coder", **kwargs: Any) -> dict[str, Any]:
    reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt, **kwargs)
    reply.add(Delta("j", text))
    return reply.body(Done("j", reason), None)["choices"][0]


def _streamed(pieces: list[str], reason: str = "stop", fmt: str = "qwen3_coder", **kwargs: Any) -> dict[str, Any]:
    """The stream's chunks put together as the openai client's helper does."""
    got = stream_reply(pieces, TOOLS, fmt=fmt, reason=reason, **kwargs)
    return {"content": got.content or None, "calls": got.pairs, "finish_reason": got.finish_reason}


def _calls(choice: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]


PARIS = call_text("get_weather", city="Paris")
# a call in the generic JSON format, which a forced call's grammar writes for any model
JSON_FORCED = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [("get_weather", '{"city": "Paris"}')])
CASES = [
    (PARIS, None, [("get_weather", '{"city": "Paris"}')]),
    # content before, two calls (the model's "optional reasoning ... BEFORE the function call")
    ("Let me check both.\n\n" + PARIS + "\n" + call_text("get_weather", city="Rome", days="3"),
     "Let me check both.", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome", "days": 3}')]),
    # values typed by the schema: a number for a string stays text, JSON for the others
    (call_text("get_weather", city="12", days="4", metric="true", where='{"lat": 48.8, "lon": 2.3}', tags='["a", "b"]', note="null", anything="5"),
     None, [("get_weather", '{"city": "12", "days": 4, "metric": true, "where": {"lat": 48.8, "lon": 2.3}, "tags": ["a", "b"], "note": null, "anything": 5}')]),
    # a string value of many lines, with tags and JSON-like text in it, is kept exactly
    (call_text("write_file", path="a.py", content='def f():\n    return "<function=x>" + \'{"a": 1}\'\n'),
     None, [("write_file", json.dumps({"path": "a.py", "content": 'def f():\n    return "<function=x>" + \'{"a": 1}\'\n'}))]),
    # Qwen3-Coder sometimes leaves out <tool_call> (llama.cpp reads <function=name> so too)
    ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", None, [("get_weather", '{"city": "Paris"}')]),
    # no parameters
    ("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", None, [("get_weather", "{}")]),
    # a function not offered, a block that does not close, prose naming the tags: text
    (call_text("search", q="x"), call_text("search", q="x"), []),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", []),
    ("Write <tool_call> then <function=name>.", "Write <tool_call> then <function=name>.", []),
    ("It is sunny in Paris.", "It is sunny in Paris.", []),
    JSON_FORCED,  # a forced call's grammar writes the generic JSON format: read for this model too
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), CASES)
def test_calls_in_qwen3_coders_format_are_tool_calls(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    check_reply(text, content, calls, "qwen3_coder")


def check_reply(text: str, content: str | None, calls: list[tuple[str, str]], fmt: str) -> None:
    """The reply of a model that writes ``text`` in its format ``fmt`` has ``content`` and
    ``calls``, unstreamed and streamed in pieces of any size."""
    choice = _body(text, fmt=fmt)
    assert (choice["message"]["content"], _calls(choice)) == (content, calls)
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop")
    for call in choice["message"].get("tool_calls") or []:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    expected = {"content": choice["message"]["content"], "calls": _calls(choice), "finish_reason": choice["finish_reason"]}
    for size in (1, 2, 5, 11, len(text)):
        assert _streamed([text[i : i + size] for i in range(0, len(text), size)], fmt=fmt) == expected, size


def test_values_are_typed_as_llama_cpp_types_them() -> None:
    assert value_json("Paris", {"type": "string"}) == '"Paris"'
    assert value_json("42", {"type": "string"}) == '"42"'
    assert value_json(" 42 ", {"type": "integer"}) == "42"
    assert value_json("True", {"type": "boolean"}) == "true"  # a Pythonic constant
    assert value_json("not a number", {"type": "number"}) == '"not a number"'  # no JSON of its kind: text
    assert value_json('"quoted"', {"type": ["string", "null"]}) == '"\\"quoted\\""'
    assert value_json("null", {"anyOf": [{"type": "string"}, {"type": "null"}]}) == "null"
    assert value_json("2", {"enum": [1, 2, 3]}) == "2"
    assert value_json("NaN", {"type": "number"}) == '"NaN"'  # not JSON: arguments must parse


def test_text_before_a_call_streams_as_it_comes_and_the_call_is_held() -> None:
    reply = Reply("chat", "m", tools=TOOLS, tool_format="qwen3_coder")
    first = reply.delta_chunks(Delta("j", "Let me look.\n\n<tool_"))
    assert [f["choices"][0]["delta"].get("content") for f in first] == ["", "Let me look."]
    held = reply.delta_chunks(Delta("j", "call>\n<function=get_weather>\n<parameter=city>\nPar"))
    assert all("content" not in f["choices"][0]["delta"] or f["choices"][0]["delta"]["content"] is None for f in held)
    # text that only looks like a start a moment goes out once it is none
    reply = Reply("chat", "m", tools=TOOLS, tool_format="qwen3_coder")
    reply.delta_chunks(Delta("j", "Use <function="))
    later = reply.delta_chunks(Delta("j", "name> here"))
    assert "".join(f["choices"][0]["delta"].get("content") or "" for f in later) == " <function=name> here"


def test_parallel_tool_calls_false_keeps_one_call() -> None:
    text = PARIS + "\n" + call_text("get_weather", city="Rome")
    choice = _body(text, parallel_tool_calls=False)
    assert _calls(choice) == [("get_weather", '{"city": "Paris"}')] and choice["finish_reason"] == "tool_calls"
    assert _streamed([text], parallel_tool_calls=False)["calls"] == [("get_weather", '{"city": "Paris"}')]


def test_a_forced_call_streams_as_the_json_format_does() -> None:
    """``required``/a named function whose parameters Qwen3-Coder's format cannot hold to their
    schema: the grammar writes the generic JSON format; its arguments stream as they come."""
    reply = Reply("chat", "m", tools=TOOLS, tool_choice="required", tool_format="qwen3_coder")
    frames = reply.delta_chunks(Delta("j", '<tool_call>\n{"name": "get_weather", "arguments": {"city"'))
    deltas = [c for f in frames for c in f["choices"][0]["delta"].get("tool_calls") or []]
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[-1]["function"]["arguments"] == '{"city"'


def rendered_history(template: str) -> tuple[list[dict[str, Any]], str]:
    """(the calls, the text) of an agent's next turn rendered by ``template``: two earlier calls
    (``arguments`` JSON strings, which the template reads as mappings) and their results."""
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3, "where": {"lat": 1}}'}},
        {"id": "call_2", "type": "function", "function": {"name": "write_file", "arguments": json.dumps({"path": "a.txt", "content": "two\nlines"})}},
    ]
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "Doing it.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "written"},
    ]
    text = render_chat_template(
        compile_chat_template(template), native_tool_messages(messages), bos_token="", eos_token="",
        tools=[{"type": "function", "function": t} for t in TOOLS], add_generation_prompt=True,
    )  # fmt: skip
    return calls, text


@pytest.mark.parametrize("template", [QWEN3_CODER, QWEN35], ids=["qwen3-coder", "qwen3.5"])
def test_history_renders_with_the_real_template_and_reads_back_as_the_same_calls(template: str) -> None:
    """An agent's next turn: its earlier calls (``arguments`` a JSON string, which the template
    reads as a mapping) and their results, rendered by the model's template; the calls as the
    template writes them read back as the calls sent."""
    calls, text = rendered_history(template)
    assert "<parameter=days>\n3\n</parameter>" in text and '<parameter=where>\n{"lat": 1}\n</parameter>' in text
    assert "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwritten\n</tool_response>" in text
    turn = text[text.index("<|im_start|>assistant") :].split("<|im_end|>")[0]
    turn = turn.split("</think>")[-1]
    content, found = parse_tool_calls(turn.removeprefix("<|im_start|>assistant"), NAMES, fmt="qwen3_coder")
    assert content == "Doing it."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]


def test_the_worker_says_qwen3_coder_in_its_hello() -> None:
    engine = SimEngine(n_lanes=1, lane_ctx=512)
    engine.features = frozenset({"template_vars"})
    engine.chat_template = QWEN3_CODER
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="m", prepare_in_thread=False)
    assert worker.hello().tool_format == "qwen3_coder"


# -- any split of a reply streams to what the whole reply is ------------------------------

_VALUES = st.lists(
    st.sampled_from(["Paris", "12", "true", "null", '{"a": [1, 2]}', "[1]", "<", ">", "</", "</param", "<function=get_weather>",
                     "<tool_call>", "\n", " ", "x\ny", "é", '"q"', "</function>"]),
    max_size=4,
).map("".join)  # fmt: skip
_PARAM_NAMES = st.sampled_from(["city", "days", "metric", "where", "tags", "note", "anything", "path", "content", "other"])


@st.composite
def _call(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["get_weather", "write_file", "search"]))
    params = draw(st.lists(st.tuples(_PARAM_NAMES, _VALUES), max_size=3))
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    head = "" if draw(st.integers(0, 5)) == 0 else "<tool_call>\n"
    tail = "</tool_call>" if head else ""
    return f"{head}<function={name}>\n{body}</function>\n{tail}"


_TEXT = st.lists(st.sampled_from(["Sure.", " ", "\n", "<", "<tool", "<function", "=", ">", "tool_call", "x", "{", '"name"', "é"]), max_size=5).map("".join)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(_TEXT, _call()), max_size=5), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_split_of_a_reply_streams_the_same_calls_and_content_as_the_whole(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    points = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    choice = _body(text)
    got = _streamed(pieces)
    if got["calls"] and got["content"]:
        # (text before a call streams before it is known that a call follows: its leading
        # whitespace went out, which the unstreamed reply, whose content is stripped, has not)
        got["content"] = got["content"].lstrip() or None
    assert got == {"content": choice["message"]["content"] or None, "calls": _calls(choice), "finish_reason": choice["finish_reason"]}
    for _name, arguments in _calls(choice):
        assert isinstance(json.loads(arguments), dict)


# -- work in proportion to the reply's length ----------------------------------------------


def test_a_reply_of_many_or_long_calls_is_parsed_in_linear_work() -> None:
    for text in (PARIS * 20_000, call_text("write_file", path="a", content="x" * 200_000) * 50, "<tool_call>\n<function=get_weather>\n" * 20_000):
        _Counted.copied = 0
        _content, calls = parse_tool_calls(_Counted(text), NAMES, fmt="qwen3_coder")
        assert _Counted.copied <= 4 * len(text), (text[:40], _Counted.copied, len(text))
    assert len(parse_tool_calls(PARIS * 100, NAMES, fmt="qwen3_coder")[1]) == 64  # (the most read, as Mistral's)


class _Piece(str):
    """A delta's text that counts the characters of held text it is appended to."""

    copied = 0

    def __radd__(self, other: str) -> str:
        _Piece.copied += len(other)
        return str(other) + str(self)


@pytest.mark.parametrize(
    "opening",
    ["<tool_call>\n<function=get_weather>\n<parameter=city>\n", "<function=get_weather>", "<tool_call>\n<function=get_wea", "<tool_call>\n", "Use <function="],
)
def test_a_long_held_reply_is_streamed_in_linear_work(opening: str) -> None:
    """A call opened and never closed (or an opening that is none) and 5,000 deltas after it: the
    held text is not rebuilt or rescanned on every delta, and nothing is lost."""
    _Piece.copied = 0
    reply = Reply("chat", "m", tools=TOOLS, tool_format="qwen3_coder")
    frames = reply.delta_chunks(Delta("j", opening))
    for _ in range(5_000):
        frames += reply.delta_chunks(Delta("j", _Piece("abcdefgh")))
    frames += reply.final_chunks(Done("j", "length"), None)
    assert _Piece.copied <= 5_000 * 2 * 1024, (opening, _Piece.copied)
    content = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
    assert content == opening + "abcdefgh" * 5_000
    assert not any(f["choices"][0]["delta"].get("tool_calls") for f in frames)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_reply_in_the_models_format_closed_at_max_tokens_is_whole(stream: bool) -> None:
    """The grammar (tests/engines/test_tool_grammar_qwen3_coder_s47.py) allows one call for a
    named function and nothing after it: closed by the max_tokens-th token it is whole."""
    text = call_text("get_weather", city="Paris")
    choice = {"type": "function", "function": {"name": "get_weather"}}
    if stream:
        got = _streamed([text[i : i + 4] for i in range(0, len(text), 4)], "length", tool_choice=choice)
    else:
        body = _body(text, "length", tool_choice=choice)
        got = {"content": body["message"]["content"], "calls": _calls(body), "finish_reason": body["finish_reason"]}
    assert got == {"content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}


def test_an_earlier_call_with_empty_arguments_renders_as_a_call_of_none() -> None:
    """A call of no parameters sent back with ``arguments`` "" (some clients send that for one):
    the template reads the arguments as a mapping, and the request was a 400 ("Can only get item
    pairs from a mapping"). Empty arguments are the empty object."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    messages = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    text = render_chat_template(compile_chat_template(QWEN3_CODER), native_tool_messages(messages), bos_token="", eos_token="", tools=[])
    assert "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>" in text
