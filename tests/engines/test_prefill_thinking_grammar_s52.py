"""tool_choice auto's grammar leaves a reasoning block free (llama-server suspends its lazy
grammar there), found from where the prompt ends. With an assistant prefill the prompt ends
with the client's text, so the block the template opened (QwQ's generation prompt, which opens
``<think>`` whatever ``enable_thinking`` says, as the model's own template does) or one the
prefill opens itself (``<think>`` after Qwen 3's closed empty block) was taken for no block: a
``<tool_call>`` the model wrote while reasoning was held to a call, which then ended the reply
inside the block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines import grammar as grammars
from scheduler.engines.chat import compile_chat_template, render_chat_template
from scheduler.engines.grammar import lazy_tool_grammar
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Submit
from scheduler.worker.loop import EngineWorker
from tests.engines.test_lazy_tool_grammar_s48 import WEATHER

TEMPLATES = Path(__file__).parent.parent / "api" / "templates_s46"
# QwQ's own template opens the block in every generation prompt (llama.cpp's copy here closes it
# again where enable_thinking is false; the model's GGUF has none of that)
QWQ = (TEMPLATES / "Qwen-QwQ-32B.jinja").read_text().replace("{%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%}", "")
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def _worker(source: str) -> EngineWorker:
    engine = SimEngine(n_lanes=1, lane_ctx=4096)
    engine.features = frozenset({"template_vars", "grammar"})
    engine.chat_template = source
    compiled = compile_chat_template(source)
    engine.render_chat = lambda messages, **extra: render_chat_template(compiled, messages, bos_token="", eos_token="", **extra)  # type: ignore[method-assign]
    engine.check_grammar = lambda g: None  # type: ignore[method-assign]
    return EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=4096), model_name="m", prepare_in_thread=False)


@pytest.mark.parametrize(
    ("source", "extra", "prefill", "thinking"),
    [
        (QWQ, {}, "Okay, so the user wants", grammars.THINKING_OPEN),  # the template's block, the prefill in it
        (QWQ, {}, "Okay.\n</think>\n\nThe weather", grammars.THINKING_MAY_OPEN),  # the prefill closed it
        (QWQ, {}, "x" * 300, grammars.THINKING_OPEN),  # a prefill longer than the tail read before
        (QWEN3, OFF, "<think>\nHmm, the user", grammars.THINKING_OPEN),  # the prefill opens one itself
        (QWEN3, OFF, "The answer is", grammars.THINKING_MAY_OPEN),  # the template's empty block: closed
    ],
)
def test_a_prefill_inside_a_reasoning_block_leaves_the_block_free(source: str, extra: dict[str, Any], prefill: str, thinking: str) -> None:
    worker = _worker(source)
    request = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": prefill}],
               "tools": [WEATHER], "tool_choice": "auto", "prefill": True, **extra}  # fmt: skip
    job, _ = worker._build_job("j", None, Submit("j", request))  # type: ignore[arg-type]
    assert job.sampling.grammar == lazy_tool_grammar([WEATHER], True, thinking=thinking)
