"""OpenAI's Responses API (``POST /v1/responses``, ``POST /responses``) over the chat pipeline.

Clients that speak only the Responses API (OpenAI's Codex CLI, the OpenAI Agents SDK, the
``openai`` package's ``client.responses.create``/``.stream``) reach the same models, keys,
classes and limits as ``/v1/chat/completions``: the body is translated to a chat request (as
llama-server's ``server_chat_convert_responses_to_chatcmpl`` does), run as one, and the chat
reply is translated back into a Response object, or into the Responses API's named
server-sent events (``event: <type>`` and ``data: {"type", "sequence_number", ...}``).

Nothing is stored: ``store`` is accepted and a response cannot be read back, so
``previous_response_id``, ``conversation``, a stored ``prompt``, ``background`` and
``item_reference`` inputs are a 400 naming them (llama-server refuses ``previous_response_id``
too). Parameters of the Responses API that change nothing here (``include``, ``truncation``
"auto", ``reasoning.summary``, ...) go the way of any other: named in
``x-superfluid-ignored-params``, a 400 ``unknown_parameter`` under ``--strict-params``.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from collections.abc import Collection
from typing import Any

from scheduler.link.messages import CONTEXT_LENGTH_EXCEEDED, Delta, Done
from superfluid_site.serving import serving

from . import responses
from .consumers import SSE_HEADERS, ChatCompletionsConsumer, reply_headers
from .errors import ApiError, context_length_exceeded, invalid_request
from .reasoning import Splitter, new_splitter
from .schemas import GenerationRequest, StandIn, chat_request_from, load_object, omitted_part, parse_content

RESPONSE_ID_PREFIX = "resp_"
CUSTOM_INPUT = "input"  # the one parameter of the function a custom (freeform) tool is served as

# Keys of the Responses API translated here (the others go to the chat parser as they came:
# llama-server's extensions such as top_k or seed are honoured there, anything else named)
_TRANSLATED = frozenset(
    {
        "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "reasoning",
        "include", "truncation", "top_logprobs", "max_tool_calls", "background", "previous_response_id",
        "conversation", "prompt", "context_management",
    }
)  # fmt: skip
# chat parameters a Responses body does not take: their Responses spelling is another (a chat
# ``max_tokens`` beside ``max_output_tokens`` would be read twice), or the reply would not fit a
# Response (``n`` choices, chat ``logprobs``): named as not honoured, as an unknown key is
_CHAT_ONLY = frozenset(
    {
        "messages", "max_tokens", "max_completion_tokens", "response_format", "functions", "function_call",
        "reasoning_effort", "n", "logprobs", "echo", "modalities", "audio",
    }
)  # fmt: skip
# state this server does not keep: a 400 naming the parameter when it is set
_STATEFUL = {
    "previous_response_id": "this server stores no responses; send the whole conversation in 'input'",
    "conversation": "this server stores no conversations; send the whole conversation in 'input'",
    "prompt": "this server stores no prompt templates; send the instructions and input themselves",
}
_INPUT_ROLES = ("user", "system", "developer", "assistant")
# Codex sends its instructions and then developer messages (permissions, sandbox) before the
# conversation: several system messages in a row, which the templates of Qwen 3.5 ("System
# message must be at the beginning"), Gemma 2 (no system role: only the first merges into the
# user's turn) and Ministral (a system message only first) refuse, every turn. At the head of the
# conversation they are one system message, their texts a blank line apart; a system or developer
# message later in the conversation stays where it is.
_SYSTEM_ROLES = ("system", "developer")
# The input parts a model here cannot read, as an agent keeps them in its history (Codex's
# view_image puts an input_image in the conversation; an MCP tool's output can hold one): their
# type -> (the keys one of which says where it is, what the model is told was there)
_OMITTED = {"input_image": (("image_url", "file_id"), "image"), "input_file": (("file_data", "file_id", "file_url"), "file")}


def _bad_type(param: str, expected: str) -> ApiError:
    return invalid_request(f"Invalid type for '{param}': expected {expected}.", param=param, code="invalid_type")


def _bad_value(param: str, expected: str) -> ApiError:
    return invalid_request(f"Invalid value for '{param}': expected {expected}.", param=param, code="invalid_value")


def _missing(param: str) -> ApiError:
    return invalid_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


class ResponsesRequest:
    """What a Responses body asks beyond the chat request it becomes: the fields a Response
    echoes back, and the input's shape (for errors that name it)."""

    def __init__(self) -> None:
        self.echo: dict[str, Any] = {}
        self.where: list[str] = []  # each chat message's place in the body (errors name it)
        self.custom: frozenset[str] = frozenset()  # the custom (freeform) tools' names: their calls are custom_tool_call items


