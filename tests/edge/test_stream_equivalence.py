"""Streamed and non-streamed replies are the same reply.

A client that switches ``stream`` on must get what the plain reply holds, in pieces: the text
joined, each choice's ``finish_reason``, the tool calls (name, arguments joined), the logprobs,
``usage`` (with ``stream_options.include_usage``), ``n`` > 1 choices with their indexes, the
effect of stop strings (also ones that straddle tokens), ``max_tokens``, completions ``echo`` and
``suffix``, and an error after text the same error object. The stream is also framed as clients
expect: one ``id``/``created``/``model``/``object`` for every chunk, the role in each chat
choice's first delta, the usage chunk with ``choices: []`` last, ``[DONE]`` at the end.

Driven on the in-process middle layer (tests/edge/inproc.py) with a scripted engine: the
simulated engine (one byte a token) whose reply is a text the test chose, found through a marker
in the prompt (``[[S<n>]]``), with logprobs, prompt scoring, FIM tokens and a grammar "sampler"
that accepts any grammar (the script is what the model writes), and a failure after the k-th
token (the worker's per-job error, as a grammar too slow to mask ends one job).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from scheduler.core.types import LaneBind
from scheduler.engines.base import Step
from scheduler.engines.sim import EOG_TOKEN, SimEngine
from tests.api.streamed import assemble as chunks_put_together
from tests.api.streamed import whole_view

from .inproc import JSON, MODEL, SimWorker, attached_loop, request

pytestmark = pytest.mark.django_db(transaction=True)

# script id -> (the reply's bytes, the token after which the job fails, or None)
SCRIPTS: dict[int, tuple[bytes, int | None]] = {}
_script_ids = itertools.count(1)
_MARK = re.compile(rb"\[\[S(\d+)\]\]")
FIM = (256, 257, 258)  # prefix, suffix, middle


def script(text: str, fail_at: int | None = None) -> str:
    """Register ``text`` as what the model writes for a prompt holding the returned marker."""
    n = next(_script_ids)
    SCRIPTS[n] = (text.encode("utf-8"), fail_at)
    return f"[[S{n}]]"


def _lp(token: int) -> float:
    return -((token % 7) / 8.0) - 0.0625  # exact in binary: the same number whichever way it goes


def _top(token: int, k: int) -> list[tuple[int, float]]:
    return [(token, _lp(token)), ((token + 1) % 256, _lp(token) - 1.0), ((token + 7) % 256, _lp(token) - 2.0)][:k]


class ScriptEngine(SimEngine):
    """The simulated engine writing the script its prompt names (then end of generation)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features = frozenset({"logprobs", "prompt_logprobs", "grammar"})
        self.vocab_size = 256 + len(FIM)
        self.want: dict[int, int | None] = {}  # lane -> its sampler's top logprobs (None: off)
        self.lp_out: dict[int, tuple[float, list[tuple[int, float]]]] = {}
        self.failed_out: dict[int, str] = {}

    def fim_tokens(self) -> tuple[int, int, int] | None:
        return FIM  # control tokens: they print nothing, as a real engine's

    def token_bytes(self, token: int) -> bytes:
        return b"" if token in FIM else super().token_bytes(token)

    def check_grammar(self, grammar: str) -> str | None:
        return None

    def bind_sampler(self, bind: LaneBind) -> None:
        super().bind_sampler(bind)
        self.want[bind.lane] = bind.sampling.logprobs

    def swap_samplers(self, a: int, b: int) -> None:
        super().swap_samplers(a, b)
        self.want[a], self.want[b] = self.want.get(b), self.want.get(a)

    def score_prompt(self, tokens: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
        return [(_lp(t), _top(t, top)) for t in tokens[1:]]

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        out, self.lp_out = self.lp_out, {}
        return out

    def take_failed(self) -> dict[int, str]:
        out, self.failed_out = self.failed_out, {}
        return out

    def forward(self, step: Step) -> dict[int, int]:
        sampled: dict[int, int] = {}
        n_fed = 0
        for lane, start_pos, tokens, sample in step.pieces:
            kv = self.kv[lane]
            assert len(kv) == start_pos, f"lane {lane}: feed at {start_pos} but KV holds {len(kv)}"
            kv.extend(tokens)
            n_fed += len(tokens)
            if not sample:
                continue
            job_id = self.lane_job[lane]
            assert job_id is not None
            k = self.generated[job_id] = self.generated.get(job_id, 0) + 1
            mark = _MARK.search(bytes(t if t < 256 else 0 for t in kv))
            text, fail_at = SCRIPTS[int(mark.group(1))] if mark else (b"", None)
            token = text[k - 1] if k <= len(text) else EOG_TOKEN
            sampled[lane] = token
            if self.want.get(lane) is not None:
                self.lp_out[lane] = (_lp(token), _top(token, int(self.want[lane] or 0)))
            if fail_at is not None and k == fail_at:
                self.failed_out[lane] = "The scripted engine failed this job."
        self.clock.advance(self.decode_round_s + (n_fed * self.prefill_s_per_token if step.prefill else 0))
        return sampled


class ScriptWorker(SimWorker):
    engine_class = ScriptEngine


# --stream-interval-ms: 0, a Delta a round (the simulator's 60 ms); 150, two or three rounds'
# tokens in one Delta, so the stream's pieces are several tokens long, cut anywhere
@pytest.fixture(params=[0, 150], ids=["every-round", "paced"])
def edge(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    # a twin asks twice: no fill-in-the-middle rate limit (it would refuse one of them)
    worker = ScriptWorker(lanes=4, lane_ctx=2048, stream_interval_ms=request.param)
    with attached_loop(worker, SUPERFLUID_COMPLETION_RATE="0") as loop:
        yield loop


# -- requests ---------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
]


def _call(name: str, args: str, *, nl: bool = True) -> str:
    sep = "\n" if nl else ""
    return f'<tool_call>{sep}{{"name": "{name}", "arguments": {args}}}{sep}</tool_call>'


TEXT_PIECES = ["Hello", " world", ",", ".", "\n", " ", "  ", "é", "€", "😀", "日本語", "ab", "abc", "END", "\t", "{", "}", '"', "[1, 2]", "x"]
CALL_PIECES = [
    _call("get_weather", '{"city": "Paris"}'),
    _call("lookup", '{"q": [1, 2, {"a": "}"}], "s": "é \\"x\\""}'),
    _call("lookup", "{}", nl=False),
    _call("nope", "{}"),
    '<tool_call>\n{"arguments": {"x": 1}, "name": "lookup"}\n</tool_call>',
    "<tool",
    "_call>",
    "<tool_call>",
]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}


