"""Errors daphne answers itself (before the application runs) are OpenAI error objects too."""

from __future__ import annotations

import json

from api.edge import install_protocol_errors


def test_daphnes_own_400_for_a_bad_header_byte_is_a_json_error_object() -> None:
    from daphne.http_protocol import WebRequest
    from twisted.web.http import HTTPChannel

    original = WebRequest.basic_error
    original_channel = HTTPChannel._respondToBadRequestAndDisconnect
    install_protocol_errors()
    try:
        sent: list[dict[str, object]] = []

        class Fake:
            handle_reply = staticmethod(sent.append)

        WebRequest.basic_error(Fake(), 400, b"Bad Request", "Invalid header value")  # type: ignore[arg-type]
        request = WebRequest.__new__(WebRequest)
        request._parsePOSTFormSubmission = True  # what Twisted's Request.__init__ sets
        assert request._parsePOSTFormSubmission is False  # a multipart body reaches the application
        written: list[bytes] = []

        class Channel:
            transport = type("T", (), {"write": staticmethod(written.append)})()
            loseConnection = staticmethod(lambda: None)

        HTTPChannel._respondToBadRequestAndDisconnect(Channel())  # type: ignore[arg-type]
    finally:
        WebRequest.basic_error = original  # type: ignore[method-assign]
        HTTPChannel._respondToBadRequestAndDisconnect = original_channel  # type: ignore[method-assign]
        del WebRequest._parsePOSTFormSubmission
    head, _, payload = written[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert set(json.loads(payload)["error"]) == {"message", "type", "param", "code"}
    start, body = sent
    assert start["status"] == 400 and (b"Content-Type", b"application/json") in start["headers"]  # type: ignore[operator]
    error = json.loads(body["body"])["error"]  # type: ignore[arg-type]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] == "Bad Request: Invalid header value"
