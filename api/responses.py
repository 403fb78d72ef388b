"""Builders for OpenAI-compatible response bodies and server-sent events.

Pure functions returning dicts or bytes; the shapes are those the official ``openai`` SDK parses
(``ChatCompletion``, ``ChatCompletionChunk``, ``Completion``, ``Model``), checked in
``tests/api/test_responses.py``. ``created`` is a unix time in whole seconds; pass ``None`` for
"now" (pass the same value to every chunk of one stream, as OpenAI does).
"""

from __future__ import annotations

import codecs
import json
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Literal

from scheduler.engines.chat import SINGLE_CALL_FORMATS
from scheduler.engines.grammar import MAX_PARALLEL_CALLS
from scheduler.link.messages import Delta, Done

from .errors import ApiError
from .reasoning import Parts, new_splitter, partial_suffix, split_parts
from .xml_tool_calls import XML_FORMATS

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


def _body(id: str, obj: str, created: int | None, model: str, **fields: Any) -> dict[str, Any]:  # noqa: A002
    """A response object: ``id``, ``object``, ``created`` and ``model``, then ``fields`` in order."""
    return {"id": id, "object": obj, "created": _created(created), "model": model, **fields}


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


def _cut_short(event: Done) -> bool:
    """Whether the reply was cut before the model ended it: by max_tokens (or the context's
    end), or by a stop string (whose match may fall inside a call's arguments: the call stays
    open, as one cut by max_tokens, not closed after arguments that were cut)."""
    return event.finish_reason == "length" or event.stop_word is not None


def cut_by_context(finish_reason: str | None, usage: Mapping[str, Any], max_tokens: int | None) -> bool:
    """Whether a reply that ended ``length`` was cut by the end of its context, not by the
    ``max_tokens`` the client asked: its ``usage``'s completion tokens stopped short of them, or
    none were asked (the worker then bounds the reply by the context's room)."""
    return finish_reason == "length" and (max_tokens is None or int(usage.get("completion_tokens") or 0) < max_tokens)


# ---------------------------------------------------------------------------------------------
# Chat completions
# ---------------------------------------------------------------------------------------------


def chat_completion(
    id: str, model: str, created: int | None, text: str, finish_reason: str | None, usage: dict[str, Any] | None  # noqa: A002 - mirrors the wire field name
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` with one assistant choice holding ``text``."""
    message = {"role": "assistant", "content": text, "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    return _body(id, "chat.completion", created, model, choices=[choice], usage=usage, system_fingerprint=None)


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
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return _chunk(id, "chat.completion.chunk", created, model, choice, include_usage)


def _chunk(id: str, obj: str, created: int | None, model: str, choice: dict[str, Any], include_usage: bool) -> dict[str, Any]:  # noqa: A002
    """A streamed event holding one choice; ``"usage": null`` after it when ``include_usage``."""
    out = _body(id, obj, created, model, system_fingerprint=None, choices=[choice])
    if include_usage:
        out["usage"] = None
    return out


def chat_usage_chunk(id: str, model: str, created: int | None, usage: dict[str, Any]) -> dict[str, Any]:  # noqa: A002
    """The trailing ``chat.completion.chunk`` sent before ``[DONE]`` when the client asked for
    usage: empty ``choices`` and the whole request's ``usage``."""
    return _body(id, "chat.completion.chunk", created, model, system_fingerprint=None, choices=[], usage=usage)


# ---------------------------------------------------------------------------------------------
# Legacy completions
# ---------------------------------------------------------------------------------------------


def text_completion(
    id: str, model: str, created: int | None, text: str, finish_reason: str | None, usage: dict[str, Any] | None  # noqa: A002
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` with one choice holding ``text``."""
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    return _body(id, "text_completion", created, model, choices=[choice], usage=usage, system_fingerprint=None)


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
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    return _chunk(id, "text_completion", created, model, choice, include_usage)


def completion_usage_chunk(id: str, model: str, created: int | None, usage: dict[str, Any]) -> dict[str, Any]:  # noqa: A002
    """The trailing completions event carrying ``usage`` with empty ``choices``."""
    return _body(id, "text_completion", created, model, system_fingerprint=None, choices=[], usage=usage)


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


# Characters Python's str.splitlines() ends a line at that JSON leaves unescaped: httpx's
# iter_lines() (and requests' with decode_unicode) splits an event's data line at them
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON, for response bodies and SSE payloads.

    Non-ASCII is kept literal (smaller than ``\\uXXXX``), but for U+2028, U+2029 and U+0085,
    which some clients' line splitters end an SSE line at (escaped, an event stays one line); a
    lone surrogate (text cut inside a character by a careless detokeniser) is replaced rather
    than crashing the stream.
    """
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii():
        text = text.translate(_LINE_BREAKS)
    return text.encode("utf-8", "replace")


def sse_event(obj: dict[str, Any]) -> bytes:
    """``obj`` as one server-sent event: ``b"data: <compact json>\\n\\n"``. JSON escapes
    newlines inside strings, so the payload is always a single ``data:`` line."""
    return b"data: " + json_bytes(obj) + b"\n\n"


def named_sse_event(obj: dict[str, Any]) -> bytes:
    """``obj`` as a server-sent event named by its ``type``: ``event: <type>`` and its ``data:``
    line, as the Responses API's and Anthropic's streams are (their SDKs read the name)."""
    return b"event: " + str(obj["type"]).encode() + b"\n" + sse_event(obj)


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


# ---------------------------------------------------------------------------------------------
# Ignored parameters
# ---------------------------------------------------------------------------------------------

IGNORED_PARAMS_HEADER = "x-superfluid-ignored-params"
_MAX_IGNORED_NAMED = 32


def ignored_params_value(names: Iterable[str]) -> str:
    """The ``x-superfluid-ignored-params`` value: the ignored parameter names, comma-separated.
    A name is only echoed if it is a plain identifier (letters, digits, ``_.-``, at most 64
    characters), so a hostile key can never inject into the header; others count as ``?``."""
    out: list[str] = []
    for name in names:
        safe = 0 < len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in name)
        out.append(name if safe else "?")
        if len(out) == _MAX_IGNORED_NAMED:
            break
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------
# Logprobs
# ---------------------------------------------------------------------------------------------


