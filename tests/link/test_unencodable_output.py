"""A job whose output cannot be put on the link (a logprob that is not a number: NaN logits from
the model) fails alone with ``unencodable``, and its lane is freed for the others, not held on
to the end of its max_tokens for a client that was already told it failed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scheduler.engines.sim import SimEngine
from scheduler.link.messages import UNENCODABLE, Done, Error

from .conftest import completion, outcome, run_one, transport


class NanLogprobSim(SimEngine):
    """Reports NaN logprobs (a model whose logits overflowed) for every lane that asks; slow
    enough in real time that a job left running holds its lane for seconds."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(n_lanes=1, lane_ctx=512, **kwargs)
        self.features = frozenset({"logprobs"})
        self.on_call = lambda n: time.sleep(0.01)

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        return {lane: (float("nan"), []) for lane in self.bound_lanes()}


async def test_a_job_whose_delta_cannot_be_encoded_fails_and_frees_its_lane() -> None:
    link = transport(NanLogprobSim)
    handle = await link.submit(request=completion(max_tokens=400, logprobs=0))
    try:
        text, event = await outcome(handle)
    finally:
        await link.cancel(handle)  # what the consumer does when the response fails
        link.finish(handle)
    assert isinstance(event, Error) and event.reason == UNENCODABLE
    # the worker's one lane is free again at once (400 tokens would hold it ~4 s): the next job,
    # without logprobs, is served well before that
    started = time.monotonic()
    text, done = await asyncio.wait_for(run_one(link, request=completion(max_tokens=5)), 10)
    assert isinstance(done, Done) and len(text) == 5
    assert time.monotonic() - started < 1.5
    await link.stop()
