"""Tool calls in the model's own format (``tool_choice`` auto). A model whose chat template renders
the tools answers in the format that template teaches: Llama 3.1/3.2/3.3 a bare
``{"name": ..., "parameters": {...}}`` object (maybe after ``<|python_tag|>``), Mistral
``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` or ``[TOOL_CALLS]name[ARGS]{...}``. Before,
only the ``<tool_call>`` format was read: such a model's calls reached the client as content and
``finish_reason`` ``stop``. The format is told from the template as llama.cpp's common/chat.cpp
tells it (templates_s46/ holds the upstream templates), the worker says it in its Hello, and the
reply parses it, streamed or not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.responses import Reply, parse_tool_calls
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.chat import compile_chat_template, native_tool_messages, render_chat_template, tool_call_format
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Delta, Done
from scheduler.worker.loop import EngineWorker
from tests.api.streamed import stream_reply

TEMPLATES = Path(__file__).parent / "templates_s46"
LLAMA31 = (TEMPLATES / "llama-3.1-instruct.jinja").read_text()
MISTRAL_NEMO = (TEMPLATES / "mistral-nemo-instruct-2407.jinja").read_text()
QWEN_STYLE = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>{% for m in messages %}{{ m.content }}{% endfor %}"
TOOLS = [{"name": "get_weather", "description": "The weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
NAMES = ["get_weather"]


def test_the_format_is_told_from_the_template() -> None:
    assert tool_call_format(LLAMA31) == "llama3"
    assert tool_call_format(MISTRAL_NEMO) == "mistral"
    assert tool_call_format(QWEN_STYLE) == "hermes"
    assert tool_call_format(None) == "hermes"  # no template: ChatML and the generic prompt
    # a template the tools are not given to (an engine without template variables) sees the
    # generic prompt, which teaches <tool_call>
    assert tool_call_format(LLAMA31, native=False) == "hermes"


def _assistant_text(template: str, call: dict[str, Any], marker: str) -> str:
    """What ``template`` writes for an assistant turn making ``call`` (an earlier call in the
    conversation, as the model was trained to write it): from ``marker`` to the turn's end."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    text = render_chat_template(
        compile_chat_template(template), native_tool_messages(messages), bos_token="<s>", eos_token="</s>",
        tools=[{"type": "function", "function": t} for t in TOOLS],
    )  # fmt: skip
    return text[text.rindex(marker) :].split("<|eot_id|>")[0].split("</s>")[0]


def test_a_call_as_the_llama31_template_writes_it_is_a_call() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    written = _assistant_text(LLAMA31, call, '{"name"')
    assert written == '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    content, calls = parse_tool_calls(written, NAMES, fmt="llama3")
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_a_call_as_the_mistral_nemo_template_writes_it_is_a_call_with_a_mistral_id() -> None:
    call = {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    written = _assistant_text(MISTRAL_NEMO, call, "[TOOL_CALLS]")
    content, calls = parse_tool_calls(written, NAMES, fmt="mistral")
    assert content is None and len(calls) == 1
    assert calls[0]["id"] == "abcDEF123" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_the_llama31_template_refuses_a_turn_of_two_calls_so_one_is_read() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call, call]}]
    with pytest.raises(ValueError, match="single tool-calls"):
        render_chat_template(compile_chat_template(LLAMA31), native_tool_messages(messages), bos_token="", eos_token="", tools=[])


def _body(fmt: str, text: str, reason: str = "stop") -> dict[str, Any]:
    reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt)
    reply.add(Delta("j", text))
    return reply.body(Done("j", reason), None)["choices"][0]


def _streamed(fmt: str, pieces: list[str], reason: str = "stop") -> dict[str, Any]:
    got = stream_reply(pieces, TOOLS, fmt=fmt, reason=reason)
    return {"content": got.content or None, "calls": got.calls, "finish_reason": got.finish_reason}


def _calls(choice: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]


