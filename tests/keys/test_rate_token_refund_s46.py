"""A request the server refused for its own reasons after admitting it (503 ``engine_unavailable``:
its model did not load, its worker was gone) gives its key's rate token back: it should not cost
the caller quota. A request refused for its own reasons (400 from the engine's checks) or one
that ran keeps its token spent (docs/keys.md, "Limits")."""

from __future__ import annotations

from typing import Any

import pytest

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from scheduler.core.qos import QosClass
from scheduler.link import messages as m
from scheduler.link.pool import ModelUnavailable
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request, stand_in_pool
from tests.keys.test_release_admission_paths import accepted, delta, done, rejected, scripted

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-refund-0123456789"
POLICY = Policy(name="one-a-minute", max_class=QosClass.INTERACTIVE, rate_limit_rpm=1)
KEYS = {digest_of(SECRET): Key(id=1, name="refund", digest=digest_of(SECRET), policy=POLICY)}
AUTH = [*JSON, (b"authorization", f"Bearer {SECRET}".encode())]


def unavailable(job_id: str) -> Any:
    return m.Rejected(job_id, m.ENGINE_UNAVAILABLE, "The engine worker is not running.")


async def test_a_model_that_does_not_load_costs_the_key_no_rate_token(monkeypatch: pytest.MonkeyPatch) -> None:
    async def acquire(model: str, priority: int, jobs: int) -> Any:
        raise ModelUnavailable(model, "The model could not be loaded.")

    stand_in_pool(monkeypatch, acquire)
    async with attached(SimWorker(), keys=KEYS):
        replies = [await request("POST", "/v1/chat/completions", chat_body(max_tokens=2, stream=stream), AUTH) for stream in (False, True, False)]
    # every one refused for the model, none for the key's one request a minute
    assert [r.status for r in replies] == [503, 503, 503], [r.body for r in replies]
    assert all(r.json()["error"]["code"] == "engine_unavailable" for r in replies)


@pytest.mark.parametrize("n", [1, 2])
async def test_a_worker_gone_before_the_job_reached_it_costs_the_key_no_rate_token(n: int) -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, _rt):
        real = link.submit
        scripted(link, [[unavailable]])
        refused = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2, n=n), AUTH)
        link.submit = real
        served = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
        limited = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
    assert (refused.status, served.status, limited.status) == (503, 200, 429), (refused.body, served.body, limited.body)


@pytest.mark.parametrize(
    "script", [[rejected], [accepted, delta, done]], ids=["400-from-the-engine", "served"]
)
async def test_a_request_the_engine_refused_or_served_keeps_its_token_spent(script: list[Any]) -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, _rt):
        scripted(link, [script])
        first = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
        second = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
    assert first.status in (200, 400), first.body
    assert (second.status, second.json()["error"]["code"]) == (429, "rate_limit_exceeded")


async def test_a_stream_that_failed_after_tokens_keeps_its_token_spent() -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, _rt):
        scripted(link, [[accepted, delta, unavailable]])
        first = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
        second = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
    assert first.status == 503, first.body
    assert second.status == 429, second.body


async def test_a_request_a_worker_had_accepted_keeps_its_token_spent() -> None:
    """A worker accepted it (its prompt was being prefilled) and it was lost before a token came:
    an engine worked on it, so, as docs/keys.md says, its token stays spent (it was refunded:
    the check looked only at tokens generated)."""
    async with attached(SimWorker(), keys=KEYS) as (link, _rt):
        real = link.submit
        made = scripted(link, [[accepted, unavailable]])
        scripted_submit = link.submit

        async def submit(**fields: Any) -> Any:
            handle = await scripted_submit(**fields)
            handle.accepted, handle.prompt_tokens = True, 3  # as the link notes its worker's Accepted
            return handle

        link.submit = submit
        first = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
        assert len(made) == 1
        link.submit = real
        second = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
    assert first.status == 503 and first.json()["error"]["code"] == "engine_unavailable", first.body
    assert second.status == 429, second.body