def _token_text(raw: list[int]) -> str:
    return bytes(raw).decode("utf-8", "replace")


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat ``choices[].logprobs`` for the worker's per-token entries (``token_id``, ``bytes``,
    ``logprob``, ``top``): one ``content`` item per completion token."""
    return {
        "content": [
            {
                "token": _token_text(e["bytes"]),
                "logprob": e["logprob"],
                "bytes": e["bytes"],
                "top_logprobs": [
                    {"token": _token_text(t["bytes"]), "logprob": t["logprob"], "bytes": t["bytes"]}
                    for t in e["top"]
                ],
            }
            for e in entries
        ],
        "refusal": None,
    }


def token_offsets(entries: list[dict[str, Any]], offset: int = 0, decoder: codecs.IncrementalDecoder | None = None) -> tuple[list[int], int]:
    """Where each entry's token starts in the text, from ``offset``, and where the text after
    them starts: a character split across tokens counts once, when its last byte comes (each
    token's text alone would count its pieces as one U+FFFD each). A stream passes its own
    ``decoder``, so a character split across two chunks counts once too."""
    decoder = decoder or codecs.getincrementaldecoder("utf-8")("replace")
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(decoder.decode(bytes(e["bytes"])))
    return offsets, offset


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0, offsets: list[int] | None = None) -> dict[str, Any]:
    """Legacy completions ``choices[].logprobs``: parallel ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (token text -> logprob) and ``text_offset`` arrays; ``offset`` is where the
    first token's text starts in the choice's text so far (or ``offsets`` gives them all).
    Each ``top_logprobs`` holds the token itself beside its alternatives, as OpenAI's legacy
    endpoint (and vLLM) answer: "The API will always return the logprob of the sampled token,
    so there may be up to logprobs+1 elements" (``logprobs`` 0: the token alone)."""
    tokens = [_token_text(e["bytes"]) for e in entries]
    if offsets is None:
        offsets, _ = token_offsets(entries, offset)
    return {
        "tokens": tokens,
        "token_logprobs": [e["logprob"] for e in entries],
        # a scored prompt's first token has no logprob and no alternatives: null, as OpenAI's
        "top_logprobs": [None if e["logprob"] is None else _top_with_token(e, token) for e, token in zip(entries, tokens, strict=True)],
        "text_offset": offsets,
    }


def _top_with_token(entry: dict[str, Any], token: str) -> dict[str, float]:
    """A legacy ``top_logprobs`` item: the alternatives, and the token where they lack it."""
    top = {_token_text(t["bytes"]): t["logprob"] for t in entry["top"]}
    top.setdefault(token, entry["logprob"])
    return top


# ---------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# A reply's tool-call tags that hold no call are text, and parsing goes on after each; past this
# many the rest is text, so that a reply made of such tags (a prompt that has the model repeat
# them) costs a bounded number of parses on the web process's event loop, not one per tag.
MAX_MISSED_BLOCKS = 16


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# JSON as RFC 8259 has it: Python's reader takes NaN, Infinity and -Infinity, which a call's
# arguments must not hold (a client's parser refuses them: "tool_calls" means arguments that parse)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
# the whitespace str.lstrip() strips (a call's block may open with any before its object)
_LEADING_SPACE = re.compile(r"\s*")


def parse_tool_calls(
    text: str, names: Collection[str], *, strip: bool = True, fmt: str = "hermes"
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a reply written in the generic format
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, or (``fmt``, the model's own
    format: ``scheduler.engines.chat.tool_call_format``) in Llama 3.x's or Mistral's. A block that
    does not parse or names no offered function stays in the content as text, but for one whose
    head (an offered name, then the arguments' ``{``) came: a stream sent that call the moment
    it came, so it is a call whatever follows (:func:`_read_tool_calls`). ``strip=False``: the
    content keeps its whitespace at both ends (the end of a stream, whose earlier text went out
    already). The generic format is read for every model: a forced call's grammar writes it."""
    content, calls, _whole = _read_tool_calls(text, names, strip=strip, fmt=fmt)
    return content, calls


def _read_tool_calls(
    text: str, names: Collection[str], *, strip: bool = True, fmt: str = "hermes"
) -> tuple[str | None, list[dict[str, Any]], list[bool]]:
    """:func:`parse_tool_calls`, and for each call whether it is whole: its arguments JSON and
    its block closed. A block whose head came is read as the stream reads it
    (``Reply._stream_calls``): its arguments as far as they go (to their closing brace, or to
    the end of the reply, cut there by max_tokens, a stop string or the end of generation),
    then its closing; a closing cut short by the reply's end is no content (markup of a call),
    and text after the arguments that is no closing is content, read on for further calls."""
    native = _NATIVE_PARSERS.get(fmt)
    # where a call in the model's own format begins, read in order with the JSON ones before it
    # as a stream reads them (then the rest is read in that format); Llama 3.x's may begin only
    # at the reply's start, so the whole reply is read in its format first
    native_from = _native_from(text, fmt) if native is not None and fmt != "llama3" else None
    if native is not None and native_from is None:
        found = _native_calls(text, names, fmt)
        if found is not None:
            return ((found[0].strip() if strip else found[0]) or None), found[1], [True] * len(found[1])
    calls: list[dict[str, Any]] = []
    whole: list[bool] = []
    rest: list[str] = []
    pos = 0
    decoder = _DECODER
    misses = 0  # blocks that were no call: each costs a parse to the end of the text at worst
    while True:
        if native_from is not None and (at_native := native_from(pos, names)) is not None:
            found = _native_calls(text[at_native:], names, fmt)
            if found is not None:  # the rest is read in the model's own format
                rest += [text[pos:at_native], found[0]]
                calls += found[1]
                whole += [True] * len(found[1])
                break
            native_from = None  # none there: the rest is read as JSON calls and text
        start = text.find(TOOL_OPEN, pos)
        if start < 0 or misses >= MAX_MISSED_BLOCKS:  # then: the rest is text
            rest.append(text[pos:])
            break
        rest.append(text[pos:start])
        body_at = start + len(TOOL_OPEN)
        # (matched in place: stripping a copy of the rest of the text for each block made a reply
        # of many calls cost the square of its length)
        at = _LEADING_SPACE.match(text, body_at).end()  # type: ignore[union-attr]  # (\s* always matches)
        if at < len(text) and text[at] != "{":
            # no JSON object follows the tag: text, at no cost (a stream sends it at once, so it
            # counts as no miss; parsed, a long array after it cost a parse to its end)
            rest.append(TOOL_OPEN)
            pos = body_at
            continue
        head = _CALL_HEAD.match(text, start, start + MAX_CALL_HEAD)
        name = _head_name(head) if head is not None else None
        if head is not None and name in names:
            call, pos, closed = _headed_call(text, head, name, fmt)
            calls.append(call)
            whole.append(closed)
            continue
        try:
            obj, end = decoder.raw_decode(text, at)
            spans = _member_spans(text, at) if isinstance(obj, dict) else {}
        except (ValueError, RecursionError):  # not a call (however deeply nested): text
            rest.append(text[start:body_at])  # the tag is text; a later block may be a call
            pos, misses = body_at, misses + 1
            continue
        close = text.find(TOOL_CLOSE, end)
        between = text[end:close] if close >= 0 else text[end:]
        name = obj.get("name") if isinstance(obj, dict) else None
        arguments = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else None
        if close < 0 or between.strip() or name not in names or not isinstance(arguments, dict):
            rest.append(text[start:body_at])  # the tag is text; a later block may be a call
            pos, misses = body_at, misses + 1
            continue
        # the arguments as the model wrote them (valid JSON: it parsed), so that a stream, which
        # sends them as they are generated, adds up to exactly the same string
        span = spans.get("arguments", spans.get("parameters"))
        calls.append(
            {
                "id": mistral_call_id() if fmt == "mistral" else new_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": text[span[0] : span[1]] if span else "{}"},
            }
        )
        whole.append(True)
        pos = close + len(TOOL_CLOSE)
    content = "".join(rest)
    return ((content.strip() if strip else content) or None), calls, whole


def _native_calls(text: str, names: Collection[str], fmt: str) -> tuple[str, list[dict[str, Any]]] | None:
    """(the text around them, the calls) of ``text`` read in the model's own format ``fmt``;
    None where it holds no call in it."""
    try:
        content, found = _NATIVE_PARSERS[fmt](text, names)
    except (ValueError, RecursionError):  # not calls after all: the text as it is
        return None
    return (content, found) if found else None


def _mistral_start(held: str, tools: Collection[str], pos: int = 0) -> tuple[int, bool] | None:
    """As :func:`api.xml_tool_calls.qwen3_coder_start`, for Mistral's ``[TOOL_CALLS]``: where in
    ``held`` (from ``pos``) it begins (True), or may still begin once more text comes (False),
    before the first ``<tool_call>`` (searched only up to it: a reply read from each position
    in turn costs its length once)."""
    tag = held.find(TOOL_OPEN, pos)
    at = held.find(MISTRAL_CALLS, pos, len(held) if tag < 0 else tag + len(MISTRAL_CALLS) - 1)
    if at >= 0:
        return at, True
    if tag >= 0:
        return None
    keep = partial_suffix(held[max(pos, len(held) - len(MISTRAL_CALLS)) :], (MISTRAL_CALLS,))
    return (len(held) - keep, False) if keep else None  # maybe the tag, still coming


# each format whose calls may begin anywhere in a reply: where one begins in streamed text
_NATIVE_STARTS = {"mistral": _mistral_start, **{fmt: starts for fmt, (_read, starts) in XML_FORMATS.items()}}


def _native_from(text: str, fmt: str) -> Callable[[int, Collection[str]], int | None] | None:
    """For a format whose calls may begin anywhere in a reply (_NATIVE_STARTS): where, reading
    ``text`` from a position, one begins as the stream finds it (``Reply._native_start``), or
    None. None for another format."""
    starts = _NATIVE_STARTS.get(fmt)
    if starts is None:
        return None

    def native_at(pos: int, names: Collection[str]) -> int | None:
        start = starts(text, names, pos)
        return None if start is None else start[0]

    return native_at


def _headed_call(text: str, head: re.Match[str], name: str, fmt: str) -> tuple[dict[str, Any], int, bool]:
    """(the call, where the text after it goes on, whether it is whole) of the block whose head
    (the offered function ``name`` and its arguments' ``{``) ``head`` matched, read as a stream
    reads it."""
    args_at = head.end()
    try:
        end = _DECODER.raw_decode(text, args_at)[1]
        parsed = True
    except (ValueError, RecursionError):  # no JSON: where its braces close (or the text's end)
        scanner = _ArgsScanner()
        end = args_at + scanner.feed(text, args_at)
        parsed = False
    call = {
        "id": mistral_call_id() if fmt == "mistral" else new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": text[args_at:end]},
    }
    tail = _call_tail(text, start=end) if end < len(text) or parsed else 0
    if tail > 0:  # closed
        return call, end + tail, parsed
    if tail == 0:  # the arguments or the closing cut short by the reply's end: markup, no content
        return call, len(text), False
    return call, end, False  # what follows the arguments is no closing: text


def _head_name(head: re.Match[str]) -> Any:
    """The function a call's head names (None where its string is no JSON: ``"get\\_weather"``
    passes the pattern, not JSON)."""
    return loads_or_none(head.group(1))


_WS = " \t\n\r"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
# ``name[ARGS]``, or ``name[CALL_ID]id[ARGS]`` (the call's id between, as Mistral Small 3.2's
# template writes an earlier call and the v13 tokenizer's models may write one)
_MISTRAL_NAME = re.compile(
    r"\s*([A-Za-z0-9_-]{1,64})\s*(?:" + re.escape(MISTRAL_CALL_ID) + r"\s*([A-Za-z0-9_-]{0,64})\s*)?" + re.escape(MISTRAL_ARGS) + r"\s*(?=\{)"
)
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


def mistral_call_id() -> str:
    """A call id as Mistral's templates take it back: 9 letters and digits (they raise
    "Tool call IDs should be alphanumeric strings with length 9!" on any other)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(9))


def _native_call(text: str, at: int, names: Collection[str], args_keys: tuple[str, ...], extra: frozenset[str]) -> tuple[dict[str, Any], int] | None:
    """The call written as the JSON object at ``text[at]`` (``{"name", <one of args_keys>}``,
    besides which only the keys in ``extra`` may be), and where the object ends; None if it is no
    such call of an offered function. Its arguments are kept as the model wrote them."""
    obj, end = _DECODER.raw_decode(text, at)
    if not isinstance(obj, dict) or obj.get("name") not in names or not obj.keys() <= {"name", *args_keys, *extra}:
        return None
    key = next((k for k in args_keys if k in obj), None)
    if key is None or ("type" in obj and obj["type"] != "function"):
        return None
    value = obj[key]
    if isinstance(value, dict):
        span = _member_spans(text, at)[key]
        arguments = text[span[0] : span[1]]
    elif isinstance(value, str) and isinstance(loads_or_none(value), dict):
        arguments = value  # the arguments as a JSON string (as OpenAI's own messages hold them)
    else:
        return None
    call = {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": arguments}}
    return call, end


def loads_or_none(text: str) -> Any:
    """``text`` read as RFC 8259 JSON (no ``NaN``), or None where it is none (nested past the
    reader's depth included)."""
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return None


def _skip_ws(text: str, i: int) -> int:
    while text[i : i + 1] and text[i] in _WS:
        i += 1
    return i


def _parse_llama3(text: str, names: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    """Llama 3.1/3.2/3.3: one call at the very start of the reply, a bare JSON object
    ``{"name": ..., "parameters": {...}}`` (``"type": "function"`` may come first), maybe after
    ``<|python_tag|>``, as llama.cpp's common_chat_parse_llama_3_1 reads it. One: these models'
    templates refuse an assistant turn with more ("This model only supports single tool-calls at
    once!"), so a second call given to the client would make its next request a 400. The rest of
    the text (a second call the model wrote included) is content."""
    i = _skip_ws(text, 0)
    if text.startswith(PYTHON_TAG, i):
        i = _skip_ws(text, i + len(PYTHON_TAG))
    if text[i : i + 1] != "{":
        return text, []
    found = _native_call(text, i, names, ("parameters", "arguments"), frozenset({"type"}))
    if found is None:
        return text, []
    # (the whitespace before the call is text around it, as before a call of another format)
    return text[: _skip_ws(text, 0)] + text[found[1] :], [found[0]]


def _parse_mistral(text: str, names: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    """Mistral: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments", "id"?}`` (Nemo,
    Small 3.x), or ``[TOOL_CALLS]name[ARGS]{...}`` once per call (the newer templates), as
    llama.cpp's common_chat_parse_mistral_nemo / magistral read them. Text before the first
    ``[TOOL_CALLS]`` and after the calls is content; the ids are Mistral's 9-character ones."""
    at = text.find(MISTRAL_CALLS)
    if at < 0:
        return text, []
    calls: list[dict[str, Any]] = []
    i = at
    while text.startswith(MISTRAL_CALLS, i) and len(calls) < MAX_PARSED_CALLS:
        j = _skip_ws(text, i + len(MISTRAL_CALLS))
        batch: list[dict[str, Any]] = []
        if text[j : j + 1] == "[":
            _array, end = _DECODER.raw_decode(text, j)  # the whole array is JSON, or no call
            k = _skip_ws(text, j + 1)
            # (bounded as the calls written one by one are: an array of many costs bounded work)
            while text[k : k + 1] == "{" and len(calls) + len(batch) < MAX_PARSED_CALLS:
                found = _native_call(text, k, names, ("arguments",), frozenset({"id"}))
                if found is None:
                    return text, []
                obj = _DECODER.raw_decode(text, k)[0]
                model_id = obj.get("id")
                found[0]["id"] = model_id if isinstance(model_id, str) and _MISTRAL_ID.fullmatch(model_id) else mistral_call_id()
                batch.append(found[0])
                k = _skip_ws(text, found[1])
                k = _skip_ws(text, k + 1) if text[k : k + 1] == "," else k
            if not batch:
                break
            i = end
        else:
            head = _MISTRAL_NAME.match(text, j)
            if head is None or head.group(1) not in names:
                break
            obj, end = _DECODER.raw_decode(text, head.end())
            if not isinstance(obj, dict):
                break
            model_id = head.group(2) or ""
            call_id = model_id if _MISTRAL_ID.fullmatch(model_id) else mistral_call_id()
            batch.append({"id": call_id, "type": "function", "function": {"name": head.group(1), "arguments": text[head.end() : end]}})
            i = end
        calls.extend(batch)
        i = _skip_ws(text, i)
    if not calls:
        return text, []
    return text[:at] + text[i:], calls


# the most calls one reply's text is read for (a reply repeating calls costs bounded parses)
MAX_PARSED_CALLS = 64


def _tagged(fmt: str) -> Callable[[str, Collection[str]], tuple[str, list[dict[str, Any]]]]:
    """The reader of a format of tags (Qwen3-Coder's, GLM's: api.xml_tool_calls), its calls given
    ids; ``names`` maps each offered name to its parameters' schema, which types the values."""
    parse = XML_FORMATS[fmt][0]

    def read(text: str, names: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
        content, calls = parse(text, names)
        return content, [{"id": new_call_id(), **call} for call in calls]

    return read


_NATIVE_PARSERS: dict[str, Callable[[str, Collection[str]], tuple[str, list[dict[str, Any]]]]] = {
    "llama3": _parse_llama3,
    "mistral": _parse_mistral,
    **{fmt: _tagged(fmt) for fmt in XML_FORMATS},
}


def _member_spans(text: str, at: int) -> dict[str, tuple[int, int]]:
    """Where each member's value of the JSON object starting at ``text[at]`` lies in ``text``
    (the last one of a repeated key, as ``json`` keeps); ValueError if it is no object."""
    decoder = _DECODER
    ws = tuple(" \t\n\r")
    spans: dict[str, tuple[int, int]] = {}
    if text[at : at + 1] != "{":
        raise ValueError("not an object")
    i = at + 1
    while True:
        while text[i : i + 1] in ws:
            i += 1
        if text[i : i + 1] == "}":
            return spans
        if text[i : i + 1] != '"':
            raise ValueError("a key was expected")
        key, i = decoder.raw_decode(text, i)
        while text[i : i + 1] in ws:
            i += 1
        if text[i : i + 1] != ":":
            raise ValueError("':' was expected")
        i += 1
        while text[i : i + 1] in ws:
            i += 1
        _value, end = decoder.raw_decode(text, i)
        spans[key] = (i, end)
        i = end
        while text[i : i + 1] in ws:
            i += 1
        if text[i : i + 1] == ",":
            i += 1
        elif text[i : i + 1] != "}":
            raise ValueError("',' or '}' was expected")


# The head of a call in the generic format up to its arguments' opening brace: once this much has
# come, with an offered name, the call is streamed (its arguments as they are generated).
_CALL_HEAD = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
# the most text a call's head may take to be streamed as it comes: an offered name is at most 64
# characters (each at most a 6-character escape), so held text past this that is still no head
# never becomes one (it is decided at the end); without the bound every delta rescanned it all
MAX_CALL_HEAD = 1024
# the most text a streamed call's closing may take, from its arguments' end to its "</tool_call>":
# members after its arguments (an "id" some models add), its "}" and whitespace; more than this
# and it is text (counted on the text, not on what a delta brought, so any chunking reads it alike)
MAX_CALL_TAIL = 4096
_CALL_KEYS = frozenset({"name", "arguments", "parameters"})


def _call_tail(text: str, scan: list[Any] | None = None, start: int = 0) -> int:
    """A call's closing, which ``text`` starts with at ``start``: what comes after its arguments.
    That is any further members (which the unstreamed parse ignores), ``}``, and
    ``</tool_call>``. Returns the length of a whole closing; 0 while ``text`` may still grow into
    one; -1 when it cannot (it is text). ``scan``: [scanner, characters scanned], kept by the
    caller between calls on the same text grown at its end, so that each character is scanned
    once (rescanned, a tail near MAX_CALL_TAIL cost its square on every call). Only the first
    MAX_CALL_TAIL characters (and the tag) are read: a delta that brought a closing with more
    text after it sent the closing as text, where the same text in small deltas closed the call."""
    limit = start + MAX_CALL_TAIL
    at = _LEADING_SPACE.match(text, start, limit).end()  # type: ignore[union-attr]  # (\s* always matches)
    if at >= limit:
        return -1
    if at == len(text):
        return 0
    if text[at] not in ",}":
        return -1
    if scan is None or not scan:
        scanner = _ArgsScanner()
        scanner.depth = 1  # inside the call's object
        scan = scan if scan is not None else []
        scan[:] = [scanner, 0]
    scanner, n = scan
    if scanner.depth > 0:  # (at 0 its members ended, at n: what follows is no member)
        n = scan[1] = n + scanner.feed(text, at + n, limit)
    if scanner.depth > 0:
        return -1 if at + n >= limit else 0  # past the bound, or its members still coming
    try:
        members = _DECODER.decode('{"_": 0' + text[at : at + n])
    except (ValueError, RecursionError):
        return -1
    if _CALL_KEYS & members.keys():  # a second name or arguments: not the call that was streamed
        return -1
    close = _LEADING_SPACE.match(text, at + n, limit).end()  # type: ignore[union-attr]
    after = text[close : close + len(TOOL_CLOSE)]
    if after == TOOL_CLOSE and close < limit:
        return close + len(TOOL_CLOSE) - start
    return 0 if close < limit and len(after) < len(TOOL_CLOSE) and TOOL_CLOSE.startswith(after) else -1


def _is_json(text: str) -> bool:
    try:
        _DECODER.decode(text)
    except (ValueError, RecursionError):  # nested past the reader's depth: no call unstreamed either
        return False
    return True


class _ArgsScanner:
    """Finds where a JSON object ends, a character at a time (strings and escapes aware)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str, start: int = 0, stop: int | None = None) -> int:
        """How many characters of ``text[start:stop]`` belong to the value; all of them if it
        goes on (read in place: a copy of the rest of a long reply for each call cost its square)."""
        stop = len(text) if stop is None else min(stop, len(text))
        for i in range(start, stop):
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1 - start
        return max(0, stop - start)


class Reply:
    """Builds one request's response from the worker's events: the streamed chunks or the final
    body, with logprobs and, when the request offers tools, tool calls parsed out of the text.

    In tool mode text is streamed until it might begin a ``<tool_call>`` block; from there it is
    held. Once the block's head names an offered function and its arguments' ``{`` has come, the
    call is sent as OpenAI streams one: a ``tool_calls`` delta with id, type and name, then the
    arguments in fragments as they are generated (adding up to exactly the string the
    non-streamed reply carries). Held text that never becomes such a head is parsed at the end:
    calls written otherwise (arguments before the name) are sent then, and anything else as
    text, as if it had never been held."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        legacy_functions: bool = False,
        tool_format: str = "hermes",
        reasoning_format: str = "none",
        logprobs: bool = False,
        include_usage: bool = False,
        index: int = 0,
        id: str | None = None,  # noqa: A002 - several choices of one request share the id
        created: int | None = None,
        echo: str = "",
        continues: bool = False,
    ) -> None:
        self.endpoint, self.model = endpoint, model
        # chat: the reply continues a prefill (an assistant turn last): its leading whitespace
        # is its own text, which tool mode (below) keeps then ("The capital is" + " Paris.")
        self.continues = continues
        self.id = id or new_id(endpoint)
        self.created = int(time.time()) if created is None else created
        self.index = index
        self.echo = echo  # completions ``echo``: the prompt's text, sent before the completion
        # each offered name and its parameters' schema (a format of tags types values by it)
        self.tool_names: dict[str, Any] = {t["name"]: t.get("parameters") for t in tools or []} if tool_choice != "none" else {}
        # the model's own call format (its worker's Hello.tool_format): a call written in it is
        # held from its opening to the end of the reply and parsed then (``native_held``);
        # Llama 3.x writes calls only at the reply's start (``native_open``: it may still begin)
        self.tool_format = tool_format if tool_format in _NATIVE_PARSERS else "hermes"
        self.native_open = self.tool_format == "llama3"
        self.native_held = False
        # parallel_tool_calls false: at most one call; a further one the model writes is dropped
        self.max_calls = None if parallel_tool_calls and not legacy_functions else 1
        if tool_format in SINGLE_CALL_FORMATS:  # its template refuses a turn of two calls
            self.max_calls = 1
        # the tools came as the legacy ``functions``: the call is the message's ``function_call``
        # ({name, arguments}, streamed as such) and the reply finishes with ``function_call``
        self.legacy = legacy_functions
        self.calls_reason = "function_call" if legacy_functions else "tool_calls"
        # a forced call's grammar (scheduler.engines.grammar.tool_grammar) allows this many calls
        # and nothing after the last but the end of generation: a reply that closed them all is
        # whole, also when the max_tokens-th token closed it (the worker then says "length")
        self.forced_calls: int | None = None
        if self.tool_names and isinstance(tool_choice, dict):
            self.forced_calls = 1
        elif self.tool_names and tool_choice == "required":
            self.forced_calls = MAX_PARALLEL_CALLS if self.max_calls is None else 1
        self.muted = False  # a streamed call past max_calls: its arguments are not sent
        self.want_logprobs = logprobs
        # stream_options.include_usage: every chunk with a choice says "usage": null (OpenAI's
        # spec: "All other chunks will also include a usage field, but with a null value")
        self.include_usage = include_usage
        self.text: list[str] = []  # everything generated
        self.held = ""  # tool mode: text not yet streamed
        # text held to the end (``native_held``), in pieces: joined once, at the end, since adding
        # each delta to one string copied the whole held text for every token (quadratic)
        self.held_parts: list[str] = []
        # completions logprobs: where the next token starts in the text, counted from the tokens
        # (text held back for a stop string comes later than its tokens' entries)
        self.lp_offset = 0
        self.lp_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.logprobs: list[dict[str, Any]] = []
        # entries whose token starts past the text come so far (its text is held back by the
        # worker: a character's first bytes, or what may be a stop string) wait here; the ones a
        # stop string ended the reply in are dropped, so the entries spell the text, streamed or not
        self.lp_waiting: list[dict[str, Any]] = []
        # the characters of the text come so far, and those the tokens whose entries were let
        # through spell, decoded as the worker decodes them (bytes that are no UTF-8 are one
        # U+FFFD each: three bytes of text for one of token, so bytes cannot be compared)
        self.lp_text_chars = 0
        self.lp_token_chars = 0
        self.lp_token_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.prompt_logprobs: list[dict[str, Any]] = []  # echo + logprobs: the prompt's entries
        self.calls_sent = 0  # tool calls streamed so far (the next one's index)
        self.args: _ArgsScanner | None = None  # the streamed call whose arguments are coming
        self.args_parts: list[str] = []  # ... and those arguments so far (joined once, when whole)
        # streamed calls that are calls unstreamed too (arguments that are JSON, the block closed)
        self.calls_closed = 0
        self.args_json = False  # the streamed call whose closing is coming: its arguments parse
        self.after_args = False  # a streamed call's arguments are complete: its tail is in held
        self.tail_scan: list[Any] = []  # ... and how far _call_tail has read it
        # tool mode: whitespace that may end the content, sent only once more content follows
        # (or at the end of a reply without calls): the unstreamed reply's content is the text
        # around its calls stripped, or, without calls, the whole text
        # (in pieces, joined when sent: a reply of whitespace alone added up as one string was
        # copied whole on every delta)
        self.pending_space: list[str] = []
        self.content_sent = False  # tool mode: content other than whitespace went out
        # tool mode: the stream's role is still to send, with its first frame, once it is known
        # whether the reply begins with text or a call (_opened; a stream another head began and
        # this one resumes replays the frames before, so the role is where that head sent it)
        self.role_pending = endpoint == "chat" and bool(self.tool_names)
        self._text_template: tuple[bytes, bytes] | tuple[()] | None = None  # delta_events' (made at first use)
        # a reasoning model's reply (its worker's Hello.reasoning_format): its reasoning is split
        # out as reasoning_content, its answer goes on as the text below (api/reasoning.py)
        # (harmony-unsplit: gpt-oss's calls read out of a reply whose reasoning stays answer; a
        # gpt-oss message's text is kept as written, split or not: no call is read in it, only
        # a recipient's call is one, _answer_chunks)
        self.reasoning = new_splitter(reasoning_format, calls=self.tool_names, continues=continues) if endpoint == "chat" else None

    # -- streaming ------------------------------------------------------------------------

    def _indexed(self, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for frame in frames:
            for choice in frame.get("choices", []):
                choice["index"] = self.index
            if self.include_usage and frame.get("choices"):
                frame["usage"] = None
        return frames

    def first_chunks(self) -> list[dict[str, Any]]:
        if self.role_pending:  # tool mode: the role goes with the reply's first frame (_opened)
            return []
        if self.endpoint == "chat":
            return self._indexed([chat_chunk(self.id, self.model, self.created, role="assistant", content="")])
        # (a prompt that spells no text, "" with BOS, still has its scored tokens to send)
        if self.echo or (self.want_logprobs and self.prompt_logprobs):
            chunk = completion_chunk(self.id, self.model, self.created, self.echo)
            if self.want_logprobs:
                chunk["choices"][0]["logprobs"] = completion_logprobs(self.prompt_logprobs, 0)
            self.lp_offset = len(self.echo)
            return self._indexed([chunk])
        return []

    def _calls_end(self, reason: str, calls: int) -> bool:
        """Whether a reply with ``calls`` calls that finished ``reason`` ended with them: at the
        end of generation, or at ``max_tokens`` once a forced call's grammar allowed no more."""
        return reason == "stop" or (reason == "length" and self.forced_calls is not None and calls >= self.forced_calls)

    def _cut_opening(self, text: str | None, reason: str | None) -> bool:
        """Whether ``text``, what is left of a forced reply once its calls are read, is a further
        call's opening that ``max_tokens`` cut before its head was whole (``<tool_call>``, or
        ``<tool_call>`` and the start of ``{"name": ...``): markup of the grammar, which allows
        nothing but calls, so no content (it went out as content "<tool_call>", streamed or not)."""
        if self.forced_calls is None or reason != "length" or not text:
            return False
        rest = text.strip()
        if not rest or TOOL_CLOSE in rest:
            return False
        if TOOL_OPEN.startswith(rest):
            return True
        if not rest.startswith(TOOL_OPEN):
            return False
        # after the tag, what a stream holds as a head still coming: nothing yet, or JSON begun
        # (anything else after it is no call's head and went out as text); a call in the
        # model's own tagged format (forced in it) is held from its tag whatever follows
        body = rest[len(TOOL_OPEN) :].lstrip()
        return self.tool_format in XML_FORMATS or not body or body.startswith("{")

    def _opened(self, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool mode: ``frames`` with the role the stream has not sent yet, as OpenAI streams it:
        in the first call's chunk with ``content`` null when the reply begins with a call (a
        reply of calls only is null content, streamed or not), else its own chunk with ``content``
        "" first."""
        if not self.role_pending or not frames:
            return frames
        self.role_pending = False
        delta = frames[0]["choices"][0]["delta"]
        entries_only = "content" not in delta and frames[0]["choices"][0].get("logprobs") is not None
        if "tool_calls" in delta or "function_call" in delta or "reasoning_content" in delta or entries_only:
            # (entries_only: logprob entries of tokens not yet known to be text or a call)
            frames[0]["choices"][0]["delta"] = {"role": "assistant", "content": None, **delta}
            return frames
        return [chat_chunk(self.id, self.model, self.created, role="assistant", content=""), *frames]

    def delta_chunks(self, event: Delta) -> list[dict[str, Any]]:
        return self._indexed(self._opened(self._delta_chunks(event)))

    def delta_events(self, event: Delta) -> list[bytes]:
        """:meth:`delta_chunks` as SSE events (:func:`sse_event` of each). A plain text delta (no
        logprobs, no tools: nearly every token) is the reply's one text chunk with only its text
        changing, so it is made from a template encoded once: the same bytes, without building
        and serialising the whole chunk for every token."""
        if self.want_logprobs or self.tool_names or event.logprobs or self.lp_waiting or self.reasoning is not None:
            return [sse_event(f) for f in self.delta_chunks(event)]
        template = self._text_template
        if template is None:
            template = self._text_template = self._make_text_template()
        if not template:
            return [sse_event(f) for f in self.delta_chunks(event)]
        text = event.text
        self.text.append(text)
        self._entries(text, None)  # (none come: its bookkeeping as delta_chunks keeps it)
        if not text:
            return []
        head, tail = template
        return [head + json_bytes(text) + tail]

    def _make_text_template(self) -> tuple[bytes, bytes] | tuple[()]:
        """(the SSE event of a text delta up to its text, and after it), or () if the marker
        standing for the text cannot be found exactly once (then every delta is built whole)."""
        marker = "\x00superfluid-text\x00"
        if self.endpoint == "completions":
            chunk = completion_chunk(self.id, self.model, self.created, marker)
        else:
            chunk = chat_chunk(self.id, self.model, self.created, content=marker)
        parts = sse_event(self._indexed([chunk])[0]).split(json_bytes(marker))
        return (parts[0], parts[1]) if len(parts) == 2 else ()

    def _entries(self, text: str, logprobs: list[dict[str, Any]] | None, done: Done | None = None) -> list[dict[str, Any]]:
        """The logprob entries to send with ``text``: those of tokens that start inside the text
        come so far; at the end (``done``) the rest, but for the tokens of the stop string that
        ended the reply (the text stops before them)."""
        self.lp_text_chars += len(text)
        self.lp_waiting.extend(logprobs or [])
        out: list[dict[str, Any]] = []
        while self.lp_waiting and (
            self.lp_token_chars < self.lp_text_chars or (done is not None and not done.stop_word)
        ):
            e = self.lp_waiting.pop(0)
            self.lp_token_chars += len(self.lp_token_decoder.decode(bytes(e["bytes"])))
            out.append(e)
        if done is not None:
            self.lp_waiting = []
        return out

    def _delta_chunks(self, event: Delta) -> list[dict[str, Any]]:
        text = event.text
        self.text.append(text)
        entries = self._entries(text, event.logprobs)
        if self.endpoint == "completions":
            chunk = completion_chunk(self.id, self.model, self.created, text)
            if self.want_logprobs:
                offsets, self.lp_offset = token_offsets(entries, self.lp_offset, self.lp_decoder)
                chunk["choices"][0]["logprobs"] = completion_logprobs(entries, offsets=offsets)
            return [chunk] if text or entries else []
        if self.reasoning is None:
            return self._answer_chunks(text, entries)
        thought, parts = self.reasoning.feed_parts(text)
        frames = self._reasoning_chunks(thought)
        if not parts:
            return frames + self._answer_chunks("", entries)
        for piece, kept in parts:  # (the entries ride on the first part's chunks)
            frames += self._answer_chunks(piece, entries, kept=kept)
            entries = []
        return frames

    def _reasoning_chunks(self, thought: str) -> list[dict[str, Any]]:
        """A chunk of ``delta.reasoning_content``, as llama-server streams a reasoning model's
        reasoning; none for none."""
        if not thought:
            return []
        chunk = chat_chunk(self.id, self.model, self.created)
        chunk["choices"][0]["delta"] = {"reasoning_content": thought}
        return [chunk]

    def _answer_chunks(self, text: str, entries: list[dict[str, Any]], *, kept: bool = False) -> list[dict[str, Any]]:
        """Chat: the chunks of newly generated answer ``text`` (``entries``: its logprobs).
        ``kept``: text kept as written (api.reasoning.Kept, a gpt-oss message's text), content
        in which no call is read (nor held as a call's start); the text held before it is read
        out first, as at the reply's end (:meth:`_read_held`), so the calls are those
        :meth:`_read_parts` reads unstreamed."""
        calls: list[dict[str, Any]] = []
        before: list[dict[str, Any]] = []
        if self.tool_names:
            if kept:
                before = self._read_held(None)
            else:
                text, calls = self._stream_calls(text)
            text = self._stripped(text)
        if not text and not entries:
            return before + calls
        if not text and self.tool_names:
            # a call's tokens, or text held as maybe one: their entries ride on the call's first
            # chunk, else on a chunk of no content. A content "" here opened a reply of calls only
            # with content "", which reassembles to "" where unstreamed it is null.
            if calls and self.want_logprobs:
                calls[0]["choices"][0]["logprobs"] = chat_logprobs(entries)
                return before + calls
            chunk = chat_chunk(self.id, self.model, self.created)
        else:
            chunk = chat_chunk(self.id, self.model, self.created, content=text)
        if self.want_logprobs:
            chunk["choices"][0]["logprobs"] = chat_logprobs(entries)
        return [*before, chunk, *calls]

    def _stream_calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Tool mode: (text to send as content, tool-call chunks) for newly generated text."""
        content: list[str] = []
        frames: list[dict[str, Any]] = []
        if self.native_held:  # held to the end (a call in the model's own format): parsed then
            self.held_parts.append(text)
            return "", frames
        held = self.held + text
        self.held = ""
        while held:
            if self.args is not None:  # a streamed call's arguments
                n = self.args.feed(held)
                if n and not self.muted:
                    frames.append(self._tool_chunk({"index": self.calls_sent - 1, "function": {"arguments": held[:n]}}))
                    self.args_parts.append(held[:n])
                held = held[n:]
                if self.args.depth > 0:
                    break
                self.args_json = not self.muted and _is_json("".join(self.args_parts))
                self.args, self.after_args, self.args_parts, self.tail_scan = None, True, [], []
                continue
            if self.after_args:  # the call's closing: any further members, "}", </tool_call>
                tail = _call_tail(held, self.tail_scan)
                if tail == 0:
                    self.held = held
                    break
                if tail > 0:
                    held = held[tail:]
                    self.calls_closed += self.args_json
                self.after_args = False  # closed; or not the closing after all: text from here
                continue  # (a later call in it still a call)
            native = self._native_start(held, content)
            if native is not None:  # a call in the model's own format (may) begin(s) there
                content.append(held[:native])
                self.held = held[native:]
                break
            free = self._release(held)  # text that cannot begin a call
            content.append(free)
            held, self.held = self.held, ""
            head = _CALL_HEAD.match(held, 0, MAX_CALL_HEAD)
            if head is None:
                body = held[len(TOOL_OPEN) :].lstrip()
                if body and body[0] != "{":  # no JSON object follows the tag: no call, unstreamed
                    content.append(TOOL_OPEN)  # either, so the tag is text, sent now, not at the end
                    held = held[len(TOOL_OPEN) :]
                    continue
                self.held = held  # maybe a call's head, still coming
                # past the most a head may take, it never becomes one: everything from here is
                # held to the end and parsed then, as before, without rescanning it every delta
                self.native_held = len(held) >= MAX_CALL_HEAD
                break
            name = _head_name(head)
            if name not in self.tool_names:  # no call streamed: held to the end, parsed then
                self.held, self.native_held = held, True
                break
            self.muted = self.max_calls is not None and self.calls_sent >= self.max_calls
            if not self.muted:
                # (a Mistral model's template takes back only its own 9-character ids)
                call_id = mistral_call_id() if self.tool_format == "mistral" else new_call_id()
                call = {"index": self.calls_sent, "id": call_id, "type": "function",
                        "function": {"name": name, "arguments": ""}}
                frames.append(self._tool_chunk(call))
                self.calls_sent += 1
            self.args = _ArgsScanner()
            held = held[head.end() :]
        return "".join(content), frames

    def _native_start(self, held: str, before: list[str]) -> int | None:
        """Where in ``held`` (text not yet sent; ``before``: text of this delta sent already) a
        call in the model's own format begins, or may still begin once more text comes: the
        text from there is held (to the end, once it surely began: ``native_held``). None:
        no such call starts in it (before a ``<tool_call>`` tag, which the usual path reads)."""
        fmt = self.tool_format
        if fmt == "llama3":
            if not self.native_open:
                return None
            if self.content_sent or self.calls_sent or any(p.strip() for p in before):
                self.native_open = False  # text came first: no call in this format any more
                return None
            at = len(held) - len(held.lstrip())
            body = held[at:]
            if not body:
                return None  # whitespace: it waits for what follows (_stripped)
            if body.startswith("{") or body.startswith(PYTHON_TAG):
                self.native_held = True
                return at
            if PYTHON_TAG.startswith(body):
                return at  # maybe the tag, still coming
            self.native_open = False
            return None
        if fmt in _NATIVE_STARTS:
            start = _NATIVE_STARTS[fmt](held, self.tool_names, 0)
            if start is None:
                return None
            self.native_held = start[1]
            return start[0]
        return None

    def _stripped(self, text: str) -> str:
        """Tool mode: ``text`` as content, its trailing whitespace held until more content
        follows (at the end: sent if the reply made no call, else dropped)."""
        trimmed = text.rstrip()
        if not trimmed:
            self.pending_space.append(text)
            return ""
        body = trimmed
        if not self.content_sent and not self.continues:
            # the content's start: in tool mode the content never begins with whitespace (a reply
            # with calls has the text around them stripped as its content, and it is not known
            # yet whether calls follow), so whitespace before this is none of it; but for a
            # reply that continues a prefill, whose content is the text after the client's
            body, self.pending_space = body.lstrip(), []
        out, self.pending_space = "".join(self.pending_space) + body, [text[len(trimmed) :]]
        self.content_sent = True
        return out

    def _release(self, text: str) -> str:
        """Tool mode: the part of the held text that cannot be the start of a tool call."""
        held = self.held + text
        at = held.find(TOOL_OPEN)
        if at < 0:
            at = len(held) - partial_suffix(held, (TOOL_OPEN,))
        self.held = held[at:]
        return held[:at]

    def final_chunks(self, event: Done, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        frames = self._indexed(self._opened(self._final_chunks(event, None)))
        if usage is not None:  # the usage chunk has no choices
            make = chat_usage_chunk if self.endpoint == "chat" else completion_usage_chunk
            frames.append(make(self.id, self.model, self.created, usage))
        return frames

    def _final_chunks(self, event: Done, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        reason = event.finish_reason
        frames: list[dict[str, Any]] = []
        if self.want_logprobs and (entries := self._entries("", None, event)):
            if self.endpoint == "completions":
                chunk = completion_chunk(self.id, self.model, self.created, "")
                offsets, self.lp_offset = token_offsets(entries, self.lp_offset, self.lp_decoder)
                chunk["choices"][0]["logprobs"] = completion_logprobs(entries, offsets=offsets)
            else:  # no content in tool mode: a reply of calls only stays null (_delta_chunks)
                chunk = chat_chunk(self.id, self.model, self.created, content=None if self.tool_names else "")
                chunk["choices"][0]["logprobs"] = chat_logprobs(entries)
            frames.append(chunk)
        if self.reasoning is not None:  # the reply's last reasoning, and answer held as a marker's start
            thought, parts = self.reasoning.finish_parts(cut=_cut_short(event))
            frames += self._reasoning_chunks(thought)
            for piece, kept in parts:
                frames += self._answer_chunks(piece, [], kept=kept)
        if self.endpoint == "chat":
            if self.tool_names:
                frames += self._read_held(reason)
            self.held, self.held_parts = "", []
            pending = "".join(self.pending_space)
            # no call after all: the text is whole (a continuation's whitespace alone too)
            if pending and not self.calls_sent and (self.content_sent or self.continues):
                frames.append(chat_chunk(self.id, self.model, self.created, content=pending))
            self.pending_space = []
            # tool_calls means whole calls (arguments that parse, the block closed): a reply with
            # a call whose arguments max_tokens, a stop string or the end of generation cut open,
            # that are no JSON, or whose block's closing never came, finishes as it did (length
            # or stop), as the same reply unstreamed does (a call past max_calls, never sent,
            # counts for nothing)
            if self.calls_sent and self.calls_closed == self.calls_sent and self._calls_end(reason, self.calls_closed):
                reason = self.calls_reason
            frames.append(chat_chunk(self.id, self.model, self.created, finish_reason=reason))
            if usage is not None:
                frames.append(chat_usage_chunk(self.id, self.model, self.created, usage))
        else:
            frames.append(completion_chunk(self.id, self.model, self.created, "", finish_reason=reason))
            if usage is not None:
                frames.append(completion_usage_chunk(self.id, self.model, self.created, usage))
        return frames

    def _read_held(self, reason: str | None) -> list[dict[str, Any]]:
        """Tool mode: the chunks of the text held as maybe a call's, read whole as the reply's
        end reads it (``reason``: its finish reason; None: text kept as written follows, no
        call read in it, :meth:`_answer_chunks`); the call reader starts afresh after it."""
        if self.held_parts:
            self.held, self.held_parts = self.held + "".join(self.held_parts), []
        frames: list[dict[str, Any]] = []
        # (held after a streamed call's arguments: its closing, cut short by max_tokens, a stop
        # string or the end of generation; markup of a call sent, which is no content)
        if self.held and not self.after_args:
            # unstripped: the content is the text around the calls stripped as a whole, and
            # this is its end (a space after text that went out is the content's own)
            content, found, whole = _read_tool_calls(self.held, self.tool_names, strip=False, fmt=self.tool_format)
            calls = found[: max(0, self.max_calls - self.calls_sent)] if self.max_calls is not None else found
            if found:
                if content and (content := self._stripped(content)):
                    frames.append(chat_chunk(self.id, self.model, self.created, content=content))
                for call, closed in zip(calls, whole, strict=False):
                    i, self.calls_sent = self.calls_sent, self.calls_sent + 1
                    self.calls_closed += closed
                    head = {"index": i, "id": call["id"], "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""}}
                    frames.append(self._tool_chunk(head))
                    frames.append(self._tool_chunk({"index": i, "function": {"arguments": call["function"]["arguments"]}}))
            # (an opening cut after content that went out is content too, as unstreamed: the
            # whole content is no cut opening there)
            elif (self.content_sent or not self._cut_opening(self.held, reason)) and (rest := self._stripped(self.held)):
                frames.append(chat_chunk(self.id, self.model, self.created, content=rest))
        # a streamed call whose arguments or closing are still open stays cut there, unclosed
        self.held, self.native_held = "", False
        self.args, self.after_args, self.args_parts, self.tail_scan = None, False, [], []
        return frames

    def _tool_chunk(self, call_delta: dict[str, Any]) -> dict[str, Any]:
        chunk = chat_chunk(self.id, self.model, self.created)
        if self.legacy:  # {"function_call": {"name", "arguments"}}: no index, id or type
            chunk["choices"][0]["delta"] = {"function_call": dict(call_delta["function"])}
        else:
            chunk["choices"][0]["delta"] = {"tool_calls": [call_delta]}
        return chunk

    def closing_entries(self, event: Done) -> list[dict[str, Any]]:
        """The logprob entries still held when the reply ends (``event``): those of its last
        tokens, but for a stop string's."""
        return self._entries("", None, event)

    # -- not streamed ---------------------------------------------------------------------

    def _read_parts(self, parts: Parts, *, strip: bool) -> tuple[str | None, list[dict[str, Any]], list[bool]]:
        """:func:`_read_tool_calls` of a reply's answer in ``parts`` (api.reasoning.Parts): text
        kept as written is content, no call read in it, and the text between such parts is
        read each on its own, as the stream reads it out before the kept text comes."""
        if len(parts) == 1 and not parts[0][1]:
            return _read_tool_calls(parts[0][0], self.tool_names, strip=strip, fmt=self.tool_format)
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        whole: list[bool] = []
        for piece, kept in parts:
            if kept:
                content.append(piece)
                continue
            text, found, closed = _read_tool_calls(piece, self.tool_names, strip=False, fmt=self.tool_format)
            content.append(text or "")
            calls += found
            whole += closed
        joined = "".join(content)
        return ((joined.strip() if strip else joined) or None), calls, whole

    def add(self, event: Delta) -> None:
        self.text.append(event.text)
        self.logprobs.extend(self._entries(event.text, event.logprobs))

    def body(self, event: Done, usage: dict[str, Any] | None) -> dict[str, Any]:
        obj = self._body(event, usage)
        obj["choices"][0]["index"] = self.index
        return obj

    def _body(self, event: Done, usage: dict[str, Any] | None) -> dict[str, Any]:
        text, reason = "".join(self.text), event.finish_reason
        self.logprobs.extend(self._entries("", None, event))
        if self.endpoint == "completions":
            obj = text_completion(self.id, self.model, self.created, self.echo + text, reason, usage)
            if self.want_logprobs:
                # the completion's offsets from the echoed text's end, as the stream counts them
                # (the prompt's token pieces may spell more than its text: a space prefix)
                offsets = token_offsets(self.prompt_logprobs)[0] + token_offsets(self.logprobs, len(self.echo))[0]
                obj["choices"][0]["logprobs"] = completion_logprobs(self.prompt_logprobs + self.logprobs, offsets=offsets)
            return obj
        calls: list[dict[str, Any]] = []
        thought = ""
        parts: Parts = [(text, False)]
        if self.reasoning is not None:
            thought, parts = split_parts(self.reasoning, text, cut=_cut_short(event))
            text = "".join(piece for piece, _kept in parts)
        content: str | None = text
        if self.tool_names:
            # a call whose head came is a call, its arguments as far as they came, as the stream
            # sent it (cut by max_tokens, a stop string or the end of generation)
            content, calls, whole = self._read_parts(parts, strip=not self.continues)
            if self.continues:  # the text around the calls, its own leading whitespace kept
                content = (content or "").rstrip() or None
            if self.max_calls is not None:
                calls, whole = calls[: self.max_calls], whole[: self.max_calls]
            # tool_calls: whole calls only (a cut one finishes as the reply did: length or stop)
            if calls and all(whole) and self._calls_end(reason, len(calls)):
                reason = self.calls_reason
            elif not calls:  # (tool mode: the content's leading whitespace is none of it, but a continuation's)
                content = text if self.continues else text.lstrip()
            if self._cut_opening(content, event.finish_reason):  # (its own end: reason may say tool_calls by now)
                content = None
        obj = chat_completion(self.id, self.model, self.created, content or "", reason, usage)
        message = obj["choices"][0]["message"]
        if thought:  # as llama-server: only where there is reasoning
            message["reasoning_content"] = thought
        if calls:
            message["content"] = content
            if self.legacy:
                message["function_call"] = calls[0]["function"]
            else:
                message["tool_calls"] = calls
        if self.want_logprobs:
            obj["choices"][0]["logprobs"] = chat_logprobs(self.logprobs)
        return obj


# ---------------------------------------------------------------------------------------------
# llama-server's /infill (its native completion object)
# ---------------------------------------------------------------------------------------------


def infill_stop_type(event: Done) -> str:
    """llama-server's ``stop_type``: ``word`` (a stop string), ``eos`` (the model ended it),
    ``limit`` (n_predict, the context, or /infill's ``n_indent`` and ``t_max_predict_ms``: the
    worker finishes those ``length``, as llama-server's STOP_TYPE_LIMIT, with no stop word),
    ``none`` (anything else)."""
    if event.finish_reason == "length":
        return "limit"
    if event.finish_reason == "stop":
        return "word" if event.stop_word else "eos"
    return "none"


def infill_timings(event: Done) -> dict[str, Any]:
    """llama-server's ``timings`` from the job's usage and timing: ``cache_n`` the prompt tokens
    taken from the prefix cache, ``prompt_n`` the prompt tokens computed (cached ones not), ``prompt_ms`` from admission to the first token (so it holds the
    first token's sampling; a preempted job's wait is in it too), ``predicted_ms`` from the first
    token to the end."""
    usage, timing = event.usage, event.timing or {}
    cache_n = int(usage.get("cached_tokens", 0))
    prompt_n = max(0, int(usage.get("prompt_tokens", 0)) - cache_n)
    predicted_n = int(usage.get("completion_tokens", 0))
    queue, ttft, total = timing.get("queue_wait_ms"), timing.get("ttft_ms"), timing.get("total_ms")
    prompt_ms = max(0.0, float(ttft) - float(queue or 0)) if ttft is not None else 0.0
    predicted_ms = max(0.0, float(total) - float(ttft)) if total is not None and ttft is not None else 0.0

    def per(n: int, ms: float) -> tuple[float, float]:
        return (ms / n if n else 0.0), (n * 1000.0 / ms if ms > 0 else 0.0)

    prompt_per_token_ms, prompt_per_second = per(prompt_n, prompt_ms)
    predicted_per_token_ms, predicted_per_second = per(predicted_n, predicted_ms)
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_per_token_ms, 3),
        "prompt_per_second": round(prompt_per_second, 3),
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_per_token_ms, 3),
        "predicted_per_second": round(predicted_per_second, 3),
    }


def infill_partial(text: str, tokens_predicted: int, tokens_evaluated: int, index: int = 0) -> dict[str, Any]:
    """One streamed ``/infill`` or ``/completion`` frame (llama-server's partial result);
    ``index``: the prompt's, where a /completion request holds several."""
    return {
        "index": index, "content": text, "tokens": [], "stop": False, "id_slot": -1,
        "tokens_predicted": tokens_predicted, "tokens_evaluated": tokens_evaluated,
    }  # fmt: skip


def infill_final(model: str, content: str, event: Done, *, whole_text: str, index: int = 0) -> dict[str, Any]:
    """The ``/infill`` result (llama-server's final completion object): ``content`` the whole text
    (the last streamed frame's: empty, the text came before it); ``whole_text`` decides
    ``has_new_line``. ``tokens_cached`` is llama-server's n_past: the slot's tokens at the end,
    the prompt and every generated token but the last, which was sampled and never decoded
    (server-context.cpp's send_final_response: ``slot.prompt.n_tokens()``)."""
    usage = event.usage
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "index": index,
        "content": content,
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": model,
        "tokens_predicted": completion,
        "tokens_evaluated": prompt,
        "has_new_line": "\n" in whole_text,
        "truncated": False,
        "stop_type": infill_stop_type(event),
        "stopping_word": event.stop_word or "",
        "tokens_cached": prompt + max(completion - 1, 0),
        "timings": infill_timings(event),
    }


def native_generation_settings(request: Any, n_predict: int | None = None) -> dict[str, Any]:
    """``/completion``'s ``generation_settings``: the settings the completion ran with, those of
    llama-server's this server has (an absent sampling one is llama-server's default, as on
    llama-server: schemas.LLAMA_SERVER_SAMPLING; ``n_predict`` -1: no limit but the context).
    Typed as llama-server's, which typed clients decode: ``seed`` the unsigned 32 bits sampled
    with (4294967295, llama.cpp's LLAMA_DEFAULT_SEED: none given), ``logit_bias``
    ``[{"bias", "token"}]``; ``n_predict``: the limit given where it is not the one run (0, run
    as one token)."""
    limit = n_predict if n_predict is not None else request.max_tokens if request.max_tokens is not None else -1
    return {
        "n_predict": limit,
        "seed": (request.seed if request.seed is not None else -1) & 0xFFFFFFFF,
        "temperature": request.temperature,
        "top_k": request.top_k,
        "top_p": request.top_p,
        "min_p": request.min_p,
        "typical_p": request.typical_p,
        "repeat_penalty": request.repeat_penalty,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "stop": list(request.stop),
        "max_tokens": limit,
        "n_indent": request.n_indent,
        "t_max_predict_ms": request.t_max_predict_ms,
        "ignore_eos": request.ignore_eos,
        "stream": request.stream,
        "logit_bias": [{"bias": float(b), "token": int(t)} for t, b in request.logit_bias],
        "n_probs": request.logprobs or 0,
    }


def native_probabilities(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama-server's ``completion_probabilities`` for the worker's per-token entries: the
    token's ``id``, ``token`` (its text), ``bytes``, ``logprob`` and its ``top_logprobs``."""

    def item(e: dict[str, Any]) -> dict[str, Any]:
        return {"id": e["token_id"], "token": _token_text(e["bytes"]), "bytes": e["bytes"], "logprob": e["logprob"]}

    return [{**item(e), "top_logprobs": [item(t) for t in e["top"]]} for e in entries]


_MAX_PATH_PARTS = 16  # deeper than any result's values; a longer path is not split further


def pick_fields(obj: dict[str, Any], paths: list[str] | None) -> dict[str, Any]:
    """llama-server's ``response_fields``: only the values at these paths (``a/b`` reaches into
    an object), each keyed by its path as given; a path that leads nowhere is left out. None or
    an empty list: the whole object."""
    if not paths:
        return obj
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = obj
        for part in path.split("/", _MAX_PATH_PARTS):  # (a path deeper than any value: nowhere)
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[path] = value
    return out


# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------


def embedding_value(vector: list[float], encoding_format: str) -> list[float] | str:
    """One embedding as ``float`` (a JSON array) or ``base64`` (little-endian float32 bytes,
    base64-encoded, as OpenAI sends it and the ``openai`` client decodes it)."""
    if encoding_format == "base64":
        import base64
        import struct

        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)
