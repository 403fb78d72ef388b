"""A body sent compressed (``Content-Encoding: gzip``, as an HTTP client configured to compress
its uploads sends it) is refused with 415 naming the encoding, on the generation routes and on
the API's other routes that read a body. The server reads bodies as they are sent: a gzipped
chat request was answered "We could not parse the JSON body of your request", which sent its
author looking for a bug in JSON that was fine. Nothing it carried reaches the worker."""

from __future__ import annotations

import gzip
import json

import pytest

from .inproc import JSON, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/infill", "/tokenize", "/v1/files", "/v1/batches"])
@pytest.mark.parametrize("coding", [b"gzip", b"br", b"deflate, gzip", b"GZIP"])
async def test_a_compressed_body_is_a_415_naming_its_encoding(sim: SimWorker, path: str, coding: bytes) -> None:
    body = gzip.compress(chat_body("hi", max_tokens=2) if "completions" in path else json.dumps({"content": "hi"}).encode())
    async with attached(sim) as (link, _rt):
        reply = await request("POST", path, body, [*JSON, (b"content-encoding", coding)])
        assert reply.status == 415 and reply.is_error_object(), (reply.status, reply.body)
        error = reply.json()["error"]
        assert error["code"] == "unsupported_content_encoding" and coding.decode() in error["message"], error
        assert link.worker.stats["requests_total"] == 0 and not link.worker.contexts  # type: ignore[attr-defined]


@pytest.mark.parametrize("coding", [b"identity", b"", b" identity "])
async def test_an_identity_encoding_is_a_body_as_sent(sim: SimWorker, coding: bytes) -> None:
    async with attached(sim):
        reply = await request("POST", "/v1/chat/completions", chat_body("hi", max_tokens=2), [*JSON, (b"content-encoding", coding)])
        assert reply.status == 200, reply.body


async def test_a_get_that_names_an_encoding_reads_no_body_and_is_answered(sim: SimWorker) -> None:
    async with attached(sim):
        reply = await request("GET", "/v1/models", b"", [(b"content-encoding", b"gzip")])
        assert reply.status == 200 and reply.json()["object"] == "list", reply.body
