"""What the worker gives a model's own chat template, checked against what llama.cpp's server
(common/chat.cpp) gives it: the templates in templates_s46/ are the upstream ones (llama.cpp's
models/templates/). The prompt is read back from the worker's tokens (the simulated engine's
tokens are bytes), so each test sees what the model would be given."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.chat import compile_chat_template, render_chat_template
from scheduler.engines.sim import SimEngine
from scheduler.worker.loop import EngineWorker, Refusal

TEMPLATES = Path(__file__).parent / "templates_s46"
LLAMA31 = (TEMPLATES / "llama-3.1-instruct.jinja").read_text()
LLAMA32 = (TEMPLATES / "llama-3.2-3b-instruct.jinja").read_text()
TOOLS = [{"name": "get_weather", "description": "The weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def _prompt(template: str, request: dict[str, Any]) -> str:
    """The prompt the worker builds for the chat ``request`` on a model with ``template``."""
    engine = SimEngine(n_lanes=1, lane_ctx=4096)
    engine.features = frozenset({"template_vars"})
    engine.chat_template = template
    compiled = compile_chat_template(template)
    engine.render_chat = lambda messages, **extra: render_chat_template(compiled, messages, bos_token="<s>", eos_token="</s>", **extra)  # type: ignore[method-assign]
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=4096), model_name="m", prepare_in_thread=False)
    tokens, _, _, _ = worker._prompt_tokens({"endpoint": "chat", **request}, "")
    return bytes(tokens).decode()


def _today(template: str, request: dict[str, Any]) -> tuple[str, set[str]]:
    """(the prompt, the dates it may say: today's, read before and after it is built)"""
    before = time.strftime("%d %b %Y")
    text = _prompt(template, request)
    return text, {before, time.strftime("%d %b %Y")}


@pytest.mark.parametrize("template", [LLAMA31, LLAMA32], ids=["llama-3.1", "llama-3.2"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["chat", "tools"])
def test_a_llama3_template_is_told_todays_date(template: str, tools: Any) -> None:
    """Llama 3.1's template writes "Today Date: " + ``date_string``, which llama.cpp's server sets
    to today (Llama 3.2's and 3.3's call ``strftime_now``). Before, it was not given: every
    prompt said "Today Date: 26 Jul 2024" and the model answered questions about today with it."""
    request: dict[str, Any] = {"messages": [{"role": "user", "content": "What day is it?"}]}
    if tools:
        request["tools"] = tools
    text, today = _today(template, request)
    assert "26 Jul 2024" not in text
    assert any(f"Today Date: {day}\n" in text for day in today)


def test_chat_template_kwargs_set_the_date() -> None:
    request = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"date_string": "01 Jan 2030"}}
    assert "Today Date: 01 Jan 2030\n" in _prompt(LLAMA31, request)


def test_a_template_that_refuses_the_messages_is_a_refusal() -> None:
    # the worker's path for a template's raise_exception is unchanged: a 400 naming the messages
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    request = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call, call]}], "tools": TOOLS}
    with pytest.raises(Refusal, match="single tool-calls"):
        _prompt(LLAMA31, request)


QWEN25 = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "Thanks. Write a haiku about it."},
]


def test_a_tool_history_without_tools_is_in_the_templates_own_format() -> None:
    """A request with earlier calls and results but no ``tools`` (an agent's follow-up that
    offers none) was rendered in the generic format: the calls as ``<tool_call>`` text in the
    assistant's turn and the results as user turns, which a Llama 3.1 model never saw in
    training. llama.cpp's server gives the template the messages as they are; so does the worker
    now, as it does when tools are offered (with no ``tools`` variable)."""
    text = _prompt(LLAMA31, {"messages": HISTORY})
    assert '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>" in text
    assert "<tool_call>" not in text and "<tool_response>" not in text
    assert "Environment: ipython" not in text  # no tools offered: none described
    # Qwen 2.5's own format is <tool_call>/<tool_response> inside its own turns
    qwen = _prompt(QWEN25, {"messages": HISTORY})
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in qwen
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in qwen
    assert "# Tools" not in qwen


MISTRAL_NEMO = (TEMPLATES / "mistral-nemo-instruct-2407.jinja").read_text()
MISTRAL_SMALL = (TEMPLATES / "mistral-small-3.2-24b-instruct-2506.jinja").read_text()


def _mistral_history(call_id: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": call_id},
    ]


