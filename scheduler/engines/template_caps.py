"""llama-server's ``chat_template_caps`` (its /props): what a chat template does with a chat,
found as llama.cpp finds it (common/jinja/caps.cpp ``caps_get``): the template is rendered with
probe conversations, and what it touched of them is read back. llama.cpp's own Jinja runtime
counts every value a template reads (``stats.used``) and the operations done on it
(``stats.ops``); here the probe's values are dicts, lists and strings that note the same as the
project's renderer (:func:`chat.render_chat_template`) reads them, and the template's tests and
filters note the values they are applied to. A probe the template raises on counts as llama.cpp's
``try``/``catch`` counts it; a template that does not compile has every capability false."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from .chat import compile_chat_template, render_chat_template, takes_system_turn, template_knows_tools

CAPS = (
    "supports_string_content",
    "supports_typed_content",
    "supports_tools",
    "supports_tool_calls",
    "supports_parallel_tool_calls",
    "supports_system_role",
    "supports_preserve_reasoning",
    "supports_reasoning_effort",
    "supports_object_arguments",
)


class _Stats:
    """A probe value's ``stats``: whether the template read it, and what it did with it."""

    def __init__(self) -> None:
        self.used = False
        self.ops: set[str] = set()


def _stats(value: Any) -> _Stats | None:
    # (not getattr: on a Jinja Undefined that raises)
    return value._caps_stats if isinstance(value, (_Str, _List, _Dict)) else None


def _mark(value: Any, op: str | None = None, *, deep: bool = False) -> None:
    stats = _stats(value)
    if stats is not None:
        stats.used = True
        if op:
            stats.ops.add(op)
    if deep and isinstance(value, dict):
        for item in dict.values(value):
            _mark(item, deep=True)
    elif deep and isinstance(value, list):
        for item in list.__iter__(value):
            _mark(item, deep=True)


class _Str(str):
    """A probe string: read (``{{ }}``, compared, tested, sliced) marks it used."""

    _caps_stats: _Stats

    def __str__(self) -> str:
        _mark(self)
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        _mark(self)
        return str.__eq__(self, other)

    __hash__ = str.__hash__

    def __len__(self) -> int:
        _mark(self)
        return str.__len__(self)

    def __iter__(self) -> Iterator[str]:
        _mark(self, "array_access")
        return str.__iter__(self)

    def __getitem__(self, key: Any) -> str:
        _mark(self, "array_access" if isinstance(key, int) else None)
        return str.__getitem__(self, key)


class _List(list):  # type: ignore[type-arg]
    _caps_stats: _Stats

    def __iter__(self) -> Iterator[Any]:
        _mark(self, "array_access")
        for item in list.__iter__(self):
            _mark(item)
            yield item

    def __getitem__(self, key: Any) -> Any:
        _mark(self, "array_access" if isinstance(key, int) else None)
        item = list.__getitem__(self, key)
        _mark(item)
        return item

    def __len__(self) -> int:
        _mark(self)
        return list.__len__(self)


class _Dict(dict):  # type: ignore[type-arg]
    _caps_stats: _Stats

    def __getitem__(self, key: Any) -> Any:
        _mark(self, "object_access")
        item = dict.__getitem__(self, key)
        _mark(item)
        return item

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self) -> Any:  # (json.dumps reads a dict subclass's items: tojson reads them all)
        _mark(self, "object_access", deep=True)
        return dict.items(self)


def _probe_value(value: Any) -> Any:
    """``value`` (JSON) as a probe value, with its own stats."""
    made: Any
    if isinstance(value, dict):
        made = _Dict({k: _probe_value(v) for k, v in value.items()})
    elif isinstance(value, list):
        made = _List(_probe_value(v) for v in value)
    elif isinstance(value, str):
        made = _Str(value)
    else:
        return value
    made._caps_stats = _Stats()
    return made


