"""Logprobs of the token that completes a stop string while carrying text of its own before it
(``"};\\n"`` with stop ``"\\n"``, ``" Paris."`` with stop ``"."``): the client gets that text, so it
gets the token's entry too, one entry per token of the text (scheduler/worker/output.py's
``TextStream.tokens_out``, read by scheduler/worker/loop.py's ``_process``)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.base import Step
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Delta, Done, Message, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.output import TextStream


class PiecesSim(SimEngine):
    """The sim engine with logprobs, whose generated tokens (a-z) each stand for ``letter + tail``."""

    def __init__(self, tail: bytes, **kw: Any) -> None:
        super().__init__(**kw)
        self.tail = tail
        self.features = frozenset({"logprobs"})
        self._sampled: list[int] = []

    def token_bytes(self, token: int) -> bytes:
        return bytes([token % 256]) + (self.tail if 97 <= token <= 122 else b"")

    def forward(self, step: Step) -> dict[int, int]:
        sampled = super().forward(step)
        self._sampled = list(sampled)
        return sampled

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        return {lane: (-0.25, []) for lane in self._sampled}


def _reply(tail: bytes, stop: list[str]) -> tuple[str, list[bytes], Done]:
    clock = FakeClock()
    worker = EngineWorker(PiecesSim(tail, n_lanes=1, lane_ctx=512, clock=clock), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock)
    sent: list[Message] = []

    class Conn:
        def queue(self, message: Message) -> None:
            sent.append(message)

    body = {"endpoint": "completions", "prompt": "hello", "max_tokens": 4, "logprobs": 1, "stop": stop}
    worker.handle(Conn(), Submit(id="j", request=body, qos=1))  # type: ignore[arg-type]
    for _ in range(100):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    deltas = [m for m in sent if isinstance(m, Delta)]
    done = [m for m in sent if isinstance(m, Done)]
    assert len(done) == 1, sent
    entries = [bytes(e["bytes"]) for m in deltas for e in m.logprobs or []]
    return "".join(m.text for m in deltas), entries, done[0]


def test_the_token_that_completes_a_stop_string_after_text_of_its_own_keeps_its_entry() -> None:
    text, entries, done = _reply(b";", [";"])  # every token is "x;": the first one stops
    assert done.finish_reason == "stop" and done.stop_word == ";"
    assert len(text) == 1  # its letter reached the client ...
    assert len(entries) == 1 and entries[0] == text.encode() + b";"  # ... and so does its entry


def test_without_a_stop_every_token_keeps_its_entry() -> None:
    text, entries, done = _reply(b"", ["zzzz"])
    assert done.finish_reason == "length" and len(entries) == 4 and b"".join(entries).decode() == text


@pytest.mark.parametrize(
    ("pieces", "stop", "out"),
    [
        ([b"a;"], [";"], 1),  # text of its own before the stop
        ([b";"], [";"], 0),  # the stop string at the very first token
        ([b"a", b";"], [";"], 1),
        ([b"a;", b"b"], ["b"], 1),  # the stop string is the whole token
        ([b"x", b"a;"], ["x"], 0),  # (a token after the stop is not out)
        ([b"ab", b"cd"], ["bc"], 1),  # "b" held from the first token, the second begins with "c"
        ([b"ab", b"xcd"], ["bxc"], 1),
        ([b"a", b"bcd"], ["cd"], 2),  # "b" is the second token's, before the stop
        ([b"a", b"b", b"c"], ["abcd", "b"], 1),  # "a" held, released as the "b" stop completes
        ([b"\xe4\xb8", b"\xad;"], [";"], 2),  # the character's last byte is the second token's
        ([b"\xe4", b"\xb8\xad", b"x;"], ["\u4e2dx;"], 0),
    ],
)
def test_at_a_stop_the_tokens_out_are_those_with_text_before_it(pieces: list[bytes], stop: list[str], out: int) -> None:
    stream = TextStream(pieces.__getitem__, stop)
    for token in range(len(pieces)):
        stream.push(token)
    assert stream.stopped
    assert stream.tokens_out == out


def test_a_token_pushed_after_the_stop_is_not_out() -> None:
    stream = TextStream([b"a;", b"b"].__getitem__, [";"])
    assert stream.push(0) == "a" and stream.tokens_out == 1
    assert stream.push(1) == "" and stream.tokens_out == 1


def test_a_token_whose_text_is_held_is_not_out_until_its_text_goes() -> None:
    stream = TextStream([b"a", b"b#", b"c", b"\xe4\xb8", b"\xad"].__getitem__, ["b#x"])
    assert stream.push(0) == "a" and stream.tokens_out == 1
    assert stream.push(1) == "" and stream.tokens_out == 1  # "b#" may begin the stop string
    assert stream.push(2) == "b#c" and stream.tokens_out == 3
    assert stream.push(3) == "" and stream.tokens_out == 3  # a character's first bytes
    assert stream.push(4) == "\u4e2d" and stream.tokens_out == 5
