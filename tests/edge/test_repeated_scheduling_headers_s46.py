"""A request that sends X-LlamaSwap-Priority or x-superfluid-qos twice (two header lines) is read
by the first line, as llama-swap reads its priority header (Go's ``Header.Get``); the key headers
keep the last (tests/keys/test_several_authorization_headers.py). The last line used to win, so
a client behind a gateway that appends its own header got the other value than under llama-swap."""

from __future__ import annotations

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("headers", "runs_as"),
    [
        ([(b"x-llamaswap-priority", b"-100"), (b"x-llamaswap-priority", b"100")], "background"),
        ([(b"x-llamaswap-priority", b"interactive"), (b"X-LlamaSwap-Priority", b"batch")], "interactive"),
        ([(b"x-superfluid-qos", b"background"), (b"x-superfluid-qos", b"interactive")], "background"),
        ([(b"x-superfluid-qos", b"agent"), (b"x-superfluid-qos", b"no-such-class")], "agent"),
    ],
)
async def test_the_first_of_a_repeated_scheduling_header_decides(headers: list[tuple[bytes, bytes]], runs_as: str) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON + headers)
    assert reply.status == 200, reply.body
    assert reply.headers["x-superfluid-qos"] == runs_as
