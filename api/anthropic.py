"""Anthropic's Messages API over the chat pipeline: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, as llama-server serves them (Claude Code with
``ANTHROPIC_BASE_URL``, the ``anthropic`` SDK).

A Messages body is translated to a chat completions body (:func:`to_chat_body`, as
llama-server's ``server_chat_convert_anthropic_to_oai``) and parsed by the chat route's own
parser; the request then runs exactly as a chat completion does (keys, classes, admission,
limits, activity rows, a client that leaves frees its lane). The chat reply, streamed or not,
is translated back (:class:`BlockStream`, :func:`message_body`), and errors are Anthropic's
error objects (:func:`api.errors.anthropic_error_body`). docs/api.md, "Anthropic Messages API", says what is
honoured and what is refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from scheduler.core.qos import QosClass
from scheduler.link.messages import Delta
from scheduler.link.pool import get_pool
from scheduler.link.transport import JobHandle
from superfluid_site.serving import serving

from . import responses
from .admission import admit_tool, forbidden, key_required
from .consumers import ChatCompletionsConsumer
from .edge import error_response
from .errors import ApiError, anthropic_error_body, invalid_request, model_not_found
from .rendering import count_chat_tokens, render_chat
from .schemas import GenerationRequest, chat_request_from, load_object, named_model, omitted_part
from .views import _allowed, _json_body, _served_models, _with_tool_vocab, naming_ignored

# What a Messages body may hold. ``chat_template_kwargs`` is llama-server's extension (its
# converter passes it on); ``metadata`` ({"user_id"}) changes nothing here and is accepted
# silently, as the chat route's ``metadata``. Any other key is ignored and named in
# x-superfluid-ignored-params (a 400 unknown_parameter under --strict-params).
MESSAGES_KEYS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "thinking",
        "metadata",
        "stream",
        "chat_template_kwargs",
    }
)
# What a request without max_tokens (Anthropic requires it) may generate, as llama-server's
# converter fills it in (a cap: a prompt that leaves less of the context has the rest)
DEFAULT_MAX_TOKENS = 4096
MESSAGE_KEYS = frozenset({"role", "content"})
# An image or document block's sources (Anthropic's spec): each type's keys that must be strings.
# A document of text (``text``, ``content``) is read; the others are what this server's models
# cannot read (an image; a PDF, ``base64``/``url``/``file``): a line says one was there
IMAGE_SOURCES = {"base64": ("media_type", "data"), "url": ("url",), "file": ("file_id",)}
DOCUMENT_SOURCES = {**IMAGE_SOURCES, "text": ("data",), "content": ()}
TOOL_KEYS = frozenset({"name", "description", "input_schema", "type", "cache_control"})

sse_frame = responses.named_sse_event  # one event of the stream, named by its type


# ---------------------------------------------------------------------------------------------
# The request: a Messages body as a chat completions body
# ---------------------------------------------------------------------------------------------


def _bad(message: str, param: str, code: str = "invalid_value") -> ApiError:
    return invalid_request(message, param=param, code=code)


def _unknown(keys: list[str], strict: bool) -> list[str]:
    if strict and keys:
        raise _bad(f"Unrecognized request argument supplied: {keys[0]}", keys[0], "unknown_parameter")
    return keys


def _objects(items: list[Any], name: str, keys: frozenset[str], ignored: list[str], strict: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, item) for each item of the array ``name``, which must hold objects; a key of an
    item not in ``keys`` is named ignored once as ``name.key`` (a 400 under ``strict``)."""
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"Invalid value for '{where}': expected an object.", where, "invalid_type")
        for key in item:
            if key not in keys:
                _unknown([f"{where}.{key}"], strict)
                if f"{name}.{key}" not in ignored:
                    ignored.append(f"{name}.{key}")
        yield where, item


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"Invalid value for '{where}.text': expected a string.", f"{where}.text", "invalid_type")
    return text