@pytest.mark.parametrize("template", [MISTRAL_NEMO, MISTRAL_SMALL], ids=["nemo", "small-3.2"])
@pytest.mark.parametrize("call_id", ["call_abc123XYZ456def789", "call_0", "toolu_01A"])
def test_a_foreign_call_id_is_written_as_a_mistral_one(template: str, call_id: str) -> None:
    """Mistral's templates refuse a call id that is not 9 letters and digits ("Tool call IDs
    should be alphanumeric strings with length 9!"): a conversation whose calls came from another
    server (OpenAI's ``call_...``), or a call sent with no id or as a legacy ``function_call``
    (given ``call_0`` here), was a 400 on every turn after. The prompt now writes such an id as a
    9-character one, the same in the call and in its result, and the same on every turn."""
    for tools in (TOOLS, None):
        request: dict[str, Any] = {"messages": _mistral_history(call_id)}
        if tools:
            request["tools"] = tools
        text = _prompt(template, request)
        assert call_id not in text
        if template is MISTRAL_NEMO:
            written = text.split('"id": "')[1][:9]
            assert f'"call_id": "{written}"' in text
        else:
            written = text.split("[CALL_ID]")[1][:9]
            assert f"[TOOL_RESULTS]{written}[TOOL_CONTENT]" in text
        assert written.isalnum() and written.isascii()
        assert _prompt(template, request) == text  # the next turn renders it alike


def test_a_mistral_id_is_written_as_sent() -> None:
    text = _prompt(MISTRAL_NEMO, {"messages": _mistral_history("abcDEF123"), "tools": TOOLS})
    assert '"id": "abcDEF123"' in text and '"call_id": "abcDEF123"' in text
    # two calls with ids of other forms are two ids, each paired with its result
    calls = [{"id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for n in (1, 2)]
    messages = [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "tool", "content": "rainy", "tool_call_id": "call_2"},
    ]
    text = _prompt(MISTRAL_NEMO, {"messages": messages, "tools": TOOLS})
    first, second = (part[:9] for part in text.split('"id": "')[1:3])
    assert first != second
    assert f'sunny, "call_id": "{first}"' in text and f'rainy, "call_id": "{second}"' in text


GEMMA2 = (TEMPLATES / "gemma-2-2b-it.jinja").read_text()


def test_a_system_message_opens_the_next_turn_on_a_template_without_a_system_role() -> None:
    """Gemma 2's template raises "System role not supported": every request with a system
    message was a 400, and so was every request offering tools (the generic prompt lists them in
    a system message). As llama.cpp's server does for such a template, the system text now
    opens the next message, a line between them."""
    request = {"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]}
    assert _prompt(GEMMA2, request) == "<s><start_of_turn>user\nAnswer in French.\nHi<end_of_turn>\n<start_of_turn>model\n"
    with_tools = _prompt(GEMMA2, {**request, "tools": TOOLS})
    assert with_tools.startswith("<s><start_of_turn>user\nAnswer in French.\n\nYou may call functions")
    assert with_tools.endswith("</tool_call>\nHi<end_of_turn>\n<start_of_turn>model\n")
    assert _prompt(GEMMA2, {"messages": [{"role": "system", "content": "Say hi."}]}) == "<s><start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n"
    # a template that writes system messages gets them as they are
    assert "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n" in _prompt(LLAMA31, request)
    assert "Answer in French.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in _prompt(LLAMA31, request)


MINISTRAL3 = (TEMPLATES / "ministral-3-14b-reasoning-2512.jinja").read_text()
GPT_OSS = (TEMPLATES / "gpt-oss-120b.jinja").read_text()


def test_an_empty_reply_sent_back_is_a_turn_on_ministral_3() -> None:
    """Ministral 3's template raises "Assistant message must have a string or a list of chunks in
    content or a list of tool calls." for an assistant turn with no content: an agent that sent
    back an empty reply (the model stopped at once; content null) had a 400 on every turn after.
    llama.cpp's server takes that check out of the template; so does the worker now."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "Still there?"}]
    text = _prompt(MINISTRAL3, {"messages": messages})
    assert text.endswith("[INST]Hi[/INST]</s>[INST]Still there?[/INST]")


def test_a_gpt_oss_reply_with_its_channel_tags_sent_back_is_a_turn() -> None:
    """gpt-oss's template refuses an assistant turn whose content holds its channel tags, as a
    client that keeps the raw reply sends it back; llama.cpp's server takes that check out."""
    said = "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": said}, {"role": "user", "content": "Bye"}]
    text = _prompt(GPT_OSS, {"messages": messages})
    assert said in text and text.endswith("<|start|>user<|message|>Bye<|end|><|start|>assistant")
