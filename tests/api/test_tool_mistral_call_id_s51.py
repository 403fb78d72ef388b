"""Mistral's ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``: the call's id between its name and its
arguments, as Mistral Small 3.2's template writes an earlier call (templates_s46) and models of
Mistral's v13 tokenizer may write one. Before, the reader wanted ``[ARGS]`` right after the name,
and the worker wrote ``[CALL_ID]`` (a control token) as no text, so the id ran into the name:
the call reached the client as text. Now it is a call, with the model's id where it is one
Mistral's templates take back (9 letters and digits), streamed or not."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_tool_native_formats_s46 import _body, _calls, _streamed, _worker

SMALL_32 = (Path(__file__).parent / "templates_s46" / "mistral-small-3.2-24b-instruct-2506.jinja").read_text()

CASES = [
    ('[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}', None, [("get_weather", '{"city": "Paris"}')], "abcDEF123"),
    ('Checking.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
     "Checking.", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')], "a1b2c3d4e"),
    # an id no Mistral template takes back: the call, with an id of ours
    ('[TOOL_CALLS]get_weather[CALL_ID]call_1[ARGS]{"city": "Paris"}', None, [("get_weather", '{"city": "Paris"}')], None),
    ('[TOOL_CALLS]get_weather[CALL_ID][ARGS]{"city": "Paris"}', None, [("get_weather", '{"city": "Paris"}')], None),
    # a function not offered stays text
    ('[TOOL_CALLS]search[CALL_ID]abcDEF123[ARGS]{"q": "x"}', '[TOOL_CALLS]search[CALL_ID]abcDEF123[ARGS]{"q": "x"}', [], None),
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls", "model_id"), CASES)
def test_a_call_with_its_id_between_name_and_arguments_is_a_call(text: str, content: str | None, calls: list[tuple[str, str]], model_id: str | None) -> None:
    choice = _body("mistral", text)
    assert (choice["message"]["content"], _calls(choice)) == (content, calls), text
    ids = [call["id"] for call in choice["message"].get("tool_calls") or []]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    if model_id is not None:
        assert ids[0] == model_id
    expected = {"content": choice["message"]["content"], "calls": _calls(choice), "finish_reason": choice["finish_reason"]}
    for size in (1, 4, len(text)):
        got = _streamed("mistral", [text[i : i + size] for i in range(0, len(text), size)])
        assert {**got, "calls": [(c["name"], c["arguments"]) for c in got["calls"]]} == expected, (text, size)


def test_the_worker_writes_call_id_as_text_where_it_is_a_control_token() -> None:
    worker = _worker(SMALL_32, {"[TOOL_CALLS]": 1000, "[ARGS]": 1001, "[CALL_ID]": 1002})
    assert worker.hello().tool_format == "mistral"
    spell = worker._reply_token_bytes(chat=False, offers_tools=True)
    assert [spell(t) for t in (1000, 1001, 1002)] == [b"[TOOL_CALLS]", b"[ARGS]", b"[CALL_ID]"]


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["get_weather", "search"]), call_id=st.text(alphabet="aB3_-[] ", max_size=12), gap=st.sampled_from(["", " ", "\n"]))
def test_any_id_there_reads_the_same_streamed_or_not(name: str, call_id: str, gap: str) -> None:
    text = f'[TOOL_CALLS]{name}{gap}[CALL_ID]{gap}{call_id}{gap}[ARGS]{{"city": "Paris"}}'
    choice = _body("mistral", text)
    got = _streamed("mistral", [text[i : i + 3] for i in range(0, len(text), 3)])
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == _calls(choice)
    assert got["content"] == (choice["message"]["content"] or None)
