"""Through the whole middle layer (tests/edge/inproc.py): a reasoning model's chat reply comes
back as llama-server's does, its reasoning in ``reasoning_content`` (streamed as
``delta.reasoning_content``) and its answer in ``content``. The worker reads the model's format
from its chat template and says it in its Hello; the web side splits the reply by it. Before,
gpt-oss's reply reached the client as ``<|channel|>analysis<|message|>...`` in ``content``.
/v1/completions stays raw, as on llama-server; a request with reasoning_format none keeps
gpt-oss's analysis in ``content``, as llama-server does."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest
from django.test import override_settings

from tests.api.streamed import said

from .inproc import JSON, MODEL, request
from .templated import edge_loop, engine_of, loop_fixture
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. "
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'


R1Engine = engine_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
gpt_oss = loop_fixture("gpt_oss", engine_of("gpt-oss-120b.jinja"))
r1 = loop_fixture("r1", R1Engine)
_edge = edge_loop


def _ask(loop: asyncio.AbstractEventLoop, written: str, *, stream: bool, **more: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris? " + script(written)}], "stream": stream, **more}
    return said(loop.run_until_complete(request("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON)), stream)


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_reasoning_is_reasoning_content(gpt_oss: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(gpt_oss, ANALYSIS + FINAL, stream=stream)
    assert got == {"reasoning": "The user wants the weather.", "content": "It is sunny in Paris.", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_calls_are_tool_calls(gpt_oss: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(gpt_oss, ANALYSIS + CALL, stream=stream, tools=TOOLS)
    assert got == {"reasoning": "The user wants the weather.", "content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_none_leaves_the_analysis_in_the_content(gpt_oss: asyncio.AbstractEventLoop, stream: bool) -> None:
    # as llama-server's gpt-oss parser gives it then: the analysis as written, the final
    # message's text without its header (session 53: before, the raw reply, header and all)
    unsplit = ANALYSIS + "It is sunny in Paris."
    got = _ask(gpt_oss, ANALYSIS + FINAL, stream=stream, reasoning_format="none")
    assert got == {"reasoning": None, "content": unsplit, "calls": [], "finish_reason": "stop"}
    with override_settings(SUPERFLUID_REASONING_FORMAT="none"):  # --reasoning-format none
        assert _ask(gpt_oss, ANALYSIS + FINAL, stream=stream)["content"] == unsplit


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_deepseek_legacy_splits_as_llama_server_does(gpt_oss: asyncio.AbstractEventLoop, stream: bool) -> None:
    """llama-server takes ``deepseek-legacy`` (request and flag) and splits the reasoning out as
    for ``deepseek``: it was a 400 here."""
    from scheduler.management.options import add_api_arguments

    want = {"reasoning": "The user wants the weather.", "content": "It is sunny in Paris.", "calls": [], "finish_reason": "stop"}
    assert _ask(gpt_oss, ANALYSIS + FINAL, stream=stream, reasoning_format="deepseek-legacy") == want
    parser = argparse.ArgumentParser()
    add_api_arguments(parser)
    flag = parser.parse_args(["--reasoning-format", "deepseek-legacy"]).reasoning_format
    with override_settings(SUPERFLUID_REASONING_FORMAT=flag):
        assert _ask(gpt_oss, ANALYSIS + FINAL, stream=stream) == want


def test_completions_stay_raw(gpt_oss: asyncio.AbstractEventLoop) -> None:
    body = {"model": MODEL, "prompt": "x " + script(ANALYSIS + FINAL)}
    reply = gpt_oss.run_until_complete(request("POST", "/v1/completions", json.dumps(body).encode(), JSON))
    assert reply.status == 200 and reply.json()["choices"][0]["text"] == ANALYSIS + FINAL


@pytest.mark.parametrize("stream", [False, True])
def test_a_template_that_opens_the_block_itself(r1: asyncio.AbstractEventLoop, stream: bool) -> None:
    """DeepSeek R1's generation prompt ends in ``<think>\\n``: the reply starts in the block."""
    got = _ask(r1, "The user asks about weather.\n</think>\n\nSunny.", stream=stream)
    assert got == {"reasoning": "The user asks about weather.", "content": "Sunny.", "calls": [], "finish_reason": "stop"}
    # thinking turned off: the template closes the block itself, and the reply is all answer
    off = _ask(r1, "Sunny.", stream=stream, chat_template_kwargs={"enable_thinking": False})
    assert off == {"reasoning": None, "content": "Sunny.", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_reply_of_such_a_template_is_no_reasoning(r1: asyncio.AbstractEventLoop, stream: bool) -> None:
    """A grammar writes the reply from its first token (a forced call, a response_format): it
    does not begin inside a reasoning block, though the template opened one."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    got = _ask(r1, call, stream=stream, tools=TOOLS, tool_choice="required")
    assert got == {"reasoning": None, "content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}
    answer = _ask(r1, '{"city": "Paris"}', stream=stream, response_format={"type": "json_object"})
    assert answer == {"reasoning": None, "content": '{"city": "Paris"}', "calls": [], "finish_reason": "stop"}
