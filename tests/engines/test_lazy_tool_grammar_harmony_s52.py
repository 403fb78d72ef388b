"""``tool_choice`` auto for gpt-oss (``grammar.lazy_tool_grammar`` with ``fmt`` "harmony"), as
llama.cpp's common_chat_params_init_gpt_oss holds it lazily: the reply's messages are free
(analysis, final answers, preambles, a "to=functions." written in their text) until a call's
recipient opens in a header (``<|channel|>commentary to=functions.``, ``<|start|>assistant
to=functions.``, or at the reply's start, which follows the generation prompt's
``<|start|>assistant``), and from there the call is one of the tools' with arguments that fit
their schema, then the end (``<|call|>`` ends generation). Before, the worker left gpt-oss free
in auto: a call of a function never offered, or with arguments against its schema, was
written, and read as a call where the name was offered. Checked through llguidance on the
grammar's text (the MLX engine's path; the llama.cpp engine's compile and a real model's call:
tests/engines/test_contract.py), against the reply's reader (api/reasoning.py's
HarmonySplitter and api/responses.py) streamed and not, and through the worker with gpt-oss's
own template."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.engines import grammar as grammars
from scheduler.engines.grammar import check_bounds, lazy_tool_grammar, tool_grammar

pytest.importorskip("llguidance")

from tests.api.test_reasoning_s47 import _streamed, _whole  # noqa: E402
from tests.edge.strategies import field_values  # noqa: E402
from tests.engines.test_grammar_keywords import fits  # noqa: E402
from tests.engines.test_lazy_tool_grammar_own_formats_s52 import SETTINGS, TOOLS  # noqa: E402
from tests.engines.test_lazy_tool_grammar_s48 import _request, _templated_worker, _worker, takes  # noqa: E402
from tests.engines.test_xml_tool_grammar_fuzz_s47 import schemas  # noqa: E402

HARMONY = lazy_tool_grammar(TOOLS, True, fmt="harmony")

# where a call's recipient opens (llama.cpp's triggers, and the splitter's other headers a model
# writes: a call in the final channel, a channel opened without a start)
_S = "[ \t\n\r]"
OPENING = re.compile(f"^{_S}*to=functions\\.|<\\|start\\|>assistant{_S}+to=functions\\.|<\\|channel\\|>(commentary|analysis|final){_S}+to=functions\\.")

ANALYSIS = "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>"
NEXT = "<|start|>assistant"


def _in_channel(name: str, arguments: Any, *, channel: str = "commentary", kind: str = " <|constrain|>json") -> str:
    return f"<|channel|>{channel} to=functions.{name}{kind}<|message|>{json.dumps(arguments)}"


def _in_role(name: str, arguments: Any, *, channel: str = "commentary", kind: str = " json") -> str:
    return f" to=functions.{name}<|channel|>{channel}{kind}<|message|>{json.dumps(arguments)}"


def _calls(text: str, tools: list[dict[str, Any]] = TOOLS) -> list[tuple[str, Any]]:
    """The calls the reply's reader takes from ``text`` (a gpt-oss reply), the same streamed (in
    pieces of a few sizes) as unstreamed: (name, arguments parsed)."""
    whole = _whole(text, "harmony", tools)
    for size in (1, 7, len(text)):
        assert _streamed([text[i : i + size] for i in range(0, len(text), size)], "harmony", tools) == whole, (text, size)
    return [(name, json.loads(arguments)) for name, arguments in whole["calls"]]


def test_gpt_oss_has_a_grammar_in_auto_and_its_forced_calls_are_as_they_were() -> None:
    assert HARMONY is not None
    check_bounds(HARMONY)
    # forced: the <tool_call> format from the reply's first token (the splitter reads it raw)
    assert tool_grammar(TOOLS, "required", True, fmt="harmony") == tool_grammar(TOOLS, "required", True)
    # gpt-oss reasons in channels, never in a block
    assert lazy_tool_grammar(TOOLS, True, fmt="harmony", thinking=grammars.THINKING_MAY_OPEN) is None


def test_the_worker_gives_gpt_oss_the_harmony_grammar() -> None:
    """gpt-oss's real template: the worker takes its replies for harmony (its tool format says
    "hermes": the template writes no call format of its own) and holds its calls in auto."""
    worker = _templated_worker("gpt-oss-120b.jinja")
    assert worker.reasoning_format == "harmony" and worker.tool_format == "hermes"
    assert worker._sampling(_request(TOOLS)).grammar == HARMONY
    assert worker._sampling(_request(TOOLS, "required")).grammar == tool_grammar(TOOLS, "required", True)
    assert worker._sampling(_request(TOOLS, "none")).grammar is None
    # the generation prompt ends with "<|start|>assistant": the reply may open with the role's recipient
    tools = [{"type": "function", "function": {**t, "description": "d"}} for t in TOOLS]
    assert worker.engine.render_chat([{"role": "user", "content": "hi"}], tools=tools, add_generation_prompt=True).endswith(NEXT)


REALISTIC = [
    # analysis, then the call, recipient in the channel (llama.cpp renders <|end|>; MLX none)
    (ANALYSIS + NEXT + _in_channel("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
    ("<|channel|>analysis<|message|>Call it." + NEXT + _in_channel("get_time", {}), [("get_time", {})]),
    # recipient in the role header, after analysis or opening the reply
    (ANALYSIS + NEXT + _in_role("get_weather", {"city": "Rome"}), [("get_weather", {"city": "Rome"})]),
    (_in_role("get_time", {}, kind="<|constrain|>json"), [("get_time", {})]),
    # the call opening the reply, no content type, in the analysis channel
    (_in_channel("get_weather", {"city": "Oslo"}, channel="analysis", kind=""), [("get_weather", {"city": "Oslo"})]),
    # a preamble, then the call
    (ANALYSIS + NEXT + "<|channel|>commentary<|message|>Checking.<|end|>" + NEXT + _in_channel("get_time", {}), [("get_time", {})]),
    # gpt-oss-20b's stray "to=assistant" before its channel stays free
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|>" + NEXT + _in_channel("get_time", {}), [("get_time", {})]),
    # a built-in tool's call stays free, as at the reply's start in llama.cpp (the reader drops it)
    (ANALYSIS + NEXT + ' to=browser.search<|channel|>commentary json<|message|>{"query": 5}', []),
    # final answers, and "to=functions." in a message's text
    (ANALYSIS + NEXT + "<|channel|>final<|message|>Hello!", []),
    ('<|channel|>analysis<|message|>I could write to=functions.get_weather {"city": 5} or to=functions.search.<|end|>'
     + NEXT + "<|channel|>final<|message|>It is sunny; to=functions.get_weather says so.", []),
    # a generic block written in a message's text is free, arguments against the schema and all,
    # and it is text (session 53: it was read as a call), the recipient's call the only one
    (ANALYSIS + NEXT + '<|channel|>final<|message|><tool_call>{"name": "get_weather", "arguments": {"city": 5}}</tool_call>', []),
    (ANALYSIS + NEXT + '<|channel|>commentary<|message|><tool_call>{"name": "get_time"}</tool_call><|end|>' + NEXT
     + _in_channel("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "calls"), REALISTIC)
def test_realistic_replies_fit_and_are_read_as_their_calls_streamed_or_not(text: str, calls: list[tuple[str, Any]]) -> None:
    assert HARMONY is not None
    assert fits(HARMONY, text), text
    assert _calls(text) == calls
    if calls:  # a call ends the reply: <|call|> (an end of generation) or nothing comes after it
        assert not takes(HARMONY, text + "<|end|>") and not takes(HARMONY, text + "x")


@pytest.mark.parametrize(
    ("opened", "after"),
    [
        (ANALYSIS + NEXT + "<|channel|>commentary to=functions.", "search <|constrain|>json<|message|>{}"),  # not offered
        (NEXT[:0] + "<|channel|>commentary to=functions.", "get_weathers<|message|>"),
        (ANALYSIS + NEXT + " to=functions.", "get_weather<|channel|>commentary json<|message|>{\"town\": "),  # not its parameter
        ("<|channel|>commentary to=functions.", 'get_weather<|message|>{"city": 5'),  # not its type
        ("<|channel|>commentary to=functions.", 'get_weather<|message|>{"city": "Paris, France"'),  # past its maxLength
        ("<|channel|>commentary to=functions.", "get_weather<|message|>Paris"),  # no JSON
        (" to=functions.", "get_weather<|channel|>final<|message|>"),  # a call's channel is commentary or analysis
        (" to=functions.", "get_weather <|channel|>commentary<|message|>"),
        ("<|channel|>final to=functions.", "get_time<|message|>{} and more"),  # the call, then the end
    ],
)
def test_once_a_recipient_opens_only_a_call_of_the_tools_that_fits_goes_on(opened: str, after: str) -> None:
    assert HARMONY is not None
    assert takes(HARMONY, opened) and not takes(HARMONY, opened + after), after


# text made of the markers' pieces (and no tool's name, so no whole call), so that near misses
# and whole openings come up often
pieces = st.lists(
    st.sampled_from(["<|channel|>", "<|start|>", "<|message|>", "<|end|>", "<|constrain|>", "assistant", "analysis", "commentary", "final",
                     "to=", "functions.", "to=functions.", "to=assistant", "json", " ", "\n", "\t", "<|", "x", "\u00e9", "{", '"', "}"]),
    max_size=14,
).map("".join)  # fmt: skip
texts = st.one_of(pieces, st.text(max_size=20))


@SETTINGS
@given(text=texts)
@example(text="to=functions.")  # (the reply's start: the role's recipient)
@example(text="\n to=functions.")
@example(text="<|start|>assistant\t\n to=functions.")
@example(text="<|start|>assistantto=functions.")  # (no recipient to the splitter: free)
@example(text="<|channel|>final to=functions.")
@example(text="<|channel|>commentary to=functions")  # (cut inside the opening: not yet one)
@example(text="x to=functions.get_weather")
def test_text_is_free_unless_a_calls_recipient_opens_in_a_header(text: str) -> None:
    assert HARMONY is not None
    assert fits(HARMONY, text) == (OPENING.search(text) is None), text


cities = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<"), max_size=30)


@SETTINGS
@given(
    city=cities,
    thought=words,
    in_role=st.booleans(),
    channel=st.sampled_from(["commentary", "analysis"]),
    kind=st.sampled_from(["", " json", " <|constrain|>json", "<|constrain|>json"]),
    end=st.sampled_from(["<|end|>", ""]),
)
def test_a_call_the_grammar_allows_is_read_as_that_call_streamed_or_not(city: str, thought: str, in_role: bool, channel: str, kind: str, end: str) -> None:
    assert HARMONY is not None
    call = (_in_role if in_role else _in_channel)("get_weather", {"city": city}, channel=channel, kind=kind)
    text = f"<|channel|>analysis<|message|>{thought}{end}{NEXT}{call}"
    assert fits(HARMONY, text), text
    assert _calls(text) == [("get_weather", {"city": city})]


names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names, other=names)
def test_any_name_the_reader_takes_is_held_as_written_and_no_other_opens_a_call(name: str, other: str) -> None:
    """A name with quotes, backslashes, control characters, non-ASCII: its call is written as it
    is and read back as it. A name the splitter cannot read (whitespace or "<" ends a
    recipient) has no call: with no other tool, no grammar (the reply free, as before)."""
    tools = [{"name": name, "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]
    grammar = lazy_tool_grammar(tools, True, fmt="harmony")
    if re.fullmatch(r"[^\s<\x00]+", name) is None:
        assert grammar is None
        return
    assert grammar is not None
    check_bounds(grammar)
    text = ANALYSIS + NEXT + _in_channel(name, {"n": 1})
    assert fits(grammar, text), text
    assert _calls(text, tools) == [(name, {"n": 1})]
    if other != name:
        assert not takes(grammar, f"<|channel|>commentary to=functions.{other}<|message|>"), other


def test_the_argument_rules_are_the_forced_calls_own_made_once() -> None:
    forced = tool_grammar(TOOLS, "required", False)
    assert forced is not None and HARMONY is not None
    rules = {line for line in forced.splitlines() if not line.startswith("root")}
    assert rules <= set(HARMONY.splitlines())
    assert sum(line.startswith("args0 ::=") for line in HARMONY.splitlines()) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=st.one_of(schemas, field_values(st.sampled_from(["type", "properties", "required", "items", "$ref", "$defs", "enum", "pattern"]), max_leaves=8)))
def test_hostile_tool_parameters_give_gpt_oss_a_grammar_or_none_never_an_error(params: Any) -> None:
    """Tools whose parameters were never read in ``auto`` for gpt-oss are read now: each gives the
    grammar, within bounds, whose calls share the forced call's arguments rule, or none (the
    reply free, as before), never a refusal or a crash."""
    worker = _worker(frozenset({"grammar"}))
    worker.__dict__["reasoning_format"] = "harmony"
    grammar = worker._sampling(_request([{"name": "f", "parameters": params}])).grammar
    if grammar is not None:
        check_bounds(grammar)
        rules = dict(line.split(" ::= ", 1) for line in grammar.split("\n") if line)
        assert f"{rules['call-arguments']}" in rules["harmony-channel"]


def test_on_mlx_the_harmony_markers_special_tokens_stand_for_their_text(tmp_path: Any) -> None:
    """On MLX gpt-oss's markers are special tokens, which llguidance reads as no text; the masks
    let one stand for its text where the grammar holds it (scheduler/engines/token_mask.py): a
    reply made of them goes through the grammar token by token, a call's name is held, and
    <|call|> (an end of generation) ends it. Checked on a vocabulary built here (every byte a
    token, the markers added special as gpt-oss's tokenizer.json adds them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    from scheduler.engines.hf_vocab import RENDERED_CONTROL
    from scheduler.engines.token_mask import TokenMasks
    from tests.engines.test_token_mask_specials_s51 import spell

    markers = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers])
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    ids = {m: tok.token_to_id(m) for m in markers}
    # (<|end|> ends a message, not the generation, and is text, as the MLX engine reads gpt-oss's
    # vocabulary: hf_vocab.end_is_text)
    masks = TokenMasks(tmp_path / "tokenizer.json", tok.get_vocab_size(), [ids["<|call|>"], ids["<|return|>"]], (*RENDERED_CONTROL, "<|end|>"))
    assert HARMONY is not None
    m = masks.matcher(HARMONY)

    def take(*parts: str) -> None:
        for part in parts:
            for t in [ids[part]] if part in ids else spell(tok, part):
                assert m.allowed()[t], (part, t)
                m.accept(t)

    take("<|channel|>", "analysis", "<|message|>", "Use to=functions.get_weather.", "<|end|>", "<|start|>", "assistant", "<|channel|>", "commentary to=functions.")
    assert not m.allowed()[ids["<|call|>"]] and not m.allowed()[spell(tok, "s")[0]]  # (no "search")
    take("get_weather", " ", "<|constrain|>", "json", "<|message|>", '{"city": "Paris"}')
    assert m.allowed()[ids["<|call|>"]] and not m.allowed()[ids["<|start|>"]]