@st.composite
def script_text(draw: st.DrawFn, tools: bool) -> str:
    pieces = st.sampled_from(TEXT_PIECES + (CALL_PIECES if tools else []))
    return "".join(draw(st.lists(pieces, min_size=0, max_size=10)))


@st.composite
def stops(draw: st.DrawFn, texts: list[str]) -> list[str]:
    """Stop strings: pieces of the scripts (so they match, often across tokens: a token is a
    byte here) and some that may not."""
    out = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        text = draw(st.sampled_from(texts))
        if text and draw(st.booleans()):
            at = draw(st.integers(min_value=0, max_value=len(text) - 1))
            piece = text[at : at + draw(st.integers(min_value=1, max_value=5))]
        else:
            piece = draw(st.sampled_from(["END", "\n\n", "é", "lo w", "</tool_call>", '"', "日本"]))
        out.append(piece)
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, dict[str, Any], bool]:
    """(path, the request without ``stream``, include_usage for its streamed twin)."""
    chat = draw(st.booleans())
    body: dict[str, Any] = {"model": MODEL}
    tools = chat and draw(st.integers(min_value=0, max_value=9)) < 5
    fail_at = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(min_value=1, max_value=12)))
    texts: list[str] = []

    def marked() -> str:
        text = draw(script_text(tools))
        texts.append(text)
        note(f"script {len(texts)}: {text!r}")
        return draw(st.sampled_from(["Q ", "Qé ", "日本 "])) + script(text, fail_at)

    if chat:
        body["messages"] = [{"role": "user", "content": marked()}]
        if tools:
            if draw(st.integers(min_value=0, max_value=9)) < 2:  # the legacy functions
                body["functions"] = [t["function"] for t in TOOLS]
                body["function_call"] = draw(st.sampled_from(["auto", "none", {"name": "lookup"}]))
            else:
                body["tools"] = TOOLS
                body["tool_choice"] = draw(
                    st.sampled_from(["auto", "auto", "none", "required", {"type": "function", "function": {"name": "lookup"}}])
                )
                if draw(st.booleans()):
                    body["parallel_tool_calls"] = draw(st.booleans())
        if draw(st.integers(min_value=0, max_value=9)) < 3:  # a prefill the reply continues
            body["messages"].append({"role": "assistant", "content": draw(st.sampled_from(["Sure,", "{", "The answer is", "\n"]))})
        lp = draw(st.integers(min_value=0, max_value=5))
        if lp >= 3:
            body["logprobs"] = True
            if lp >= 4:
                body["top_logprobs"] = draw(st.integers(min_value=0, max_value=3))
    else:
        several = draw(st.integers(min_value=0, max_value=9)) < 2
        body["prompt"] = [marked() for _ in range(2)] if several else marked()
        if draw(st.integers(min_value=0, max_value=9)) < 2:  # as token ids (a byte is a token here)
            body["prompt"] = [list(p.encode()) for p in body["prompt"]] if several else list(body["prompt"].encode())
        if draw(st.integers(min_value=0, max_value=9)) < 3:
            body["echo"] = True
        if draw(st.integers(min_value=0, max_value=9)) < 2:
            body["suffix"] = draw(st.sampled_from(["", " tail", "\nreturn x é"]))
        if draw(st.booleans()):
            body["logprobs"] = draw(st.integers(min_value=0, max_value=3))
    if draw(st.integers(min_value=0, max_value=9)) < 3:
        body["n"] = draw(st.integers(min_value=2, max_value=3))
    if draw(st.booleans()):
        body["stop"] = draw(stops(texts))
    if draw(st.booleans()):
        longest = max(len(t.encode()) for t in texts)
        body["max_tokens"] = draw(st.integers(min_value=1, max_value=longest + 3))
    if draw(st.booleans()):
        body["seed"] = draw(st.integers(min_value=0, max_value=2**31))
    if draw(st.integers(min_value=0, max_value=9)) < 2:
        body["response_format"] = draw(st.sampled_from([SCHEMA, {"type": "json_object"}, {"type": "text"}]))
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, draw(st.booleans())


