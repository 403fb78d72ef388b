"""A reasoning model's reply, as llama-server's default ``--reasoning-format auto`` returns it:
the reasoning in ``reasoning_content`` (streamed as ``delta.reasoning_content``), the answer in
``content``, a gpt-oss call as ``tool_calls``. Before, the raw reasoning (gpt-oss's channel
markers and all, or a ``<think>`` block) came back in ``content``.

The model's format is read from its real chat template (llama.cpp's copies, beside this file);
the replies are written as the models write them (gpt-oss's harmony channels as llama.cpp renders
them: ``<|channel|>``, ``<|message|>``, ``<|start|>``, ``<|constrain|>`` as text, ``<|end|>`` as none)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.errors import ApiError
from api.reasoning import split_reasoning
from api.responses import Reply
from api.schemas import parse_chat_request
from scheduler.engines.chat import compile_chat_template, reasoning_format, render_chat_template, template_inputs
from scheduler.link.messages import Delta, Done
from tests.api.streamed import assemble, cut_at, streamed_chunks, whole_view

TEMPLATES = Path(__file__).parent / "templates_s46"
TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]

GPT_OSS_TEXT = "<|channel|>analysis<|message|>The user greets. Answer briefly.<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
GPT_OSS_CALL = (
    "<|channel|>analysis<|message|>Need the weather; call the tool.<|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)
QWEN3_TEXT = "<think>\nThe user says hi.\nI should answer.\n</think>\n\nHi! What can I do for you?"
QWEN3_CALL = '<think>\nWeather: use the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
R1_TEXT = "Okay, the user says hi.\n</think>\n\nHello there."  # its template opened the block


def test_the_format_is_read_from_the_models_template() -> None:
    def fmt(name: str) -> str:
        return reasoning_format((TEMPLATES / name).read_text())

    assert fmt("gpt-oss-120b.jinja") == "harmony"
    assert fmt("Qwen-Qwen3-0.6B.jinja") == "think"
    # their generation prompt ends in "<think>\n": the reply starts inside the block
    assert fmt("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja") == "think-open"
    assert fmt("Qwen-QwQ-32B.jinja") == "think-open"
    for plain in ("qwen2.5-7b-instruct.jinja", "llama-3.1-instruct.jinja", "mistral-nemo-instruct-2407.jinja", "gemma-2-2b-it.jinja"):
        assert fmt(plain) == "none"


def _whole(text: str, fmt: str, tools: list[dict[str, Any]] | None = None, reason: str = "stop", tool_format: str = "hermes") -> dict[str, Any]:
    reply = Reply("chat", "m", tools=tools, reasoning_format=fmt, tool_format=tool_format)
    reply.add(Delta(id="j", text=text))
    return whole_view(reply.body(Done(id="j", finish_reason=reason), None)["choices"][0])


def _streamed(pieces: list[str], fmt: str, tools: list[dict[str, Any]] | None = None, reason: str = "stop", tool_format: str = "hermes") -> dict[str, Any]:
    reply = Reply("chat", "m", tools=tools, reasoning_format=fmt, tool_format=tool_format)
    return assemble(reply.first_chunks() + streamed_chunks(reply, pieces, reason)).view()


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_analysis_is_reasoning_and_final_is_content(stream: bool) -> None:
    got = _streamed(list(GPT_OSS_TEXT), "harmony") if stream else _whole(GPT_OSS_TEXT, "harmony")
    assert got == {"reasoning": "The user greets. Answer briefly.", "content": "Hello! How can I help?", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_gpt_oss_call_is_a_tool_call(stream: bool) -> None:
    got = _streamed(list(GPT_OSS_CALL), "harmony", TOOLS) if stream else _whole(GPT_OSS_CALL, "harmony", TOOLS)
    assert got == {"reasoning": "Need the weather; call the tool.", "content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}
    # its call's recipient in the role header (<|start|>assistant to=functions.NAME<|channel|>...)
    in_role = '<|channel|>analysis<|message|>Call it.<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}'
    assert _whole(in_role, "harmony", TOOLS)["calls"] == [("get_weather", '{"city": "Rome"}')]
    # no tools offered, or not this one: a call nobody asked for is dropped, as llama-server drops it
    assert _whole(GPT_OSS_CALL, "harmony") == {"reasoning": "Need the weather; call the tool.", "content": None, "calls": [], "finish_reason": "stop"}
    other = [{"name": "get_time", "parameters": {}}]
    assert _streamed(list(GPT_OSS_CALL), "harmony", other) == {"reasoning": "Need the weather; call the tool.", "content": None, "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_think_blocks_are_reasoning(stream: bool) -> None:
    def ask(text: str, fmt: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return _streamed(list(text), fmt, tools) if stream else _whole(text, fmt, tools)

    assert ask(QWEN3_TEXT, "think") == {"reasoning": "The user says hi.\nI should answer.", "content": "Hi! What can I do for you?", "calls": [], "finish_reason": "stop"}
    assert ask(QWEN3_CALL, "think", TOOLS) == {"reasoning": "Weather: use the tool.", "content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}
    assert ask(R1_TEXT, "think-open") == {"reasoning": "Okay, the user says hi.", "content": "Hello there.", "calls": [], "finish_reason": "stop"}
    # a reply that opens no block holds no reasoning; one cut short in its block is all reasoning
    assert ask("Just an answer.", "think") == {"reasoning": None, "content": "Just an answer.", "calls": [], "finish_reason": "stop"}
    assert ask("<think>Still thinking about", "think")["reasoning"] == "Still thinking about"
    assert ask("Still thinking about", "think-open")["content"] is None


def test_no_format_leaves_the_text_as_it_came() -> None:
    assert _whole(QWEN3_TEXT, "none")["content"] == QWEN3_TEXT
    assert _streamed(list(GPT_OSS_TEXT), "none")["content"] == GPT_OSS_TEXT


def test_completions_stay_raw() -> None:
    reply = Reply("completions", "m", reasoning_format="harmony")
    reply.add(Delta(id="j", text=GPT_OSS_TEXT))
    assert reply.body(Done(id="j", finish_reason="stop"), None)["choices"][0]["text"] == GPT_OSS_TEXT


REPLIES = [
    (GPT_OSS_TEXT, "harmony", None),
    (GPT_OSS_CALL, "harmony", TOOLS),
    (GPT_OSS_CALL, "harmony", None),
    (GPT_OSS_CALL, "harmony", [{"name": "get_time", "parameters": {}}]),
    ("<|channel|>analysis<|message|>a<|start|>assistant<|channel|>commentary<|message|>Let me check. <|start|>assistant<|channel|>final<|message|> <b>x</b>", "harmony", None),
    ('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', "harmony", TOOLS),  # a forced call's grammar
    (QWEN3_TEXT, "think", None),
    (QWEN3_CALL, "think", TOOLS),
    (R1_TEXT, "think-open", None),
    ("  <think> a < b </thin </think>  <think>not again</think>", "think", None),
    ("<thin", "think", None),
    (" \n ", "think-open", None),
    # a header whose <|message|> ends in the last characters it may take
    ("<|channel|>final" + " " * 491 + "<|message|>hi", "harmony", None),
    ("<|channel|>final" + " " * 520 + "<|message|>hi", "harmony", None),
]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(REPLIES), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_any_split_of_a_reply_streams_what_the_whole_reply_says(case: tuple[str, str, Any], cuts: list[int]) -> None:
    text, fmt, tools = case
    pieces = cut_at(text, cuts)
    assert _streamed(pieces, fmt, tools) == _whole(text, fmt, tools)


def test_splitting_is_linear() -> None:
    """Each piece is looked at once: a long reasoning fed token by token is not rescanned."""
    long = "<think>" + "word < and </thi more " * 20000 + "</think>answer"
    reasoning, answer = split_reasoning(long, "think")
    assert answer == "answer" and reasoning.startswith("word")
    harmony = "<|channel|>analysis<|message|>" + "x <| y " * 20000 + "<|start|>assistant<|channel|>final<|message|>ok"
    assert split_reasoning(harmony, "harmony")[1] == "ok"


def test_an_earlier_turns_reasoning_reaches_the_template() -> None:
    """A history sent back as the replies came (reasoning_content, or gpt-oss's thinking):
    gpt-oss's template writes a turn of calls' reasoning as its analysis message (llama-server
    passes it as ``thinking``); Qwen 3's writes the last turns' in a ``<think>`` block."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "Need the weather.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": TOOLS[0]}],
    }
    request = parse_chat_request(json.dumps(body).encode(), models=["m"], strict=True)  # no unknown key
    assert request.messages is not None and request.messages[1]["reasoning_content"] == "Need the weather."
    for name, written in (("gpt-oss-120b.jinja", "<|channel|>analysis<|message|>Need the weather.<|end|>"), ("Qwen-Qwen3-0.6B.jinja", "<think>\nNeed the weather.\n</think>")):
        source = (TEMPLATES / name).read_text()
        messages, extra = template_inputs(request.messages, request.tools, source, None, native_ok=True)
        prompt = render_chat_template(compile_chat_template(source), messages, bos_token="", eos_token="", **extra)
        assert written in prompt, name
    # gpt-oss's own name for it
    body["messages"][1] = {**body["messages"][1], "reasoning_content": None, "thinking": "Need the weather."}
    request = parse_chat_request(json.dumps(body).encode(), models=["m"], strict=True)
    assert request.messages is not None and request.messages[1]["reasoning_content"] == "Need the weather."


