"""An assistant message with both ``reasoning_content`` and gpt-oss's ``thinking``: the first is
read, and ``thinking``, when it says something else, was dropped without a word; it is named in
``x-superfluid-ignored-params`` now (a 400 naming it with ``--strict-params``), as any key not
honoured is."""

from __future__ import annotations

from tests.api.test_schemas import assert_400, chat, chat_error


def _messages(**reasoning: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", **reasoning}, {"role": "user", "content": "z"}]


def test_thinking_beside_a_different_reasoning_content_is_named_ignored() -> None:
    messages = _messages(reasoning_content="First.", thinking="Second.")
    req = chat(messages=messages)
    assert req.messages[1]["reasoning_content"] == "First."
    assert req.ignored == ["messages.thinking"]
    assert_400(chat_error(_strict=True, messages=messages), "messages[1].thinking", "unknown_parameter")


def test_the_same_reasoning_under_both_names_or_either_alone_is_read_and_not_named() -> None:
    for reasoning, read in [
        ({"reasoning_content": "Same.", "thinking": "Same."}, "Same."),
        ({"thinking": "Only."}, "Only."),
        ({"reasoning_content": "Only."}, "Only."),
        ({"reasoning_content": "", "thinking": "Second."}, "Second."),
    ]:
        req = chat(_strict=True, messages=_messages(**reasoning))
        assert req.messages[1]["reasoning_content"] == read and req.ignored == [], reasoning