REPLIES = {
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
        ('<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
        # one call: Llama 3.x templates refuse a turn of two (the client's next request a 400)
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {"city": "Rome"}}',
         '; {"name": "get_weather", "parameters": {"city": "Rome"}}', [("get_weather", '{"city": "Paris"}')]),
        # not at the start, a function not offered, an answer that is JSON: text
        ('It is {"name": "get_weather", "parameters": {}}', 'It is {"name": "get_weather", "parameters": {}}', []),
        ('{"name": "search", "parameters": {}}', '{"name": "search", "parameters": {}}', []),
        ('{"answer": 42}', '{"answer": 42}', []),
        # a forced call's grammar writes the generic format: read for every model
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [("get_weather", '{"city": "Paris"}')]),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]', None, [("get_weather", '{"city": "Paris"}')]),
        ('Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
         "Checking.", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', None,
         [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]),
        # arguments written as a JSON string (llama.cpp's parser takes them so too)
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]', None, [("get_weather", '{"city": "Paris"}')]),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": "Paris"}]', '[TOOL_CALLS][{"name": "get_weather", "arguments": "Paris"}]', []),
        ('[TOOL_CALLS][{"name": "search", "arguments": {}}]', '[TOOL_CALLS][{"name": "search", "arguments": {}}]', []),
        ("Paris is sunny.", "Paris is sunny.", []),
        # a forced call (the generic format): its id too is one Mistral's template takes back
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [("get_weather", '{"city": "Paris"}')]),
    ],
}
CASES = [(fmt, *case) for fmt, cases in REPLIES.items() for case in cases]


def test_calls_in_the_models_format_are_tool_calls_unstreamed() -> None:
    for fmt, text, content, calls in CASES:
        choice = _body(fmt, text)
        assert (choice["message"]["content"], _calls(choice)) == (content, calls), (fmt, text)
        assert choice["finish_reason"] == ("tool_calls" if calls else "stop"), (fmt, text)
        for call in choice["message"].get("tool_calls") or []:
            assert call["type"] == "function" and call["id"]
            if fmt == "mistral":  # Mistral's templates take back only 9-character ids
                assert len(call["id"]) == 9 and call["id"].isalnum()


def test_streamed_the_same_reply_as_unstreamed() -> None:
    for fmt, text, _content, _expected in CASES:
        choice = _body(fmt, text)
        expected = {"content": choice["message"]["content"], "calls": _calls(choice), "finish_reason": choice["finish_reason"]}
        for size in (1, 3, 7, len(text)):
            got = _streamed(fmt, [text[i : i + size] for i in range(0, len(text), size)])
            assert {**got, "calls": [(c["name"], c["arguments"]) for c in got["calls"]]} == expected, (fmt, text, size)


def test_a_streamed_forced_call_of_a_mistral_model_has_a_mistral_id() -> None:
    reply = Reply("chat", "m", tools=TOOLS, tool_choice="required", tool_format="mistral")
    frames = reply.delta_chunks(Delta("j", '<tool_call>\n{"name": "get_weather", "arguments": {'))
    ids = [c["id"] for f in frames for c in f["choices"][0]["delta"].get("tool_calls") or [] if c.get("id")]
    assert len(ids) == 1 and len(ids[0]) == 9 and ids[0].isalnum()


def test_text_before_a_llama3_reply_is_streamed_at_once() -> None:
    reply = Reply("chat", "m", tools=TOOLS, tool_format="llama3")
    frames = reply.delta_chunks(Delta("j", "Hello"))
    assert [f["choices"][0]["delta"].get("content") for f in frames] == ["", "Hello"]
    # and a call-like object later in the text is no call (Llama writes calls at the start)
    later = reply.delta_chunks(Delta("j", ' {"name": "get_weather", "parameters": {}}'))
    assert later and all("tool_calls" not in f["choices"][0]["delta"] for f in later)


FRAGMENTS = st.sampled_from(
    ["[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<tool_call>", "</tool_call>", "{", "}", "[", "]", ",", ";", ":", " ", "\n",
     '"name"', '"arguments"', '"parameters"', '"type"', '"function"', '"id"', '"get_weather"', '"x"', "get_weather", "1", "null", "text"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["hermes", "llama3", "mistral"]), parts=st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=30), size=st.integers(1, 9))
