"""A job submitted again after its worker was lost (``Submit.resume_text``/``resume_tokens``, from
scheduler/link/transport.py's ``delivered_text``/``delivered_tokens``) while the worker held the
text of a token back (a possible stop string's start, a character's first bytes): with logprobs
on, the delta of that token went out with its entry and its count but none of its text, so the
next worker generates the token again, counts it twice against max_tokens, and the client gets
its entry twice and one token of text fewer than a reply whose worker was not lost."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock
from scheduler.link.messages import Delta, Message, Submit
from scheduler.worker.loop import EngineWorker

from .test_stop_token_logprobs import PiecesSim


def _deltas(body: dict[str, Any], resume_text: str = "", resume_tokens: int = 0) -> list[Delta]:
    clock = FakeClock()
    worker = EngineWorker(PiecesSim(b"", n_lanes=1, lane_ctx=512, clock=clock), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock)
    sent: list[Message] = []

    class Conn:
        def queue(self, message: Message) -> None:
            sent.append(message)

    worker.handle(Conn(), Submit(id="j", request=body, qos=1, resume_text=resume_text, resume_tokens=resume_tokens))  # type: ignore[arg-type]
    for _ in range(100):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    return [m for m in sent if isinstance(m, Delta)]


def test_a_job_lost_while_its_worker_held_a_tokens_text_resumes_to_the_same_reply() -> None:
    body: dict[str, Any] = {"endpoint": "completions", "prompt": "hello", "max_tokens": 8, "temperature": 0.0, "logprobs": 1}
    whole = "".join(d.text for d in _deltas(body))
    body["stop"] = [whole[2] + "#"]  # the third token's text is held, then released by the fourth
    first = _deltas(body)
    assert "".join(d.text for d in first) == whole
    for cut in range(1, len(first)):  # the worker is lost after each delta in turn
        lost = first[:cut]  # the web side submits the job again after what was delivered
        delivered_text, delivered_tokens = "".join(d.text for d in lost), lost[-1].tokens
        rest = _deltas(body, delivered_text, delivered_tokens)
        assert delivered_text + "".join(d.text for d in rest) == whole, cut
        entries = [bytes(e["bytes"]).decode() for d in lost + rest for e in d.logprobs or []]
        assert "".join(entries) == whole, cut
        assert rest[-1].tokens == 8, cut  # max_tokens, counted once each
