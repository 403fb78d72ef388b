"""The activity row of a request that ended without its worker's answer (its client left while
it was queued or mid-reply) keeps the size of its prompt, as the worker accepted it: a client
that gave up during a long prefill is exactly the request whose row must say how long its
prompt was. Through the in-process middle layer (tests/edge/inproc.py)."""

from __future__ import annotations

import pytest

from api.metrics import web_metrics
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

from .test_why_it_waited import answered, generating, left, one_job, opened, qos, queued_at_the_worker, rows_of, until

pytestmark = pytest.mark.django_db(transaction=True)


async def prompt_tokens_of(body: bytes) -> int:
    """The prompt tokens the worker counts for ``body``, from a whole reply's usage."""
    reply = await request("POST", "/v1/chat/completions", body, JSON, timeout_s=30)
    assert reply.status == 200, reply.body
    return int(reply.json()["usage"]["prompt_tokens"])


@pytest.mark.parametrize("n", [1, 2])
async def test_a_client_that_leaves_mid_reply_has_its_prompt_tokens_on_its_row_and_its_keys_count(n: int) -> None:
    """One lane; a chat (n choices) generates and its client leaves mid-reply: its row has the
    completion tokens generated for it and, as a whole reply's row would, its prompt tokens
    (once for n choices of one prompt); the key's superfluid_key_tokens_total counts them."""
    text = "a fairly long prompt " * 6
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        expected = await prompt_tokens_of(chat_body(text, max_tokens=2))
        web_metrics.reset()
        comm = await opened(chat_body(text, max_tokens=200, n=n, stream=True), qos("agent"))
        known = set(link.inflight)
        await until(lambda: len(set(link.inflight) - known) == n, lambda: "the jobs were not submitted")
        [job] = [h for h in link.inflight.values() if h.job_id not in known and (h.request in ("", h.job_id))]
        await until(lambda: job.delivered_tokens > 0, lambda: "the job never ran")
        await left(comm)
        await until(lambda: not link.inflight, lambda: "the jobs were not cancelled")
    [row] = await rows_of(job)
    assert row["error_code"] == "client_disconnected" and row["completion_tokens"], row
    assert row["prompt_tokens"] == expected, row
    assert web_metrics.key_tokens.get(("anonymous", "prompt")) == expected, web_metrics.key_tokens


async def test_a_client_that_leaves_while_queued_has_its_prompt_tokens_and_no_completion_tokens() -> None:
    """One lane busy; a chat queues behind it (the worker accepted its prompt) and its client
    leaves: its row has the prompt's size and no completion tokens."""
    text = "another prompt " * 5
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        expected = await prompt_tokens_of(chat_body(text, max_tokens=2))
        known: set[str] = set(link.inflight)
        first, _first_job = await generating(link, known, "a", 60, "agent")
        waiting = await opened(chat_body(text, max_tokens=8), qos("agent"))
        waiting_job = await one_job(link, known)
        await queued_at_the_worker(link, waiting_job)
        await until(lambda: waiting_job.accepted, lambda: "the worker never accepted the queued job")
        await left(waiting)
        await until(lambda: waiting_job.job_id not in link.inflight, lambda: "the queued job was not cancelled")
        assert await answered(first) == 200
    [row] = await rows_of(waiting_job)
    assert (row["status"], row["error_code"]) == (499, "client_disconnected"), row
    assert row["prompt_tokens"] == expected and row["completion_tokens"] is None, row
