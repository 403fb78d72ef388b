"""``chat_template_kwargs.enable_thinking`` sent as the string ``"false"`` (llama-server refuses a
string there; some clients send one) is a non-empty string to every chat template: truthy to
DeepSeek R1's and QwQ's ``not enable_thinking`` and to GLM's, not ``false`` to Qwen 3's ``is
false``. The template keeps thinking on and opens the block itself, so the reply starts inside
it, as with ``true``. The web side read the string as thinking off and looked for a ``<think>``
the model never writes: the reasoning, ``</think>`` and all, came back as content."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler.engines.chat import compile_chat_template, render_chat_template

from .test_reasoning_inproc_s47 import R1Engine, _ask, r1  # noqa: F401 - r1: the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _opens(enable_thinking: Any) -> bool:
    prompt = render_chat_template(compile_chat_template(R1Engine.template), [{"role": "user", "content": "Hi"}], bos_token="", eos_token="", enable_thinking=enable_thinking)
    return prompt.endswith("<think>\n")


@pytest.mark.parametrize("stream", [False, True])
def test_a_string_false_keeps_the_templates_thinking_and_the_reasoning_is_split(r1: asyncio.AbstractEventLoop, stream: bool) -> None:  # noqa: F811
    assert _opens("false") and _opens(True) and not _opens(False)
    got = _ask(r1, "The user asks about weather.\n</think>\n\nSunny.", stream=stream, chat_template_kwargs={"enable_thinking": "false"})
    assert got == {"reasoning": "The user asks about weather.", "content": "Sunny.", "calls": [], "finish_reason": "stop"}