def test_reasoning_format_per_request() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat_request(json.dumps({**base, "reasoning_format": "none"}).encode(), models=["m"], strict=True).reasoning_format == "none"
    with pytest.raises(ApiError) as refused:
        parse_chat_request(json.dumps({**base, "reasoning_format": "loud"}).encode(), models=["m"])
    assert refused.value.status == 400 and refused.value.param == "reasoning_format"
    # absent: the wire form a request had before
    assert "reasoning_format" not in parse_chat_request(json.dumps(base).encode(), models=["m"]).to_wire()


def test_an_earlier_turns_reasoning_is_tokenised_as_text() -> None:
    """A reasoning sent back that quotes a control token's text ("<|im_end|>") is the model's
    text, not a turn's end: tokenised as text, as the turn's content is."""
    from scheduler.engines.chat import chat_prompt_tokens

    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    template = compile_chat_template(source)
    END = -1  # <|im_end|> as its control token

    def tokenize(text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        out: list[int] = []
        for i, part in enumerate(text.split("<|im_end|>") if special else [text]):
            out += [END] * (i > 0) + [ord(c) for c in part]
        return out

    def controls(reasoning: str) -> int:
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "reasoning_content": reasoning},
        ]

        def render(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            return render_chat_template(template, msgs, bos_token="", eos_token="", add_generation_prompt=False)

        tokens, _ = chat_prompt_tokens(render, tokenize, messages, None)
        assert "".join(chr(t) for t in tokens if t != END).count("it ends") == 1  # the reasoning is written
        return tokens.count(END)

    assert controls("\nit ends <|im_end|> here\n") == controls("\nit ends ---------- here\n")

    # gpt-oss's: a turn of calls' reasoning, given to its template as thinking
    oss = compile_chat_template((TEMPLATES / "gpt-oss-120b.jinja").read_text())
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def oss_controls(reasoning: str) -> int:
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "reasoning_content": reasoning, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ]
        messages, extra = template_inputs(messages, None, (TEMPLATES / "gpt-oss-120b.jinja").read_text(), None, native_ok=True)

        def render(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            return render_chat_template(oss, msgs, bos_token="", eos_token="", **extra)

        tokens, _ = chat_prompt_tokens(render, tokenize, messages, None)
        assert "".join(chr(t) for t in tokens if t != END).count("it ends") == 1
        return tokens.count(END)

    assert oss_controls("it ends <|im_end|> here") == oss_controls("it ends ---------- here")


def test_a_whole_reply_of_many_messages_is_split_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work is counted, not timed: the text each step of the gpt-oss splitter is handed (it
    copies what it leaves). A reply of many messages, split whole (the unstreamed reply), handed
    each step the rest of the reply: its length times the messages'."""
    from api.reasoning import HarmonySplitter

    handed = 0
    step = HarmonySplitter._step

    def counted(self: HarmonySplitter, text: str, reasoning: list[str], answer: list[str]) -> str:
        nonlocal handed
        handed += len(text)
        return step(self, text, reasoning, answer)

    monkeypatch.setattr(HarmonySplitter, "_step", counted)
    text = "<|start|>assistant<|channel|>analysis<|message|>hm<|start|>assistant<|channel|>final<|message|>x" * 5_000
    reasoning, answer = split_reasoning(text[len("<|start|>assistant") :], "harmony")
    assert answer == "x" * 5_000 and reasoning == "hm" * 5_000
    assert handed <= 8 * len(text), (handed, len(text))


def test_a_long_header_is_read_alike_wherever_the_reply_is_cut() -> None:
    """gpt-oss's header may take so many characters; one whose <|message|> ends in its last
    ones was a header unstreamed and text where a delta ended inside that <|message|>."""
    for text in ("<|channel|>final" + " " * 491 + "<|message|>hi", "<|channel|>final" + " " * 496 + "<|message|>hi"):
        whole = _whole(text, "harmony")
        for cut in range(490, len(text) + 1):
            assert _streamed([text[:cut], text[cut:]], "harmony") == whole, cut
