"""``tool_choice`` auto for Llama 3.x's and Mistral's own call formats (``grammar.lazy_tool_grammar``
with ``fmt`` "llama3" and "mistral"), as llama.cpp's common/chat.cpp holds them lazily: the text
is free until a call opens (Llama: ``{"name": "`` at the reply's start, maybe after
``"type": "function",`` and ``<|python_tag|>``; Mistral: ``[TOOL_CALLS]`` anywhere; both:
``<tool_call>``, read for every model), and from there the call is one of the tools' with
arguments that fit their schema. Before, these formats were free whole: a call of a tool never
offered or with arguments against the schema was written, and read as a call where the name was
offered. Checked through llguidance on the grammar's text (the MLX engine's path; the llama.cpp
engine's compile and a real model's call: tests/engines/test_contract.py), against the reply's
reader streamed and not, and through the worker with the models' own templates."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api.responses import parse_tool_calls
from scheduler.engines import grammar as grammars
from scheduler.engines.grammar import TOOL_OPEN, check_bounds, lazy_tool_grammar, tool_grammar

pytest.importorskip("llguidance")

from tests.api.streamed import stream_reply, whole_reply  # noqa: E402
from tests.edge.strategies import field_values  # noqa: E402
from tests.engines.test_grammar_keywords import fits  # noqa: E402
from tests.engines.test_lazy_tool_grammar_s48 import _request, _templated_worker, _worker, takes  # noqa: E402
from tests.engines.test_xml_tool_grammar_fuzz_s47 import schemas  # noqa: E402

WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": False},
}
CLOCK = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
TOOLS = [WEATHER, CLOCK]
LLAMA = lazy_tool_grammar(TOOLS, False, fmt="llama3")
MISTRAL = lazy_tool_grammar(TOOLS, True, fmt="mistral")
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# llama.cpp's trigger for Llama 3.x (anchored at the start), with the whitespace and
# <|python_tag|> the reader skips before it
_S = "[ \t\n\r]*"
LLAMA_OPENING = re.compile(f'{_S}(<\\|python_tag\\|>{_S})?\\{{{_S}("type"{_S}:{_S}"function"{_S},{_S})?"name"{_S}:{_S}"')

# text made of the openings' pieces (and no tool's name, so no whole call), so that near misses
# and whole openings come up often
pieces = st.lists(
    st.sampled_from(['{', '"name"', '"type"', '"function"', ":", ",", '"', " ", "\n", "\t", "<|python_tag|>", "<|python", "x", "\u00e9",
                     "[TOOL_CALLS]", "[TOOL_", "CALLS]", "[", "]", "<tool_call>", "<tool_", "call>"]),
    max_size=12,
).map("".join)  # fmt: skip
texts = st.one_of(pieces, st.text(max_size=20))


def test_both_formats_have_a_grammar_in_auto_and_their_forced_calls_are_as_they_were() -> None:
    assert LLAMA is not None and MISTRAL is not None
    check_bounds(LLAMA)
    check_bounds(MISTRAL)
    for fmt in ("llama3", "mistral"):  # forced: the <tool_call> format, read for every model
        assert tool_grammar(TOOLS, "required", True, fmt=fmt) == tool_grammar(TOOLS, "required", True)
    # Llama 3.x in a reasoning block (no template of theirs has one): left free
    assert lazy_tool_grammar(TOOLS, False, fmt="llama3", thinking=grammars.THINKING_MAY_OPEN) is None


@SETTINGS
@given(text=texts)
@example(text='\n {\n "name" :\t"')  # an opening spaced as the call's JSON cannot be: not free either
@example(text='<|python_tag|> {"type":"function",  "name":"')
@example(text='{"type": "function", "nam')  # (cut inside the opening: not yet one)
@example(text='{"name": 5}')
@example(text='{"parameters": {}, "name": "get_time"}')  # (not llama.cpp's opening: free)
@example(text='It is {"name": "x"}')
@example(text="<|python_tag|>print(1)")
def test_llama3_text_is_free_unless_it_opens_a_call(text: str) -> None:
    assert LLAMA is not None
    assert fits(LLAMA, text) == (LLAMA_OPENING.match(text) is None and TOOL_OPEN not in text), text


@SETTINGS
@given(text=texts)
@example(text="Sure. [TOOL_CALLS]")
@example(text="[TOOL_[TOOL_CALLS")
@example(text="<tool_<tool_call>")
def test_mistral_text_is_free_unless_it_opens_a_call(text: str) -> None:
    assert MISTRAL is not None
    assert fits(MISTRAL, text) == ("[TOOL_CALLS]" not in text and TOOL_OPEN not in text), text


@pytest.mark.parametrize(
    ("fmt", "opened", "after"),
    [
        ("llama3", '{"name": "', 'get_wether"'),  # no such tool
        ("llama3", '<|python_tag|>{"type": "function", "name": "', 'search"'),
        ("llama3", '{"name": "', 'get_weather", "parameters": {"town": '),  # not its parameter
        ("llama3", '{"name": "', 'get_weather", "parameters": {"city": 5'),  # not its type
        ("llama3", '{"name": "', 'get_weather", "parameters": {"city": "Paris, France"'),  # past its maxLength
        ("llama3", '\n{"name": "', 'get_time", "parameters": {}} and more'),  # one call, then the end
        ("mistral", "Let me check. [TOOL_CALLS]", 'search[ARGS]{}'),
        ("mistral", "[TOOL_CALLS]", '[{"name": "get_weather", "arguments": {"city": 5'),
        ("mistral", "[TOOL_CALLS]", 'get_weather[ARGS]{"town": '),
        ("mistral", "[TOOL_CALLS]", 'get_weather[CALL_ID]abc[ARGS]'),  # Mistral's ids are 9 characters
        ("mistral", "[TOOL_CALLS]", "I will look it up."),
        ("mistral", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5'),
    ],
)
def test_once_a_call_opens_only_a_call_of_the_tools_that_fits_goes_on(fmt: str, opened: str, after: str) -> None:
    grammar = LLAMA if fmt == "llama3" else MISTRAL
    assert grammar is not None
    assert takes(grammar, opened) and not takes(grammar, opened + after)


def _llama_call(name: str, arguments: Any, *, typed: bool = False, lead: str = "") -> str:
    head = '"type": "function", ' if typed else ""
    return f'{lead}{{{head}"name": {json.dumps(name)}, "parameters": {json.dumps(arguments)}}}'


def _mistral_calls(form: str, calls: list[tuple[str, Any]]) -> str:
    if form == "array":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if form == "array-id":  # Nemo writes each call's id after its arguments
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a, "id": f"call{i:05d}"} for i, (n, a) in enumerate(calls)])
    call_id = "[CALL_ID]a1B2c3D4e" if form == "v13" else ""
    return "".join(f"[TOOL_CALLS]{n}{call_id}[ARGS]{json.dumps(a)}" for n, a in calls)


def _tagged(calls: list[tuple[str, Any]]) -> str:
    return "\n".join(f"{TOOL_OPEN}\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def _read_alike(fmt: str, text: str, tools: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The calls the reply's reader takes from ``text``, the same streamed (in pieces of every
    few sizes) as unstreamed: (name, arguments parsed)."""
    whole = whole_reply(text, tools, "stop", tool_format=fmt)
    for size in (1, 5, len(text)):
        streamed = stream_reply([text[i : i + size] for i in range(0, len(text), size)], tools, fmt=fmt)
        assert {"content": streamed.content or None, "calls": streamed.pairs, "finish_reason": streamed.finish_reason} == whole, (text, size)
    return [(name, json.loads(arguments)) for name, arguments in whole["calls"]]


