"""A request with the key header given twice (a gateway that adds its own ``Authorization``
beside the client's): every route reads the same one, the last, as the generation endpoints
do (api/consumers.py). The Django routes (``/v1/models``, ``/metrics``, files and batches) saw
the values joined with a comma ("Bearer wrong,Bearer right"), no key at all: 401 there while
the same headers were served on ``/v1/chat/completions``."""

from __future__ import annotations

import pytest
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

SECRET = "sf-the-right-one-0123456789"
KEYS = {digest_of(SECRET): Key(id=7, name="alice", digest=digest_of(SECRET))}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [b"authorization", b"x-api-key"])
async def test_a_repeated_key_header_is_read_alike_by_every_route(name: bytes) -> None:
    value = (lambda s: b"Bearer " + s) if name == b"authorization" else (lambda s: s)
    twice = [(name, value(b"sf-not-this-one")), (name, value(SECRET.encode()))]
    with override_settings(SUPERFLUID_KEYS_REQUIRED=True):
        async with attached(SimWorker(), keys=KEYS):
            chat = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON + twice)
            models = await request("GET", "/v1/models", b"", twice)
            assert (chat.status, models.status) == (200, 200), (chat.body, models.body)
            wrong_last = list(reversed(twice))
            chat = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON + wrong_last)
            models = await request("GET", "/v1/models", b"", wrong_last)
            assert (chat.status, models.status) == (401, 401)
