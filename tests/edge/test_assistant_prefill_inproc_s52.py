"""Assistant prefill through the whole middle layer (tests/edge/inproc.py): a chat whose last
message is an assistant turn is continued, not answered anew, as llama-server's
``oaicompat_chat_params_parse`` does and Anthropic's API does. The engine here renders with a
model's real chat template (tests/api/templates_s46/) and records the prompt it is given, so
the tests see that it ends with the prefill's text (no end of turn after it), and that the
reply is the continuation only. ``--no-prefill-assistant`` (the setting) makes the turn a turn
again; two assistant turns at the end, and a template that thinks first, are 400s."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.test import override_settings

from scheduler.engines.chat import compile_chat_template, render_chat_template
from tests.api.streamed import said

from .inproc import JSON, MODEL, request
from .templated import TemplateEngine, engine_of, loop_fixture
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

PROMPTS: dict[str, bytes] = {}  # job id -> the prompt the engine was given (a token a byte)


class RecordingEngine(TemplateEngine):
    """The scripted engine rendering chats with its template, as a real engine renders its
    model's, and recording each job's prompt when it samples its first token."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._compiled = compile_chat_template(self.template)

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        return render_chat_template(self._compiled, messages, bos_token="", eos_token="", **extra)

    def forward(self, step: Any) -> dict[int, int]:
        first = {lane: self.lane_job[lane] for lane, _pos, _tokens, sample in step.pieces if sample and not self.generated.get(self.lane_job[lane] or "")}
        sampled = super().forward(step)
        for lane, job_id in first.items():
            assert job_id is not None
            PROMPTS[job_id] = bytes(self.kv[lane])
        return sampled


chatml = loop_fixture("chatml", engine_of("qwen2.5-7b-instruct.jinja", RecordingEngine))
qwen3 = loop_fixture("qwen3", engine_of("Qwen-Qwen3-0.6B.jinja", RecordingEngine))


def post(loop: asyncio.AbstractEventLoop, path: str, body: dict[str, Any]) -> Any:
    PROMPTS.clear()
    return loop.run_until_complete(request("POST", path, json.dumps(body).encode(), JSON))


def prompt() -> str:
    assert len(PROMPTS) == 1, PROMPTS
    return next(iter(PROMPTS.values())).decode()


def anthropic_text(reply: Any, stream: bool) -> str:
    """The text of a 200 /v1/messages reply, its stream's text deltas put together."""
    assert reply.status == 200, reply.body
    if stream:
        deltas = [json.loads(d) for d in reply.sse_data()]
        return "".join(d["delta"].get("text", "") for d in deltas if d["type"] == "content_block_delta")
    return "".join(b["text"] for b in reply.json()["content"] if b["type"] == "text")


def chat(loop: asyncio.AbstractEventLoop, messages: list[dict[str, Any]], **more: Any) -> Any:
    return post(loop, "/v1/chat/completions", {"model": MODEL, "messages": messages, **more})


@pytest.mark.parametrize("stream", [False, True])
def test_the_reply_continues_the_last_assistant_turn(chatml: asyncio.AbstractEventLoop, stream: bool) -> None:
    marker = script('"answer": 42}')
    reply = chat(chatml, [{"role": "user", "content": f"JSON please {marker}"}, {"role": "assistant", "content": "{"}], stream=stream)
    assert said(reply, stream)["content"] == '"answer": 42}'  # the continuation only
    # the generation prompt, then the prefill's text: no end of turn after it
    assert prompt().endswith(f"JSON please {marker}<|im_end|>\n<|im_start|>assistant\n{{")


def test_the_prefill_counts_in_the_prompt_tokens(chatml: asyncio.AbstractEventLoop) -> None:
    messages = [{"role": "user", "content": "Go " + script("done")}, {"role": "assistant", "content": "Sure,"}]
    reply = chat(chatml, messages)
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["prompt_tokens"] == len(prompt().encode())  # a token a byte
    assert reply.json()["usage"]["completion_tokens"] == len("done")


def test_a_stop_string_applies_to_the_continuation_only(chatml: asyncio.AbstractEventLoop) -> None:
    """The prefill's text is the prompt's: a stop string it holds does not end the reply at once."""
    reply = chat(chatml, [{"role": "user", "content": "Count " + script("1, 2, 3. Then")}, {"role": "assistant", "content": "Counting."}], stop=["."])
    assert said(reply, False)["content"] == "1, 2, 3"


def test_without_prefill_the_last_assistant_turn_is_a_turn(chatml: asyncio.AbstractEventLoop) -> None:
    marker = script("A new turn.")
    with override_settings(SUPERFLUID_PREFILL_ASSISTANT=False):
        reply = chat(chatml, [{"role": "user", "content": f"Hi {marker}"}, {"role": "assistant", "content": "{"}])
    assert said(reply, False)["content"] == "A new turn."
    assert prompt().endswith("<|im_start|>assistant\n{<|im_end|>\n<|im_start|>assistant\n")


