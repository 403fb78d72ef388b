"""Errors daphne answers itself (before the application runs) are OpenAI error objects too."""

from __future__ import annotations

import json

import pytest

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


async def test_an_application_that_fails_after_its_headers_cuts_its_reply_short_and_the_checker_runs_on(
    json_protocol_errors: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """daphne's application checker (each second: reap finished applications, answer a crash with
    a 500, kill one whose client left long ago) answers a failed application with basic_error,
    whose response start raised "HTTP response has already been started" when the reply had
    begun: the exception escaped the checker before it scheduled its next run, so from then on
    no crashed application was answered (its client waited for ever) and none was reaped. The
    reply cannot become a 500 then: it is cut short (no last chunk), and the checker goes on."""
    import asyncio
    from types import SimpleNamespace

    from daphne import server as daphne_server
    from twisted.internet.task import Clock

    from .test_request_bounds import BODY, connect, head

    _server, protocol, transport, _clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY)
    request = protocol._channel.requests[0]
    request.handle_reply({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    request.handle_reply({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("a failure after the headers"))
    checker_clock = Clock()
    monkeypatch.setattr(daphne_server, "reactor", checker_clock)
    daphne = SimpleNamespace(connections={request: {"application_instance": failed}}, application_close_timeout=10, application_checker=lambda: None)
    daphne_server.Server.application_checker(daphne)  # type: ignore[arg-type]
    assert len(checker_clock.getDelayedCalls()) == 1  # it runs again in a second
    raw = transport.value()
    assert raw.count(b"HTTP/1.1 ") == 1 and b"data: {}" in raw and not raw.endswith(b"0\r\n\r\n")  # cut short, not a whole reply
    assert transport.disconnecting