# -- the streamed reply, checked and put back together ----------------------------------------


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage without the prefix cache's share: the second of two equal requests finds more of
    its prompt cached, which is no difference between streaming and not."""
    if usage is None:
        return None
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def whole(body: dict[str, Any], chat: bool, logprobs: bool) -> dict[str, Any]:
    """The plain reply, in the form :func:`assemble` gives the stream."""
    choices = {}
    for c in body["choices"]:
        if chat:
            message = c["message"]
            calls = [(t["function"]["name"], t["function"]["arguments"]) for t in message.get("tool_calls") or []]
            assert all(t["id"].startswith("call_") and t["type"] == "function" for t in message.get("tool_calls") or [])
            function_call = message.get("function_call")
            lp = (c["logprobs"] or {}).get("content") if logprobs else None
            choices[c["index"]] = {
                "text": message["content"] or "", "calls": calls, "finish_reason": c["finish_reason"],
                "function_call": (function_call["name"], function_call["arguments"]) if function_call else None,
                "logprobs": (lp or []) if logprobs else None,
            }  # fmt: skip
        else:
            lp = c["logprobs"]
            choices[c["index"]] = {
                "text": c["text"], "finish_reason": c["finish_reason"],
                "logprobs": ({k: lp[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")} if lp else None) if logprobs else None,
            }  # fmt: skip
    return {"model": body["model"], "choices": choices, "usage": _usage(body["usage"])}


def assemble(data: list[str], chat: bool, include_usage: bool, logprobs: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Check the stream's framing; (the reply it adds up to, the error frame's error or None)."""
    assert data and data[-1] == "[DONE]", data[-3:]
    assert "[DONE]" not in data[:-1]
    frames = [json.loads(d) for d in data[:-1]]
    error = None
    if frames and "error" in frames[-1]:
        error = frames.pop()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    assert not any("error" in f for f in frames)
    obj = "chat.completion.chunk" if chat else "text_completion"
    ids = {(f["id"], f["created"], f["model"], f["object"]) for f in frames}
    assert len(ids) <= 1, ids
    for f in frames:
        assert f["id"].startswith("chatcmpl-" if chat else "cmpl-") and f["object"] == obj, f
        assert "system_fingerprint" in f
        if include_usage:
            assert "usage" in f, f
        else:
            assert "usage" not in f, f
    usage = None
    if include_usage and error is None:
        assert frames and frames[-1]["choices"] == [] and frames[-1]["usage"] is not None, frames[-1:]
        usage = frames.pop()["usage"]
    assert all(len(f["choices"]) == 1 and f.get("usage") is None for f in frames), [f for f in frames if len(f["choices"]) != 1]
    choices: dict[int, dict[str, Any]] = {}
    ended: set[int] = set()
    calls: dict[int, dict[int, list[str]]] = {}
    for f in frames:
        c = f["choices"][0]
        i = c["index"]
        assert i not in ended, f"a chunk of choice {i} after its finish_reason: {f}"
        first = i not in choices
        entry = choices.setdefault(i, {"text": "", "finish_reason": None, "logprobs": [] if logprobs else None})
        if chat:
            entry.setdefault("calls", [])
            entry.setdefault("function_call", None)
            delta = c["delta"]
            assert set(delta) <= {"role", "content", "tool_calls", "function_call"}, delta
            assert ("role" in delta) == first and delta.get("role", "assistant") == "assistant", (first, delta)
            entry["text"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                mine = calls.setdefault(i, {})
                if call["index"] not in mine:  # a call's first delta: id, type and name
                    assert call["id"].startswith("call_") and call["type"] == "function" and call["function"]["name"], call
                    mine[call["index"]] = [call["function"]["name"], call["function"].get("arguments", "")]
                else:
                    assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}, call
                    mine[call["index"]][1] += call["function"]["arguments"]
            if "function_call" in delta:
                fc = delta["function_call"]
                if entry["function_call"] is None:
                    assert fc.get("name"), fc
                    entry["function_call"] = (fc["name"], fc.get("arguments", ""))
                else:
                    assert "name" not in fc, fc
                    entry["function_call"] = (entry["function_call"][0], entry["function_call"][1] + fc.get("arguments", ""))
            if logprobs and c["logprobs"] is not None:
                entry["logprobs"] += c["logprobs"]["content"]
        else:
            entry["text"] += c["text"]
            if logprobs and c["logprobs"] is not None:
                lp = c["logprobs"]
                got = entry["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                for k in got:
                    got[k] += lp[k]
                entry["logprobs"] = got
        if c["finish_reason"] is not None:
            entry["finish_reason"] = c["finish_reason"]
            ended.add(i)
    if error is None:
        assert ended == set(choices), (ended, set(choices))
    for i, mine in calls.items():
        choices[i]["calls"] = [tuple(mine[k]) for k in sorted(mine)]
        assert sorted(mine) == list(range(len(mine)))
    if not chat and logprobs:
        for entry in choices.values():
            entry["logprobs"] = entry["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    model = frames[0]["model"] if frames else None
    return {"model": model, "choices": choices, "usage": _usage(usage)}, error


def compare(path: str, body: dict[str, Any], include_usage: bool, plain_status: int, plain: bytes, streamed_status: int, streamed: bytes) -> None:
    chat = path.endswith("chat/completions")
    logprobs = body.get("logprobs") is True if chat else body.get("logprobs") is not None  # (completions' 0 asks too)
    if plain_status != 200:
        error = json.loads(plain)["error"]
        if streamed_status != 200:  # refused before anything was sent: the same refusal
            assert (streamed_status, json.loads(streamed)["error"]) == (plain_status, error)
            return
        data = [line[6:] for line in streamed.decode().split("\n") if line.startswith("data: ")]
        _, streamed_error = assemble(data, chat, include_usage, logprobs)
        assert streamed_error == error, (streamed_error, error)  # the same error, after the text
        return
    assert streamed_status == 200, streamed[:400]
    data = [line[6:] for line in streamed.decode().split("\n") if line.startswith("data: ")]
    got, error = assemble(data, chat, include_usage, logprobs)
    assert error is None, error
    want = whole(json.loads(plain), chat, logprobs)
    assert got["model"] == want["model"]
    assert sorted(got["choices"]) == sorted(want["choices"]) == list(range(len(want["choices"])))
    if include_usage:
        assert got["usage"] == want["usage"]
    for i, w in want["choices"].items():
        g = got["choices"][i]
        assert g["finish_reason"] == w["finish_reason"], (i, g, w)
        assert g["logprobs"] == w["logprobs"], (i, g["logprobs"], w["logprobs"])
        if not chat:
            assert g["text"] == w["text"], (i, g["text"], w["text"])
            continue
        if body.get("functions"):  # the legacy reply: one function_call, never tool_calls
            assert not g["calls"] and not w["calls"], (i, g, w)
            g["calls"] = [g["function_call"]] if g["function_call"] else []
            w["calls"] = [w["function_call"]] if w["function_call"] else []
        k = len(w["calls"])
        assert g["calls"][:k] == w["calls"], (i, g["calls"], w["calls"])
        extra = g["calls"][k:]
        if extra:
            # documented: a call streamed as it came that the reply then did not complete (a stop
            # string, max_tokens or the end of generation cut its arguments or its closing; or
            # its arguments are no JSON) stays a call in the stream and is text unstreamed; so
            # the reply finishes as unstreamed, never tool_calls
            assert g["finish_reason"] != "tool_calls", (i, g, w)
            assert all(name in w["text"] and args in w["text"] for name, args in extra), (i, g, w)
        elif w["calls"] and body["messages"][-1]["role"] != "assistant":
            # documented: whitespace before the first text went out before a call could be known
            # (a prefill's continuation keeps its leading whitespace both ways)
            assert g["text"].strip() == w["text"], (i, g["text"], w["text"])
        else:
            assert g["text"] == w["text"], (i, g["text"], w["text"])


async def both(path: str, body: dict[str, Any], include_usage: bool) -> tuple[int, bytes, int, bytes]:
    plain = await request("POST", path, json.dumps(body).encode(), JSON, timeout_s=20)
    twin = {**body, "stream": True}
    if include_usage:
        twin["stream_options"] = {"include_usage": True}
    streamed = await request("POST", path, json.dumps(twin).encode(), JSON, timeout_s=20)
    return plain.status, plain.body, streamed.status, streamed.body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_a_streamed_reply_adds_up_to_the_non_streamed_one(edge: asyncio.AbstractEventLoop, case: tuple[str, dict[str, Any], bool]) -> None:
    path, body, include_usage = case
    plain_status, plain, streamed_status, streamed = edge.run_until_complete(both(path, body, include_usage))
    assert plain_status < 500, plain[:400]
    event(f"{path} {plain_status} {json.loads(plain)['error']['code'] if plain_status != 200 else ''}")
    compare(path, body, include_usage, plain_status, plain, streamed_status, streamed)


# -- the defects the net found, each on its own ------------------------------------------------


def _finish_reasons(data: list[str]) -> list[str]:
    return [c["finish_reason"] for f in data[:-1] for c in json.loads(f)["choices"] if c["finish_reason"]]


@pytest.mark.parametrize(
    ("text", "stop"),
    [('<tool_call>\n{"name": "lookup", "arguments": {"q": 1}}', None),  # the model ended before its closing
     ('<tool_call>\n{"name": "lookup", "arguments": {"q": 1}}\n</tool_call>', ["</tool_call>"])],  # a stop string cut it
    ids=["end-of-generation", "stop-string"],
)
def test_a_call_whose_closing_never_came_finishes_stop_streamed_as_unstreamed(
    edge: asyncio.AbstractEventLoop, text: str, stop: list[str] | None
) -> None:
    """Streamed, the call goes out as it comes (it cannot be taken back); it finished
    ``tool_calls``, where unstreamed the same block without its ``</tool_call>`` was no call, its
    text content. Now both give the call, its arguments as they came, and finish ``stop``: the
    call is not whole (``tool_calls`` means whole calls, as a reply max_tokens cut gives the call
    and finishes ``length``)."""
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Q " + script(text)}], "tools": TOOLS}
    if stop:
        body["stop"] = stop
    plain_status, plain, streamed_status, streamed = edge.run_until_complete(both("/v1/chat/completions", body, False))
    assert plain_status == streamed_status == 200
    choice = json.loads(plain)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [("lookup", '{"q": 1}')]
    data = [line[6:] for line in streamed.decode().split("\n") if line.startswith("data: ")]
    assert _finish_reasons(data) == ["stop"]
    assert chunks_put_together([json.loads(d) for d in data[:-1]]).view() == whole_view(choice)


class SpacePrefixEngine(ScriptEngine):
    """A SentencePiece-style vocabulary (Llama 2, Mistral v0.x: ``add_space_prefix``): a prompt
    tokenised with its special tokens begins with a space piece ("Hello" is "▁Hello"), so its
    tokens' bytes spell one character more than the prompt's text."""

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        return ([32] if add_special else []) + list(text.encode("utf-8"))


class SpacePrefixWorker(SimWorker):
    engine_class = SpacePrefixEngine


def test_echoed_completion_offsets_index_the_text_streamed_or_not() -> None:
    """``echo`` + ``logprobs``: a completion token's ``text_offset`` is where it begins in the
    choice's text (the prompt's text, then the completion). Streamed it was ``len(prompt)`` on;
    unstreamed it was counted through the prompt's token pieces, one further on where those spell
    more than the prompt (a space-prefix vocabulary): the offsets pointed one character past
    each token, and differed from the stream's."""
    with attached_loop(SpacePrefixWorker(lanes=2, lane_ctx=512)) as loop:
        prompt = "Q " + script("xyz")
        body = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 1}
        plain_status, plain, streamed_status, streamed = loop.run_until_complete(both("/v1/completions", body, False))
    assert plain_status == streamed_status == 200
    choice = json.loads(plain)["choices"][0]
    assert choice["text"] == prompt + "xyz"
    lp = choice["logprobs"]
    completion = list(zip(lp["tokens"], lp["text_offset"], strict=True))[-3:]
    assert [choice["text"][at] for _, at in completion] == [t for t, _ in completion] == ["x", "y", "z"]
    data = [line[6:] for line in streamed.decode().split("\n") if line.startswith("data: ")]
    got, _ = assemble(data, False, False, True)
    assert got["choices"][0]["logprobs"]["text_offset"] == lp["text_offset"]


@pytest.mark.parametrize("legacy", [False, True], ids=["tools", "functions"])
def test_text_around_a_call_decided_at_the_end_keeps_its_space_streamed(edge: asyncio.AbstractEventLoop, legacy: bool) -> None:
    """A call written with its arguments before its name is held and decided at the end. The
    text after it kept its leading space unstreamed ("Hello world": the content is the text
    around the call, stripped as a whole) but lost it streamed ("Helloworld"): the held part's
    content was stripped on its own."""
    text = 'Hello<tool_call>\n{"arguments": {"x": 1}, "name": "lookup"}\n</tool_call> world'
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Q " + script(text)}]}
    if legacy:
        body["functions"] = [t["function"] for t in TOOLS]
    else:
        body["tools"] = TOOLS
    plain_status, plain, streamed_status, streamed = edge.run_until_complete(both("/v1/chat/completions", body, False))
    assert plain_status == streamed_status == 200
    message = json.loads(plain)["choices"][0]["message"]
    assert message["content"] == "Hello world"
    data = [line[6:] for line in streamed.decode().split("\n") if line.startswith("data: ")]
    got, _ = assemble(data, True, False, False)
    assert got["choices"][0]["text"] == "Hello world"
    calls = got["choices"][0]["function_call" if legacy else "calls"]
    assert (calls if legacy else calls[0]) == ("lookup", '{"x": 1}')
