"""Logprobs of the token that completes a stop string while carrying text of its own before it
(``"};\\n"`` with stop ``"\\n"``, ``" Paris."`` with stop ``"."``): the client gets that text, so it
gets the token's entry too, one entry per token of the text (scheduler/worker/output.py's
``TextStream.stop_token_has_text``, read by scheduler/worker/loop.py's ``_process``)."""

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
    ("pieces", "stop", "has_text"),
    [
        ([b"a;"], [";"], True),  # text of its own before the stop
        ([b";"], [";"], False),  # the stop string at the very first token
        ([b"a", b";"], [";"], False),
        ([b"a;", b"b"], ["b"], False),  # the stop string is the whole token
        ([b"x", b"a;"], ["x"], False),
        ([b"ab", b"cd"], ["bc"], False),  # "b" held from the first token, the second begins with "c"
        ([b"ab", b"xcd"], ["bxc"], False),
        ([b"a", b"bcd"], ["cd"], True),  # "b" is the second token's, before the stop
        ([b"a", b"b", b"c"], ["abcd", "b"], False),  # "a" held, released as the "b" stop completes
        ([b"\xe4\xb8", b"\xad;"], [";"], True),  # the character's last byte is the token's
        ([b"\xe4", b"\xb8\xad", b"x;"], ["\u4e2dx;"], False),
    ],
)
def test_the_stream_says_whether_the_stopping_token_had_text_before_the_stop(pieces: list[bytes], stop: list[str], has_text: bool) -> None:
    stream = TextStream(pieces.__getitem__, stop)
    for token in range(len(pieces)):
        stream.push(token)
    assert stream.stopped
    assert stream.stop_token_has_text is has_text


def test_a_token_pushed_after_the_stop_has_no_text_of_its_own() -> None:
    stream = TextStream([b"a;", b"b"].__getitem__, [";"])
    assert stream.push(0) == "a" and stream.stop_token_has_text
    assert stream.push(1) == "" and not stream.stop_token_has_text
