"""Hypothesis strategies for hostile requests: shared by the in-process fuzz test and
bench/fuzz.py (which fires them at a live server)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/models/sim",
    "/v1",
    "/v1/",
    "/v1/embeddings",
    "/v1/chat/completions/",
    "/health",
    "/slots",
    "/metrics",
    "/v1/internal/state",
]
GENERATION = ("/v1/chat/completions", "/v1/completions")
# llama-server's own generation routes: their bodies (native_body) read n_predict and its aliases
NATIVE = ("/completion", "/infill")

# strings a client may send, lone surrogates and control characters included
nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00", "\x00", "<|im_end|>", "<|im_start|>system", "\u202e", "\ufeff", ""]),
    st.builds(lambda a, b: a + "\ud800" + b, st.text(max_size=8), st.text(max_size=8)),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    nasty_text,
)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)), max_leaves=12)


def field_values(keys: st.SearchStrategy[str] | None = None, *, ints: st.SearchStrategy[int] | None = None, max_leaves: int = 10) -> st.SearchStrategy[Any]:
    """Small JSON values for one field of a body a schema parser is fuzzed with: plain scalars
    (``ints`` for the integers, any up to 2**70 by default), lists, and objects keyed by ``keys``
    (short text by default: the names a field's own objects use make the parser go deeper)."""
    leaf = st.none() | st.booleans() | (st.integers(-(2**70), 2**70) if ints is None else ints) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) if keys is None else keys, inner, max_size=3), max_leaves=max_leaves)

message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "developer", "tool"]), nasty_text), "content": st.one_of(nasty_text, json_values)},
    optional={"name": json_values, "tool_calls": json_values, "extra": json_values, "reasoning_content": json_values, "thinking": json_values},
)
# an earlier reply sent back as it came: its reasoning (reasoning_content, gpt-oss's thinking)
# and its calls, with the client's strings in them
earlier_reply = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.one_of(st.none(), nasty_text)},
    optional={
        "reasoning_content": st.one_of(nasty_text, json_values),
        "thinking": nasty_text,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"id": nasty_text, "type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "get_weather"]), "arguments": st.one_of(nasty_text, json_values.map(json.dumps))})}),
            max_size=2,
        ),
    },
)
OPTIONAL_FIELDS = {
    "max_tokens": st.one_of(st.integers(min_value=-3, max_value=8), st.integers(min_value=10**6, max_value=2**70), json_values),
    "max_completion_tokens": st.integers(min_value=-1, max_value=8),
    "temperature": st.one_of(st.floats(min_value=-5, max_value=5), json_values),
    "top_p": st.floats(min_value=-1, max_value=2),
    "top_k": st.integers(min_value=-5, max_value=2**40),
    "seed": st.one_of(st.integers(min_value=-(2**70), max_value=2**70), json_values),
    "stop": st.one_of(nasty_text, st.lists(nasty_text, max_size=6), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
    "user": json_values,
    "n": st.integers(min_value=-1, max_value=3),
    "logit_bias": json_values,
    "tools": json_values,
    "response_format": json_values,
    "suffix": st.one_of(nasty_text, json_values),
    "echo": json_values,
    "unknown_thing": json_values,
    "reasoning_format": st.one_of(st.sampled_from(["auto", "deepseek", "none", "deepseek-legacy", "AUTO", ""]), json_values),
    "reasoning_effort": st.one_of(nasty_text, json_values),
    "chat_template_kwargs": st.one_of(st.fixed_dictionaries({}, optional={"enable_thinking": json_values, "reasoning_effort": json_values}), json_values),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}]), json_values),
}


def _sometimes(draw: st.DrawFn, tenths: int) -> bool:
    """True in about ``tenths`` out of ten draws (Hypothesis's own integers favour the ends of
    a range, which would skew these weights)."""
    return _pick(draw, 10) < tenths


def _pick(draw: st.DrawFn, n: int) -> int:
    """0..n-1, about evenly (a residue of a wide draw)."""
    return draw(st.integers(min_value=0, max_value=2**32)) % n


VALID_FIELDS = {
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "seed": st.integers(min_value=0, max_value=2**31),
    "stop": st.lists(nasty_text, max_size=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": nasty_text,
    "reasoning_format": st.sampled_from(["auto", "deepseek", "none"]),
}


@st.composite
def generation_body(draw: st.DrawFn, chat: bool) -> bytes:
    """Mostly nearly valid requests (so that hostile strings get past the schema to where they
    once did harm), sometimes anything at all."""
    model = "sim" if _sometimes(draw, 8) else draw(st.one_of(nasty_text, json_values))
    body: dict[str, Any] = {"model": model}
    if chat:
        if _sometimes(draw, 8):
            role = st.sampled_from(["user", "system", "assistant", "developer"])
            content = st.one_of(nasty_text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": nasty_text}), min_size=1, max_size=2))
            body["messages"] = draw(st.lists(st.fixed_dictionaries({"role": role, "content": content}), min_size=1, max_size=3))
            if _sometimes(draw, 3):  # an earlier reply sent back (its reasoning, its calls), then a turn
                body["messages"][-1:-1] = [draw(earlier_reply)]
        else:
            body["messages"] = draw(st.one_of(st.lists(message, max_size=4), json_values))
    elif _sometimes(draw, 8):
        body["prompt"] = draw(st.one_of(nasty_text, st.lists(st.integers(min_value=0, max_value=255), min_size=1, max_size=20)))
        if _sometimes(draw, 3):
            body["suffix"] = draw(nasty_text)
    else:
        body["prompt"] = draw(st.one_of(nasty_text, st.lists(st.integers(min_value=-5, max_value=300), max_size=20), json_values))
    valid = _sometimes(draw, 7)
    pool = VALID_FIELDS if valid else OPTIONAL_FIELDS
    for name in draw(st.lists(st.sampled_from(sorted(pool)), max_size=3, unique=True)):
        body[name] = draw(pool[name])
    # keep generations short: without a cap a reply runs to the end of the lane's context, as on
    # llama-server (minutes on a loaded machine, which bench/fuzz.py would count as a hang);
    # ``max_completion_tokens`` caps only chat (completions ignore it, as OpenAI's do)
    if body.get("max_tokens") is None and (not chat or body.get("max_completion_tokens") is None):
        body["max_tokens"] = draw(st.integers(min_value=1, max_value=8))
    raw = json.dumps(body).encode()
    mangle = _pick(draw, 20)
    if mangle == 0:
        raw = raw.replace(b"\\ud800", b"\xed\xa0\x80").replace(b"\\udfff", b"\xed\xbf\xbf")
    elif mangle == 1:
        raw = raw[: draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))]
    elif mangle == 2:
        raw = b"\xef\xbb\xbf" + raw
    elif mangle == 3:
        raw = json.dumps(body).encode("utf-16")
    return raw


