"""GLM 4.5/4.6/4.7's calls held in their own format (``grammar._glm_tool_grammar``): a forced call
(``tool_choice`` required or a named function) is forced in it, and in ``tool_choice`` auto a call
the model opens with ``<tool_call>`` is held to it (llama-server's lazy grammar), as Qwen3-Coder's
are in theirs. Before, a forced call of a GLM model was forced into the JSON ``<tool_call>``
format it was not trained on, and in ``auto`` its calls were free: a call naming no offered
function, or whose arguments did not fit, reached the client as text.

The format, as the real templates write an earlier call (templates_s46/glm-4.6.jinja with new
lines, glm-4.7-flash.jinja without)::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

A string value is any text without ``</arg_value>`` in it, any other value the JSON its schema
allows. Checked through llguidance (``fits``, the MLX engine's grammar path), through the worker,
and through llama.cpp on the bundled model (``engine``, tests/engines/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.responses import parse_tool_calls
from scheduler.engines.grammar import check_bounds, lazy_tool_grammar, tool_grammar

pytest.importorskip("llguidance")

from tests.api.test_tool_qwen3_coder_s47 import PARAMS, rendered_history  # noqa: E402
from tests.engines.test_grammar_keywords import fits  # noqa: E402
from tests.engines.test_tool_grammar_qwen3_coder_s47 import TOOLS, WEATHER, forced_forecast, refused_calls  # noqa: E402
from tests.engines.test_xml_tool_grammar_fuzz_s47 import SETTINGS, odd_text, schemas  # noqa: E402

TEMPLATES = Path(__file__).parent.parent / "api" / "templates_s46"
GLM46 = (TEMPLATES / "glm-4.6.jinja").read_text()
GLM47 = (TEMPLATES / "glm-4.7-flash.jinja").read_text()
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


def glm_call(name: str, sep: str = "\n", **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in params.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def test_a_forced_call_is_held_to_glms_own_format_and_the_schemas() -> None:
    grammar = tool_grammar(TOOLS, "required", True, fmt="glm45")
    assert grammar is not None and '"get_weather"' in grammar and "<arg_key>" in grammar
    check_bounds(grammar)
    good = [
        (glm_call("get_weather", city="Paris"), {"city": "Paris"}),
        (glm_call("get_weather", "", city="Paris", days="3", unit="celsius"), {"city": "Paris", "days": 3, "unit": "celsius"}),  # GLM 4.7's layout
        (glm_call("get_weather", city="Multi\nline </arg_key> <arg_value> <\n"), {"city": "Multi\nline </arg_key> <arg_value> <\n"}),
        (glm_call("write_file", path="a.py", content=""), {"path": "a.py", "content": ""}),
    ]
    for text, arguments in good:
        assert fits(grammar, text), text
        content, calls = parse_tool_calls(text, SCHEMAS, fmt="glm45")
        assert content is None and [json.loads(c["function"]["arguments"]) for c in calls] == [arguments], text
    assert fits(grammar, glm_call("get_weather", city="Rome") + "\n" + glm_call("write_file", path="a", content="b"))
    assert fits(grammar, glm_call("get_weather", "", city="Rome") + glm_call("write_file", "", path="a", content="b"))
    for text in refused_calls(glm_call, "</arg_value>"):
        assert not fits(grammar, text), text
    named = tool_grammar(TOOLS, {"name": "write_file"}, True, fmt="glm45")
    assert named is not None and fits(named, glm_call("write_file", path="a", content="b"))
    assert not fits(named, glm_call("get_weather", city="Rome")) and not fits(named, glm_call("write_file", path="a", content="b") * 2)


@pytest.mark.parametrize("template", [GLM46, GLM47], ids=["glm-4.6", "glm-4.7-flash"])
def test_the_calls_the_real_templates_write_are_what_the_grammar_lets_through(template: str) -> None:
    """The template's rendering of an earlier turn's calls (what the model learnt to write), in
    either layout, fits the grammar of the same tools: the model is held to its own habits."""
    params = {**PARAMS, "properties": {k: v for k, v in PARAMS["properties"].items() if k != "anything"}}  # (no type: the JSON format's)
    tools = [{"name": "get_weather", "parameters": params}, {"name": "write_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}]
    _, text = rendered_history(template)
    turn = text[text.index("<|assistant|>") :].split("<|observation|>")[0]
    written = turn[turn.index("<tool_call>") :]
    assert fits(tool_grammar(tools, "required", True, fmt="glm45") or "", written), written
    lazy = lazy_tool_grammar(tools, True, fmt="glm45")
    assert lazy is not None and fits(lazy, "Doing it.\n" + written)


def test_tool_choice_auto_is_free_text_until_the_model_opens_a_call_then_held() -> None:
    grammar = lazy_tool_grammar(TOOLS, True, fmt="glm45")
    assert grammar is not None
    assert fits(grammar, "It is sunny in Paris, I think.")
    assert fits(grammar, "Let me check.\n" + glm_call("get_weather", city="Paris"))
    assert not fits(grammar, "Let me check.\n" + glm_call("get_weather", city="Paris", days="0"))
    assert not fits(grammar, "Let me check.\n<tool_call>search\n</tool_call>")
    # the rules that hold the call are the forced grammar's
    lazy, forced = lazy_tool_grammar([WEATHER], False, fmt="glm45"), tool_grammar([WEATHER], "required", False, fmt="glm45")
    assert lazy is not None and forced is not None
    assert {r for r in lazy.splitlines() if not r.startswith(("root", "lazy-text"))} == {r for r in forced.splitlines() if not r.startswith("root")}


def test_names_and_parameters_the_format_cannot_hold_keep_the_json_format() -> None:
    for tool in (
        {"name": "get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},  # (the reader ends a name at a space)
        {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "^[a-z]+$"}}}},
        {"name": "f", "parameters": {"type": "object", "properties": {"a b": {"type": "string"}}}},
        {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}},
    ):
        assert tool_grammar([tool], "required", True, fmt="glm45") == tool_grammar([tool], "required", True), tool


def test_the_worker_holds_a_glm_models_calls_in_its_own_format() -> None:
    from tests.api.test_tool_native_formats_s46 import _worker

    worker = _worker(GLM46, {})
    assert worker.tool_format == "glm45"
    worker.engine.features = frozenset({"template_vars", "grammar"})
    worker.engine.check_grammar = lambda _g: None  # type: ignore[method-assign]
    ask = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    assert worker._sampling({**ask, "tool_choice": "required"}).grammar == tool_grammar(TOOLS, "required", True, fmt="glm45")
    held = worker._sampling({**ask, "tool_choice": "auto"}).grammar
    assert held is not None and fits(held, "Sure.\n" + glm_call("get_weather", city="Paris"))


@SETTINGS
@given(params=schemas, data=st.data())
def test_what_the_format_lets_through_reads_back_as_written(params: dict[str, Any], data: st.DataObject) -> None:
    """Hostile schemas (odd names, enums of odd strings, ``required`` of anything): a grammar in
    the format lets only calls through that read back (api/xml_tool_calls.py) as written, and a
    string value can never close its value early."""
    from scheduler.engines.grammar import GrammarError

    try:
        grammar = tool_grammar([{"name": "f", "parameters": params}], "required", True, fmt="glm45")
    except GrammarError:
        return  # (a 400: tests/engines/test_xml_tool_grammar_fuzz_s47.py)
    if grammar is None or "<arg_key>" not in grammar:
        return  # (the JSON format, fuzzed in tests/engines/test_grammar_schema_fuzz.py)
    check_bounds(grammar)
    values: dict[str, str] = {}
    for key, schema in params["properties"].items():
        if schema.get("type") != "string":
            continue  # (the JSON values: their own fuzz)
        enum = schema.get("enum")
        values[key] = data.draw(st.sampled_from(enum) if enum else odd_text.filter(lambda t: "</arg_value>" not in t) | st.text(max_size=6))
    if set(params.get("required") or []) - values.keys():
        return
    sep = data.draw(st.sampled_from(["\n", ""]))
    text = glm_call("f", sep, **values)
    if not fits(grammar, text):
        assert any(schema.get("enum") for schema in params["properties"].values()), text
        return
    content, calls = parse_tool_calls(text, {"f": params}, fmt="glm45")
    assert content is None and len(calls) == 1, text
    assert json.loads(calls[0]["function"]["arguments"]) == values, text
    for key in values:  # a value holding the closing is never let through
        broken = text.replace(f"<arg_value>{values[key]}</arg_value>", f"<arg_value>{values[key]}</arg_value>x</arg_value>", 1)
        assert not fits(grammar, broken), broken


def test_llama_cpp_takes_the_grammars_and_the_forced_reply_is_a_call_that_fits(engine: Any) -> None:
    for grammar in (tool_grammar(TOOLS, "required", True, fmt="glm45"), lazy_tool_grammar(TOOLS, True, fmt="glm45")):
        assert grammar is not None and engine.check_grammar(grammar) is None
    forced_forecast(engine, "glm45", "<tool_call>forecast")
