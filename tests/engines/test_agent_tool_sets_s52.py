"""The tool sets real agents send (testkit/agent_tools.py: Claude Code's, Codex's, MCP
servers', pydantic's and zod's schemas), whole, through every call format the grammar module
writes: a forced call's grammar (``tool_grammar``, ``required``) and ``tool_choice`` auto's
(``lazy_tool_grammar``) build within the grammar bounds; each tool's realistic call, written as
the model writes it in that format, fits the grammar (llguidance: ``fits``, ``takes``) and is read
back, whole and streamed, as the same name and arguments; a call that breaks its schema does not
fit. The bundled model's engine (llama.cpp's grammar parser) compiles every one of them, and the
worker gives them to a request."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.responses import parse_tool_calls
from scheduler.engines import grammar as grammars
from testkit.agent_tools import SETS
from tests.api.streamed import stream_reply
from tests.engines.test_grammar_keywords import _byte_tokenizer, _lark, fits
from tests.engines.test_lazy_tool_grammar_s48 import takes

pytest.importorskip("llguidance")

FORMATS = ("hermes", "qwen3_coder", "glm45", "llama3", "mistral")
Call = tuple[str, dict[str, Any]]


def _grammar(tools: list[dict[str, Any]], fmt: str, lazy: bool) -> str:
    grammar = grammars.lazy_tool_grammar(tools, True, fmt=fmt) if lazy else grammars.tool_grammar(tools, "required", True, fmt=fmt)
    assert grammar is not None
    grammars.check_bounds(grammar)
    return grammar


def _tagged_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def written(fmt: str, grammar: str, calls: list[Call], lazy: bool) -> str:
    """``calls`` as a model writes them in ``fmt`` (the grammar's: a forced call, and a tagged
    format whose tools it cannot hold, is the JSON ``<tool_call>`` format); ``lazy``: after a
    line of text, where the format lets a call follow text (not Llama 3.x's)."""
    tagged = "<function=" in grammar if fmt == "qwen3_coder" else "<arg_key>" in grammar if fmt == "glm45" else False
    if tagged and fmt == "qwen3_coder":
        text = "\n".join(
            f"<tool_call>\n<function={name}>\n" + "".join(f"<parameter={k}>\n{_tagged_value(v)}\n</parameter>\n" for k, v in args.items()) + "</function>\n</tool_call>"
            for name, args in calls
        )
    elif tagged:
        text = "\n".join(f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_tagged_value(v)}</arg_value>\n" for k, v in args.items()) + "</tool_call>" for name, args in calls)
    elif lazy and fmt == "llama3":
        (name, args), = calls
        return json.dumps({"name": name, "parameters": args})
    elif lazy and fmt == "mistral":
        text = "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": args} for name, args in calls])
    else:
        text = "\n".join(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>" for name, args in calls)
    return "I'll do that.\n" + text if lazy else text


class Matcher:
    """``fits`` of one grammar, compiled once (a set's grammar takes llguidance ~0.1 s to compile)."""

    def __init__(self, grammar: str) -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(_byte_tokenizer(), _lark(grammar), log_level=0)
        assert not self.matcher.is_error(), self.matcher.get_error()

    def fits(self, text: str) -> bool:
        self.matcher.reset()
        data = list(text.encode("utf-8"))
        return self.matcher.try_consume_tokens(data) == len(data) and bool(self.matcher.is_accepting())


CASES = [pytest.param(s, fmt, lazy, id=f"{s}-{fmt}-{'auto' if lazy else 'required'}") for s in SETS for fmt in FORMATS for lazy in (False, True)]


@pytest.mark.parametrize(("set_name", "fmt", "lazy"), CASES)
def test_each_tools_call_fits_and_reads_back_and_a_broken_one_does_not_fit(set_name: str, fmt: str, lazy: bool) -> None:
    tools, calls, invalid = SETS[set_name]
    grammar = _grammar(tools, fmt, lazy)
    matcher = Matcher(grammar)
    schemas = {t["name"]: t["parameters"] for t in tools}
    for name, args in calls:
        text = written(fmt, grammar, [(name, args)], lazy)
        assert matcher.fits(text), text
        content, read = parse_tool_calls(text, schemas, fmt=fmt)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in read] == [(name, args)], text
        streamed = stream_reply([text[i : i + 7] for i in range(0, len(text), 7)], tools, fmt=fmt)
        assert [(n, json.loads(a)) for n, a in streamed.pairs] == [(name, args)], text
    for name, args in invalid:
        text = written(fmt, grammar, [(name, args)], lazy)
        assert not matcher.fits(text), text


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm45", "mistral"])
def test_several_calls_of_a_set_fit_in_one_reply(fmt: str) -> None:
    tools, calls, _ = SETS["codex"]
    four = calls[:4]
    for lazy in (False, True):
        grammar = _grammar(tools, fmt, lazy)
        text = written(fmt, grammar, four, lazy)
        assert fits(grammar, text), text
        _content, read = parse_tool_calls(text, {t["name"]: t["parameters"] for t in tools}, fmt=fmt)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in read] == four