def _blocks(content: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """A message's content as ``[(type, block)]``: a string is one text block."""
    if isinstance(content, str):
        return [("text", {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise _bad(f"Invalid value for '{where}': expected a string or an array of content blocks.", where, "invalid_type")
    out = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"Invalid value for '{where}[{j}]': expected a content block with a 'type'.", f"{where}[{j}]", "invalid_type")
        out.append((block["type"], block))
    return out


def _unsupported_block(kind: str, where: str) -> ApiError:
    # as the chat route refuses a content part it cannot serve (a model here reads text only)
    return _bad(
        f"Content blocks of type '{kind}' are not supported (in '{where}'): this server's models read text only.",
        where,
        "unsupported_content",
    )


def _system_text(system: Any) -> str:
    """``system``: a string or text blocks (their cache_control ignored), joined a block a line
    as the chat route joins text parts."""
    if isinstance(system, str):
        texts = [system]
    else:
        texts = []
        for j, (kind, block) in enumerate(_blocks(system, "system")):
            if kind != "text":
                raise _unsupported_block(kind, f"system[{j}]")
            texts.append(_text_of(block, f"system[{j}]"))
    if texts:
        texts[0] = normalize_billing_header(texts[0])
    return "\n".join(texts)


def normalize_billing_header(text: str) -> str:
    """Claude Code's first system block can be ``x-anthropic-billing-header: ...; cch=<5
    characters>;...``, whose stamp changes with every request: left as it is, no request's
    prompt shared a cached prefix past it. The stamp is made constant, as llama-server does
    (its normalize_anthropic_billing_header)."""
    head = "x-anthropic-billing-header:"
    if not text.startswith(head):
        return text
    at = text.find("cch=", len(head))
    if at < 0 or text[at + 9 : at + 10] != ";":
        return text
    return text[: at + 4] + "fffff" + text[at + 9 :]


def _source(block: dict[str, Any], where: str, shapes: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """An image or document block's ``source``, checked to be one of ``shapes``."""
    source = block.get("source")
    if not isinstance(source, dict):
        if source is None:
            raise _bad(f"Missing required parameter: '{where}.source'.", f"{where}.source", "missing_required_parameter")
        raise _bad(f"Invalid value for '{where}.source': expected an object.", f"{where}.source", "invalid_type")
    kind = source.get("type")
    if not isinstance(kind, str) or kind not in shapes:  # (a list or an object is no key of shapes: a TypeError, a 500)
        expected = ", ".join(f"'{k}'" for k in shapes)
        raise _bad(f"Invalid value for '{where}.source.type': expected one of {expected}.", f"{where}.source.type")
    for key in shapes[kind]:
        if not isinstance(source.get(key), str):
            raise _bad(f"Invalid value for '{where}.source.{key}': expected a string.", f"{where}.source.{key}", "invalid_type")
    return source


def _media_text(kind: str, block: dict[str, Any], where: str, ignored: list[str], strict: bool) -> str:
    """An image or document block of a user turn or a tool result as the text the model reads:
    a document of text its text; an image or a PDF a line telling the model one was there
    (:func:`omitted_part`), named in ``ignored`` as ``messages.<type>``. The model reads no
    images, but Claude Code sends its history again every turn (a PNG its Read tool read, a
    picture pasted in), so a 400 would refuse every later turn of the session; under
    ``strict`` (--strict-params) it is one, as before. A block that is no well-formed image or
    document is a 400 naming the field."""
    if kind == "image" and strict:
        raise _unsupported_block(kind, where)
    source = _source(block, where, IMAGE_SOURCES if kind == "image" else DOCUMENT_SOURCES)
    if source["type"] == "text":
        return str(source["data"])
    if source["type"] == "content":
        return _readable_text(source.get("content"), f"{where}.source.content", ignored, strict, media=("image",))
    if strict:
        raise _unsupported_block(kind, where)
    if f"messages.{kind}" not in ignored:
        ignored.append(f"messages.{kind}")
    return omitted_part(kind)


def _readable_text(content: Any, where: str, ignored: list[str], strict: bool, media: tuple[str, ...] = ("image", "document")) -> str:
    """A tool result's content (a content document's: ``media`` images only): a string, or
    text, image and document blocks, joined a block a line."""
    if isinstance(content, str):
        return content
    parts = []
    for j, (kind, part) in enumerate(_blocks(content, where)):
        if kind == "text":
            parts.append(_text_of(part, f"{where}[{j}]"))
        elif kind in media:
            parts.append(_media_text(kind, part, f"{where}[{j}]", ignored, strict))
        else:
            raise _unsupported_block(kind, f"{where}[{j}]")
    return "\n".join(parts)


def _tool_result(block: dict[str, Any], where: str, ignored: list[str], strict: bool) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"Missing required parameter: '{where}.tool_use_id'.", f"{where}.tool_use_id", "missing_required_parameter")
    content = block.get("content")
    text = "" if content is None else _readable_text(content, f"{where}.content", ignored, strict)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"Invalid value for '{where}.is_error': expected a boolean.", f"{where}.is_error", "invalid_type")
    if is_error:  # the model is told the call failed (a chat tool message has no flag for it)
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"Missing required parameter: '{where}.id'.", f"{where}.id", "missing_required_parameter")
    if not isinstance(name, str) or not name:
        raise _bad(f"Invalid value for '{where}.name': expected a non-empty string.", f"{where}.name", "invalid_type")
    if not isinstance(arguments, dict):
        raise _bad(f"Invalid value for '{where}.input': expected an object.", f"{where}.input", "invalid_type")
    try:
        text = json.dumps(arguments, ensure_ascii=False)
    except RecursionError:  # (as deep as the body's parser took, deeper than the encoder goes from here)
        raise _bad(f"Invalid value for '{where}.input': it is nested too deeply.", f"{where}.input") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _messages(raw: Any, ignored: list[str], strict: bool) -> list[dict[str, Any]]:
    """The conversation as chat messages: an assistant turn's text, thinking and tool_use blocks
    one assistant message (reasoning_content, tool_calls); a user turn's tool_result blocks tool
    messages, before the rest of its text as a user message (Anthropic puts the results first,
    and a chat template wants them right after the calls)."""
    if not isinstance(raw, list):
        if raw is None:
            raise _bad("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
        raise _bad("Invalid value for 'messages': expected an array of messages.", "messages", "invalid_type")
    out: list[dict[str, Any]] = []
    for where, msg in _objects(raw, "messages", MESSAGE_KEYS, ignored, strict):
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise _bad(f"Invalid value for '{where}.role': expected 'user' or 'assistant'.", f"{where}.role")
        if "content" not in msg:
            raise _bad(f"Missing required parameter: '{where}.content'.", f"{where}.content", "missing_required_parameter")
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, (kind, block) in enumerate(_blocks(msg["content"], f"{where}.content")):
            at = f"{where}.content[{j}]"
            if kind == "text":
                texts.append(_text_of(block, at))
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                # an earlier reply's reasoning, for the template (redacted: nothing readable)
                thought = block.get("thinking", "") if kind == "thinking" else ""
                if not isinstance(thought, str):
                    raise _bad(f"Invalid value for '{at}.thinking': expected a string.", f"{at}.thinking", "invalid_type")
                thoughts.append(thought)
            elif kind == "tool_use" and role == "assistant":
                calls.append(_tool_call(block, at))
            elif kind == "tool_result" and role == "user":
                results.append(_tool_result(block, at, ignored, strict))
            elif kind in ("image", "document") and role == "user":
                texts.append(_media_text(kind, block, at, ignored, strict))
            elif kind in ("thinking", "redacted_thinking", "tool_use", "tool_result"):
                raise _bad(f"Invalid value for '{at}': a '{kind}' block cannot be in a {role} message.", at)
            else:
                raise _unsupported_block(kind, at)
        out.extend(results)
        if role == "assistant":
            if texts or calls or thoughts:
                turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
                if calls:
                    turn["tool_calls"] = calls
                if any(thoughts):
                    turn["reasoning_content"] = "".join(thoughts)
                _add_turn(out, turn)
        elif texts or not results:
            _add_turn(out, {"role": "user", "content": "\n".join(texts)})
    return out


def _add_turn(out: list[dict[str, Any]], turn: dict[str, Any]) -> None:
    """``turn`` after the chat messages ``out``; where the last of them is a turn of the same role
    (two user turns in a row: Claude Code sends one after an interrupted turn, a command's output,
    a hook's), the two are one, their texts a line apart, as Anthropic combines consecutive turns
    of a role. Left two, the templates whose turns must alternate (Gemma's, Mistral's) refused the
    conversation, and with it every later turn of the session, which sends it again."""
    last = out[-1] if out else None
    if last is None or last["role"] != turn["role"]:
        out.append(turn)
        return
    last["content"] = "\n".join(text for text in (last["content"], turn["content"]) if text)
    if turn.get("tool_calls"):
        last["tool_calls"] = [*last.get("tool_calls", []), *turn["tool_calls"]]
    if turn.get("reasoning_content"):
        last["reasoning_content"] = last.get("reasoning_content", "") + turn["reasoning_content"]


def _tools(raw: Any, ignored: list[str], strict: bool) -> list[dict[str, Any]]:
    """``tools``: each a chat function (its cache_control a hint, ignored; another key of a tool,
    as one of the message's, named ignored)."""
    if not isinstance(raw, list):
        raise _bad("Invalid value for 'tools': expected an array of tools.", "tools", "invalid_type")
    out = []
    for where, tool in _objects(raw, "tools", TOOL_KEYS, ignored, strict):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            # Anthropic's server tools (web_search_*, bash_*, text_editor_*, computer_*, ...) run
            # at Anthropic: nothing here runs them, and their schema is not in the request
            raise _bad(
                f"Invalid value for '{where}.type': '{kind}' is an Anthropic server tool, which this server cannot run; "
                "define the tool with a name, description and input_schema instead.",
                f"{where}.type",
                "unsupported_value",
            )
        schema = tool.get("input_schema")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(raw: Any, chat: dict[str, Any]) -> None:
    """``tool_choice``: auto, any (a call is required), tool (that one's), none; with
    ``disable_parallel_tool_use`` (one call at most)."""
    if not isinstance(raw, dict):
        raise _bad("Invalid value for 'tool_choice': expected an object with a 'type'.", "tool_choice", "invalid_type")
    kind = raw.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str):
            raise _bad("Missing required parameter: 'tool_choice.name'.", "tool_choice.name", "missing_required_parameter")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise _bad("Invalid value for 'tool_choice.type': expected 'auto', 'any', 'tool' or 'none'.", "tool_choice.type")
    parallel = raw.get("disable_parallel_tool_use")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise _bad("Invalid value for 'tool_choice.disable_parallel_tool_use': expected a boolean.", "tool_choice.disable_parallel_tool_use", "invalid_type")
        chat["parallel_tool_calls"] = not parallel


def _thinking(raw: Any, chat: dict[str, Any], ignored: list[str]) -> None:
    """``thinking``: enabled (or adaptive) turns the template's thinking on, disabled off (the
    template variable ``enable_thinking``, as llama-server's chat_template_kwargs; one the body
    sets itself wins). Nothing here bounds the reasoning's length: ``budget_tokens`` is
    checked, then named ignored (``max_tokens`` bounds the whole reply)."""
    if not isinstance(raw, dict):
        raise _bad("Invalid value for 'thinking': expected an object with a 'type'.", "thinking", "invalid_type")
    kind = raw.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise _bad("Invalid value for 'thinking.type': expected 'enabled', 'adaptive' or 'disabled'.", "thinking.type")
    budget = raw.get("budget_tokens")
    if budget is not None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise _bad("Invalid value for 'thinking.budget_tokens': expected a non-negative integer.", "thinking.budget_tokens", "invalid_type")
        ignored.append("thinking.budget_tokens")
    kwargs = chat.get("chat_template_kwargs")
    if kwargs is None or isinstance(kwargs, dict):
        chat["chat_template_kwargs"] = {"enable_thinking": kind != "disabled", **(kwargs or {})}


def to_chat_body(body: dict[str, Any], *, strict: bool = False) -> tuple[dict[str, Any], list[str]]:
    """(the chat completions body of a Messages body, what of it is ignored). Raises
    :class:`ApiError` for what cannot be served."""
    ignored = _unknown([key for key in body if key not in MESSAGES_KEYS], strict)
    chat: dict[str, Any] = {}
    for key in ("model", "temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "metadata"):
        if key in body:
            chat[key] = body[key]
    chat["max_tokens"] = body["max_tokens"] if body.get("max_tokens") is not None else DEFAULT_MAX_TOKENS
    messages = _messages(body.get("messages"), ignored, strict)
    system = body.get("system")
    if system is not None:
        messages.insert(0, {"role": "system", "content": _system_text(system)})
    chat["messages"] = messages
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"], ignored, strict)
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("Invalid value for 'stop_sequences': expected an array of strings.", "stop_sequences", "invalid_type")
        if [s for s in stops if s]:  # an empty one can never match: dropped, as Anthropic ignores it
            chat["stop"] = [s for s in stops if s]
    if body.get("thinking") is not None:
        _thinking(body["thinking"], chat, ignored)
    if serving().prefill_assistant:
        _prefill(body, chat)
    return chat, ignored


def _prefill(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """A last assistant turn of text is a prefill the reply continues (api/schemas.py
    ``prefilled``), as at Anthropic: its text may not end with white space (Anthropic's 400,
    its words), and without ``thinking`` (Anthropic's default: no thinking) the template's is
    off (``enable_thinking`` false), so that the reply continues the text rather than reasoning
    first, which a prefill cannot follow (a 400 where the body turns thinking on)."""
    last = chat["messages"][-1] if chat["messages"] else None
    if last is None or last["role"] != "assistant" or last.get("tool_calls") or not last["content"]:
        return
    if last["content"] != last["content"].rstrip():
        raise _bad("messages: final assistant content cannot end with trailing whitespace", "messages")
    kwargs = chat.get("chat_template_kwargs")
    if body.get("thinking") is None and (kwargs is None or isinstance(kwargs, dict)):
        chat["chat_template_kwargs"] = {"enable_thinking": False, **(kwargs or {})}


def parse_messages_request(raw: bytes, *, models: list[str], strict: bool = False) -> GenerationRequest:
    """Validate a ``POST /v1/messages`` body and return the chat request it is."""
    body = load_object(raw)
    chat, ignored = to_chat_body(body, strict=strict)
    try:
        request = chat_request_from(chat, models=models, strict=strict, prefill=serving().prefill_assistant)
    except ApiError as exc:
        raise _in_messages_terms(exc) from None
    request.ignored = ignored + [key for key in request.ignored if key not in ignored]
    # max_tokens is what Anthropic's API requires and Claude Code sets high (32,000) whatever the
    # model: a prompt that leaves less of the context has the context's end bound the reply
    # (stop_reason max_tokens), as llama-server's n_predict, not a 400
    request.max_tokens_is_cap = True
    return request


_CHAT_NAMES = {"'stop'": "'stop_sequences'", "'parameters'": "'input_schema'", ".function.parameters": ".input_schema", ".function.": "."}


def _in_messages_terms(exc: ApiError) -> ApiError:
    """A chat parser's error about a field the Messages body spells otherwise, named as it is
    spelled there (``stop`` is ``stop_sequences``, a tool's ``function.parameters`` its
    ``input_schema``)."""
    message, param = exc.message, exc.param
    for chat_name, name in _CHAT_NAMES.items():
        message = message.replace(chat_name, name)
        if param is not None:
            param = param.replace(chat_name.strip("'"), name.strip("'"))
    return ApiError(exc.status, message, type=exc.type, param=param, code=exc.code, headers=exc.headers)


# ---------------------------------------------------------------------------------------------
# The reply: the chat reply's chunks (streamed) or body as Anthropic's message
# ---------------------------------------------------------------------------------------------


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.rpartition("-")[2]


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells one (``toolu_...``), the same streamed or not."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str | None, stop_word: str | None, stops: list[str], *, context_cut: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat finish_reason: a stop sequence of the request's
    ends the reply ``stop_sequence`` naming it; a call, ``tool_use``; max_tokens,
    ``max_tokens``; the context's end before max_tokens (``context_cut``: the request's
    max_tokens is a cap, see parse_messages_request), ``model_context_window_exceeded``, as
    Anthropic's API says when a prompt and max_tokens overshoot the window; else ``end_turn``."""
    if finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "length":
        return ("model_context_window_exceeded" if context_cut else "max_tokens"), None
    if stop_word is not None and stop_word in stops:
        return "stop_sequence", stop_word
    return "end_turn", None


def usage_of(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's usage from the worker's: input_tokens the prompt's tokens not read from the
    prefix cache (cache_read_input_tokens the ones that were), as Anthropic and llama-server
    count them."""
    cached = int(usage.get("cached_tokens") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    return {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object tool_use's ``input`` is (a call cut open, or whose
    arguments are no JSON object: ``{}``, as llama-server gives it). Read as RFC 8259 JSON: a
    ``NaN`` Python's reader takes made the body invalid JSON, and arguments nested past its depth
    raised RecursionError out of the reply (both are a call, its arguments as the model wrote
    them, since a call whose head came is one: ``responses.parse_tool_calls``)."""
    value = responses.loads_or_none(arguments)
    return value if isinstance(value, dict) else {}


def message_body(
    chat: dict[str, Any], model: str, stop_word: str | None, stops: list[str], usage: dict[str, Any], max_tokens: int
) -> dict[str, Any]:
    """The non-streamed message of a chat completion's body: its blocks in order (thinking,
    text, tool_use); ``max_tokens`` the request's (a reply cut short of it: the context's end)."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"], "input": _input(call["function"]["arguments"])})
    finish = choice.get("finish_reason")
    cut = responses.cut_by_context(finish, usage, max_tokens)
    reason, sequence = stop_reason(finish, stop_word, stops, context_cut=cut)
    return {
        "id": message_id(chat["id"]),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(usage),
    }


class BlockStream:
    """The chat reply's streamed chunks as Messages stream events: each run of reasoning, text
    or one call's arguments a content block, opened when it begins and closed when another
    begins or the reply ends (``index`` counting the blocks)."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text", or "tool:<n>" (the chat call index)

    def _start(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        frames = self.close()
        self.index += 1
        self.open = kind
        return [*frames, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def feed(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        for chunk in chunks:
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                thought = delta.get("reasoning_content")
                if thought:
                    if self.open != "thinking":
                        frames += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                    frames.append(self._delta({"type": "thinking_delta", "thinking": thought}))
                text = delta.get("content")
                if text:
                    if self.open != "text":
                        frames += self._start("text", {"type": "text", "text": ""})
                    frames.append(self._delta({"type": "text_delta", "text": text}))
                for call in delta.get("tool_calls") or []:
                    fn = call.get("function") or {}
                    kind = f"tool:{call.get('index', 0)}"
                    if call.get("id") is not None:
                        block = {"type": "tool_use", "id": tool_use_id(call["id"]), "name": fn.get("name", ""), "input": {}}
                        frames += self._start(kind, block)
                    if fn.get("arguments") and self.open == kind:
                        frames.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return frames


def assembled(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a stream's frames (:class:`BlockStream`'s) put together, as the SDK's
    ``get_final_message()`` does: each block's deltas joined, a tool_use's ``input`` the object
    its partial JSON adds up to (``{}`` for arguments cut open, as :func:`message_body`)."""
    blocks: list[dict[str, Any]] = []
    arguments: dict[int, str] = {}
    for frame in frames:
        if frame["type"] == "content_block_start":
            blocks.append(dict(frame["content_block"]))
        elif frame["type"] == "content_block_delta":
            delta, block = frame["delta"], blocks[frame["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                arguments[frame["index"]] = arguments.get(frame["index"], "") + delta["partial_json"]
    for index, text in arguments.items():
        blocks[index]["input"] = _input(text)
    return blocks


def in_written_order(body: dict[str, Any], again: responses.Reply, texts: list[str], event: Any) -> dict[str, Any]:
    """The message ``body`` (:func:`message_body`'s) with its blocks in the order the model wrote
    them, as the stream gives them (text after a call is a text block after its tool_use): the
    reply's text (``texts``, its deltas) replayed through ``again`` (a fresh reply of the same
    request) and the stream's own translation, so the two are the same message."""
    blocks, frames = BlockStream(), []
    for n, text in enumerate(texts, 1):
        frames += blocks.feed(again.delta_chunks(Delta(id=event.id, text=text, tokens=n)))
    replayed = assembled(frames + blocks.feed(again.final_chunks(event, None)) + blocks.close())
    if _same_blocks(replayed, body["content"]):  # (else the whole reply's, as it was parsed)
        body["content"] = replayed
    return body


def _same_blocks(ordered: list[dict[str, Any]], whole: list[dict[str, Any]]) -> bool:
    """Whether ``ordered`` holds what ``whole`` does (its thinking, its text, its calls' names
    and inputs), however it orders and splits them."""

    def held(blocks: list[dict[str, Any]]) -> tuple[str, str, list[tuple[Any, Any]]]:
        texts = [b.get("text", "") for b in blocks if b["type"] == "text"]
        thoughts = [b.get("thinking", "") for b in blocks if b["type"] == "thinking"]
        return "".join(thoughts), "".join(texts), [(b.get("name"), b.get("input")) for b in blocks if b["type"] == "tool_use"]

    return held(ordered) == held(whole)


_CONTEXT = re.compile(r"maximum context length is (\d+) tokens\. However, you requested (\d+) tokens in the ")


def prompt_too_long(exc: ApiError) -> ApiError:
    """A prompt the context cannot hold, worded as Anthropic words it (``prompt is too long: N
    tokens > M maximum``), which Claude Code reads to compact its conversation and retry."""
    if exc.code != "context_length_exceeded":
        return exc
    found = _CONTEXT.search(exc.message)
    message = f"prompt is too long: {found[2]} tokens > {found[1]} maximum" if found else f"prompt is too long: {exc.message}"
    return ApiError(exc.status, message, type=exc.type, param=exc.param, code=exc.code, headers=exc.headers)


# ---------------------------------------------------------------------------------------------
# POST /v1/messages
# ---------------------------------------------------------------------------------------------


class MessagesConsumer(ChatCompletionsConsumer):
    """``POST /v1/messages``: a chat completion (its admission, class, limits, activity row and
    metrics under ``chat``) asked and answered in Anthropic's Messages shapes."""

    stream_end = b""  # the stream ends with message_stop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks = BlockStream()

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        return parse_messages_request(body, models=models, strict=serving().strict_params)

    def sse_frame(self, frame: dict[str, Any]) -> bytes:
        return sse_frame(frame)

    def keepalive_event(self) -> bytes:
        """Anthropic's own keepalive: a stream may hold any number of ``ping`` events."""
        return sse_frame({"type": "ping"})

    def response_headers(self, handle: JobHandle, qos: QosClass) -> list[tuple[bytes, bytes]]:
        """The reply's headers, with its id also as Anthropic's ``request-id`` (what the SDK's
        ``_request_id`` and its errors' ``request_id`` read)."""
        return [*super().response_headers(handle, qos), (b"request-id", handle.job_id.encode())]

    def input_tokens(self) -> int:
        jobs = list(self.sends.values())
        return (jobs[0][0].prompt_tokens or 0) if jobs else 0

    def opening_frames(self, reply: responses.Reply) -> list[dict[str, Any]]:
        message: dict[str, Any] = {
            "id": message_id(reply.id),
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens(), "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def delta_events(self, reply: responses.Reply, event: Any) -> list[bytes]:
        return [sse_frame(f) for f in self.blocks.feed(reply.delta_chunks(event))]

    def final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Any) -> list[dict[str, Any]]:
        chunks = reply.final_chunks(event, None)
        frames = self.blocks.feed(chunks) + self.blocks.close()
        finish = next((c["choices"][0].get("finish_reason") for c in reversed(chunks) if c.get("choices")), event.finish_reason)
        cut = responses.cut_by_context(finish, event.usage, request.max_tokens)
        reason, sequence = stop_reason(finish, event.stop_word, request.stop or [], context_cut=cut)
        frames.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage_of(event.usage)})
        frames.append({"type": "message_stop"})
        return frames

    def final_body(self, request: GenerationRequest, reply: responses.Reply, event: Any) -> dict[str, Any]:
        body = message_body(reply.body(event, None), request.model, event.stop_word, request.stop or [], event.usage, request.max_tokens)
        return in_written_order(body, self.reply(request), reply.text, event)

    async def send_error(self, exc: ApiError) -> None:
        exc = prompt_too_long(exc)
        self.record.error_code = exc.code or exc.type
        if self.headers_sent:  # the stream has begun: Anthropic's error event ends it
            await self.send_body(sse_frame(anthropic_error_body(exc.status, exc.message)))
            return
        self.record.status = exc.status
        extra = [(k.lower().encode(), str(v).encode()) for k, v in (exc.headers or {}).items()]
        self.record.request_id = self.record.request_id or uuid.uuid4().hex
        extra += [(b"x-request-id", self.record.request_id.encode()), (b"request-id", self.record.request_id.encode())]
        await self.send_json(exc.status, anthropic_error_body(exc.status, exc.message, self.record.request_id), extra)


# ---------------------------------------------------------------------------------------------
# POST /v1/messages/count_tokens
# ---------------------------------------------------------------------------------------------


def anthropic_errors(view: Callable[..., Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
    """A Django view whose error replies (its own, and those of the wrappers inside this one:
    a key refused, a wrong method, a foreign origin) are Anthropic's error objects."""
    @functools.wraps(view)
    async def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = await view(request, *args, **kwargs)
        # (RequestIdMiddleware names the reply's X-Request-Id after this returns: its id is set)
        request_id = response.get("x-request-id") or getattr(request, "request_id", None)
        if request_id:
            response["request-id"] = request_id  # Anthropic's name for it, which its SDK reads
        if response.status_code < 400 or not response.get("Content-Type", "").startswith("application/json"):
            return response
        try:
            error = json.loads(response.content)["error"]
            message = error["message"]
        except (ValueError, KeyError, TypeError):
            return response
        rewritten = JsonResponse(anthropic_error_body(response.status_code, str(message), request_id), status=response.status_code)
        for name, value in response.items():
            if name.lower() not in ("content-type", "content-length"):
                rewritten[name] = value
        return rewritten

    return inner


@key_required()
async def count_tokens(request: HttpRequest) -> HttpResponse:
    """``{"input_tokens": N}``: the tokens of the prompt a Messages body's conversation (its
    system, tools and messages) renders to with the model's chat template, as its worker would
    prefill it, without generating. ``model`` as a Messages request names it (404 for one not
    served); the body's other Messages fields are allowed (and change nothing)."""
    try:
        body = await asyncio.to_thread(_json_body, request)
        chat, ignored = to_chat_body(body, strict=serving().strict_params)
        pool = get_pool()
        served = pool.names() if pool is not None else await _served_models()
        model = named_model(chat)  # (an empty one is none, as on /v1/messages: a 400, not a 404)
        if model is None:
            raise _bad("Missing required parameter: 'model'.", "model", "missing_required_parameter")
        if not isinstance(model, str):
            raise _bad("Invalid value for 'model': expected a string.", "model", "invalid_type")
        if model not in served:
            raise model_not_found(model)
        if not _allowed(request, [model]):  # as /v1/messages refuses it (admission's check)
            raise forbidden(f"This API key may not use the model `{model}`.", "model_forbidden", "model")
        try:
            wire = (await asyncio.to_thread(functools.partial(chat_request_from, chat, models=served, prefill=serving().prefill_assistant))).to_wire()
        except ApiError as exc:
            raise _in_messages_terms(exc) from None
        admission = await admit_tool(request.principal)  # type: ignore[attr-defined]
    except ApiError as exc:
        return error_response(exc)

    def work(vocab: Any) -> HttpResponse:
        reply = JsonResponse({"input_tokens": count_chat_tokens(vocab, render_chat(vocab, wire))})
        return naming_ignored(reply, [*ignored, *wire["ignored"]])

    return await _with_tool_vocab(model, admission, work)
