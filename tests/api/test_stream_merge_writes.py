"""Several choices (n > 1) merged into one stream: what arrived together goes out together."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request, writes_of_a_reader_behind

pytestmark = pytest.mark.django_db(transaction=True)


def by_choice(data: list[str]) -> dict[int, tuple[str, list[Any]]]:
    """Each choice's streamed text and finish reasons, by index; the last chunk (usage) apart."""
    out: dict[int, tuple[str, list[Any]]] = {}
    for chunk in (json.loads(d) for d in data[:-2]):
        (choice,) = chunk["choices"]
        text, reasons = out.get(choice["index"], ("", []))
        out[choice["index"]] = (text + (choice["delta"].get("content") or ""), reasons + [choice["finish_reason"]])
    return out


async def test_deltas_of_several_choices_that_arrive_together_go_out_in_one_write() -> None:
    """n=2: the reader fell behind while both choices ran to their end; the single-choice stream
    sends what was queued in one write, the merged one sent one write per delta (52 writes for
    48 deltas), each a trip through daphne on a loop that was already behind."""
    sim = SimWorker(lanes=2)
    async with attached(sim):
        body = chat_body(max_tokens=24, stream=True, temperature=0, n=2, stream_options={"include_usage": True})
        whole = (await request("POST", "/v1/chat/completions", body, JSON)).sse_data()
        writes = await writes_of_a_reader_behind(sim, body)
    data = [line[6:] for line in b"".join(writes).decode().split("\n") if line.startswith("data: ")]
    assert len(data) == len(whole) >= 50 and data[-1] == "[DONE]"  # nothing lost or repeated ...
    assert by_choice(data) == by_choice(whole) and set(by_choice(data)) == {0, 1}
    assert json.loads(data[-2])["choices"] == [] and json.loads(data[-2])["usage"]["completion_tokens"] == 48
    assert len(writes) <= 6  # ... and 48 deltas did not take 48 writes


async def test_a_choice_that_fails_while_its_sibling_streams_ends_the_stream_after_what_was_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    """n=2, the second choice fails after two deltas: the deltas that came before its error
    (both choices') reach the client, then one error frame and ``[DONE]``; the sibling still
    running is cancelled at the worker, not run to its end for nobody."""
    import asyncio

    from scheduler.link import messages as m

    sim = SimWorker(lanes=2, step_sleep_s=0.003)
    async with attached(sim) as (link, _rt):
        real, submitted = link.submit, []

        async def submit(**kwargs: Any) -> Any:
            handle = await real(**kwargs)
            submitted.append(handle)
            if len(submitted) == 2:
                seen = [0]

                def failed(event: Any) -> Any:  # the third delta read is an error instead
                    if isinstance(event, m.Delta):
                        seen[0] += 1
                        if seen[0] == 3:
                            return m.Error(id=handle.job_id, reason="engine_error", detail="boom")
                    return event

                class Failing(asyncio.Queue):  # type: ignore[type-arg]
                    def get_nowait(self) -> Any:  # (get() reads through it too)
                        return failed(super().get_nowait())

                handle.events = Failing()
            return handle

        monkeypatch.setattr(link, "submit", submit)
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=200, stream=True, n=2), JSON)
        assert reply.status == 200
        data = reply.sse_data()
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "engine_error"
        chunks = [json.loads(d) for d in data[:-2]]
        assert all("error" not in c for c in chunks)
        text = {i: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"][0]["index"] == i) for i in (0, 1)}
        assert len(text[1]) == 2  # the failing choice's two deltas before its error
        deadline = time.monotonic() + 10
        while sim.busy() != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sim.busy() == (0, 0)
        assert sim.transport is not None and sim.transport.worker is not None
        assert sim.transport.worker.scheduler.counters["cancelled"] == 2  # neither ran to its 200th token
