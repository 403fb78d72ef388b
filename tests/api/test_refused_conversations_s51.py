"""Conversations agents send that models' own templates refuse, rendered as the template may take
them (``chat.refused_conversation_fixes``, tried only after the template's ``raise_exception``):
before, each was a 400 ``invalid_messages`` on every turn of such a session.

* Claude Code's user text right after tool results (its reminders, the user's next words):
  Mistral's templates want roles to alternate once tool turns are left out;
* two user turns in a row (an interrupted turn): Gemma's, Mistral's;
* a developer (system) message in mid-conversation, which Codex adds when permissions or the
  model change: Qwen 3.5's "System message must be at the beginning";
* parallel calls in the history: Llama 3.x's "This model only supports single tool-calls at once!".

Through the worker (the prompt it renders) and the web side's rendering (``/apply-template``,
token counts) with the real templates (templates_s46, llama.cpp's copies); a conversation a
template takes is rendered exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.chat import (
    compile_chat_template,
    native_tool_messages,
    refused_conversation_fixes,
    render_chat_template,
)
from scheduler.engines.sim import SimEngine
from scheduler.worker.loop import EngineWorker

TEMPLATES = Path(__file__).parent / "templates_s46"
TOOLS = [{"name": "read", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def call(call_id: str, path: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "read", "arguments": json.dumps({"path": path})}}


AFTER_RESULTS = [
    {"role": "user", "content": "Read a.txt."},
    {"role": "assistant", "content": "", "tool_calls": [call("abcdefgh1", "a.txt")]},
    {"role": "tool", "tool_call_id": "abcdefgh1", "content": "alpha"},
    {"role": "user", "content": "<system-reminder>Keep it short.</system-reminder>"},
]
TWO_USERS = [{"role": "user", "content": "Hello."}, {"role": "user", "content": "[Request interrupted by user]"}]
LATE_DEVELOPER = [
    {"role": "system", "content": "You are Codex."},
    {"role": "user", "content": "List files."},
    {"role": "assistant", "content": "Done."},
    {"role": "system", "content": "<permissions>workspace-write</permissions>"},
    {"role": "user", "content": "Now edit one."},
]
PARALLEL = [
    {"role": "user", "content": "Read both."},
    {"role": "assistant", "content": "", "tool_calls": [call("abcdefgh1", "a.txt"), call("abcdefgh2", "b.txt")]},
    {"role": "tool", "tool_call_id": "abcdefgh1", "content": "alpha"},
    {"role": "tool", "tool_call_id": "abcdefgh2", "content": "beta"},
]
CASES = [
    ("mistral-small-3.2-24b-instruct-2506.jinja", AFTER_RESULTS, "alternate"),
    ("ministral-3-14b-reasoning-2512.jinja", AFTER_RESULTS, "alternate"),
    ("gemma-2-2b-it.jinja", TWO_USERS, "alternate"),
    ("mistral-small-3.2-24b-instruct-2506.jinja", TWO_USERS, "alternate"),
    ("qwen3.5-4b.jinja", LATE_DEVELOPER, "System message must be at the beginning"),
    ("llama-3.1-instruct.jinja", PARALLEL, "single tool-calls"),
]


class RenderingEngine(SimEngine):
    """The simulated engine rendering chats with ``template`` (a token a byte), as a real
    engine renders its model's."""

    def __init__(self, template: str) -> None:
        super().__init__(n_lanes=1, lane_ctx=16384)
        self.features = frozenset({"template_vars"})
        self.chat_template = template
        self._compiled = compile_chat_template(template)

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        return render_chat_template(self._compiled, messages, bos_token="", eos_token="", **extra)


def _worker(template: str, _pieces: dict[str, int]) -> EngineWorker:
    return EngineWorker(RenderingEngine(template), SchedulerConfig(max_batch=1, lane_ctx=16384), model_name="m", prepare_in_thread=False)


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"]]


def prompt_text(worker: EngineWorker, messages: list[dict[str, Any]]) -> str:
    tokens, *_ = worker._prompt_tokens({"endpoint": "chat", "messages": messages, "tools": TOOLS}, "")
    return b"".join(worker.engine.token_bytes(t) for t in tokens).decode("utf-8", "replace")


