"""``tool_choice`` auto's grammar (llama-server's lazy grammar: ``grammar.lazy_tool_grammar``):
any text until the model opens a call, then a call of one of the tools that fits its parameters.
Checked through llguidance (the MLX engine's grammar path, ``fits``) on the grammar's text, and
through the worker, which builds it for a request (the real model's replies are in
tests/engines/test_contract.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines import grammar as grammars
from scheduler.engines.grammar import TOOL_OPEN, lazy_tool_grammar, tool_grammar, tools_or_format_grammar
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Submit
from scheduler.worker.loop import EngineWorker

pytest.importorskip("llguidance")

from tests.edge.strategies import field_values  # noqa: E402
from tests.engines.test_grammar_keywords import _byte_tokenizer, _lark, fits  # noqa: E402
from tests.engines.test_xml_tool_grammar_fuzz_s47 import schemas  # noqa: E402

WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": False},
}
CLOCK = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


def _call(name: str, arguments: Any) -> str:
    return f"{TOOL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def takes(gbnf: str, text: str) -> bool:
    """Whether ``text`` can begin a text the grammar allows (all of it consumed, not necessarily
    an end)."""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_tokenizer(), _lark(gbnf), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    data = list(text.encode("utf-8"))
    return matcher.try_consume_tokens(data) == len(data)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# text made mostly of the opening's pieces, so that near misses ("<tool_cal>", "<<tool_call")
# and whole openings come up often
pieces = st.lists(st.sampled_from(["<", "tool", "_", "call", ">", "<tool_call", "tool_call>", "x", " ", "\n", "\u00e9", "{", '"']), max_size=12).map("".join)
texts = st.one_of(pieces, st.text(max_size=30))
GRAMMAR = lazy_tool_grammar([WEATHER, CLOCK], True)


@SETTINGS
@given(text=texts)
def test_any_text_without_the_opening_is_free_and_the_opening_is_held_to_a_call(text: str) -> None:
    assert GRAMMAR is not None
    assert fits(GRAMMAR, text) == (TOOL_OPEN not in text), text


@SETTINGS
@given(text=texts.filter(lambda t: TOOL_OPEN not in t), city=st.text(max_size=8))
def test_text_then_calls_that_fit_are_allowed_and_nothing_after_them(text: str, city: str) -> None:
    assert GRAMMAR is not None
    calls = _call("get_weather", {"city": city}) + "\n" + _call("get_time", {})
    assert fits(GRAMMAR, text + calls)
    assert not takes(GRAMMAR, text + calls + "\nmore")


@pytest.mark.parametrize(
    "after",
    [
        ' {"name": "get_weather"',  # not the format's new line
        '\n{"name": "get_wether"',  # no such tool
        '\n{"name": "get_weather", "arguments": {"town": ',  # not its parameter
        '\n{"name": "get_weather", "arguments": {"city": "Paris, France"',  # past its maxLength
        '\n{"name": "get_weather", "arguments": {"city": 5',  # not its type
        "\nI will look it up.",  # words after the opening
    ],
)
def test_after_the_opening_only_a_call_that_fits_goes_on(after: str) -> None:
    assert GRAMMAR is not None
    assert takes(GRAMMAR, "Let me check.\n" + TOOL_OPEN)
    assert not takes(GRAMMAR, "Let me check.\n" + TOOL_OPEN + after)


def test_the_format_is_the_forced_calls() -> None:
    string_city = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    coder = lazy_tool_grammar([string_city], True, fmt="qwen3_coder")
    assert coder is not None and "<function=get_weather>" in coder
    assert fits(coder, "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    # the rules that hold the call are the forced grammar's, for each format
    for fmt in ("hermes", "qwen3_coder", "glm45"):
        lazy, forced = lazy_tool_grammar([string_city], False, fmt=fmt), tool_grammar([string_city], "required", False, fmt=fmt)
        assert lazy is not None and forced is not None
        assert {r for r in lazy.splitlines() if not r.startswith(("root", "lazy-text"))} == {r for r in forced.splitlines() if not r.startswith("root")}
    # (Llama 3.x's and Mistral's own openings: tests/engines/test_lazy_tool_grammar_own_formats_s52.py)
    assert lazy_tool_grammar([], True) is None


@SETTINGS
@given(literal=st.text(alphabet="ab]^-\\\n", min_size=1, max_size=5), text=st.text(alphabet="ab]^-\\\nc", max_size=14))
def test_text_without_a_literal_is_exactly_the_text_the_literal_does_not_occur_in(literal: str, text: str) -> None:
    """The free text's rules for any literal, self-overlapping ones ("aab", "abab") and those
    with a character class's own characters in them included."""
    conv = grammars._converter()
    conv._add_rule("root", grammars._text_without(conv, literal))
    gbnf = grammars._format(conv)
    grammars.check_bounds(gbnf)
    assert fits(gbnf, text) == (literal not in text), (literal, text)


