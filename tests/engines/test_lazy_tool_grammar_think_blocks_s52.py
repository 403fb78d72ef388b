"""``tool_choice`` auto for models that reason in ``[THINK]...[/THINK]`` (Magistral Small
2507/2509, Ministral 3 Reasoning: reasoning format "mistral", Mistral's call format), as llama.cpp's
ministral_3 handler reads their replies (common/chat.cpp: an optional ``[THINK]`` block first,
then content up to ``[TOOL_CALLS]``, then the calls): the block is free whole, a
``[TOOL_CALLS]`` or ``<tool_call>`` written in it is words about a call, and after it the text is
free until a call opens, which is then held to the tools' schemas. Before, these models were left
with no grammar in auto (a call of a tool never offered, or with arguments against the schema,
was written and read as a call). The block is the one ``<think>`` models have
(``grammar.Thinking``), with the markers of the model's reasoning format; whitespace before its
opening is what the reply's splitter (api/reasoning.py) skips. Checked through llguidance on the
grammar's text, against the splitter and the reply's reader streamed and not, through the
worker with the real Ministral 3 Reasoning template, and on the bundled model's grammar sampler
(tests/engines/test_contract.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api.reasoning import split_reasoning
from api.responses import Reply
from scheduler.engines import chat as chat_format
from scheduler.engines import grammar as grammars
from scheduler.engines.grammar import TOOL_OPEN, Thinking, check_bounds, lazy_tool_grammar, tool_grammar
from scheduler.link.messages import Delta, Done, Submit

pytest.importorskip("llguidance")

from tests.api.streamed import assemble, streamed_chunks, whole_view  # noqa: E402
from tests.engines.test_grammar_keywords import fits  # noqa: E402
from tests.engines.test_lazy_tool_grammar_own_formats_s52 import TOOLS, _mistral_calls, _tagged  # noqa: E402
from tests.engines.test_lazy_tool_grammar_s48 import _request, _templated_worker, takes  # noqa: E402

OPEN, CLOSE = chat_format.REASONING_BLOCKS["mistral"]
MAGISTRAL = Thinking(False, OPEN, CLOSE)
GRAMMAR = lazy_tool_grammar(TOOLS, True, fmt="mistral", thinking=MAGISTRAL)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# hostile text made of the markers' and the openings' pieces, so that whole markers and near
# misses come up often
_PIECES = ["[THINK]", "[/THINK", "/THINK]", "[/", "[TOOL_CALLS]", "[TOOL_", "CALLS]", "[ARGS]", "[CALL_ID]", "<tool_call>", "<tool_",
           "get_weather", "{", "}", '"', "[", "]", " ", "\n", "x", "\u00e9"]  # fmt: skip
hostile = st.one_of(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join), st.text(max_size=24))
reasoning = hostile.filter(lambda t: CLOSE not in t)  # anything the block can hold
# text before a call: anything that opens none (a "[/THINK]" or "[THINK]" in it is text)
answers = hostile.filter(lambda t: "[TOOL_CALLS]" not in t and TOOL_OPEN not in t)
# whitespace the splitter skips before the opening (any of Python's, as str.lstrip)
_SPACES = [c for c in map(chr, range(0x3001)) if c.isspace()]
leads = st.lists(st.sampled_from(_SPACES), max_size=grammars.LEAD_SPACE).map("".join)
cities = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)


def _read(text: str, *, size: int | None = None) -> dict[str, Any]:
    """What the client reads of a Magistral reply ``text``: built whole, or streamed in pieces of
    ``size`` characters (reasoning, content, calls as (name, arguments), finish reason)."""
    reply = Reply("chat", "m", tools=TOOLS, tool_format="mistral", reasoning_format="mistral")
    if size is None:
        reply.add(Delta("j", text))
        return whole_view(reply.body(Done("j", "stop"), None)["choices"][0])
    return assemble(streamed_chunks(reply, [text[i : i + size] for i in range(0, len(text), size)])).view()


def _read_alike(text: str) -> dict[str, Any]:
    whole = _read(text)
    for size in (1, 4, max(len(text), 1)):
        assert _read(text, size=size) == whole, (text, size)
    return whole


def test_the_grammar_is_mistrals_with_the_block_before_it_and_forced_calls_are_as_they_were() -> None:
    assert GRAMMAR is not None
    check_bounds(GRAMMAR)
    assert GRAMMAR != lazy_tool_grammar(TOOLS, True, fmt="mistral")
    assert GRAMMAR != lazy_tool_grammar(TOOLS, True, fmt="mistral", thinking=grammars.THINKING_MAY_OPEN)  # (its own markers)
    assert tool_grammar(TOOLS, "required", True, fmt="mistral") == tool_grammar(TOOLS, "required", True)


@SETTINGS
@given(lead=leads, thought=reasoning, words=answers)
@example(lead="", thought='I will write [TOOL_CALLS]get_weather[ARGS]{"town": 5} and <tool_call>{', words="")
@example(lead="\n", thought="[THINK][TOOL_CALLS][/THINK", words="[/THINK] [THINK]")
@example(lead=" \u3000", thought="[TOOL_CALLS]search[ARGS]", words="Sure.")
def test_the_reasoning_block_is_free_whole_and_so_is_the_text_after_it(lead: str, thought: str, words: str) -> None:
    """Whatever the model writes while it reasons, calls' openings included, goes on (and may be
    cut there); after the block, text that opens no call ends the reply as it likes. The
    splitter reads the same block: the reasoning is what was written in it, no call."""
    assert GRAMMAR is not None
    opened = lead + OPEN + thought
    assert fits(GRAMMAR, opened), opened
    text = opened + CLOSE + words
    assert fits(GRAMMAR, text), text
    assert split_reasoning(text, "mistral") == (thought.strip(), words.lstrip())
    read = _read_alike(text)
    assert read["calls"] == [] and read["reasoning"] == (thought.strip() or None), read


@SETTINGS
@given(lead=leads, thought=reasoning, words=answers, form=st.sampled_from(["named", "array", "array-id", "tagged"]), args=st.lists(cities, min_size=1, max_size=3))
@example(lead="", thought="[TOOL_CALLS]get_time[ARGS]{}", words="", form="named", args=["Paris"])
def test_calls_after_the_block_are_held_and_read_as_those_calls_streamed_or_not(
    lead: str, thought: str, words: str, form: str, args: list[str]
) -> None:
    assert GRAMMAR is not None
    calls: list[tuple[str, Any]] = [("get_weather", {"city": city}) for city in args] + [("get_time", {})]
    written = _tagged(calls) if form == "tagged" else _mistral_calls(form, calls)
    text = lead + OPEN + thought + CLOSE + words + written
    assert fits(GRAMMAR, text), text
    assert not takes(GRAMMAR, text + "\nmore"), text  # then only the end
    read = _read_alike(text)
    assert [(name, json.loads(arguments)) for name, arguments in read["calls"]] == calls, read
    assert read["reasoning"] == (thought.strip() or None) and read["finish_reason"] == "tool_calls", read


@pytest.mark.parametrize(
    ("opened", "after"),
    [
        ("[THINK]Let me see.[/THINK]Sure. [TOOL_CALLS]", "search[ARGS]{}"),  # no such tool
        ("[THINK]Let me see.[/THINK][TOOL_CALLS]", 'get_weather[ARGS]{"town": '),  # not its parameter
        ("[THINK][TOOL_CALLS] maybe[/THINK][TOOL_CALLS]", 'get_weather[ARGS]{"city": 5'),  # not its type
        ("[THINK]x[/THINK][TOOL_CALLS]", "I will look it up."),
        ("[THINK]x[/THINK]", '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5'),
        # no block: held from the start, as before; a block opens the reply or is none
        ("Sure. [TOOL_CALLS]", "search[ARGS]{}"),
        ("Sure. [THINK]", "[TOOL_CALLS]search"),
        (" " * (grammars.LEAD_SPACE + 1) + "[THINK]", "[TOOL_CALLS]search"),  # (past the whitespace the grammar lets stand)
    ],
)
def test_once_a_call_opens_after_the_block_only_a_call_of_the_tools_that_fits_goes_on(opened: str, after: str) -> None:
    assert GRAMMAR is not None
    assert takes(GRAMMAR, opened) and not takes(GRAMMAR, opened + after)


def test_a_think_block_may_follow_whitespace_as_the_splitter_reads_it() -> None:
    """The ``<think>`` block is the same machinery: the splitter takes a reply that opens it
    after whitespace as reasoning, and the grammar now leaves that block free too (before, a
    ``<tool_call>`` in it was held as a call)."""
    grammar = lazy_tool_grammar(TOOLS, True, thinking=grammars.THINKING_MAY_OPEN)
    assert grammar is not None
    text = "\n<think>I could write <tool_call> {city}</think>It is sunny."
    assert split_reasoning(text, "think") == ("I could write <tool_call> {city}", "It is sunny.")
    assert fits(grammar, text)


# -- the worker: the real template tells the block and the format -----------------------------


def test_the_worker_holds_ministral_3_reasonings_calls_and_leaves_its_block_free() -> None:
    """Ministral 3 Reasoning's template (the same as Magistral Small 2509's in what matters here:
    [THINK] in its system prompt, [TOOL_CALLS]name[ARGS] calls, a generation prompt that opens
    no block) gives the Mistral format's grammar with a [THINK] block the reply may open."""
    worker = _templated_worker("ministral-3-14b-reasoning-2512.jinja")
    assert (worker.tool_format, worker.reasoning_format) == ("mistral", "mistral")
    job, _ = worker._build_job("j", None, Submit("j", _request(TOOLS)))  # type: ignore[arg-type]
    assert job.sampling.grammar == GRAMMAR
    # forced calls are as they were
    assert worker._sampling(_request(TOOLS, "required")).grammar == tool_grammar(TOOLS, "required", True)

