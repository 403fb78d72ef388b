"""A forced call (``tool_choice`` required or a named function) of a model that writes Qwen3-Coder's
format is forced in that format, as llama.cpp forces it (common/parsers/qwen3-coder.cpp), not in
the JSON ``<tool_call>`` one it was not trained on: a string parameter's value any text up to its
``</parameter>``, any other's the JSON its schema allows. Parameters the format cannot hold to
their schema (a string with a pattern, a union with a string in it) keep the JSON format.

The grammar is checked by llguidance (the MLX engine's matcher) and by llama.cpp, on the bundled
model (``engine``, tests/engines/conftest.py): its forced reply reads back as a call that fits."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from api.responses import parse_tool_calls
from scheduler.core.types import SamplingParams
from scheduler.engines.grammar import check_bounds, tool_grammar
from testkit.engine_driver import Run, chat, drive, release, text_of
from tests.engines.test_grammar_keywords import fits

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        },
        "required": ["city"],
    },
}
WRITE = {"name": "write_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}
TOOLS = [WEATHER, WRITE]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def refused_calls(call: Callable[..., str], closing: str) -> list[str]:
    """Calls of WEATHER and WRITE in a tagged format (``call``: its writer; ``closing``: what ends
    a value) that a forced grammar of TOOLS must refuse."""
    return [
        call("get_weather"),  # a required parameter left out
        call("get_weather", city="a", days="9"),  # out of the schema's range
        call("get_weather", city="a", unit="kelvin"),
        call("get_weather", city=f"a{closing}b"),  # (the reader would take it for the closing)
        call("search", q="x"),  # not offered
        call("get_weather", city="a") + "\nand text after",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ]


def test_the_grammar_forces_the_models_own_format_and_the_schemas() -> None:
    grammar = tool_grammar(TOOLS, "required", True, fmt="qwen3_coder")
    assert grammar is not None and "<function=get_weather>" in grammar
    check_bounds(grammar)
    good = [
        call("get_weather", city="Paris"),
        call("get_weather", city="Multi\nline </param> <\n", days="3", unit="celsius", where='{"lat": 48.5}'),
        call("write_file", path="a.py", content="") + "\n" + call("get_weather", city="Rome"),
    ]
    bad = refused_calls(call, "</parameter>")
    for text in good:
        assert fits(grammar, text), text
        content, calls = parse_tool_calls(text, {t["name"]: t["parameters"] for t in TOOLS}, fmt="qwen3_coder")
        assert content is None and calls
    for text in bad:
        assert not fits(grammar, text), text
    named = tool_grammar(TOOLS, {"name": "write_file"}, True, fmt="qwen3_coder")
    assert named is not None and fits(named, call("write_file", path="a", content="b"))
    assert not fits(named, call("get_weather", city="Rome")) and not fits(named, call("write_file", path="a", content="b") * 2)


def test_parameters_the_format_cannot_hold_keep_the_json_format() -> None:
    for schema in ({"type": "string", "pattern": "^[a-z]+$"}, {"type": ["string", "object"]}, {"anyOf": [{"type": "string"}, {"type": "integer"}]}):
        tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}}]
        assert tool_grammar(tools, "required", True, fmt="qwen3_coder") == tool_grammar(tools, "required", True), schema
    # other models: the JSON format, as before
    assert "<function=" not in str(tool_grammar(TOOLS, "required", True))


def test_the_worker_forces_a_qwen3_coder_model_in_its_own_format() -> None:
    from pathlib import Path

    from tests.api.test_tool_native_formats_s46 import _worker

    template = (Path(__file__).parent.parent / "api" / "templates_s46" / "qwen3-coder.jinja").read_text()
    worker = _worker(template, {})
    worker.engine.features = frozenset({"template_vars", "grammar"})
    worker.engine.check_grammar = lambda _g: None  # type: ignore[method-assign]
    request = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "required"}
    assert worker._sampling(request).grammar == tool_grammar(TOOLS, "required", True, fmt="qwen3_coder")


# (values the grammar bounds: the bundled model, not trained on the format, writes a free-text
# value on and on; Qwen3-Coder closes its own)
FORECAST = {
    "name": "forecast",
    "parameters": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}, "hourly": {"type": "boolean"}},
        "required": ["unit", "days"],
    },
}


def test_llama_cpp_takes_the_grammars_and_the_forced_reply_is_a_call_that_fits(engine: Any) -> None:
    for choice in ("required", {"name": "get_weather"}):
        grammar = tool_grammar(TOOLS, choice, True, fmt="qwen3_coder")
        assert grammar is not None and engine.check_grammar(grammar) is None, choice
    forced_forecast(engine, "qwen3_coder", "<tool_call>\n<function=forecast>\n")


def forced_forecast(engine: Any, fmt: str, head: str) -> None:
    """The bundled model's forced call of FORECAST in ``fmt``: it begins with ``head``, closes and
    ends, and reads back as one call whose arguments fit the schema."""
    import jsonschema

    grammar = tool_grammar([FORECAST], {"name": "forecast"}, True, fmt=fmt)
    sampling = SamplingParams(temperature=0.0, grammar=grammar)
    run = drive(engine, [Run(0, chat(engine, "What will the weather be in Paris this week?"), sampling, 300, stop_on_eog=True)])[0]
    text = text_of(engine, run.output)
    release(engine, 0)
    assert text.startswith(head) and len(run.output) < 300, text  # closed, and ended
    content, calls = parse_tool_calls(text, {"forecast": FORECAST["parameters"]}, fmt=fmt)
    assert content is None and len(calls) == 1, text
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), FORECAST["parameters"])