def test_rules_a_tools_defs_already_named_are_left_to_them() -> None:
    tool = {
        "name": "f",
        "parameters": {"$defs": {"lazy-text-0": {"type": "integer"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/lazy-text-0"}}, "required": ["n"]},
    }
    grammar = lazy_tool_grammar([tool], False)
    assert grammar is not None
    assert fits(grammar, "hi " + _call("f", {"n": 3})) and not takes(grammar, "hi " + TOOL_OPEN + '\n{"name": "f", "arguments": {"n": "x')


# -- the worker: which requests get it ---------------------------------------------------------


def _worker(features: frozenset[str]) -> EngineWorker:
    engine = SimEngine(n_lanes=1, lane_ctx=512)
    engine.features = features
    engine.check_grammar = lambda g: None  # type: ignore[method-assign]
    return EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="m", prepare_in_thread=False)


def _request(tools: list[dict[str, Any]], choice: Any = "auto", **extra: Any) -> dict[str, Any]:
    return {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": choice, **extra}


def test_the_worker_gives_tool_choice_auto_the_lazy_grammar() -> None:
    worker = _worker(frozenset({"grammar"}))
    assert worker.tool_format == "hermes"
    assert worker._sampling(_request([WEATHER])).grammar == lazy_tool_grammar([WEATHER], True)
    assert worker._sampling(_request([WEATHER], parallel_tool_calls=False)).grammar == lazy_tool_grammar([WEATHER], False)
    # forced, none, and auto beside a response_format are as they were
    assert worker._sampling(_request([WEATHER], "required")).grammar == tool_grammar([WEATHER], "required", True)
    assert worker._sampling(_request([WEATHER], "none")).grammar is None
    both = worker._sampling(_request([WEATHER], response_format={"type": "json_object"})).grammar
    assert both == tools_or_format_grammar([WEATHER], True, {"type": "json_object"})


def test_tool_choice_auto_stays_free_where_no_grammar_can_hold_the_tools() -> None:
    """An engine without a grammar sampler (the simulated one) and tools whose parameters no
    grammar can hold answer auto requests as before, free, not with a 400 (a forced call of
    such tools is refused, as it was)."""
    from scheduler.worker.loop import Refusal

    assert _worker(frozenset())._sampling(_request([WEATHER])).grammar is None
    odd = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "\\p{L}+"}}}}
    worker = _worker(frozenset({"grammar"}))
    with pytest.raises(grammars.GrammarError):
        lazy_tool_grammar([odd], True)
    assert worker._sampling(_request([odd])).grammar is None
    with pytest.raises(Refusal):
        worker._sampling(_request([odd], "required"))
    worker.engine.check_grammar = lambda g: "the grammar does not parse"  # type: ignore[method-assign]
    assert worker._sampling(_request([WEATHER])).grammar is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=st.one_of(schemas, field_values(st.sampled_from(["type", "properties", "required", "items", "$ref", "$defs", "enum", "pattern"]), max_leaves=8)))
def test_hostile_tool_parameters_give_auto_a_grammar_or_none_never_an_error(params: Any) -> None:
    """Tools whose parameters were never read in ``auto`` (nothing was held) are read now: each
    gives the lazy grammar or none (the reply free, as before), never a refusal or a crash."""
    worker = _worker(frozenset({"grammar"}))
    for fmt in ("hermes", "qwen3_coder"):
        worker.__dict__["tool_format"] = fmt
        grammar = worker._sampling(_request([{"name": "f", "parameters": params}])).grammar
        if grammar is not None:
            grammars.check_bounds(grammar)


# -- a reasoning block is free whole (llama-server suspends its lazy grammar while the model
# reasons): a "<tool_call>" written while thinking is words about a call; held, it ended the
# reply inside the block, with no call and no answer

CALL = _call("get_weather", {"city": "Oslo"})
MUSING = "The user wants weather. I could write <tool_call> {city} or <tool_call>\nlater.\n"