def test_fuzz_the_parser_never_raises_and_loses_no_text(fmt: str, parts: list[str], size: int) -> None:
    text = "".join(parts)
    content, calls = parse_tool_calls(text, NAMES, fmt=fmt)
    if not calls:  # no call: the text as it came (but for leading whitespace: none of the content in tool mode)
        assert _body(fmt, text)["message"]["content"] == text.lstrip()
    for call in calls:  # (a call whose head came is one, its arguments as far as they came)
        assert call["function"]["name"] == "get_weather"
    if _body(fmt, text)["finish_reason"] == "tool_calls":  # whole calls: arguments that parse
        assert all(isinstance(json.loads(call["function"]["arguments"]), dict) for call in calls)
    # streamed, in any pieces: the same content and calls as unstreamed
    choice = _body(fmt, text)
    got = _streamed(fmt, [text[i : i + size] for i in range(0, len(text), size)])
    assert got["content"] == (choice["message"]["content"] or None)
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == _calls(choice)
    assert got["finish_reason"] == choice["finish_reason"]


def _worker(template: str, pieces: dict[str, int]) -> EngineWorker:
    """A worker on the simulated engine with ``template`` and the control tokens ``pieces``
    (their text: their id), which decode to no text as plain text (as llama.cpp's do)."""
    engine = SimEngine(n_lanes=1, lane_ctx=512)
    engine.features = frozenset({"template_vars"})
    engine.chat_template = template
    plain_tokenize, plain_bytes = engine.tokenize, engine.token_bytes
    by_id = {v: k for k, v in pieces.items()}

    def tokenize(text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        if special and text in pieces:
            return [pieces[text]]
        return plain_tokenize(text, add_special=add_special, special=special, after=after)

    engine.tokenize = tokenize  # type: ignore[method-assign]
    engine.token_bytes = lambda t: b"" if t in by_id else plain_bytes(t)  # type: ignore[method-assign]
    return EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="m", prepare_in_thread=False)


def test_the_worker_says_its_format_and_writes_the_formats_control_tokens_as_text() -> None:
    worker = _worker(MISTRAL_NEMO, {"[TOOL_CALLS]": 1000, "[ARGS]": 1001})
    assert worker.hello().tool_format == "mistral"
    spell = worker._reply_token_bytes(chat=False, offers_tools=True)
    assert spell(1000) == b"[TOOL_CALLS]" and spell(1001) == b"[ARGS]" and spell(ord("a")) == b"a"
    assert _worker(LLAMA31, {"<|python_tag|>": 1000}).hello().tool_format == "llama3"
    sim = EngineWorker(SimEngine(n_lanes=1, lane_ctx=512), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="m", prepare_in_thread=False)
    assert sim.hello().tool_format == "hermes"  # no template variables: the generic prompt


def test_a_llama3_model_is_forced_and_answered_one_call_at_a_time() -> None:
    """``required`` allowed up to 4 calls: a Llama 3.x model's reply of two went to the client,
    and its template refused the conversation on the next turn (a 400). As llama.cpp turns
    ``parallel_tool_calls`` off for a template that cannot take them, the grammar allows one."""
    from scheduler.engines import grammar as grammars

    worker = _worker(LLAMA31, {})
    engine = worker.engine
    engine.features = frozenset({"template_vars", "grammar"})
    engine.check_grammar = lambda _g: None  # type: ignore[method-assign]
    request = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "required"}
    assert worker._sampling(request).grammar == grammars.tool_grammar(TOOLS, "required", False)
    mistral = _worker(MISTRAL_NEMO, {})
    mistral.engine.features = frozenset({"template_vars", "grammar"})
    mistral.engine.check_grammar = lambda _g: None  # type: ignore[method-assign]
    assert mistral._sampling(request).grammar == grammars.tool_grammar(TOOLS, "required", True)
    # the reply reads one call, and a reply of one whole forced call finishes tool_calls
    two = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' * 2
    reply = Reply("chat", "m", tools=TOOLS, tool_choice="required", tool_format="llama3")
    reply.add(Delta("j", two))
    choice = reply.body(Done("j", "length"), None)["choices"][0]
    assert _calls(choice) == [("get_weather", '{"city": "Paris"}')] and choice["finish_reason"] == "tool_calls"
