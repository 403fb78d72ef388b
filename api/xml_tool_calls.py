"""Tool calls written in tags rather than JSON (``scheduler.engines.chat.tool_call_format``
"qwen3_coder" and "glm45"). Qwen3-Coder's format (also Qwen3.5's and Nemotron Nano 3's)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Each parameter's value is text; it becomes the call's ``arguments`` JSON by the tool's schema, as
llama.cpp's common/parsers/qwen3-coder.cpp reads it: a parameter whose schema allows only strings
is the text as it is; one that allows other kinds is that JSON value where the text is one of
them (a number, ``true``, an object...), else the text as a string (a model that wrote ``True``
for a boolean gets ``true``). The newline after ``<parameter=...>`` and the one before
``</parameter>`` are the format's, not the value's. A call must name an offered function; a
block that is no such call stays in the content as text. Qwen3-Coder sometimes leaves out the
``<tool_call>`` opening (llama.cpp reads ``<function=name>`` alone as a call's start): read so
too, where ``name`` is offered.

GLM 4.5/4.6/4.7's format, its values typed the same way (its template writes a string value as
it is and any other as JSON)::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .reasoning import partial_suffix

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"

# the most characters a function's or a parameter's name may take between ``=`` and ``>``
MAX_NAME = 256
# a call's head (``<tool_call>``, whitespace, ``<function=name>``) still undecided past this many
# characters is held to the end of the reply and read then (as the JSON format's MAX_CALL_HEAD)
MAX_HEAD = 1024
# blocks that begin as a call and are none: past this many, the rest of the reply is text, so that
# a reply of such openings costs a bounded number of reads (as the JSON format's MAX_MISSED_BLOCKS)
MAX_MISSES = 16
MAX_CALLS = 64  # the most calls one reply is read for

_WS = " \t\n\r"
_KINDS = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def value_kinds(schema: Any, depth: int = 0) -> frozenset[str]:
    """The JSON kinds a parameter's ``schema`` allows (``type``, a list of types, the branches
    of ``anyOf``/``oneOf``, an ``enum``'s or ``const``'s values); all of them where it does not
    say (no schema, a ``$ref``)."""
    if not isinstance(schema, Mapping) or depth > 16:
        return _KINDS
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind}) & _KINDS or _KINDS
    if isinstance(kind, list):
        return frozenset(k for k in kind if isinstance(k, str)) & _KINDS or _KINDS
    kinds: set[str] = set()
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                kinds |= value_kinds(branch, depth + 1)
    values = list(schema["enum"]) if isinstance(schema.get("enum"), list) else []
    if "const" in schema:
        values.append(schema["const"])
    kinds.update(k for k in map(_kind_of, values) if k)
    if not kinds and isinstance(schema.get("properties"), Mapping):
        kinds.add("object")
    if not kinds and "items" in schema:
        kinds.add("array")
    return frozenset(kinds) or _KINDS


# a parsed JSON value's Python type and its JSON Schema kind (bool before int: True is an int)
_KIND_OF_TYPE: tuple[tuple[type, str], ...] = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (dict, "object"), (list, "array"))


def _kind_of(value: Any) -> str | None:
    return next((kind for t, kind in _KIND_OF_TYPE if isinstance(value, t)), None)


def _fits(value: Any, kinds: frozenset[str]) -> bool:
    """Whether a JSON value read from a parameter's text is one of the non-string ``kinds``."""
    kind = _kind_of(value)
    if kind == "integer":
        return "integer" in kinds or "number" in kinds
    if kind == "number":
        return "number" in kinds or ("integer" in kinds and float(value).is_integer())
    return kind in kinds and kind != "string"


_PYTHON_CONSTANTS = {"True": "true", "False": "false", "None": "null"}


def value_json(text: str, schema: Any, kinds: frozenset[str] | None = None) -> str:
    """A parameter's text as the JSON value its ``schema`` makes of it (see the module's doc);
    ``kinds``: ``value_kinds(schema)``, where the caller has it already."""
    kinds = value_kinds(schema) if kinds is None else kinds
    if kinds - {"string"}:
        raw = text.strip(_WS)
        raw = _PYTHON_CONSTANTS.get(raw, raw)
        try:
            value = _DECODER.decode(raw)
        except (ValueError, RecursionError):
            pass
        else:
            if _fits(value, kinds):
                return raw  # as the model wrote it (valid JSON: it parsed)
    return json.dumps(text, ensure_ascii=False)


def _params_schemas(tools: Collection[str], name: str) -> Mapping[str, Any]:
    params = tools.get(name) if isinstance(tools, Mapping) else None
    props = params.get("properties") if isinstance(params, Mapping) else None
    return props if isinstance(props, Mapping) else {}