# ---------------------------------------------------------------------------------------------
# Request: Responses body -> chat body
# ---------------------------------------------------------------------------------------------


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """An earlier reply's reasoning item as the text its chat turn carries (``reasoning_content``):
    its ``reasoning_text`` content (a summary is no reasoning, and encrypted content is none of
    this server's)."""
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list):
        raise _bad_type(f"{where}.content", "an array of reasoning text parts")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise _bad_type(f"{where}.content[{k}].text", "a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _stand_ins(ignored: list[str], strict: bool) -> dict[str, StandIn] | None:
    """What stands in for an image or a file in a message or a tool's output: a line telling the
    model one was there (:func:`omitted_part`), the part named in ``ignored`` as
    ``input.<type>``. The model reads no images, but an agent sends its history again every
    turn, so a 400 for one would refuse every later turn of its session. A part that is no
    well-formed image or file (none of its sources given, one not a string) is still a 400
    naming the field; under ``strict`` (--strict-params) every one is, as a part the chat route
    cannot serve."""
    if strict:
        return None

    def stand_in(part: dict[str, Any], where: str) -> str:
        sources, what = _OMITTED[part["type"]]
        given = [key for key in sources if part.get(key) is not None]
        for key in [*given, "detail", "filename"]:
            if part.get(key) is not None and not isinstance(part[key], str):
                raise _bad_type(f"{where}.{key}", "a string")
        if not given:
            raise invalid_request(
                f"Missing required parameter: '{where}.{sources[0]}' (or " + " or ".join(f"'{k}'" for k in sources[1:]) + ").",
                param=f"{where}.{sources[0]}",
                code="missing_required_parameter",
            )
        name = f"input.{part['type']}"
        if name not in ignored:
            ignored.append(name)
        return omitted_part(what)

    return dict.fromkeys(_OMITTED, stand_in)


def _messages(body: dict[str, Any], out: ResponsesRequest, ignored: list[str], *, strict: bool) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages (``out.where``: each one's place); an
    image or file in them as :func:`_stand_ins` says."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad_type("instructions", "a string")
        messages.append({"role": "system", "content": instructions})
        out.where.append("instructions")
    items = body.get("input")
    if items is None:
        raise _missing("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        out.where.append("input")
        return messages
    if not isinstance(items, list):
        raise _bad_type("input", "a string or an array of input items")
    stand_ins = _stand_ins(ignored, strict)

    def assistant_turn(where: str) -> dict[str, Any]:
        """The assistant turn an item of an earlier reply belongs to: the one before it, when
        the last message is one (a reply's reasoning, text and calls are one turn)."""
        if messages and messages[-1]["role"] == "assistant":
            return messages[-1]
        messages.append({"role": "assistant", "content": ""})
        out.where.append(where)
        return messages[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad_type(where, "an input item object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if not isinstance(kind, str):
            raise _missing(f"{where}.type")
        if kind == "message":
            role = item.get("role")
            if role not in _INPUT_ROLES:
                raise _bad_value(f"{where}.role", "one of 'user', 'system', 'developer', 'assistant'")
            if role == "assistant":
                text = parse_content(item.get("content"), role, f"{where}.content", ("output_text", "input_text"), empty_ok=True)
                turn = assistant_turn(where)
                turn["content"] = turn["content"] + text
            else:
                text = parse_content(item.get("content"), role, f"{where}.content", ("input_text",), empty_ok=True, stand_ins=stand_ins)
                if role in _SYSTEM_ROLES and messages and all(m["role"] in _SYSTEM_ROLES for m in messages):
                    # the system text at the head of the conversation is one system message
                    # (:data:`_SYSTEM_ROLES`); its place in errors stays the first one's
                    messages[-1]["content"] = "\n\n".join(t for t in (messages[-1]["content"], text) if t)
                    continue
                if role == "user" and messages and messages[-1]["role"] == "user":
                    # user messages in a row are one user turn, a line apart: Codex sends its
                    # environment context and then the user's prompt (and AGENTS.md before them),
                    # which the templates whose turns must alternate (Gemma's, Mistral's and
                    # Devstral's) refused, every turn; as the Anthropic route combines them
                    messages[-1]["content"] = "\n".join(t for t in (messages[-1]["content"], text) if t)
                    continue
                messages.append({"role": role, "content": text})
                out.where.append(where)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _bad_type(f"{where}.{key}", "a string") if key in item else _missing(f"{where}.{key}")
            turn = assistant_turn(where)
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "custom_tool_call":
            # an earlier reply's call of a custom (freeform) tool: the chat call of the function
            # it is served as (its one string parameter, ``input``)
            for key in ("call_id", "name", "input"):
                if not isinstance(item.get(key), str):
                    raise _bad_type(f"{where}.{key}", "a string") if key in item else _missing(f"{where}.{key}")
            turn = assistant_turn(where)
            arguments = json.dumps({CUSTOM_INPUT: item["input"]}, ensure_ascii=False)
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}
            turn.setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad_type(f"{where}.call_id", "a string") if "call_id" in item else _missing(f"{where}.call_id")
            if "output" not in item:
                raise _missing(f"{where}.output")
            output = parse_content(item["output"], "tool", f"{where}.output", ("input_text",), empty_ok=True, stand_ins=stand_ins)
            messages.append({"role": "tool", "content": output, "tool_call_id": call_id})
            out.where.append(where)
        elif kind == "reasoning":
            thought = _reasoning_text(item, where)
            if thought:
                turn = assistant_turn(where)
                turn["reasoning_content"] = turn.get("reasoning_content", "") + thought
        elif kind == "item_reference":
            raise invalid_request(
                f"Invalid value for '{where}.type': 'item_reference' needs a stored item; this server "
                "stores none, send the item itself.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        else:
            raise invalid_request(
                f"Input items of type '{kind}' are not supported (in '{where}'); 'message', "
                "'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output' "
                "and 'reasoning' items are.",
                param=f"{where}.type",
                code="unsupported_value",
            )
    if not messages:
        raise _bad_value("input", "a non-empty string or array of input items")
    return messages


def _custom_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom (freeform) tool as the chat function it is served as: one string parameter,
    ``input``, its text; a grammar the input follows (Codex's ``apply_patch`` has a Lark one)
    is told to the model in the description, not enforced."""
    name = tool.get("name")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad_type(f"{where}.description", "a string")
    fmt = tool.get("format")
    fmt = {} if fmt is None else fmt
    if not isinstance(fmt, dict):
        raise _bad_type(f"{where}.format", "an object")
    kind = fmt.get("type", "text")
    if kind not in ("text", "grammar"):
        raise _bad_value(f"{where}.format.type", "'text' or 'grammar'")
    text = description or ""
    if kind == "grammar":
        definition, syntax = fmt.get("definition"), fmt.get("syntax")
        if not isinstance(definition, str):
            raise _bad_type(f"{where}.format.definition", "a string") if definition is not None else _missing(f"{where}.format.definition")
        if syntax not in ("lark", "regex"):
            raise _bad_value(f"{where}.format.syntax", "'lark' or 'regex'")
        text += f"\n\nThe string `{CUSTOM_INPUT}` is the tool's whole input, in this {syntax} grammar:\n{definition}"
    return {
        "name": name,
        "description": text.strip(),
        "parameters": {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as raw text."}},
            "required": [CUSTOM_INPUT],
            "additionalProperties": False,
        },
    }


def _tools(body: dict[str, Any], ignored: list[str], *, strict: bool) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]], frozenset[str]]:
    """(the chat ``tools``, the Response's echo of them, the custom tools' names). Function
    tools as they are; a custom (freeform) tool as a function of one string, ``input`` (its
    calls come back as ``custom_tool_call`` items: Codex's ``apply_patch`` is one for GPT-5
    models and where ``include_apply_patch_tool`` is set); a hosted tool (web_search,
    file_search, mcp, code_interpreter, ...) is left out of the prompt, since no reply here
    could call it, and named in ``ignored`` (as llama-server drops them: Codex sends
    ``web_search`` where it is turned on, and a 400 would stop every turn); under ``strict``
    (--strict-params) it is a 400 naming its type."""
    raw = body.get("tools")
    if raw is None:
        return None, [], frozenset()
    if not isinstance(raw, list):
        raise _bad_type("tools", "an array of tools")
    chat: list[dict[str, Any]] = []
    echo: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad_type(where, "a tool object")
        kind = tool.get("type")
        if kind == "custom":
            chat.append({"type": "function", "function": _custom_function(tool, where)})
            echo.append(tool)
            if isinstance(tool.get("name"), str):
                custom.add(tool["name"])
            continue
        if kind != "function":
            if not isinstance(kind, str):
                raise _missing(f"{where}.type")
            if strict:
                raise invalid_request(
                    f"Tools of type '{kind}' are not supported (in '{where}'); 'function' and 'custom' tools are.",
                    param=f"{where}.type",
                    code="unsupported_value",
                )
            ignored.append(f"tools.{kind}")  # (the header names plain identifiers only, no brackets)
            echo.append(tool)
            continue
        fn = {k: v for k, v in tool.items() if k != "type"}
        if "strict" not in fn:
            fn["strict"] = True  # the Responses API's default
        chat.append({"type": "function", "function": fn})
        echo.append({"type": "function", "name": fn.get("name"), "description": fn.get("description"),
                     "parameters": fn.get("parameters"), "strict": fn["strict"]})  # fmt: skip
    return chat, echo, frozenset(custom)


def _tool_choice(choice: Any) -> Any:
    """The Responses ``tool_choice`` as the chat's."""
    if choice is None or isinstance(choice, str):
        return choice  # "auto" | "none" | "required" (the chat parser checks the value)
    if not isinstance(choice, dict):
        raise _bad_type("tool_choice", "a string or an object")
    kind = choice.get("type")
    if kind in ("function", "custom"):  # (a custom tool is served as a function)
        name = choice.get("name")
        if not isinstance(name, str):
            raise _missing("tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        tools = choice.get("tools")
        if isinstance(tools, list):
            tools = [{"type": "function" if t.get("type") == "custom" else t.get("type"), "function": {"name": t.get("name")}}
                     if isinstance(t, dict) else t for t in tools]  # fmt: skip
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": tools}}
    if not isinstance(kind, str):
        raise _missing("tool_choice.type")
    raise invalid_request(
        f"Invalid value for 'tool_choice.type': '{kind}' names a tool this server does not have; "
        "expected 'function', 'custom' or 'allowed_tools'.",
        param="tool_choice.type",
        code="unsupported_value",
    )


def _text_format(body: dict[str, Any], ignored: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the chat ``response_format`` of ``text.format``, the Response's ``text``)."""
    text = body.get("text")
    if text is None:
        return None, {"format": {"type": "text"}, "verbosity": "medium"}
    if not isinstance(text, dict):
        raise _bad_type("text", "an object")
    for key, value in text.items():
        if key == "verbosity":
            if value not in (None, "low", "medium", "high"):
                raise _bad_value("text.verbosity", "'low', 'medium' or 'high'")
            if value not in (None, "medium"):
                ignored.append("text.verbosity")  # the model writes as it writes
        elif key != "format":
            ignored.append(f"text.{key}")
    fmt = text.get("format")
    echo = {"format": {"type": "text"}, "verbosity": text.get("verbosity") or "medium"}
    if fmt is None:
        return None, echo
    if not isinstance(fmt, dict):
        raise _bad_type("text.format", "an object")
    kind = fmt.get("type")
    echo["format"] = fmt
    if kind == "text":
        return None, echo
    if kind == "json_object":
        return {"type": "json_object"}, echo
    if kind == "json_schema":
        if "schema" not in fmt:
            raise _missing("text.format.schema")
        if not isinstance(fmt.get("name"), str):
            raise _bad_type("text.format.name", "a string") if "name" in fmt else _missing("text.format.name")
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}, echo
    raise _bad_value("text.format.type", "'text', 'json_object' or 'json_schema'")


def _reasoning(body: dict[str, Any], chat: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    """``reasoning``: its ``effort`` goes to the chat template (``reasoning_effort``, as
    llama-server passes it); a summary is not written here (the reply's reasoning is given as
    it is), so ``summary`` is named as not honoured."""
    spec = body.get("reasoning")
    if spec is None:
        return {"effort": None, "summary": None}
    if not isinstance(spec, dict):
        raise _bad_type("reasoning", "an object")
    effort = spec.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _bad_type("reasoning.effort", "a string")
        chat["reasoning_effort"] = effort
    for key, value in spec.items():
        if key != "effort" and value is not None:
            ignored.append(f"reasoning.{key}")
    return {"effort": effort, "summary": spec.get("summary")}


def _unhonoured(body: dict[str, Any], ignored: list[str]) -> None:
    """The Responses API's parameters that change nothing here: named where they ask for
    something (their defaults are what this server does anyway), or a 400 for those that need
    state this server does not keep."""
    for key, why in _STATEFUL.items():
        if body.get(key) is not None:
            raise invalid_request(f"Unsupported parameter: '{key}': {why}.", param=key, code="unsupported_parameter")
    background = body.get("background")
    if background is not None and not isinstance(background, bool):
        raise _bad_type("background", "a boolean")
    if background:
        raise invalid_request(
            "Unsupported parameter: 'background': this server stores no responses to poll; leave it false.",
            param="background",
            code="unsupported_parameter",
        )
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise _bad_type("include", "an array of strings")
    if include:
        ignored.append("include")
    truncation = body.get("truncation")
    if truncation not in (None, "auto", "disabled"):
        raise _bad_value("truncation", "'auto' or 'disabled'")
    if truncation == "auto":  # a prompt over the context is refused, as with 'disabled'
        ignored.append("truncation")
    for key in ("top_logprobs", "max_tool_calls"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise _bad_value(key, "an integer greater than or equal to 0")
        if value and key == "top_logprobs" or value is not None and key == "max_tool_calls":
            ignored.append(key)
    if body.get("context_management") is not None:
        ignored.append("context_management")


def responses_to_chat(body: dict[str, Any], *, strict: bool = False) -> tuple[dict[str, Any], list[str], ResponsesRequest]:
    """A Responses body as a chat body: (the chat body, the Responses parameters not honoured,
    what the Response echoes). With ``strict`` a parameter not honoured is a 400
    ``unknown_parameter``, as on the chat route."""
    out = ResponsesRequest()
    ignored: list[str] = []
    chat: dict[str, Any] = {}
    for key, value in body.items():
        if key in _CHAT_ONLY:
            ignored.append(key)
        elif key not in _TRANSLATED:
            chat[key] = value  # model, stream, temperature, ... and llama-server's extensions
    _unhonoured(body, ignored)
    chat["messages"] = _messages(body, out, ignored, strict=strict)
    tools, tools_echo, out.custom = _tools(body, ignored, strict=strict)
    if tools:  # (none left when every tool was a hosted one)
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    max_output = body.get("max_output_tokens")
    if max_output is not None:
        chat["max_completion_tokens"] = max_output
    response_format, text_echo = _text_format(body, ignored)
    if response_format is not None:
        chat["response_format"] = response_format
    reasoning_echo = _reasoning(body, chat, ignored)
    if strict and ignored:
        raise invalid_request(f"Unrecognized request argument supplied: {ignored[0]}", param=ignored[0], code="unknown_parameter")
    out.echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": max_output,
        "max_tool_calls": body.get("max_tool_calls"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": reasoning_echo,
        "safety_identifier": body.get("safety_identifier"),
        "store": False,  # nothing is stored here, whatever was asked
        "text": text_echo,
        "tool_choice": body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        "tools": tools_echo,
        "top_logprobs": 0,
        "truncation": "disabled",
        "user": body.get("user"),
    }
    return chat, ignored, out


# chat parameter names in the chat parser's errors, as the Responses body spells them
_PARAM_NAMES = (
    (re.compile(r"^max_completion_tokens$|^max_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema\."), "text.format."),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^tool_choice\.allowed_tools\.tools\[(\d+)\]\.function\.name$"), r"tool_choice.tools[\1].name"),
    (re.compile(r"^tool_choice\.allowed_tools"), "tool_choice"),
    (re.compile(r"^reasoning_effort$"), "reasoning.effort"),
)


def _renamed(exc: ApiError, where: list[str]) -> ApiError:
    """The chat parser's error for a translated body, naming the Responses body's parameter."""
    param = exc.param
    if not param:
        return exc
    if param == "messages":  # the whole conversation (its size, the template's refusal): the input
        message = re.sub(r"\b(the|your) messages\b", r"\1 input", exc.message)  # ("tokens in the messages", "your messages holds")
        return ApiError(exc.status, message, type=exc.type, param="input", code=exc.code, headers=exc.headers)
    new = param
    m = re.match(r"^messages\[(\d+)\]", param)
    if m:
        i = int(m.group(1))
        new = where[i] if i < len(where) else "input"
    else:
        for pattern, spelled in _PARAM_NAMES:
            if pattern.search(param):
                new = pattern.sub(spelled, param, count=1)
                break
    if new == param:
        return exc
    message = exc.message.replace(param, new)
    return ApiError(exc.status, message, type=exc.type, param=new, code=exc.code, headers=exc.headers)


def parse_responses_request(raw: bytes, *, models: Collection[str], strict: bool = False) -> tuple[GenerationRequest, ResponsesRequest]:
    """Validate a ``POST /v1/responses`` body: the chat request it runs as, and what its
    Response echoes. Errors are the chat route's (400 with ``param``, 404 ``model_not_found``),
    naming the Responses body's parameters."""
    return responses_request_from(load_object(raw), models=models, strict=strict)


def responses_request_from(body: dict[str, Any], *, models: Collection[str], strict: bool = False) -> tuple[GenerationRequest, ResponsesRequest]:
    """:func:`parse_responses_request` of a decoded body (``/v1/responses/input_tokens`` counts
    the same request, its errors named the same way)."""
    chat, ignored, out = responses_to_chat(body, strict=strict)
    try:
        request = chat_request_from(chat, models=models, strict=strict)
    except ApiError as exc:
        raise _renamed(exc, out.where) from None
    request.ignored = ignored + [name for name in request.ignored if name not in ignored]
    return request, out


# ---------------------------------------------------------------------------------------------
# Reply: chat reply -> Response
# ---------------------------------------------------------------------------------------------


def response_id(chat_id: str) -> str:
    """The Response's id, made of its chat reply's (the same random part: a stream resumed on
    another head names the same Response)."""
    return RESPONSE_ID_PREFIX + chat_id.split("-", 1)[-1]


def response_usage(chat_usage: dict[str, Any] | None, reasoning_tokens: int = 0) -> dict[str, Any] | None:
    """The chat ``usage`` in the Responses API's names."""
    if chat_usage is None:
        return None
    prompt, completion = int(chat_usage.get("prompt_tokens", 0)), int(chat_usage.get("completion_tokens", 0))
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
        "total_tokens": prompt + completion,
    }


def response_object(
    resp_id: str, created: int, model: str, echo: dict[str, Any], request: GenerationRequest, *,
    status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, error: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A Response object (``status`` ``in_progress``, ``completed``, ``incomplete`` or
    ``failed``), with the request's fields echoed as OpenAI echoes them."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        **echo,
        "model": model,
        "output": output,
        "service_tier": "default",
        "temperature": request.temperature,
        "top_p": request.top_p,
        "usage": usage,
    }


def _short_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "encrypted_content": None, "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [output_text(text)] if text is not None else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": "fc_" + call_id.removeprefix("call_"), "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments of the function call it was served as: its one
    string (``input``, or the one string the model gave under another name); arguments that are
    not such an object (a call cut short) are given as they are."""
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):  # (nested past the reader's depth: a call whose head came is one)
        return arguments
    if isinstance(args, str):  # (the string itself, as JSON)
        return args
    if isinstance(args, dict):
        if isinstance(args.get(CUSTOM_INPUT), str):
            return str(args[CUSTOM_INPUT])
        strings = [v for v in args.values() if isinstance(v, str)]
        if len(args) == 1 and strings:
            return str(strings[0])
    return arguments


def custom_call_item(call_id: str, name: str, input_text: str, status: str) -> dict[str, Any]:
    return {"id": "ctc_" + call_id.removeprefix("call_"), "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name, "input": input_text}


def tool_call_item(call_id: str, name: str, arguments: str, status: str, custom: Collection[str]) -> dict[str, Any]:
    """A call's output item: ``custom_tool_call`` for a custom tool's (its input), else ``function_call``."""
    if name in custom:
        return custom_call_item(call_id, name, custom_input(arguments), status)
    return call_item(call_id, name, arguments, status)


def status_of(finish_reason: str | None) -> str:
    """A chat reply's finish as a Response's status: cut at the token limit, ``incomplete``."""
    return "incomplete" if finish_reason == "length" else "completed"


def output_of_chat(chat_body: dict[str, Any], custom: Collection[str] = ()) -> tuple[list[dict[str, Any]], str]:
    """A non-streamed chat reply's message as the Response's output items, in OpenAI's order
    (reasoning, the message, the calls), and the Response's status."""
    choice = chat_body["choices"][0]
    message = choice["message"]
    status = status_of(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(reasoning_item(_short_id("rs_"), message["reasoning_content"], "completed"))
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if content or not calls:
        output.append(message_item(_short_id("msg_"), content, status))
    for i, call in enumerate(calls):  # a reply cut short was cut in its last call
        cut = status == "incomplete" and i == len(calls) - 1
        output.append(tool_call_item(call["id"], call["function"]["name"], call["function"]["arguments"], "incomplete" if cut else "completed", custom))
    return output, status


class ResponseEvents:
    """One streamed Response: the chat reply's chunks as the Responses API's events, each with
    its ``type`` and a rising ``sequence_number``; output items are added as they begin (the
    reasoning, the message, each call) and done at the end, or when the next call begins."""

    def __init__(self, resp_id: str, created: int, model: str, echo: dict[str, Any], request: GenerationRequest, custom: Collection[str] = ()) -> None:
        self.resp_id, self.created, self.model, self.echo, self.request = resp_id, created, model, echo, request
        self.custom = custom  # the custom tools' names (their calls are custom_tool_call items)
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # every output item, in output_index order
        self.open: set[int] = set()  # the items not yet done
        self.reasoning: int | None = None  # the reasoning item's index
        self.message: int | None = None  # the message item's index
        self.calls: dict[int, int] = {}  # the chat call index -> its item's index
        self.texts: dict[int, list[str]] = {}  # an item's text or arguments so far
        self.finish_reason: str | None = None
        self.ended = False
        self.opening = [self.event("response.created", response=self.snapshot("in_progress")),
                        self.event("response.in_progress", response=self.snapshot("in_progress"))]  # fmt: skip

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        frame = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return frame

    def snapshot(self, status: str, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        output = [self.whole(i, status) for i in range(len(self.items))] if status != "in_progress" else []
        return response_object(self.resp_id, self.created, self.model, self.echo, self.request, status=status, output=output, usage=usage, error=error)

    def progress(self) -> dict[str, Any]:
        """``response.in_progress`` again, with the output so far: the keepalive of a stream that
        waits (Codex ends a turn after ``stream_idle_timeout_ms`` without an event; SSE comments
        are not events to it), as an event every client of this API already reads."""
        snapshot = self.snapshot("in_progress")
        snapshot["output"] = [self.whole(i, "in_progress") for i in range(len(self.items))]
        return self.event("response.in_progress", response=snapshot)

    def whole(self, i: int, status: str) -> dict[str, Any]:
        """Item ``i`` as it stands: its text or arguments so far, ``status`` if it is still open."""
        item = dict(self.items[i])
        text = "".join(self.texts[i])
        done = i not in self.open
        item_status = item["status"] if done else ("incomplete" if status in ("incomplete", "failed") else status)
        if item["type"] == "reasoning":
            return reasoning_item(item["id"], text, item_status)
        if item["type"] == "message":
            return message_item(item["id"], text, item_status)
        return tool_call_item(item["call_id"], item["name"], text, item_status, self.custom)

    def add_item(self, item: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        i = len(self.items)
        self.items.append(item)
        self.open.add(i)
        self.texts[i] = []
        return i, self.event("response.output_item.added", output_index=i, item=item)

    def feed(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events of a delta's chat chunks."""
        out: list[dict[str, Any]] = []
        for chunk in chunks:
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    out += self.reasoning_delta(delta["reasoning_content"])
                if delta.get("content"):
                    out += self.text_delta(delta["content"])
                for call in delta.get("tool_calls") or []:
                    out += self.call_delta(call)
                if choice.get("finish_reason") is not None:
                    self.finish_reason = choice["finish_reason"]
        return out

    def reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.reasoning is None:
            self.reasoning, added = self.add_item(reasoning_item(_short_id("rs_"), "", "in_progress"))
            out += [added, self.event("response.content_part.added", item_id=self.items[self.reasoning]["id"], output_index=self.reasoning,
                                      content_index=0, part={"type": "reasoning_text", "text": ""})]  # fmt: skip
        i = self.reasoning
        self.texts[i].append(text)
        return [*out, self.event("response.reasoning_text.delta", item_id=self.items[i]["id"], output_index=i, content_index=0, delta=text)]

    def open_message(self) -> list[dict[str, Any]]:
        """The message item's events as it begins (none once it has)."""
        out: list[dict[str, Any]] = []
        if self.reasoning is not None and self.reasoning in self.open:
            out += self.close(self.reasoning, "completed")  # the answer began: the reasoning is whole
        if self.message is None:
            self.message, added = self.add_item(message_item(_short_id("msg_"), None, "in_progress"))
            out += [added, self.event("response.content_part.added", item_id=self.items[self.message]["id"], output_index=self.message,
                                      content_index=0, part=output_text(""))]  # fmt: skip
        return out

    def text_delta(self, text: str) -> list[dict[str, Any]]:
        out = self.open_message()
        i = self.message
        assert i is not None
        self.texts[i].append(text)
        return [*out, self.event("response.output_text.delta", item_id=self.items[i]["id"], output_index=i, content_index=0, delta=text, logprobs=[])]

    def call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if index not in self.calls:
            for j in sorted(self.open):  # a call begins: the reasoning and the call before are whole
                if self.items[j]["type"] != "message":
                    out += self.close(j, "completed")
            item = tool_call_item(call.get("id") or responses.new_call_id(), fn.get("name", ""), "", "in_progress", self.custom)
            if item["type"] == "custom_tool_call":
                item["input"] = ""
            self.calls[index], added = self.add_item(item)
            out.append(added)
        i = self.calls[index]
        args = fn.get("arguments")
        if args:
            self.texts[i].append(args)
            if self.items[i]["type"] == "function_call":  # (a custom call's input is sent whole at its end)
                out.append(self.event("response.function_call_arguments.delta", item_id=self.items[i]["id"], output_index=i, delta=args))
        return out

    def close(self, i: int, status: str) -> list[dict[str, Any]]:
        """The events that end item ``i`` (its text's, its part's, its own)."""
        self.open.discard(i)
        item = self.items[i]
        text = "".join(self.texts[i])
        whole = self.whole(i, status)
        whole["status"] = status
        self.items[i] = whole
        out: list[dict[str, Any]] = []
        if item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0, text=text))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                                  part={"type": "reasoning_text", "text": text}))  # fmt: skip
        elif item["type"] == "message":
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=output_text(text)))
        elif item["type"] == "custom_tool_call":  # its input: the string in the arguments, known at their end
            out.append(self.event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=i, delta=whole["input"]))
            out.append(self.event("response.custom_tool_call_input.done", item_id=item["id"], output_index=i, input=whole["input"]))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i, name=item["name"], arguments=text))
        out.append(self.event("response.output_item.done", output_index=i, item=whole))
        return out

    def finish(self, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The events that end the Response: its open items done, then ``response.completed``
        (``response.incomplete`` when the token limit cut it)."""
        status = status_of(self.finish_reason)
        out: list[dict[str, Any]] = []
        if self.message is None and not self.calls:  # no answer: an empty message, as unstreamed
            out += self.open_message()
        for i in sorted(self.open):  # (a call still open at a cut is the one it cut)
            out += self.close(i, "completed" if self.items[i]["type"] == "reasoning" else status)
        self.ended = True
        return [*out, self.event(f"response.{status}", response=self.snapshot(status, usage))]

    def failed(self, exc: ApiError) -> list[dict[str, Any]]:
        """The events that end a Response that failed after its stream began: OpenAI's ``error``
        event, then ``response.failed`` (the output so far, ``error`` set), so that a client
        reading either learns why the stream stopped."""
        code = exc.code or exc.type
        error = {"code": code, "message": exc.message}
        self.ended = True
        return [
            self.event("error", code=code, message=exc.message, param=exc.param),
            self.event("response.failed", response=self.snapshot("failed", None, error)),
        ]


sse_frame = responses.named_sse_event  # one event of the stream, named by its type


def context_cut(request: GenerationRequest, event: Done) -> ApiError | None:
    """A reply the end of the context cut before ``max_output_tokens`` (or with none asked):
    ``context_length_exceeded``, as OpenAI fails a Response that would outgrow the window
    (``truncation`` ``disabled``), not ``incomplete`` (which says ``max_output_tokens``
    stopped it). Codex compacts its thread on that code; on ``response.incomplete`` it would
    send the same turn again, to be cut again."""
    usage = event.usage
    if not responses.cut_by_context(event.finish_reason, usage, request.max_tokens):
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return context_length_exceeded(
        f"The reply reached the end of the model's context ({prompt + completion} tokens: {prompt} of input and {completion} "
        "generated) before it finished. Shorten the input (compact the conversation, or start a new one).",
        param="input",
    )


# ---------------------------------------------------------------------------------------------
# The route
# ---------------------------------------------------------------------------------------------


class ResponsesConsumer(ChatCompletionsConsumer):
    """``POST /v1/responses`` (and llama-server's ``/responses``): a chat completion in every
    respect but its shapes (admission, keys, classes, limits, activity rows and metrics under
    ``chat``, a disconnect freeing the lane), answered as a Response object or the Responses
    API's event stream."""

    stream_end = b""  # the stream ends with response.completed (no [DONE])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = ResponsesRequest()  # parse
        self.parsed: GenerationRequest | None = None  # the request as parsed (a refusal after the parse: whether it streams)
        self.events: ResponseEvents | None = None  # the Response being built (reply)
        self.thinking: Splitter | None = None  # the reply's reasoning, as deltas come (saw_delta)
        self.reasoning_tokens = 0
        self.thought = self.answered = False  # (saw_delta)
        self.tokens_before_answer = 0

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        request, self.asked = parse_responses_request(body, models=models, strict=serving().strict_params)
        self.parsed = request
        return request

    def reply(self, request: GenerationRequest, **extra: Any) -> responses.Reply:
        reply = super().reply(request, **extra)
        self.events = ResponseEvents(response_id(reply.id), reply.created, request.model, self.asked.echo, request, self.asked.custom)
        self.thinking = new_splitter(self.reply_reasoning(request), calls=reply.tool_names, continues=reply.continues)
        return reply

    def saw_delta(self, event: Delta, *, reached_client: bool = True) -> None:
        super().saw_delta(event, reached_client=reached_client)
        # usage's reasoning_tokens: the tokens before the answer begins (its markers too), in
        # a reply that reasoned
        if self.thinking is not None and not self.answered:
            thought, answer = self.thinking.feed(event.text)
            self.thought = self.thought or bool(thought)
            if answer.strip():
                self.answered = True
            else:
                self.tokens_before_answer = event.tokens
        self.reasoning_tokens = self.tokens_before_answer if self.thought else 0

    def sse_frame(self, frame: dict[str, Any]) -> bytes:
        return sse_frame(frame)

    def opening_frames(self, reply: responses.Reply) -> list[dict[str, Any]]:
        assert self.events is not None
        return list(self.events.opening)

    def keepalive_event(self) -> bytes:
        assert self.events is not None
        return sse_frame(self.events.progress())

    def delta_events(self, reply: responses.Reply, event: Delta) -> list[bytes]:
        assert self.events is not None
        return [sse_frame(f) for f in self.events.feed(reply.delta_chunks(event))]

    def final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> list[dict[str, Any]]:
        assert self.events is not None
        frames = self.events.feed(reply.final_chunks(event, None))
        cut = context_cut(request, event)
        if cut is not None:
            self.record.error_code = cut.code
            return frames + self.events.failed(cut)
        return frames + self.events.finish(response_usage(self.usage(event), self.reasoning_tokens))

    def final_body(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> dict[str, Any]:
        cut = context_cut(request, event)
        if cut is not None:
            raise cut
        chat = reply.body(event, None)
        output, status = output_of_chat(chat, self.asked.custom)
        usage = response_usage(self.usage(event), self.reasoning_tokens)
        return response_object(response_id(reply.id), reply.created, request.model, self.asked.echo, request, status=status, output=output, usage=usage)

    async def send_error(self, exc: ApiError) -> None:
        events = self.events
        if self.headers_sent and self.record.stream and events is not None and not events.ended:
            # the stream began: OpenAI's error event and response.failed end it (not a chat error frame)
            self.record.error_code = exc.code or exc.type
            await self.send_body(b"".join(sse_frame(f) for f in events.failed(exc)))
            return
        # before any output: the chat route's error, naming the Responses body's field (a prompt
        # over the context, or one the template refuses, is the worker's word on "messages")
        exc = _renamed(exc, self.asked.where)
        request = self.parsed
        if not self.headers_sent and exc.code == CONTEXT_LENGTH_EXCEEDED and request is not None and request.stream:
            await self.send_failed_stream(request, exc)
            return
        await super().send_error(exc)

    async def send_failed_stream(self, request: GenerationRequest, exc: ApiError) -> None:
        """A streamed request whose input the context cannot hold, refused before its stream
        began (the size check, the worker's count): a 200 stream of ``response.created``,
        ``response.in_progress``, ``error`` and ``response.failed`` with ``error.code``
        ``context_length_exceeded``, as OpenAI reports a streamed request's overflow. Codex reads
        that code only there (its context window full: it compacts, or asks for a new thread);
        an HTTP 400 it shows as an invalid request. The activity row and metrics count the
        refusal as the unstreamed one's: status 400, ``context_length_exceeded``."""
        self.record.error_code = exc.code
        self.record.status = exc.status
        self.record.model, self.record.stream = request.model, True
        self.record.request_id = self.record.request_id or uuid.uuid4().hex  # (no job yet: an id of its own)
        self.reply(request)
        events = self.events
        assert events is not None
        # (its class once admitted, when the worker refused it; the body's ignored parameters as
        # parsed: a refusal in the parse comes before the consumer keeps them)
        await self.send_headers(status=200, headers=SSE_HEADERS + reply_headers(self.record.request_id, self.record.qos, request.ignored))
        self.headers_sent = True
        await self.send_body(b"".join(sse_frame(f) for f in [*events.opening, *events.failed(exc)]))
