"""An earlier reply's reasoning (``reasoning_content``, or gpt-oss's ``thinking``) is read on an
assistant message only. On a user, system or tool message it was dropped without a word; it is
now named in ``x-superfluid-ignored-params`` as any key not honoured is, and with
``--strict-params`` it is a 400 naming it."""

from __future__ import annotations

import pytest

from tests.api.test_schemas import assert_400, chat, chat_error


@pytest.mark.parametrize("key", ["reasoning_content", "thinking"])
@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_reasoning_on_a_message_not_the_assistants_is_named_ignored(key: str, role: str) -> None:
    msg = {"role": role, "content": "x", key: "Some thoughts."}
    req = chat(messages=[msg, {"role": "user", "content": "y"}] if role != "user" else [msg])
    assert "reasoning_content" not in req.messages[0]
    assert req.ignored == [f"messages.{key}"]
    assert_400(chat_error(_strict=True, messages=[msg]), f"messages[0].{key}", "unknown_parameter")


def test_an_assistant_messages_reasoning_is_read_and_not_named_and_null_is_nothing() -> None:
    messages = [{"role": "user", "content": "x", "reasoning_content": None},
                {"role": "assistant", "content": "y", "reasoning_content": "Thought."},
                {"role": "user", "content": "z"}]
    req = chat(_strict=True, messages=messages)
    assert req.messages[1]["reasoning_content"] == "Thought." and req.ignored == []