def _typer(tools: Collection[str], name: str) -> Callable[[str, str], str]:
    """``value_json`` for the parameters of the call of ``name``, each parameter's kinds read
    from its schema once: a call that repeats a parameter of a long schema (the client's: an
    ``anyOf`` of thousands of branches) costs the schema once, not once per repetition."""
    schemas = _params_schemas(tools, name)
    kinds: dict[str, frozenset[str]] = {}

    def typed(key: str, text: str) -> str:
        if key not in kinds:
            kinds[key] = value_kinds(schemas.get(key))
        return value_json(text, None, kinds[key])

    return typed


def _name_at(text: str, i: int) -> tuple[str, int] | None:
    """The name written from ``text[i]`` to the next ``>`` and where it ends (after the ``>``);
    None where no ``>`` comes within MAX_NAME characters."""
    close = text.find(">", i, i + MAX_NAME + 1)
    if close < 0:
        return None
    return text[i:close].strip(_WS), close + 1


def _block(text: str, at: int, tools: Collection[str]) -> tuple[dict[str, Any], int] | None:
    """The call written from ``text[at]`` (``<tool_call>`` or ``<function=``) and where it ends;
    None where it is no call of an offered function."""
    i = at
    wrapped = text.startswith(CALL_OPEN, i)
    if wrapped:
        i = _skip_ws(text, i + len(CALL_OPEN))
    if not text.startswith(FUNCTION_OPEN, i):
        return None
    head = _name_at(text, i + len(FUNCTION_OPEN))
    if head is None or head[0] not in tools:
        return None
    name, i = head
    typed = _typer(tools, name)
    values: dict[str, str] = {}
    while True:
        i = _skip_ws(text, i)
        if text.startswith(FUNCTION_CLOSE, i):
            i += len(FUNCTION_CLOSE)
            break
        if not text.startswith(PARAM_OPEN, i):
            return None
        param = _name_at(text, i + len(PARAM_OPEN))
        if param is None or not param[0]:
            return None
        key, start = param
        end = text.find(PARAM_CLOSE, start)
        if end < 0:
            return None
        value = text[start:end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        values[key] = typed(key, value)
        i = end + len(PARAM_CLOSE)
    j = _skip_ws(text, i)
    if text.startswith(CALL_CLOSE, j):
        i = j + len(CALL_CLOSE)
    elif wrapped and j < len(text):  # (its closing may be left out only at the reply's end)
        return None
    return _call(name, values), i


_Block = Callable[[str, int, Collection[str]], "tuple[dict[str, Any], int] | None"]


def _glm_name_end(text: str, i: int) -> int:
    """Where the function's name written from ``text[i]`` ends (the first whitespace or ``<``),
    looking at most MAX_NAME + 1 characters; -1 where it does not end within them."""
    for j in range(i, min(len(text), i + MAX_NAME + 1)):
        if text[j] in _WS or text[j] == "<":
            return j
    return -1


def _glm_block(text: str, at: int, tools: Collection[str]) -> tuple[dict[str, Any], int] | None:
    """GLM's call written from ``text[at]`` (``<tool_call>``) and where it ends; None where it
    is no call of an offered function."""
    i = _skip_ws(text, at + len(CALL_OPEN))
    end = _glm_name_end(text, i)
    if end < 0 or text[i:end] not in tools:
        return None
    name, i = text[i:end], end
    typed = _typer(tools, name)
    values: dict[str, str] = {}
    while True:
        i = _skip_ws(text, i)
        if text.startswith(CALL_CLOSE, i):
            return _call(name, values), i + len(CALL_CLOSE)
        if not text.startswith(KEY_OPEN, i):
            return None
        close = text.find(KEY_CLOSE, i, i + len(KEY_OPEN) + MAX_NAME + 1)
        key = text[i + len(KEY_OPEN) : close].strip(_WS) if close >= 0 else ""
        if not key:
            return None
        i = _skip_ws(text, close + len(KEY_CLOSE))
        if not text.startswith(VALUE_OPEN, i):
            return None
        close = text.find(VALUE_CLOSE, i)
        if close < 0:
            return None
        values[key] = typed(key, text[i + len(VALUE_OPEN) : close])
        i = close + len(VALUE_CLOSE)


def parse_glm45(text: str, tools: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    """(the text around the calls, the calls) of a reply in GLM 4.5's format (``tools`` as for
    :func:`parse_qwen3_coder`)."""
    return _parse(text, tools, None, _glm_block)


def _call(name: str, values: dict[str, str]) -> dict[str, Any]:
    arguments = "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {v}" for k, v in values.items()) + "}"
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def parse_qwen3_coder(text: str, tools: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    """(the text around the calls, the calls) of a reply in Qwen3-Coder's format; ``tools``: the
    offered functions' names, or a mapping of each name to its ``parameters`` schema (which
    types the values). The calls have no ``id`` yet (the caller gives them theirs)."""
    return _parse(text, tools, FUNCTION_OPEN, _block)


def _parse(text: str, tools: Collection[str], bare: str | None, block: _Block) -> tuple[str, list[dict[str, Any]]]:
    """The calls ``block`` reads at each ``<tool_call>`` (and each ``bare`` opening) of ``text``,
    and the text around them."""
    calls: list[dict[str, Any]] = []
    rest: list[str] = []
    pos = misses = 0
    next_call, next_fn = text.find(CALL_OPEN), text.find(bare) if bare else -1
    while misses < MAX_MISSES and len(calls) < MAX_CALLS:
        if 0 <= next_call < pos:
            next_call = text.find(CALL_OPEN, pos)
        if bare and 0 <= next_fn < pos:
            next_fn = text.find(bare, pos)
        starts = [s for s in (next_call, next_fn) if s >= 0]
        if not starts:
            break
        at = min(starts)
        found = block(text, at, tools)
        rest.append(text[pos:at])
        if found is None:
            step = len(CALL_OPEN) if text.startswith(CALL_OPEN, at) else len(bare or "")
            rest.append(text[at : at + step])  # the opening is text; a later one may be a call
            pos, misses = at + step, misses + 1
            continue
        calls.append(found[0])
        pos = found[1]
    rest.append(text[pos:])
    return "".join(rest), calls


def _may_name(rest: str, tools: Collection[str]) -> bool | None:
    """After ``<function=``: True where ``rest`` names an offered function (its ``>`` came),
    None while it may still, False where it cannot."""
    close = rest.find(">", 0, MAX_NAME + 1)
    if close >= 0:
        return rest[:close].strip(_WS) in tools
    if len(rest) > MAX_NAME:
        return False
    begun = rest.lstrip(_WS)
    return None if any(str(n).startswith(begun) for n in tools) else False


def _after(text: str, i: int) -> str:
    """What a name after ``text[i]`` can take, and one more character (no copy of the rest)."""
    return text[i : i + MAX_NAME + 1]


def qwen3_coder_start(held: str, tools: Collection[str], pos: int = 0) -> tuple[int, bool] | None:
    """Streaming: where in ``held`` (text not sent yet; read from ``pos``) a call in
    Qwen3-Coder's format begins (True: surely; the text from there is held to the end of the
    reply and read then), or may still begin once more text comes (False: the text from there
    waits). None: none begins before the first ``<tool_call>`` that opens anything else (a JSON
    call, which the caller streams as it reads the JSON format, or text)."""
    tag = held.find(CALL_OPEN, pos)
    while True:
        fn = held.find(FUNCTION_OPEN, pos, tag if tag >= 0 else len(held))
        if fn < 0:
            break
        named = _may_name(_after(held, fn + len(FUNCTION_OPEN)), tools)
        if named is not False:
            return fn, bool(named)
        pos = fn + len(FUNCTION_OPEN)
    if tag >= 0:
        i = _skip_ws(held, tag + len(CALL_OPEN))
        after = held[i : i + len(FUNCTION_OPEN)]
        if i - tag > MAX_HEAD:
            return tag, True  # (undecided this long: read at the end, as a whole reply is)
        if after == FUNCTION_OPEN:
            named = _may_name(_after(held, i + len(FUNCTION_OPEN)), tools)
            return None if named is False else (tag, bool(named))
        return (tag, False) if FUNCTION_OPEN.startswith(after) else None
    # the end (from ``pos``) may be an opening still coming
    keep = partial_suffix(held[max(pos, len(held) - len(FUNCTION_OPEN)) :], (FUNCTION_OPEN,))
    return (len(held) - keep, False) if keep else None


def glm45_start(held: str, tools: Collection[str], pos: int = 0) -> tuple[int, bool] | None:
    """As :func:`qwen3_coder_start`, for GLM 4.5's format (``<tool_call>`` then a name)."""
    tag = held.find(CALL_OPEN, pos)
    if tag < 0:
        return None  # (a ``<tool_call>`` still coming is held by the caller)
    i = _skip_ws(held, tag + len(CALL_OPEN))
    if i - tag > MAX_HEAD:
        return tag, True
    end = _glm_name_end(held, i)
    if end < 0:
        begun = held[i : i + MAX_NAME + 1]
        if len(begun) > MAX_NAME or not any(str(n).startswith(begun) for n in tools):
            return None
        return tag, False
    return (tag, True) if held[i:end] in tools else None


# each format: (its reader, where a call in it begins in streamed text)
XML_FORMATS: dict[str, tuple[Callable[[str, Collection[str]], tuple[str, list[dict[str, Any]]]], Callable[[str, Collection[str], int], tuple[int, bool] | None]]] = {
    "qwen3_coder": (parse_qwen3_coder, qwen3_coder_start),
    "glm45": (parse_glm45, glm45_start),
}
