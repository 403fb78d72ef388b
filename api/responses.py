"""Builders for OpenAI-compatible response bodies and server-sent events.

Pure functions returning dicts or bytes; the shapes are those the official ``openai`` SDK parses
(``ChatCompletion``, ``ChatCompletionChunk``, ``Completion``, ``Model``), checked in
``tests/api/test_responses.py``. ``created`` is a unix time in whole seconds; pass ``None`` for
"now" (pass the same value to every chunk of one stream, as OpenAI does).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from typing import Any, Literal

from .errors import ApiError

Endpoint = Literal["chat", "completions"]

SSE_DONE = b"data: [DONE]\n\n"

_ID_PREFIX: dict[str, str] = {"chat": "chatcmpl-", "completions": "cmpl-"}


def new_id(endpoint: Endpoint) -> str:
    """A fresh response id: ``chatcmpl-`` (chat) or ``cmpl-`` (completions) plus 24 random hex
    characters."""
    try:
        prefix = _ID_PREFIX[endpoint]
    except KeyError:
        raise ValueError(f"unknown endpoint {endpoint!r}") from None
    return prefix + secrets.token_hex(12)


def _created(created: int | None) -> int:
    return int(time.time()) if created is None else int(created)


def usage_dict(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The ``usage`` object: prompt, completion and total token counts, plus
    ``prompt_tokens_details.cached_tokens`` (prompt tokens served from the prefix cache)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# ---------------------------------------------------------------------------------------------
# Chat completions
# ---------------------------------------------------------------------------------------------


def chat_completion(
    id: str,  # noqa: A002 - mirrors the wire field name
    model: str,
    created: int | None,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` with one assistant choice holding ``text``."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": _created(created),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "system_fingerprint": None,
    }


def chat_chunk(
    id: str,  # noqa: A002
    model: str,
    created: int | None,
    *,
    role: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``. The ``delta`` holds only the keys given (``role`` on the
    first chunk, ``content`` on text chunks, neither on the final one carrying
    ``finish_reason``). ``include_usage=True`` adds ``"usage": null``, which OpenAI puts on every
    chunk but the usage chunk when the client asked for ``stream_options.include_usage``."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    out: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": _created(created),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        out["usage"] = None
    return out


def chat_usage_chunk(
    id: str,  # noqa: A002
    model: str,
    created: int | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The trailing ``chat.completion.chunk`` sent before ``[DONE]`` when the client asked for
    usage: empty ``choices`` and the whole request's ``usage``."""
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": _created(created),
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage,
    }


# ---------------------------------------------------------------------------------------------
# Legacy completions
# ---------------------------------------------------------------------------------------------


def text_completion(
    id: str,  # noqa: A002
    model: str,
    created: int | None,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` with one choice holding ``text``."""
    return {
        "id": id,
        "object": "text_completion",
        "created": _created(created),
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
        "system_fingerprint": None,
    }


def completion_chunk(
    id: str,  # noqa: A002
    model: str,
    created: int | None,
    text: str,
    finish_reason: str | None = None,
    *,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One streamed completions event. OpenAI streams these with ``object`` ``text_completion``
    (there is no separate chunk object name); ``include_usage`` as in :func:`chat_chunk`."""
    out: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": _created(created),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        out["usage"] = None
    return out


def completion_usage_chunk(
    id: str,  # noqa: A002
    model: str,
    created: int | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The trailing completions event carrying ``usage`` with empty ``choices``."""
    return {
        "id": id,
        "object": "text_completion",
        "created": _created(created),
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage,
    }


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON, for response bodies and SSE payloads.

    Non-ASCII is kept literal (smaller than ``\\uXXXX``); a lone surrogate (text cut inside a
    character by a careless detokeniser) is replaced rather than crashing the stream.
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace")


def sse_event(obj: dict[str, Any]) -> bytes:
    """``obj`` as one server-sent event: ``b"data: <compact json>\\n\\n"``. JSON escapes
    newlines inside strings, so the payload is always a single ``data:`` line."""
    return b"data: " + json_bytes(obj) + b"\n\n"


def sse_error(error: ApiError) -> bytes:
    """An error reported mid-stream (headers already sent): ``data: {"error": {...}}``; the
    ``openai`` SDK raises ``APIError`` on an event whose payload has an ``error`` key."""
    return sse_event(error.body())


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def model_object(
    model_id: str, created: int | None, owned_by: str = "superfluid", **extra: Any
) -> dict[str, Any]:
    """One ``model`` entry for ``GET /v1/models``; ``extra`` keys (context length, state, ...)
    are added alongside the standard ``id``/``object``/``created``/``owned_by``."""
    return {
        "id": model_id,
        "object": "model",
        "created": _created(created),
        "owned_by": owned_by,
        **extra,
    }


def model_list(objs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The ``GET /v1/models`` body: ``{"object": "list", "data": [...]}``."""
    return {"object": "list", "data": list(objs)}
