"""A batch file's upload (``POST /v1/files``) is bounded by SUPERFLUID_BATCH_MAX_FILE_BYTES plus
the multipart around the file (batches/asgi.py), not by ``--max-body-bytes``, in the protocol
layer too (api/edge.py): a file of the documented size (at most that many bytes, by default
``--max-body-bytes``) reaches the application, and a larger limit set for batch files holds.

As tests/edge/test_request_bounds.py, these drive daphne's real request object on Twisted's real
HTTP channel over an in-memory transport with a test clock."""

from __future__ import annotations

import pytest
from django.test import override_settings

from .test_request_bounds import connect, reply

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 1000


def upload(file_bytes: int, *, chunked: bool = False, path: bytes = b"/v1/files") -> tuple[bytes, bytes]:
    """The head and body of a multipart upload of a batch file of ``file_bytes`` bytes."""
    line = b'{"custom_id": "a"}'
    content = (line + b"\n") * (file_bytes // (len(line) + 1)) + b" " * (file_bytes % (len(line) + 1))
    assert len(content) == file_bytes
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
        + content + b"\r\n--b--\r\n"
    )  # fmt: skip
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1:8000", b"Content-Type: multipart/form-data; boundary=b"]
    lines.append(b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body))
    if chunked:
        body = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return b"\r\n".join(lines) + b"\r\n\r\n", body


@override_settings(SUPERFLUID_MAX_BODY_BYTES=LIMIT, SUPERFLUID_BATCH_MAX_FILE_BYTES=0)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_batch_file_of_the_largest_size_allowed_reaches_the_application(chunked: bool) -> None:
    """The file may be ``--max-body-bytes`` long (the default bound of a batch file); with its
    multipart envelope the body is longer, and the protocol layer refused it with a 413 before
    batches/asgi.py, which allows for the envelope, ever saw it."""
    server, protocol, transport, clock = connect()
    head, body = upload(LIMIT, chunked=chunked)
    protocol.dataReceived(head + body)
    assert transport.value() == b"", transport.value()[:300]
    assert len(server.scopes) == 1 and server.scopes[0]["path"] == "/v1/files"
    protocol._channel.requests[0].content.close()  # (the body a real application would read)


@override_settings(SUPERFLUID_MAX_BODY_BYTES=LIMIT, SUPERFLUID_BATCH_MAX_FILE_BYTES=10 * LIMIT)
async def test_a_batch_file_limit_above_max_body_bytes_holds() -> None:
    server, protocol, transport, clock = connect()
    head, body = upload(5 * LIMIT)
    protocol.dataReceived(head + body)
    assert transport.value() == b"" and len(server.scopes) == 1


@override_settings(SUPERFLUID_MAX_BODY_BYTES=LIMIT, SUPERFLUID_BATCH_MAX_FILE_BYTES=0)
@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/tokenize", b"/v1/files/abc"])
async def test_every_other_body_keeps_the_max_body_bytes_bound(path: bytes) -> None:
    server, protocol, transport, clock = connect()
    head, body = upload(LIMIT, path=path)
    protocol.dataReceived(head + body)
    status, error = reply(transport)
    assert status == 413 and error["error"]["code"] == "request_too_large" and server.scopes == []


@override_settings(SUPERFLUID_MAX_BODY_BYTES=LIMIT, SUPERFLUID_BATCH_MAX_FILE_BYTES=0)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_upload_beyond_its_own_bound_is_still_413_in_the_protocol_layer(chunked: bool) -> None:
    from batches.asgi import upload_limit

    server, protocol, transport, clock = connect()
    head, body = upload(upload_limit() + 1, chunked=chunked)
    protocol.dataReceived(head + body)
    status, error = reply(transport)
    assert status == 413 and error["error"]["code"] == "request_too_large" and server.scopes == []