def test_an_optional_property_may_come_before_a_required_one_as_the_schema_lists_them() -> None:
    """Claude Code's NotebookEdit lists ``cell_id`` (optional) before ``new_source`` (required),
    Codex's update_plan ``explanation`` before ``plan``, a pydantic model its fields with
    defaults wherever they are declared: the JSON grammar wrote every required property first,
    so each of these calls, in the schema's order, was refused after its first property."""
    tools, _calls, _invalid = SETS["claude_code"]
    grammar = _grammar(tools, "hermes", False)
    notebook = {"notebook_path": "/n.ipynb", "cell_id": "c1", "new_source": "x = 1"}
    assert fits(grammar, written("hermes", grammar, [("NotebookEdit", notebook)], False))
    assert takes(grammar, '<tool_call>\n{"name": "NotebookEdit", "arguments": {"notebook_path": "/n.ipynb", "new_source": "x", "cell_type": "code"')
    assert not takes(grammar, '<tool_call>\n{"name": "NotebookEdit", "arguments": {"new_source": "x", "cell_id": "c1", "notebook_path"')


# -- the bundled model's engine and the worker -------------------------------------------------


@pytest.mark.model
def test_the_bundled_models_engine_compiles_every_sets_grammars_and_the_worker_gives_them(engine: Any) -> None:
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.worker.loop import EngineWorker

    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=2048), model_name="m", prepare_in_thread=False)
    for set_name, (tools, _calls, _invalid) in SETS.items():
        for fmt in FORMATS:
            for lazy in (False, True):
                assert engine.check_grammar(_grammar(tools, fmt, lazy)) is None, (set_name, fmt, lazy)
        request = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
        fmt = worker.tool_format
        assert worker._sampling({**request, "tool_choice": "required"}).grammar == _grammar(tools, fmt, False)
        assert worker._sampling({**request, "tool_choice": "auto"}).grammar == _grammar(tools, fmt, True)
    # and the grammar sampler runs under the biggest set's forced grammar: what it writes is a call's start
    from scheduler.core.types import SamplingParams
    from testkit.engine_driver import chat, generate, release, text_of

    grammar = _grammar(SETS["agent_with_mcp"][0], worker.tool_format, False)
    out = generate(engine, 0, chat(engine, "List the files in /data."), SamplingParams(temperature=0.0, grammar=grammar), 24)
    release(engine, 0)
    assert len(out) == 24 and text_of(engine, out).startswith("<tool_call>") and takes(grammar, text_of(engine, out)), text_of(engine, out)


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm45"])
def test_claude_codes_tools_are_forced_in_a_tagged_models_own_format(fmt: str) -> None:
    """WebFetch's ``url`` (``format: uri``) and WebSearch's ``query`` (``minLength: 2``) made the
    whole set fall back to the JSON format for Qwen3-Coder and GLM: in ``auto`` the model's own
    ``<function=Bash>`` after ``<tool_call>`` was masked and it had to write JSON. A format the
    JSON format does not enforce either is any text, and a short least length is held."""
    tools, _calls, _invalid = SETS["claude_code"]
    for lazy in (False, True):
        grammar = _grammar(tools, fmt, lazy)
        assert ("<function=" if fmt == "qwen3_coder" else "<arg_key>") in grammar
        short = written(fmt, grammar, [("WebSearch", {"query": "x"})], lazy)
        assert not Matcher(grammar).fits(short)


def _tagged_call(fmt: str, value: str) -> str:
    if fmt == "qwen3_coder":
        return f"<tool_call>\n<function=f>\n<parameter=v>\n{value}\n</parameter>\n</function>\n</tool_call>"
    return f"<tool_call>f\n<arg_key>v</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(["qwen3_coder", "glm45"]),
    least=st.integers(0, 5),
    value=st.lists(st.sampled_from(["<", "/", "</", "parameter", "arg_value", ">", "a", "é", "\n", "</parameter>", "</arg_value>"]), max_size=6).map("".join),
)
def test_a_tagged_formats_text_of_a_least_length_is_exactly_the_texts_that_long_without_the_values_end(fmt: str, least: int, value: str) -> None:
    tool = {"name": "f", "parameters": {"type": "object", "properties": {"v": {"type": "string", "minLength": least, "format": "hostname"}}, "required": ["v"]}}
    grammar = grammars.tool_grammar([tool], "required", False, fmt=fmt)
    assert grammar is not None
    grammars.check_bounds(grammar)
    end = "</parameter>" if fmt == "qwen3_coder" else "</arg_value>"
    assert _matcher(grammar).fits(_tagged_call(fmt, value)) == (len(value) >= least and end not in value), (fmt, least, value)


@functools.cache
def _matcher(grammar: str) -> Matcher:
    return Matcher(grammar)


def test_a_format_the_json_format_enforces_or_a_long_least_length_keeps_the_json_format() -> None:
    for schema in ({"type": "string", "format": "date-time"}, {"type": "string", "minLength": grammars.MAX_TEXT_MIN_LENGTH + 1}, {"type": "string", "maxLength": 3}):
        tool = {"name": "f", "parameters": {"type": "object", "properties": {"v": schema}, "required": ["v"]}}
        grammar = grammars.tool_grammar([tool], "required", False, fmt="qwen3_coder")
        assert grammar is not None and "<function=" not in grammar, schema
