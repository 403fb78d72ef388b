"""Tool calls in GLM 4.5/4.6/4.7's own format: the template (templates_s46/glm-4.6.jinja and
glm-4.7-flash.jinja, llama.cpp's upstream copies) teaches

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM 4.7 writes it without the newlines). Before, the template's ``<tool_call>`` had it taken for
Hermes' JSON format: the calls reached the client as content with finish_reason ``stop``. Values
are typed by the tool's schema as Qwen3-Coder's are (api.xml_tool_calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.responses import parse_tool_calls
from scheduler.engines.chat import tool_call_format

from .test_tool_parse_linear_s46 import _Counted
from .test_tool_qwen3_coder_s47 import JSON_FORCED, NAMES, _body, _calls, _streamed, check_reply, rendered_history

TEMPLATES = Path(__file__).parent / "templates_s46"
GLM46 = (TEMPLATES / "glm-4.6.jinja").read_text()
GLM47 = (TEMPLATES / "glm-4.7-flash.jinja").read_text()


def glm_call(name: str, sep: str = "\n", **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in params.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def test_the_format_is_told_from_the_real_templates() -> None:
    assert tool_call_format(GLM46) == "glm45"
    assert tool_call_format(GLM47) == "glm45"
    assert tool_call_format(GLM46, native=False) == "hermes"


PARIS = glm_call("get_weather", city="Paris")
CASES = [
    (PARIS, None, [("get_weather", '{"city": "Paris"}')]),
    ("<think>Weather, then.</think>\nLet me check.\n" + PARIS + "\n" + glm_call("get_weather", "", city="Rome", days="3"),
     "<think>Weather, then.</think>\nLet me check.", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome", "days": 3}')]),
    (glm_call("get_weather", city="12", days="4", metric="true", where='{"lat": 48.8}', tags='["a"]', note="null"),
     None, [("get_weather", '{"city": "12", "days": 4, "metric": true, "where": {"lat": 48.8}, "tags": ["a"], "note": null}')]),
    # a string value is kept exactly, its spaces and newlines and tags in it included
    (glm_call("write_file", path="a.py", content="\n  x = '<tool_call>'\n"), None, [("write_file", json.dumps({"path": "a.py", "content": "\n  x = '<tool_call>'\n"}))]),
    ("<tool_call>get_weather</tool_call>", None, [("get_weather", "{}")]),
    # a function not offered, a call that never closes, prose: text
    (glm_call("search", q="x"), glm_call("search", q="x"), []),
    ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris", []),
    ("Write <tool_call> then a name.", "Write <tool_call> then a name.", []),
    JSON_FORCED,  # a forced call's grammar writes the generic JSON format: read for this model too
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), CASES)
def test_calls_in_glms_format_are_tool_calls(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    check_reply(text, content, calls, "glm45")


@pytest.mark.parametrize("template", [GLM46, GLM47], ids=["glm-4.6", "glm-4.7-flash"])
def test_history_renders_with_the_real_template_and_reads_back_as_the_same_calls(template: str) -> None:
    calls, text = rendered_history(template)
    assert "<tool_response>sunny" in text.replace("\n", "") and "<tool_response>written" in text.replace("\n", "")
    turn = text[text.index("<|assistant|>") :].split("<|observation|>")[0].removeprefix("<|assistant|>")
    content, found = parse_tool_calls(turn, NAMES, fmt="glm45")
    assert content is not None and content.endswith("Doing it.")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]


def test_a_reply_of_many_or_long_calls_is_parsed_in_linear_work() -> None:
    for text in (PARIS * 20_000, glm_call("write_file", path="a", content="x" * 200_000) * 50, "<tool_call>get_weather\n<arg_key>city</arg_key>" * 20_000):
        _Counted.copied = 0
        parse_tool_calls(_Counted(text), NAMES, fmt="glm45")
        assert _Counted.copied <= 4 * len(text), (text[:40], _Counted.copied, len(text))


_VALUES = st.lists(st.sampled_from(["Paris", "12", "true", "null", '{"a": 1}', "<", ">", "</", "</arg_value", "<arg_key>", "<tool_call>", "\n", " ", "é"]), max_size=4).map("".join)


@st.composite
def _call(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["get_weather", "write_file", "search"]))
    params = draw(st.lists(st.tuples(st.sampled_from(["city", "days", "where", "content", "other"]), _VALUES), max_size=3))
    return glm_call(name, draw(st.sampled_from(["", "\n"])), **dict(params))


_TEXT = st.lists(st.sampled_from(["Sure.", " ", "\n", "<", "<tool", "tool_call>", "get_weather", ">", "x", "{", '"name"', "é"]), max_size=5).map("".join)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(_TEXT, _call()), max_size=5), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_split_of_a_reply_streams_the_same_calls_and_content_as_the_whole(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    points = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    choice = _body(text, fmt="glm45")
    got = _streamed(pieces, fmt="glm45")
    if got["calls"] and got["content"]:  # (as for Qwen3-Coder's: leading whitespace streamed early)
        got["content"] = got["content"].lstrip() or None
    assert got == {"content": choice["message"]["content"] or None, "calls": _calls(choice), "finish_reason": choice["finish_reason"]}


def test_the_worker_says_glm45_and_writes_its_tags_as_text_where_they_are_control_tokens() -> None:
    """A GGUF may make GLM's tags control tokens, which decode to no text as plain text: the reply
    would lose the call's markup (llama-server keeps them: its preserved tokens)."""
    from .test_tool_native_formats_s46 import _worker

    tags = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
    worker = _worker(GLM46, {tag: 1000 + i for i, tag in enumerate(tags)})
    assert worker.hello().tool_format == "glm45"
    spell = worker._reply_token_bytes(chat=False, offers_tools=True)
    assert [spell(1000 + i) for i in range(len(tags))] == [t.encode() for t in tags]
    from .test_tool_qwen3_coder_s47 import QWEN3_CODER

    qwen = _worker(QWEN3_CODER, {"<tool_call>": 1000, "</tool_call>": 1001})
    assert qwen.hello().tool_format == "qwen3_coder" and qwen._reply_token_bytes(chat=False, offers_tools=True)(1000) == b"<tool_call>"