cities = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<[{"), max_size=20)


@SETTINGS
@given(city=cities, typed=st.booleans(), lead=st.sampled_from(["", "\n", "<|python_tag|>", " <|python_tag|>\n"]), words=words)
def test_a_llama3_call_the_grammar_allows_is_read_as_that_call_streamed_or_not(city: str, typed: bool, lead: str, words: str) -> None:
    assert LLAMA is not None
    text = _llama_call("get_weather", {"city": city}, typed=typed, lead=lead)
    assert fits(LLAMA, text), text
    assert _read_alike("llama3", text, TOOLS) == [("get_weather", {"city": city})]
    # the generic format, after free text (Llama 3.x writes one call a reply: parallel is off)
    text = words + _tagged([("get_weather", {"city": city})])
    assert fits(LLAMA, text), text
    assert _read_alike("llama3", text, TOOLS) == [("get_weather", {"city": city})]


@SETTINGS
@given(form=st.sampled_from(["array", "array-id", "named", "v13", "tagged"]), args=st.lists(cities, min_size=1, max_size=4), words=words)
def test_mistral_calls_the_grammar_allows_are_read_as_those_calls_streamed_or_not(form: str, args: list[str], words: str) -> None:
    assert MISTRAL is not None
    calls = [("get_weather", {"city": city}) for city in args] + [("get_time", {})]
    calls = calls[: grammars.MAX_PARALLEL_CALLS]
    text = words + (_tagged(calls) if form == "tagged" else _mistral_calls(form, calls))
    assert fits(MISTRAL, text), text
    assert _read_alike("mistral", text, TOOLS) == calls
    assert not takes(MISTRAL, text + "\nmore"), text  # then only the end


names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names, other=names)
def test_any_tool_name_is_held_as_it_is_written_and_no_other_name_opens_a_call(name: str, other: str) -> None:
    """A name with quotes, backslashes, control characters, non-ASCII: its call is written with
    it JSON-escaped (or, non-ASCII, raw) and read back as it; Mistral's [ARGS] form only where
    the reader takes the name there. A name not offered cannot open a call in any form."""
    tools = [{"name": name, "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]
    for fmt, parallel in (("llama3", False), ("mistral", True)):
        grammar = lazy_tool_grammar(tools, parallel, fmt=fmt)
        assert grammar is not None
        check_bounds(grammar)
        written = [_llama_call(name, {"n": 1})] if fmt == "llama3" else [_mistral_calls("array", [(name, {"n": 1})])]
        if fmt == "mistral" and grammars._MISTRAL_NAME.fullmatch(name):
            written.append(_mistral_calls("named", [(name, {"n": 1})]))
        for text in written:
            assert fits(grammar, text), (fmt, text)
            assert parse_tool_calls(text, [name], fmt=fmt)[1][0]["function"]["name"] == name
        if other != name:
            opened = '{"name": ' + json.dumps(other)[:-1] if fmt == "llama3" else '[TOOL_CALLS][{"name": ' + json.dumps(other)[:-1]
            assert not takes(grammar, opened + '"'), (fmt, other)
            if fmt == "mistral" and not name.startswith(other):
                assert not takes(grammar, f"[TOOL_CALLS]{other}[ARGS]"), other


def test_a_mistral_arrays_calls_may_carry_the_models_own_ids_and_keep_them() -> None:
    # Mistral Nemo writes "id" after a call's arguments (its template writes earlier calls so, and
    # llama.cpp's grammar asks for it): held, the model may still write it, 9 characters only
    assert MISTRAL is not None
    text = _mistral_calls("array-id", [("get_weather", {"city": "Paris"}), ("get_time", {})])
    assert fits(MISTRAL, text)
    assert not takes(MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "abc"}')
    assert not takes(MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {}, "index": ')
    _content, calls = parse_tool_calls(text, [t["name"] for t in TOOLS], fmt="mistral")
    assert [call["id"] for call in calls] == ["call00000", "call00001"]


def test_a_mistral_name_the_args_form_cannot_write_is_called_as_an_array() -> None:
    tool = {"name": "weather in paris", "parameters": {"type": "object", "properties": {}}}
    grammar = lazy_tool_grammar([tool], True, fmt="mistral")
    assert grammar is not None and "[ARGS]" not in grammar
    assert fits(grammar, _mistral_calls("array", [("weather in paris", {})]))


def test_the_argument_rules_are_the_forced_calls_own_made_once() -> None:
    """The opening's calls reuse the forced grammar's rules (the call object and each tool's
    arguments), not copies of them."""
    forced = tool_grammar(TOOLS, "required", False)
    assert forced is not None and LLAMA is not None and MISTRAL is not None
    rules = {line for line in forced.splitlines() if not line.startswith("root")}
    for grammar in (LLAMA, MISTRAL):
        assert rules <= set(grammar.splitlines())
        assert sum(line.startswith("args0 ::=") for line in grammar.splitlines()) == 1
        assert not any(line.startswith("args0") and line[5:6].isdigit() for line in grammar.splitlines())


# -- the worker: the model's template tells the format ----------------------------------------


@pytest.mark.parametrize(
    ("template_file", "fmt", "parallel"),
    [
        ("llama-3.1-instruct.jinja", "llama3", False),  # one call a turn (SINGLE_CALL_FORMATS)
        ("llama-3.2-3b-instruct.jinja", "llama3", False),
        ("mistral-nemo-instruct-2407.jinja", "mistral", True),
        ("mistral-small-3.2-24b-instruct-2506.jinja", "mistral", True),
    ],
)
def test_the_worker_gives_these_models_their_own_formats_lazy_grammar(template_file: str, fmt: str, parallel: bool) -> None:
    worker = _templated_worker(template_file)
    assert worker.tool_format == fmt
    assert worker._sampling(_request(TOOLS)).grammar == lazy_tool_grammar(TOOLS, parallel, fmt=fmt)
    assert worker._sampling(_request(TOOLS, "required")).grammar == tool_grammar(TOOLS, "required", parallel)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=st.one_of(schemas, field_values(st.sampled_from(["type", "properties", "required", "items", "$ref", "$defs", "enum", "pattern"]), max_leaves=8)))
def test_hostile_tool_parameters_give_these_formats_a_grammar_or_none_never_an_error(params: Any) -> None:
    """Tools whose parameters were never read in ``auto`` for these models are read now: each
    gives the lazy grammar, within bounds, whose calls share the forced call's argument rules, or
    none (the reply free, as before), never a refusal or a crash."""
    worker = _worker(frozenset({"grammar"}))
    for fmt in ("llama3", "mistral"):
        worker.__dict__["tool_format"] = fmt
        grammar = worker._sampling(_request([{"name": "f", "parameters": params}])).grammar
        if grammar is not None:
            check_bounds(grammar)
            rules = dict(line.split(" ::= ", 1) for line in grammar.split("\n") if line)
            args = rules["call-arguments"]  # (the forced call's arguments rule, shared)
            assert f'":" space {args} space "}}" space' in rules["llama-call"] if fmt == "llama3" else f'"[ARGS]" {args}' in rules["mistral-call"]
