"""A job submitted again after its worker was lost goes on after the text already sent
(``Submit.resume_text``): a stop string that began in that text and ends in the new one stops
the stream (scheduler/worker/output.py's ``TextStream(..., resumed=...)``), as it would have
had the worker not been lost, and nothing of it reaches the client."""

from __future__ import annotations

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from scheduler.worker.output import TextStream


def _chars(text: str) -> tuple[list[int], dict[int, bytes]]:
    """One token per character."""
    table = {i: c.encode() for i, c in enumerate(text)}
    return list(table), table


def _run(resumed: str, new: str, stop: list[str]) -> tuple[str, TextStream]:
    tokens, table = _chars(new)
    stream = TextStream(table.__getitem__, stop, resumed=resumed)
    out = "".join(stream.push(t) for t in tokens) + stream.flush()
    return out, stream


def test_a_stop_string_begun_in_the_text_already_sent_stops_the_resumed_stream() -> None:
    out, stream = _run("once a", "bcd", ["ab"])
    assert out == "" and stream.stopped and stream.stop_word == "ab"


def test_one_that_ends_in_the_new_text_after_a_false_start_stops_there() -> None:
    out, stream = _run("x aa", "caab!", ["aab"])  # the match begun in "aa" fails at "c"
    assert out == "c" and stream.stop_word == "aab"


def test_a_resumed_stream_without_a_stop_string_sends_all_its_text() -> None:
    out, stream = _run("a", "cab", ["abc"])
    assert out == "cab" and not stream.stopped


@settings(max_examples=300)
@example("xa", "ba", ["ab", "b"])
@given(
    st.text(alphabet="ab\u00e9", max_size=8),
    st.text(alphabet="ab\u00e9", max_size=10),
    st.lists(st.text(alphabet="ab\u00e9", min_size=1, max_size=4), max_size=3),
)
def test_resumed_text_and_new_text_stop_as_the_whole_text_would(resumed: str, new: str, stop: list[str]) -> None:
    assume(not any(s in resumed for s in stop))  # the lost worker would have stopped there
    text, expected = resumed, new
    for i in range(len(new)):
        text = resumed + new[: i + 1]
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            expected = text[len(resumed) : max(min(hits), len(resumed))]
            break
    out, stream = _run(resumed, new, stop)
    assert out == expected


def test_the_worker_stops_a_resumed_job_at_a_stop_string_that_spans_the_text_already_sent() -> None:
    """End to end at the worker: a completion submitted again with the text its lost worker had
    streamed ("abc") and a stop string of that text's last character and the continuation's first
    ends at once with finish_reason stop, sending nothing of it."""
    from scheduler.core.qos import QosClass
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.sim import SimEngine
    from scheduler.link.messages import Delta, Done, Message, Submit
    from scheduler.worker.loop import EngineWorker

    def resumed(stop: list[str]) -> tuple[str, Done]:
        sent: list[Message] = []

        class Conn:
            def queue(self, message: Message) -> None:
                sent.append(message)

        worker = EngineWorker(SimEngine(n_lanes=1, lane_ctx=512), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim")
        body = {"endpoint": "completions", "model": "sim", "prompt": "hello", "max_tokens": 8, "temperature": 0.0, "stop": stop}
        worker.handle(Conn(), Submit(id="j", request=body, qos=int(QosClass.COMPLETION), resume_text="abc", resume_tokens=3))  # type: ignore[arg-type]
        for _ in range(100):
            if not worker.run_tick() and worker.scheduler.idle:
                break
        done = [m for m in sent if isinstance(m, Done)]
        assert len(done) == 1, sent
        return "".join(m.text for m in sent if isinstance(m, Delta)), done[0]

    going_on, _ = resumed([])
    assert going_on and "c" + going_on[0] not in "abc"
    text, done = resumed(["c" + going_on[0]])
    assert text == "" and done.finish_reason == "stop", (text, done)