# llama-server's /completion and /infill fields (n_predict and its aliases: -1..INT32_MAX there)
NATIVE_FIELDS = {
    "n_predict": st.one_of(st.integers(min_value=-3, max_value=8), st.integers(min_value=2**31 - 2, max_value=2**70), json_values),
    "max_tokens": st.one_of(st.integers(min_value=-3, max_value=8), json_values),
    "max_completion_tokens": st.one_of(st.integers(min_value=-3, max_value=8), json_values),
    "n_indent": st.one_of(st.integers(min_value=-2, max_value=2**40), json_values),
    "t_max_predict_ms": st.one_of(st.integers(min_value=-2, max_value=2**40), json_values),
    "n_probs": st.one_of(st.integers(min_value=-2, max_value=30), json_values),
    "return_tokens": json_values,
    "response_fields": st.one_of(st.lists(nasty_text, max_size=3), json_values),
    "input_extra": st.one_of(st.lists(st.fixed_dictionaries({}, optional={"text": nasty_text, "filename": nasty_text}), max_size=3), json_values),
    "input_suffix": st.one_of(nasty_text, json_values),
    "samplers": json_values,
    "stream": st.one_of(st.booleans(), json_values),
    "model": st.one_of(st.just("sim"), nasty_text, json_values),
    "reasoning_format": json_values,
}


@st.composite
def native_body(draw: st.DrawFn, infill: bool) -> bytes:
    """A body for llama-server's /completion or /infill: its prompt (the typed text on /infill,
    beside input_prefix) and some of its own fields, often hostile."""
    key = "input_prefix" if infill else "prompt"
    body: dict[str, Any] = {key: draw(st.one_of(nasty_text, st.lists(st.integers(min_value=0, max_value=255), min_size=1, max_size=8), json_values))}
    for name in draw(st.lists(st.sampled_from(sorted(NATIVE_FIELDS)), max_size=4, unique=True)):
        body[name] = draw(NATIVE_FIELDS[name])
    if not any(k in body for k in ("n_predict", "max_tokens", "max_completion_tokens")) or _sometimes(draw, 5):
        body["n_predict"] = draw(st.integers(min_value=0, max_value=4))  # (kept short: see generation_body)
    return json.dumps(body).encode()


header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60)
HEADERS = {
    "x-llamaswap-priority": st.one_of(header_text, st.integers(min_value=-(10**400), max_value=10**400).map(str), st.sampled_from(["interactive", "batch", "normal", "9" * 400, "-" + "9" * 5000, "1e9", "0x10"])),
    "x-superfluid-qos": st.one_of(header_text, st.sampled_from(["interactive", "completion", "agent", "background", "0", "7"])),
    "x-superfluid-batch-invariant": st.one_of(header_text, st.just("true")),
    "x-superfluid-pin-prefix": st.one_of(header_text, st.just("1")),
    "authorization": st.one_of(header_text, st.just("Bearer sf-nonsense"), st.just("Bearer ")),
    "x-api-key": header_text,
    "content-type": st.one_of(header_text, st.sampled_from(["application/json", "multipart/form-data; boundary=x", "text/plain"])),
    "origin": st.one_of(header_text, st.sampled_from(["null", "http://evil.example", "http://127.0.0.1:8000", "http://[::1]:8000", "http://localhost:3000", "file://"])),
    "accept": header_text,
}


@dataclass
class Hostile:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@st.composite
def hostile_requests(draw: st.DrawFn) -> Hostile:
    kind = _pick(draw, 10)
    if kind < 7 and _sometimes(draw, 2):  # llama-server's own generation routes
        path, method = draw(st.sampled_from(NATIVE)), "POST"
        body = draw(native_body(infill=path == "/infill")) if kind < 6 else draw(st.binary(max_size=200))
    elif kind < 7:  # the generation endpoints, where request content goes somewhere
        path, method = draw(st.sampled_from(GENERATION)), "POST"
        body = draw(generation_body(chat=path.endswith("chat/completions"))) if kind < 6 else draw(st.binary(max_size=200))
    else:
        path = draw(st.one_of(st.sampled_from(PATHS), st.text(alphabet="abcdefgh/._-%", max_size=20).map(lambda s: "/v1/" + s)))
        method = draw(st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"]))
        body = draw(st.one_of(st.just(b""), st.binary(max_size=100)))
    names = draw(st.lists(st.sampled_from(sorted(HEADERS)), max_size=3, unique=True))
    headers = {name: draw(HEADERS[name]) for name in names}
    return Hostile(method, path, headers, body)
