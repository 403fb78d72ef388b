"""/tokenize and /detokenize tokenise a body's worth of text (up to --max-body-bytes) on the web
process's threads. They were outside every per-client limit: a key at one request a minute, or
with ``max_concurrent: 1``, could send them without end and keep those threads busy. They now
take the key's (or a keyless client's) rate token and concurrency slot as a generation request
does, 429 with Retry-After beyond (docs/keys.md, "Limits")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.testing import ApplicationCommunicator
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from scheduler.core.qos import QosClass
from tests.edge.inproc import JSON, SimWorker, application, attached, request, scope

pytestmark = pytest.mark.django_db(transaction=True)

RATED, BOUNDED = "sk-tok-rated-0123456789", "sk-tok-bounded-0123456789"
KEYS = {
    digest_of(RATED): Key(id=1, name="rated", digest=digest_of(RATED), policy=Policy(name="r", max_class=QosClass.INTERACTIVE, rate_limit_rpm=2)),
    digest_of(BOUNDED): Key(id=2, name="bounded", digest=digest_of(BOUNDED), policy=Policy(name="b", max_class=QosClass.INTERACTIVE, max_concurrent=1)),
}
TOKENIZE = json.dumps({"content": "hello world"}).encode()
DETOKENIZE = json.dumps({"tokens": [1, 2]}).encode()


def auth(secret: str) -> list[tuple[bytes, bytes]]:
    return [*JSON, (b"authorization", f"Bearer {secret}".encode())]


async def test_a_keys_requests_per_minute_bound_its_tokenizer_calls() -> None:
    async with attached(SimWorker(), keys=KEYS):
        replies = [
            await request("POST", "/tokenize", TOKENIZE, auth(RATED)),
            await request("POST", "/detokenize", DETOKENIZE, auth(RATED)),
            await request("POST", "/tokenize", TOKENIZE, auth(RATED)),
            await request("POST", "/detokenize", DETOKENIZE, auth(RATED)),
        ]
    assert [r.status for r in replies] == [200, 200, 429, 429], [r.body for r in replies]
    assert replies[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert int(replies[2].headers["retry-after"]) >= 1


async def test_a_keyless_client_is_bound_by_the_per_ip_rate_limit() -> None:
    with override_settings(SUPERFLUID_RATE_LIMIT=1):
        async with attached(SimWorker()):
            first = await request("POST", "/tokenize", TOKENIZE, JSON)
            second = await request("POST", "/tokenize", TOKENIZE, JSON)
    assert (first.status, second.status) == (200, 429), (first.body, second.body)


async def test_a_tokenizer_call_under_way_holds_the_keys_concurrency_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    from api import views

    real = views._vocab
    entered, go_on = asyncio.Event(), asyncio.Event()

    async def held_vocab(model: Any = None) -> Any:
        entered.set()
        await go_on.wait()
        return await real(model)

    monkeypatch.setattr(views, "_vocab", held_vocab)
    async with attached(SimWorker(), keys=KEYS) as (_link, rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/tokenize", auth(BOUNDED)))
        await comm.send_input({"type": "http.request", "body": TOKENIZE, "more_body": False})
        await asyncio.wait_for(entered.wait(), 10)
        assert rt.slots.held.get("bounded") == 1
        monkeypatch.setattr(views, "_vocab", real)
        second = await request("POST", "/tokenize", TOKENIZE, auth(BOUNDED))
        assert (second.status, second.json()["error"]["code"]) == (429, "concurrency_limit_exceeded"), second.body
        go_on.set()
        start = await comm.receive_output(10)
        assert start["status"] == 200
        await comm.receive_output(10)
        await comm.wait(10)
        assert rt.slots.held.get("bounded") is None  # given back when the call ended
        again = await request("POST", "/tokenize", TOKENIZE, auth(BOUNDED))
        assert again.status == 200, again.body
