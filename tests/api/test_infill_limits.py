"""llama-server's ``n_indent`` and ``t_max_predict_ms`` on ``POST /infill`` (llama.vim sends both):
parsed and honoured, as llama-server's ``process_token`` honours them, with its ``stop_type``
``limit``.

- ``n_indent``: a generated line after a new line with fewer spaces and tabs than ``n_indent``
  before its first other character ends the completion there (the new line and that
  indentation stay, the rest goes), streamed or not.
- ``t_max_predict_ms``: at a token whose text holds a new line, once more than that many
  milliseconds have passed since the first generated token, the completion ends (the new line
  stays). Time is the worker's clock (a fake one here).

In process: the worker around the simulated FIM engine made to write a given text, alone
(its messages) and behind the real ASGI application."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.errors import ApiError
from api.schemas import parse_completion_request, parse_infill_request
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import EOG_TOKEN, FakeClock
from scheduler.link.messages import Delta, Done, Message, Submit, decode, encode
from scheduler.worker.loop import EngineWorker
from tests.api.test_infill import MID, FimSim, FimSimWorker
from tests.edge.inproc import JSON, MODEL, attached, request


def scripted(text: bytes) -> type[FimSim]:
    """The FIM sim engine that writes ``text`` (a token a byte), then ends it (EOG)."""

    class Scripted(FimSim):
        def next_token(self, sequence: list[int]) -> int:  # type: ignore[override]
            written = len(sequence) - 1 - sequence.index(MID)
            return text[written] if written < len(text) else EOG_TOKEN

    return Scripted


def parse(body: dict[str, Any], strict: bool = False) -> Any:
    req, _fields = parse_infill_request(json.dumps(body).encode(), models=[MODEL], strict=strict)
    return req


# -- parsing ------------------------------------------------------------------------------------


def test_both_are_read_and_no_longer_named_ignored() -> None:
    req = parse({"input_prefix": "a", "n_indent": 4, "t_max_predict_ms": 500, "samplers": ["top_k"]})
    assert (req.n_indent, req.t_max_predict_ms) == (4, 500)
    assert req.ignored == ["samplers"]
    strict = parse({"input_prefix": "a", "n_indent": 4, "t_max_predict_ms": 500}, strict=True)
    assert (strict.n_indent, strict.t_max_predict_ms) == (4, 500) and strict.ignored == []
    wire = req.to_wire()
    assert (wire["n_indent"], wire["t_max_predict_ms"]) == (4, 500)  # what the worker reads


def test_absent_null_or_zero_is_off_and_stays_off_the_wire() -> None:
    for body in ({}, {"n_indent": None, "t_max_predict_ms": None}, {"n_indent": 0, "t_max_predict_ms": 0}):
        req = parse({"input_prefix": "a", **body})
        assert (req.n_indent, req.t_max_predict_ms) == (0, 0) and req.ignored == []
        assert "n_indent" not in req.to_wire() and "t_max_predict_ms" not in req.to_wire()


def test_v1_completions_is_left_as_it_was() -> None:
    """Only /infill reads them: on /v1/completions they are unknown keys (named ignored, as any
    unknown key), and its wire form has neither."""
    raw = json.dumps({"model": MODEL, "prompt": "x", "n_indent": 4, "t_max_predict_ms": 9}).encode()
    req = parse_completion_request(raw, models=[MODEL])
    assert set(req.ignored) == {"n_indent", "t_max_predict_ms"}
    assert "n_indent" not in req.to_wire() and "t_max_predict_ms" not in req.to_wire()


@pytest.mark.parametrize("param", ["n_indent", "t_max_predict_ms"])
@pytest.mark.parametrize(("value", "code"), [(-1, "invalid_value"), ("4", "invalid_type"), (1.5, "invalid_type"), (4.0, "invalid_type"), (True, "invalid_type"), ([4], "invalid_type"), ({}, "invalid_type")])
def test_a_value_that_is_not_a_non_negative_integer_is_a_400_naming_it(param: str, value: Any, code: str) -> None:
    with pytest.raises(ApiError) as err:
        parse({"input_prefix": "a", param: value})
    error = err.value.body()["error"]
    assert err.value.status == 400 and error["param"] == param and error["code"] == code, error


def test_a_huge_integer_is_taken_and_crosses_the_link() -> None:
    req = parse({"n_indent": 10**30, "t_max_predict_ms": 2**63})
    assert (req.n_indent, req.t_max_predict_ms) == (10**30, 2**63)
    wire = req.to_wire()
    assert decode(encode(Submit(id="j", request=wire))) == Submit(id="j", request=wire)


# -- the worker ---------------------------------------------------------------------------------


def run_worker(text: bytes, round_s: float = 0.0625, **body: Any) -> tuple[list[str], Done]:
    """The /infill body through a worker on the engine that writes ``text``; each decode round
    takes ``round_s`` on the worker's fake clock. (The deltas' texts, the Done.)"""
    clock = FakeClock()
    engine = scripted(text)(n_lanes=1, lane_ctx=512, clock=clock, decode_round_s=round_s, prefill_s_per_token=0.0)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name=MODEL, clock=clock)
    sent: list[Message] = []

    class Conn:
        def queue(self, message: Message) -> None:
            sent.append(message)

    req = parse({"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 64, **body})
    worker.handle(Conn(), Submit(id="j", request=req.to_wire(), qos=1))  # type: ignore[arg-type]
    for _ in range(200):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    done = [m for m in sent if isinstance(m, Done)]
    assert len(done) == 1, sent
    return [m.text for m in sent if isinstance(m, Delta) and m.text], done[0]


CODE = b"    x = 1\n    if x:\n        y = 2\n    return y\nprint(f())\n"


def test_n_indent_cuts_the_first_under_indented_line_after_its_indentation() -> None:
    texts, done = run_worker(CODE, n_indent=4)
    assert "".join(texts) == "    x = 1\n    if x:\n        y = 2\n    return y\n"
    assert done.finish_reason == "length" and done.stop_word is None  # /infill's stop_type "limit"
    assert not any("print" in t for t in texts)  # no part of the cut line went out
    assert done.usage["completion_tokens"] == len(b"    x = 1\n    if x:\n        y = 2\n    return y\np")


def test_n_indent_keeps_the_indentation_of_the_line_it_cuts() -> None:
    texts, done = run_worker(CODE, n_indent=8)
    assert "".join(texts) == "    x = 1\n    " and done.finish_reason == "length"
    texts, done = run_worker(CODE, n_indent=0)
    assert "".join(texts) == CODE.decode() and done.finish_reason == "stop" and done.stop_word is None


def test_a_stop_string_before_the_cut_still_ends_it_as_a_stop_string() -> None:
    texts, done = run_worker(CODE, n_indent=4, stop=["if"])
    assert "".join(texts) == "    x = 1\n    " and done.finish_reason == "stop" and done.stop_word == "if"


def test_t_max_predict_ms_stops_at_the_first_new_line_after_the_limit() -> None:
    """Token k comes at k rounds (1/16 s each) after the first: the new line at token 6 comes
    375 ms after it."""
    text = b"abcdef\nghij\nkl"
    texts, done = run_worker(text, t_max_predict_ms=100)
    assert "".join(texts) == "abcdef\n" and done.finish_reason == "length" and done.stop_word is None
    assert done.usage["completion_tokens"] == 7


def test_t_max_predict_ms_does_not_stop_before_a_new_line_however_long() -> None:
    texts, done = run_worker(b"abcdefghijklmnop", t_max_predict_ms=1)
    assert "".join(texts) == "abcdefghijklmnop" and done.finish_reason == "stop"  # the model ended it


def test_t_max_predict_ms_lets_a_new_line_within_the_limit_through() -> None:
    """The new line at token 2 is 125 ms after the first token: not past 125 ms, past 124 ms."""
    text = b"ab\ncdefghijkl\nmn"
    texts, done = run_worker(text, t_max_predict_ms=125)
    assert "".join(texts) == "ab\ncdefghijkl\n" and done.finish_reason == "length"
    texts, done = run_worker(text, t_max_predict_ms=124)
    assert "".join(texts) == "ab\n" and done.finish_reason == "length"
    texts, done = run_worker(text)
    assert "".join(texts) == text.decode() and done.finish_reason == "stop"


def test_both_together_the_earlier_ends_it() -> None:
    texts, done = run_worker(b"    a\n    b\nc\n", n_indent=4, t_max_predict_ms=10_000)
    assert "".join(texts) == "    a\n    b\n" and done.finish_reason == "length"
    texts, done = run_worker(b"    a\n    b\nc\n", n_indent=4, t_max_predict_ms=100)
    assert "".join(texts) == "    a\n" and done.finish_reason == "length"  # its new line: 312.5 ms


# -- through the application --------------------------------------------------------------------


def app_worker(text: bytes) -> FimSimWorker:
    class Worker(FimSimWorker):
        engine_class = scripted(text)

    return Worker()


def infill_body(**fields: Any) -> bytes:
    return json.dumps({"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 64, **fields}).encode()


@pytest.mark.django_db(transaction=True)
async def test_infill_with_n_indent_answers_the_cut_text_with_stop_type_limit() -> None:
    async with attached(app_worker(CODE)):
        reply = await request("POST", "/infill", infill_body(n_indent=4, t_max_predict_ms=60_000), JSON)
        streamed = await request("POST", "/infill", infill_body(n_indent=4, stream=True), JSON)
    assert reply.status == 200, reply.body
    obj = reply.json()
    cut = "    x = 1\n    if x:\n        y = 2\n    return y\n"
    assert obj["content"] == cut
    assert obj["stop_type"] == "limit" and obj["stopping_word"] == "" and obj["stop"] is True and obj["truncated"] is False
    assert obj["has_new_line"] is True
    assert "n_indent" not in reply.headers.get("x-superfluid-ignored-params", "")
    assert "t_max_predict_ms" not in reply.headers.get("x-superfluid-ignored-params", "")
    assert streamed.status == 200, streamed.body
    *deltas, last = [json.loads(d) for d in streamed.sse_data()]
    assert "".join(f["content"] for f in deltas) == cut
    assert not any("print" in f["content"] for f in deltas)
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == "limit"


@pytest.mark.django_db(transaction=True)
async def test_infill_with_t_max_predict_ms_stops_at_a_new_line_with_stop_type_limit() -> None:
    """The in-process worker's fake clock moves 60 ms a decode round: the first new line (token 1)
    is within 200 ms of the first token, the second (token 8) past it."""
    text = b"a\nbcdefg\nhij"
    async with attached(app_worker(text)):
        limited = (await request("POST", "/infill", infill_body(t_max_predict_ms=200), JSON)).json()
        free = (await request("POST", "/infill", infill_body(), JSON)).json()
    assert limited["content"] == "a\nbcdefg\n" and limited["stop_type"] == "limit" and limited["stopping_word"] == ""
    assert free["content"] == text.decode() and free["stop_type"] == "eos"


@pytest.mark.django_db(transaction=True)
async def test_bad_values_are_400s_through_the_route() -> None:
    async with attached(app_worker(CODE)):
        for field, value in (("n_indent", -1), ("n_indent", True), ("t_max_predict_ms", "100"), ("t_max_predict_ms", -5)):
            reply = await request("POST", "/infill", infill_body(**{field: value}), JSON)
            assert reply.status == 400 and reply.is_error_object(), reply.body
            assert reply.json()["error"]["param"] == field
