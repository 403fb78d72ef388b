"""A chat rendered and counted in the web process as its worker renders and tokenises it, for
the routes that answer without generating: ``/apply-template``, llama-server's
``/v1/chat/completions/input_tokens``, the Responses API's ``/v1/responses/input_tokens`` and
Anthropic's ``/v1/messages/count_tokens`` (each translates its body to a chat request first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import invalid_request, server_error


@dataclass
class RenderedChat:
    """A chat body rendered as its worker renders it: ``text``; ``render(messages, tools)`` the
    template with the body's variables, ``messages`` and ``tools`` what ``text`` renders (what
    the worker tokenises the conversation from: ``chat.chat_prompt_tokens``)."""

    text: str
    render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prefill: str = ""  # a last assistant turn's text the prompt ends with (``text`` ends with it)


def render_chat(vocab: Any, wire: dict[str, Any], *, add_generation_prompt: bool = True, param: str = "messages") -> RenderedChat:
    """The chat request ``wire`` (a request's to_wire) rendered with ``vocab``'s template as the
    worker prepares a chat (scheduler/worker/loop.py): the tools in the template's own format
    where it has one, else the generic tool prompt; a system turn merged into the next where the
    template takes none; a prefill (``wire["prefill"]``: a last assistant turn the reply
    continues) after the generation prompt, whatever ``add_generation_prompt`` says, as
    llama-server's. A template that refuses the conversation, or thinks where a prefill
    would be written (``chat.PREFILL_THINKING``), is a 400 naming ``param`` (the field the
    client sent it in); one that does not compile a 500."""
    from scheduler.engines.base import EngineError
    from scheduler.engines.chat import (
        PREFILL_THINKING,
        compile_chat_template,
        merge_system_turn,
        prefill_thinks,
        render_chat_template,
        rendered_or_fixed,
        split_prefill,
        takes_system_turn,
        template_inputs,
    )

    source, bos, eos = vocab.template_parts()
    turns, prefill = split_prefill(wire["messages"], bool(wire.get("prefill")))
    if prefill:
        add_generation_prompt = True
    messages, extra = template_inputs(turns, wire.get("tools"), source, wire.get("chat_template_kwargs"), native_ok=True)
    offered = extra.pop("tools", None)  # the tools the template renders, passed with the messages
    try:
        template = compile_chat_template(source)
    except EngineError as exc:
        raise server_error(f"The model's chat template could not be used: {exc}") from None

    def render(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        variables = extra if tools is None else {**extra, "tools": tools}
        return render_chat_template(template, msgs, bos_token=bos, eos_token=eos, add_generation_prompt=add_generation_prompt, **variables)

    try:
        if messages and messages[0].get("role") == "system" and not takes_system_turn(
            lambda msgs: render_chat_template(template, msgs, bos_token=bos, eos_token=eos)
        ):
            messages = merge_system_turn(messages)  # Gemma 2's: the system text opens the next turn
        # (a conversation the template refuses, agents' as a matter of course: as it may take it)
        text, messages = rendered_or_fixed(lambda msgs: render(msgs, offered), messages)
        thinks = prefill and prefill_thinks(
            lambda msgs, **variables: render_chat_template(template, msgs, bos_token=bos, eos_token=eos, **variables), messages, extra if offered is None else {**extra, "tools": offered}
        )
    except ValueError as exc:  # a template's raise_exception, or messages it cannot handle
        raise invalid_request(f"The chat template rejected the {param}: {exc}", param=param, code="invalid_messages") from None
    if thinks:
        raise invalid_request(PREFILL_THINKING, param=param, code="invalid_messages")
    return RenderedChat(text + prefill, render, messages, offered, prefill)


def count_chat_tokens(vocab: Any, chat: RenderedChat, *, param: str = "messages") -> int:
    """The tokens of a rendered chat as the worker tokenises it (``chat.chat_prompt_tokens``:
    the template's text with special tokens parsed, BOS where the vocabulary adds one; the
    messages' text as text, continued after the template's text where the vocabulary prefixes
    a space): the chat's ``usage.prompt_tokens``."""
    from scheduler.engines.chat import chat_prompt_tokens

    continued = getattr(vocab, "continued", None)

    def tokenize(text: str, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        if after is not None and continued is not None:
            tokens = continued(text, special, after)
            if tokens is not None:
                return tokens  # type: ignore[no-any-return]
        return vocab.tokenize(text, add_special=add_special, parse_special=special)  # type: ignore[no-any-return]

    try:
        tokens, _own = chat_prompt_tokens(chat.render, tokenize, chat.messages, chat.tools, prefill=chat.prefill)
    except ValueError as exc:  # a template's raise_exception on a variant of the messages
        raise invalid_request(f"The chat template rejected the {param}: {exc}", param=param, code="invalid_messages") from None
    return len(tokens)
