"""llama-server's /tokenize and /detokenize take any body up to ``--max-body-bytes`` (8 MiB by
default), as the generation endpoints do: a long document to count the tokens of is what these
routes are for. Above the bound it is 413 ``request_too_large``, never Django's own 400."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from .inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

# more than Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB), less than --max-body-bytes (8 MiB)
WORDS = 600_000  # "hello " each: 3.6 MB of text


def sized(body: bytes) -> list[tuple[bytes, bytes]]:
    return [*JSON, (b"content-length", str(len(body)).encode())]


async def test_a_body_of_a_few_megabytes_under_the_bound_is_tokenised_and_detokenised(sim: SimWorker) -> None:
    """Django's 2.5 MiB in-memory bound refused such a body before the view read it: 400
    ``bad_request`` "The request could not be understood", under a bound of 8 MiB."""
    async with attached(sim):
        body = json.dumps({"content": "hello " * WORDS}).encode()
        assert 2_621_440 < len(body) < 8 * 1024 * 1024
        reply = await request("POST", "/tokenize", body, sized(body), timeout_s=60)
        assert reply.status == 200, reply.body[:300]
        tokens = reply.json()["tokens"]
        assert len(tokens) >= WORDS
        body = json.dumps({"tokens": tokens}).encode()
        assert len(body) > 2_621_440
        reply = await request("POST", "/detokenize", body, sized(body), timeout_s=60)
        assert reply.status == 200, reply.body[:300]
        assert reply.json()["content"].strip() == ("hello " * WORDS).strip()


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_a_body_over_the_bound_is_413_as_at_the_generation_endpoints(sim: SimWorker, path: str) -> None:
    async with attached(sim):
        body = json.dumps({"content": "x" * 2000, "tokens": [1]}).encode()
        reply = await request("POST", path, body, sized(body))
        assert reply.status == 413 and reply.is_error_object(), reply.body[:300]
        assert reply.json()["error"]["code"] == "request_too_large"
        small = json.dumps({"content": "x", "tokens": [1]}).encode()
        assert (await request("POST", path, small, sized(small))).status == 200


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_a_large_body_is_parsed_off_the_event_loop(sim: SimWorker, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON of a body of megabytes holds the GIL for its parse: not on the loop thread,
    where every stream would stand still meanwhile (which thread parses, not how long)."""
    import threading

    from api import schemas

    threads: list[int] = []
    real = schemas.load_object

    def recording(raw: bytes) -> dict[str, object]:
        threads.append(threading.get_ident())
        return real(raw)

    monkeypatch.setattr(schemas, "load_object", recording)
    async with attached(sim):
        body = json.dumps({"content": "hello " * WORDS, "tokens": [1] * WORDS}).encode()
        reply = await request("POST", path, body, sized(body), timeout_s=60)
        assert reply.status == 200, reply.body[:300]
        assert threads and threading.get_ident() not in threads


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_an_empty_model_name_is_none_given(sim: SimWorker, path: str) -> None:
    """The body's ``model`` is optional here: an empty name is no name (the served model
    answers), not a 404 for a model called ""."""
    async with attached(sim):
        body = json.dumps({"content": "hello", "tokens": [1, 2], "model": ""}).encode()
        reply = await request("POST", path, body, sized(body))
        assert reply.status == 200, reply.body[:300]
