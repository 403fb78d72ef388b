"""Errors daphne answers itself (before the application runs) are OpenAI error objects too."""

from __future__ import annotations

import json

from api.edge import install_protocol_errors


def test_daphnes_own_400_for_a_bad_header_byte_is_a_json_error_object() -> None:
    from daphne.http_protocol import WebRequest

    original = WebRequest.basic_error
    install_protocol_errors()
    try:
        sent: list[dict[str, object]] = []

        class Fake:
            handle_reply = staticmethod(sent.append)

        WebRequest.basic_error(Fake(), 400, b"Bad Request", "Invalid header value")  # type: ignore[arg-type]
    finally:
        WebRequest.basic_error = original  # type: ignore[method-assign]
    start, body = sent
    assert start["status"] == 400 and (b"Content-Type", b"application/json") in start["headers"]  # type: ignore[operator]
    error = json.loads(body["body"])["error"]  # type: ignore[arg-type]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] == "Bad Request: Invalid header value"