def test_an_assistant_turn_of_tool_calls_is_a_turn(chatml: asyncio.AbstractEventLoop) -> None:
    """llama-server would continue its text and drop its calls: here it stays a turn."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    reply = chat(chatml, [{"role": "user", "content": "Call " + script("ok")}, {"role": "assistant", "content": "Calling.", "tool_calls": calls}])
    assert reply.status == 200, reply.body
    text = prompt()
    assert text.endswith("<|im_start|>assistant\n") and "Calling." in text and '"name": "f"' in text


def test_an_empty_last_assistant_turn_is_a_new_reply(chatml: asyncio.AbstractEventLoop) -> None:
    marker = script("Hello.")
    reply = chat(chatml, [{"role": "user", "content": f"Hi {marker}"}, {"role": "assistant", "content": ""}])
    assert said(reply, False)["content"] == "Hello."
    assert prompt().endswith(f"Hi {marker}<|im_end|>\n<|im_start|>assistant\n")


def test_two_assistant_turns_at_the_end_are_a_400_naming_messages(chatml: asyncio.AbstractEventLoop) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two"}]
    for path in ("/v1/chat/completions", "/apply-template", "/v1/chat/completions/input_tokens"):
        reply = post(chatml, path, {"model": MODEL, "messages": messages})
        assert reply.status == 400 and reply.is_error_object(), (path, reply.body)
        error = reply.json()["error"]
        assert error["param"] == "messages" and error["message"] == "Cannot have 2 or more assistant messages at the end of the list.", path
    assert not PROMPTS  # nothing ran
    with override_settings(SUPERFLUID_PREFILL_ASSISTANT=False):  # turns, as before
        assert chat(chatml, [*messages[:2], {"role": "assistant", "content": "Two " + script("x")}]).status == 200


def test_a_template_that_thinks_first_refuses_the_prefill(qwen3: asyncio.AbstractEventLoop) -> None:
    messages = [{"role": "user", "content": "Hi " + script("lo!")}, {"role": "assistant", "content": "Hel"}]
    reply = chat(qwen3, messages)
    assert reply.status == 400 and reply.is_error_object(), reply.body
    assert reply.json()["error"]["param"] == "messages"
    assert reply.json()["error"]["message"] == "Assistant response prefill is incompatible with enable_thinking."
    assert not PROMPTS
    # thinking turned off: the template closes an empty reasoning block, the prefill follows
    reply = chat(qwen3, messages, chat_template_kwargs={"enable_thinking": False})
    view = said(reply, False)
    assert view["content"] == "lo!" and view["reasoning"] is None
    assert prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nHel")


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_continue_the_prefill(qwen3: asyncio.AbstractEventLoop, stream: bool) -> None:
    """As at Anthropic: no ``thinking`` is no thinking, so the prefill is continued (the
    template's thinking off); the reply's content is the continuation only."""
    body = {"model": MODEL, "max_tokens": 50, "stream": stream,
            "messages": [{"role": "user", "content": "JSON " + script('"a": 1}')}, {"role": "assistant", "content": [{"type": "text", "text": "{"}]}]}  # fmt: skip
    reply = post(qwen3, "/v1/messages", body)
    if not stream:
        assert [b["type"] for b in reply.json()["content"]] == ["text"]
    assert anthropic_text(reply, stream) == '"a": 1}'
    assert prompt().endswith("<think>\n\n</think>\n\n{")


def test_anthropic_refuses_a_prefill_with_trailing_white_space_or_thinking(qwen3: asyncio.AbstractEventLoop) -> None:
    base = {"model": MODEL, "max_tokens": 50}
    spaced = post(qwen3, "/v1/messages", {**base, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello "}]})
    assert spaced.status == 400, spaced.body
    assert spaced.json()["type"] == "error" and spaced.json()["error"]["type"] == "invalid_request_error"
    assert "final assistant content cannot end with trailing whitespace" in spaced.json()["error"]["message"]
    thinking = post(qwen3, "/v1/messages", {**base, "thinking": {"type": "enabled", "budget_tokens": 1024},
                                            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})  # fmt: skip
    assert thinking.status == 400 and thinking.json()["error"]["type"] == "invalid_request_error", thinking.body
    assert "prefill" in thinking.json()["error"]["message"]
    assert not PROMPTS


def test_the_counting_routes_count_what_the_worker_prefills(chatml: asyncio.AbstractEventLoop) -> None:
    """/apply-template renders the prefill as the worker does (whatever add_generation_prompt
    says, as llama-server's), and the count routes count that prompt's tokens (the web side
    reads the bundled model's vocabulary and template: ChatML's turns too)."""
    messages = [{"role": "user", "content": "Go on"}, {"role": "assistant", "content": "It is"}]
    rendered = post(chatml, "/apply-template", {"model": MODEL, "messages": messages, "add_generation_prompt": False})
    assert rendered.status == 200, rendered.body
    text = rendered.json()["prompt"]
    assert text.endswith("<|im_start|>user\nGo on<|im_end|>\n<|im_start|>assistant\nIt is"), text
    tokens = post(chatml, "/tokenize", {"model": MODEL, "content": text, "add_special": True})
    counted = post(chatml, "/v1/chat/completions/input_tokens", {"model": MODEL, "messages": messages})
    anthropic = post(chatml, "/v1/messages/count_tokens", {"model": MODEL, "messages": messages})
    assert counted.json()["input_tokens"] == anthropic.json()["input_tokens"] == len(tokens.json()["tokens"]), (counted.body, anthropic.body)
    with override_settings(SUPERFLUID_PREFILL_ASSISTANT=False):
        turn = post(chatml, "/v1/chat/completions/input_tokens", {"model": MODEL, "messages": messages})
    assert turn.json()["input_tokens"] > counted.json()["input_tokens"]  # the turn's end and a new turn's start
    assert not PROMPTS  # nothing generated