def test_inside_an_open_reasoning_block_a_call_opening_is_free_and_after_it_held() -> None:
    grammar = lazy_tool_grammar([WEATHER], True, thinking=grammars.THINKING_OPEN)
    assert grammar is not None
    assert fits(grammar, MUSING)  # (cut while thinking)
    assert fits(grammar, MUSING + "</think>\n\nLet me check.\n" + CALL)
    assert fits(grammar, MUSING + "</think>\n\nIt is sunny.")
    assert not takes(grammar, MUSING + "</think>\n" + TOOL_OPEN + " {")


def test_a_reasoning_block_the_reply_may_open_is_free_and_text_without_one_is_held() -> None:
    grammar = lazy_tool_grammar([WEATHER], True, thinking=grammars.THINKING_MAY_OPEN)
    assert grammar is not None
    assert fits(grammar, "<think>\n" + MUSING + "</think>\n\n" + CALL)
    assert not takes(grammar, "<think>\n" + MUSING + "</think>\n\n" + TOOL_OPEN + " {")
    assert fits(grammar, "Sure.\n" + CALL) and not takes(grammar, "Sure.\n" + TOOL_OPEN + " {")
    assert not takes(grammar, "Sure. <think>" + TOOL_OPEN + " {")  # (a block opens the reply or is none)


def _templated_worker(template_file: str) -> EngineWorker:
    """A worker on the simulated engine rendering with a real model's template (the worker reads
    its formats from it), with a grammar sampler that takes every grammar."""
    from pathlib import Path

    from scheduler.engines.chat import compile_chat_template, render_chat_template

    source = (Path(__file__).parent.parent / "api" / "templates_s46" / template_file).read_text()
    engine = SimEngine(n_lanes=1, lane_ctx=4096)
    engine.features = frozenset({"template_vars", "grammar"})
    engine.chat_template = source
    engine.render_chat = lambda messages, **extra: render_chat_template(compile_chat_template(source), messages, bos_token="", eos_token="", **extra)  # type: ignore[method-assign]
    engine.check_grammar = lambda g: None  # type: ignore[method-assign]
    return EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=4096), model_name="m", prepare_in_thread=False)


@pytest.mark.parametrize(
    ("template_file", "on", "off"),
    [
        # the generation prompt opens the block (unless thinking is turned off)
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", grammars.THINKING_OPEN, grammars.THINKING_MAY_OPEN),
        # Qwen3 opens it itself; turned off, the template writes an empty block in the prompt
        ("Qwen-Qwen3-0.6B.jinja", grammars.THINKING_MAY_OPEN, grammars.THINKING_MAY_OPEN),
        ("qwen2.5-7b-instruct.jinja", None, None),  # no reasoning block
    ],
)
def test_the_worker_leaves_the_reasoning_block_free_where_the_template_has_one(template_file: str, on: str | None, off: str | None) -> None:
    worker = _templated_worker(template_file)
    assert worker.tool_format == "hermes"
    for kwargs, thinking in (({}, on), ({"chat_template_kwargs": {"enable_thinking": False}}, off)):
        request = _request([WEATHER], **kwargs)
        job, _ = worker._build_job("j", None, Submit("j", request))  # type: ignore[arg-type]
        assert job.sampling.grammar == lazy_tool_grammar([WEATHER], True, thinking=thinking), (kwargs, thinking)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_a_tool_list_too_big_to_keep_is_made_each_time_and_never_held_in_the_cache(fmt: str) -> None:
    """Every request with tools and tool_choice auto makes a grammar now: a cache of them keyed by
    the whole tool list would hold up to 64 request bodies (8 MiB each) in the worker. A list
    past MAX_CACHED_TOOLS_CHARS is made each time, nothing kept."""
    big = {**WEATHER, "description": "x" * (grammars.MAX_CACHED_TOOLS_CHARS + 1)}
    grammars._cached_tool_grammar.cache_clear()
    grammars._cached_xml_tool_grammar.cache_clear()
    made = lazy_tool_grammar([big], parallel=True, fmt=fmt)
    assert made is not None and TOOL_OPEN in made
    assert grammars._cached_tool_grammar.cache_info().currsize == grammars._cached_xml_tool_grammar.cache_info().currsize == 0
    small = lazy_tool_grammar([WEATHER], parallel=True, fmt=fmt)
    assert small is not None
    assert grammars._cached_tool_grammar.cache_info().currsize + grammars._cached_xml_tool_grammar.cache_info().currsize >= 1
