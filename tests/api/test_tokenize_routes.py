"""llama-server's /tokenize and /detokenize in-process (tests/edge/inproc.py), bodies of the
largest size included: their JSON is read, checked and written off the event loop, in slices
(measured with a 5 ms ticker on this 2-core machine: the loop's longest stall 0.67-0.71 s before,
~0.10 s after, for /tokenize with pieces; 0.44-0.63 s and ~0.08 s for /detokenize; speed is
measured there, not asserted here)."""

from __future__ import annotations

import json

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

TOKENS = 1_300_000  # "hello " each: 7.8 MB of text, under --max-body-bytes (8 MiB)


async def test_tokenize_with_pieces_of_the_largest_body_answers_every_token() -> None:
    """The reply of a million tokens with their pieces (it was one json.dumps, in a thread but
    holding the GIL: the event loop stood still ~0.7 s, every stream with it)."""
    async with attached(SimWorker()):
        assert (await request("POST", "/tokenize", b'{"content": "warm"}', JSON)).status == 200  # the vocabulary read
        body = json.dumps({"content": "hello " * TOKENS, "with_pieces": True}).encode()
        headers = [*JSON, (b"content-length", str(len(body)).encode())]
        reply = await request("POST", "/tokenize", body, headers, timeout_s=120)
        assert reply.status == 200 and reply.headers["content-type"] == "application/json"
        tokens = reply.json()["tokens"]
        assert len(tokens) >= TOKENS and tokens[1] == {"id": tokens[1]["id"], "piece": " hello"}


@pytest.mark.parametrize("with_pieces", [False, True])
async def test_tokenize_replies_are_the_same_json_as_before(with_pieces: bool) -> None:
    async with attached(SimWorker()):
        for content in ("", "héllo 😀 <|im_start|>", "x " * 5000):
            body = json.dumps({"content": content, "with_pieces": with_pieces}).encode()
            reply = await request("POST", "/tokenize", body, JSON)
            assert reply.status == 200
            tokens = json.loads(reply.body)["tokens"]
            assert reply.body == json.dumps({"tokens": tokens}).encode()
            if with_pieces:  # a piece that is not whole UTF-8 is its bytes, as llama-server gives it
                assert all(isinstance(t["piece"], (str, list)) for t in tokens)
            assert (content == "") == (tokens == [])


async def test_detokenize_of_a_million_ids_answers_their_text() -> None:
    """(The body's parse and its checks ran on the event loop: ~0.6 s still.)"""
    async with attached(SimWorker()):
        assert (await request("POST", "/tokenize", b'{"content": "warm"}', JSON)).status == 200
        hello = (await request("POST", "/tokenize", b'{"content": " hello"}', JSON)).json()["tokens"]
        body = json.dumps({"tokens": hello * 1_000_000}).encode()
        headers = [*JSON, (b"content-length", str(len(body)).encode())]
        reply = await request("POST", "/detokenize", body, headers, timeout_s=120)
        assert reply.status == 200 and reply.json()["content"] == " hello" * 1_000_000


@pytest.mark.parametrize(
    ("tokens", "code"),
    [([-1], "invalid_value"), ([49152], "invalid_value"), ([10**30], "invalid_value"), ([True], "invalid_type"), ([1.0], "invalid_type"), ("1", "invalid_type")],
)
async def test_detokenize_refuses_ids_outside_the_vocabulary_and_non_integers(tokens: object, code: str) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/detokenize", json.dumps({"tokens": tokens}).encode(), JSON)
        assert reply.status == 400 and reply.is_error_object() and reply.json()["error"]["code"] == code, reply.body
        assert reply.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize(
    ("path", "body", "answer"),
    [
        ("/tokenize", b"{}", {"tokens": []}),
        ("/tokenize", b'{"add_special": true, "with_pieces": true}', {"tokens": []}),
        ("/tokenize", b"", {"tokens": []}),
        ("/detokenize", b"{}", {"content": ""}),
        ("/detokenize", b'{"model": "sim"}', {"content": ""}),
    ],
)
async def test_a_body_without_content_or_tokens_answers_empty_as_llama_server(path: str, body: bytes, answer: dict[str, object]) -> None:
    """llama-server tokenizes ``content`` only where the body has it (``body.count("content")``),
    else answers ``{"tokens": []}``; /detokenize without ``tokens`` answers ``{"content": ""}``.
    They were 400 ``invalid_type``."""
    async with attached(SimWorker()):
        reply = await request("POST", path, body, JSON)
        assert reply.status == 200, reply.body
        assert reply.json() == answer


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", b'{"content": null}', "content"),
        ("/tokenize", b'{"content": 5}', "content"),
        ("/tokenize", b'{"with_pieces": "yes"}', "with_pieces"),
        ("/detokenize", b'{"tokens": null}', "tokens"),
        ("/detokenize", b'{"tokens": {"a": 1}}', "tokens"),
    ],
)
async def test_a_field_of_the_wrong_type_is_still_400(path: str, body: bytes, param: str) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", path, body, JSON)
        assert reply.status == 400 and reply.is_error_object(), reply.body
        assert reply.json()["error"]["param"] == param and reply.json()["error"]["code"] == "invalid_type"