@pytest.mark.parametrize(("template_file", "messages", "refusal"), CASES, ids=[f"{c[0].split('.jinja')[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_conversation_the_template_refuses_is_rendered_as_it_takes_it(template_file: str, messages: list[dict[str, Any]], refusal: str) -> None:
    template = (TEMPLATES / template_file).read_text()
    compiled = compile_chat_template(template)
    with pytest.raises(ValueError, match=refusal):  # the template's own refusal, as sent
        render_chat_template(compiled, native_tool_messages(messages), bos_token="", eos_token="", tools=TOOLS)
    worker = _worker(template, {})
    text = prompt_text(worker, messages)
    at = 0
    for part in texts(messages):  # every text the client sent, in its order
        found = text.find(part, at)
        assert found >= 0, (part, text)
        at = found + len(part)
    for m in messages:  # every earlier call, its arguments as the template writes them
        for c in m.get("tool_calls") or []:
            assert json.dumps(json.loads(c["function"]["arguments"])) in text, (c, text)


def test_the_web_side_renders_and_counts_the_same_conversation() -> None:
    from api.rendering import count_chat_tokens, render_chat

    template = (TEMPLATES / "mistral-small-3.2-24b-instruct-2506.jinja").read_text()
    worker = _worker(template, {})

    class Vocab:
        def template_parts(self) -> tuple[str, str, str]:
            return template, "", ""

        def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
            return worker.engine.tokenize(text, add_special=add_special, special=parse_special)

    chat = render_chat(Vocab(), {"messages": AFTER_RESULTS, "tools": TOOLS})
    assert "Keep it short." in chat.text and chat.text.index("alpha") < chat.text.index("Keep it short.")
    assert count_chat_tokens(Vocab(), chat) == len(worker._prompt_tokens({"endpoint": "chat", "messages": AFTER_RESULTS, "tools": TOOLS}, "")[0])


def test_a_conversation_the_template_takes_is_rendered_as_sent() -> None:
    template = (TEMPLATES / "qwen3.5-4b.jinja").read_text()
    worker = _worker(template, {})
    messages = LATE_DEVELOPER[:3] + [{"role": "user", "content": "Now edit one."}]
    direct = render_chat_template(compile_chat_template(template), messages, bos_token="", eos_token="", tools=[{"type": "function", "function": TOOLS[0]}])
    assert prompt_text(worker, messages).endswith(direct[-200:])
    assert refused_conversation_fixes(messages) is None  # nothing to change: no retry would differ


def test_a_refusal_the_fixes_do_not_cure_is_the_templates_own() -> None:
    worker = _worker("{{ raise_exception('This template takes nothing.') }}", {})
    from scheduler.worker.loop import Refusal

    with pytest.raises(Refusal) as refused:
        worker._prompt_tokens({"endpoint": "chat", "messages": TWO_USERS}, "")
    assert "This template takes nothing." in refused.value.detail


ROLES = st.sampled_from(["system", "user", "assistant", "tool", "calls"])


@settings(max_examples=300, deadline=None)
@given(roles=st.lists(ROLES, min_size=1, max_size=10), words=st.lists(st.text(min_size=1, max_size=6), min_size=10, max_size=10))
def test_the_fixes_lose_no_text_and_keep_its_order(roles: list[str], words: list[str]) -> None:
    messages: list[dict[str, Any]] = []
    for i, role in enumerate(roles):
        if role == "calls":
            ids = [f"id{i}x{j}" for j in range(2)]
            messages.append({"role": "assistant", "content": words[i], "tool_calls": [call(k, f"{k}.txt") for k in ids]})
            messages += [{"role": "tool", "tool_call_id": k, "content": f"{words[i]}-{k}"} for k in ids]
        else:
            messages.append({"role": role, "content": words[i]})
    fixed = refused_conversation_fixes(messages)
    if fixed is None:
        return
    joined = "\u0000".join(texts(fixed))
    at = 0
    for part in texts(messages):
        found = joined.find(part, at)
        assert found >= 0, (part, messages, fixed)
        at = found + len(part)
    calls = [c["id"] for m in messages for c in m.get("tool_calls") or []]
    assert [c["id"] for m in fixed for c in m.get("tool_calls") or []] == calls
    assert all(m["role"] != "system" for m in fixed[1:])
    assert refused_conversation_fixes(fixed) is None  # once is enough


HOSTILE_TEMPLATES = ["mistral-small-3.2-24b-instruct-2506.jinja", "ministral-3-14b-reasoning-2512.jinja", "gemma-2-2b-it.jinja",
                     "qwen3.5-4b.jinja", "llama-3.1-instruct.jinja", "mistral-nemo-instruct-2407.jinja"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(template_file=st.sampled_from(HOSTILE_TEMPLATES), roles=st.lists(ROLES, min_size=1, max_size=8), words=st.lists(st.text(max_size=5), min_size=8, max_size=8))
def test_any_conversation_renders_or_is_the_templates_refusal_never_another_error(template_file: str, roles: list[str], words: list[str]) -> None:
    """Through the web side's rendering (``/apply-template``, the count routes): a 200 or a 400
    ``invalid_messages``, never a 500, whatever the turns."""
    from api.errors import ApiError
    from api.rendering import render_chat

    template = (TEMPLATES / template_file).read_text()
    messages: list[dict[str, Any]] = []
    for i, role in enumerate(roles):
        if role == "calls":
            ids = [f"abcdefg{i}{j}" for j in range(2)]
            messages.append({"role": "assistant", "content": words[i], "tool_calls": [call(k, words[i]) for k in ids]})
            messages += [{"role": "tool", "tool_call_id": k, "content": words[i]} for k in ids]
        else:
            messages.append({"role": role, "content": words[i]})

    class Vocab:
        def template_parts(self) -> tuple[str, str, str]:
            return template, "<s>", "</s>"

    try:
        render_chat(Vocab(), {"messages": messages, "tools": TOOLS})
    except ApiError as exc:
        assert exc.status == 400 and exc.code == "invalid_messages", exc
