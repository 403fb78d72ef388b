"""The ASGI application over the in-process transport: what a client sees of the link's outcomes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.testing import HttpCommunicator

from superfluid_site.runtime import forget, install

from .conftest import transport
from .test_transport import CrashingSim

pytestmark = pytest.mark.django_db(transaction=True)


def application() -> Any:
    from superfluid_site.asgi import application as app

    return app


async def post(body: dict[str, Any] | bytes, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    comm = HttpCommunicator(application(), "POST", path, body=raw, headers=[(b"content-type", b"application/json"), (b"host", b"127.0.0.1")])
    response = await comm.get_response(timeout=30)
    return response["status"], response["body"]


def frames(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


@pytest.fixture
async def link_of(request: pytest.FixtureRequest) -> Any:
    made = []

    async def make(**kwargs: Any) -> Any:
        made.append(install(transport(**kwargs)))
        assert await made[-1].wait_connected(5)
        return made[-1]

    yield make
    for link in made:
        await link.stop()
    forget(asyncio.get_running_loop())


async def test_a_stream_through_the_in_process_worker_is_well_framed(link_of: Any) -> None:
    await link_of()
    status, body = await post({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True})
    assert status == 200
    got = frames(body)
    assert got[-1] == "[DONE]"
    text = "".join(json.loads(f)["choices"][0]["delta"].get("content") or "" for f in got[:-1] if json.loads(f)["choices"])
    assert len(text) == 7 and json.loads(got[-2])["choices"][0]["finish_reason"] == "length"


async def test_a_poison_request_gets_503_engine_crashed_after_two_crashes_and_the_next_is_served(link_of: Any) -> None:
    link = await link_of(make_engine=lambda: CrashingSim(poison=b"POISON"))
    # the worker dies in the job's first tick, before its acceptance leaves: no stream has begun,
    # so the client gets a real 503 rather than a 200 with an error frame
    status, body = await post({"model": "sim", "messages": [{"role": "user", "content": "POISON"}], "stream": True})
    assert status == 503 and json.loads(body)["error"]["code"] == "engine_crashed"
    assert link.restarts == 2
    status, body = await post({"model": "sim", "messages": [{"role": "user", "content": "POISON"}]})
    assert status == 503 and json.loads(body)["error"]["code"] == "engine_crashed"
    status, body = await post({"model": "sim", "messages": [{"role": "user", "content": "fine"}], "max_tokens": 3})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]


async def test_a_prompt_beyond_the_context_is_a_400_naming_messages(link_of: Any) -> None:
    await link_of()
    status, body = await post({"model": "sim", "messages": [{"role": "user", "content": "<|im_end|>" * 80_000}]})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