def _noting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A test or filter that notes the value it is applied to, as llama.cpp's runtime does (a
    test's op is ``test_is_<name>``, a filter's its name)."""

    @functools.wraps(fn)
    def noted(value: Any, *args: Any, **kwargs: Any) -> Any:
        _mark(value, name, deep=name in ("tojson", "string"))
        return fn(value, *args, **kwargs)

    return noted


def _probe_template(source: str | None) -> Any:
    template = compile_chat_template(source)
    env = template.environment
    env.tests = {name: _noting(f"test_is_{name}", fn) for name, fn in env.tests.items()}
    env.filters = {name: _noting(name, fn) for name, fn in env.filters.items()}
    return template


_TOOLS = [
    {
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }
]
_CONTENT_MARKER = "STRING_MARKER"
_REASONING_MARKER = "<REASONING_CONTENT_PLACEHOLDER>"


def _call_messages(arguments: Any, calls: int = 1) -> list[dict[str, Any]]:
    tool_calls = [
        {"id": f"call0000{i + 1}", "type": "function", "function": {"name": "tool1", "arguments": arguments}} for i in range(calls)
    ]
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


class _Probe:
    """One rendering of the template (caps.cpp's ``caps_try_execute``): its probe values, whether
    it rendered, and its text."""

    def __init__(self, template: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **variables: Any) -> None:
        self.messages = _probe_value(messages)
        self.tools = _probe_value(tools or [])
        try:
            self.text = render_chat_template(template, self.messages, bos_token="", eos_token="", tools=self.tools, **variables)
            self.ok = True
        except Exception:  # noqa: BLE001 — any failure is the template's, as llama.cpp's catch reads it
            self.text, self.ok = "", False

    def stats(self, *path: Any) -> _Stats:
        """The stats of the probe value at ``path`` (``"tools"`` or ``"messages"``, then keys)."""
        value = self.tools if path[0] == "tools" else self.messages
        for key in path[1:]:  # (read past the probe values' own noting)
            value = dict.__getitem__(value, key) if isinstance(value, dict) else list.__getitem__(value, key)
        return _stats(value) or _Stats()

    def used(self, *path: Any) -> bool:
        return self.stats(*path).used


def _caps(source: str | None) -> dict[str, bool]:
    template = _probe_template(source)
    caps = dict.fromkeys(CAPS, False)
    caps.update(supports_string_content=True, supports_tools=True, supports_tool_calls=True, supports_parallel_tool_calls=True)

    # content: a string (is it tested as one? read as an array of parts?), then an empty array
    probe = _Probe(template, [{"role": "user", "content": _CONTENT_MARKER}])
    ops = probe.stats("messages", 0, "content").ops
    as_array = bool(ops & {"selectattr", "array_access"})
    caps["supports_typed_content"] = as_array
    if not probe.ok or (as_array and _CONTENT_MARKER not in probe.text):
        caps["supports_string_content"] = False
    if "test_is_string" in ops:
        parts = _Probe(template, [{"role": "user", "content": []}])
        if parts.ok and parts.stats("messages", 0, "content").ops & {"selectattr", "array_access"}:
            caps["supports_typed_content"] = True

    # a system message: the one this server merges into the next turn where the template takes none
    caps["supports_system_role"] = takes_system_turn(lambda msgs: render_chat_template(template, msgs, bos_token="", eos_token=""))

    # tools, and a call whose arguments are an object, else a JSON string
    probe = _Probe(template, _call_messages({"arg": "value"}), _TOOLS)
    if probe.ok:
        caps["supports_tools"] = probe.used("tools", 0, "function", "name")
        if not probe.used("messages", 1, "tool_calls"):
            caps["supports_tool_calls"] = False
        else:
            caps["supports_object_arguments"] = probe.used("messages", 1, "tool_calls", 0, "function", "arguments", "arg")
    if not caps["supports_object_arguments"]:
        probe = _Probe(template, _call_messages('{"arg": "value"}'), _TOOLS)
        if not probe.ok:
            caps["supports_tools"] = caps["supports_tool_calls"] = False
        else:
            caps["supports_tools"] = caps["supports_tools"] and probe.used("tools", 0, "function", "name")
            caps["supports_tool_calls"] = caps["supports_tool_calls"] and probe.used("messages", 1, "tool_calls")
    caps["supports_tools"] = caps["supports_tools"] and template_knows_tools(source)

    # two calls in one turn: is the second one's function read?
    arguments: Any = {"arg": "value"} if caps["supports_object_arguments"] else '{"arg": "value"}'
    probe = _Probe(template, _call_messages(arguments, calls=2), _TOOLS)
    caps["supports_parallel_tool_calls"] = probe.ok and probe.used("messages", 1, "tool_calls", 1, "function")

    # reasoning kept deeper in the history than the last assistant turn
    turns = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": _REASONING_MARKER},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ]
    keep: dict[str, Any] = {"preserve_thinking": True, "clear_thinking": False, "truncate_history_thinking": False, "drop_thinking": False}
    caps["supports_preserve_reasoning"] = _REASONING_MARKER in _Probe(template, turns, enable_thinking=True, **keep).text

    # a reasoning effort: is it read?
    effort = _probe_value("low")
    _Probe(template, [{"role": "user", "content": "User message"}], enable_thinking=True, reasoning_effort=effort, reasoning_strength=effort)
    caps["supports_reasoning_effort"] = effort._caps_stats.used
    return caps


@functools.lru_cache(maxsize=64)
def chat_template_caps(source: str | None) -> dict[str, bool]:
    """llama-server's ``chat_template_caps`` of the template ``source`` (ChatML when None),
    computed once per template (a model's, so once per model). A template that does not compile,
    or that fails in a way no probe catches, has every capability false, as llama.cpp's."""
    try:
        return _caps(source)
    except Exception:  # noqa: BLE001 — a hostile template must not break /props
        return dict.fromkeys(CAPS, False)
