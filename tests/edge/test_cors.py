"""CORS for the origins the API accepts (``origin_allowed``: an allowed host's, or one listed in
SUPERFLUID_ALLOWED_ORIGINS): a browser's preflight is answered (no key needed, nothing reaches
the model), and every reply to such a page, errors and streams included, lets it read the
answer. A foreign or malformed origin never gets an ``Access-Control-Allow-Origin``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activity import writer as activity_writer
from activity.models import ActivityEntry

from .inproc import JSON, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)

LISTED = "https://app.example.com"  # SUPERFLUID_ALLOWED_ORIGINS in these tests
OURS = [b"http://localhost:3000", b"http://127.0.0.1:8000", LISTED.encode()]
FOREIGN = [
    b"http://evil.example",
    b"null",
    b"http://127.0.0.1.evil.example:8000",
    b"https://app.example.com.evil.example",
    b"http://localhost:3000,http://evil.example",  # two Origin values, joined
]
MALFORMED = [
    b"file://",
    b"localhost:3000",
    b"http://localhost:3000/page",
    b"http://localhost:3000?x=1",
    b"http://user@localhost:3000",
    b"http://localhost:99999",
    b"https://app.example.com/",
    b"http://localhost:3000 http://evil.example",
]
# the generation endpoints (Channels consumers) and the Django API views, with their methods
PATHS = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/infill": "POST",
    "/v1/embeddings": "POST",
    "/v1/models": "GET, HEAD",
    "/v1/models/sim": "GET, HEAD",
    "/tokenize": "POST",
    "/health": "GET, HEAD",
    "/v1/files": "GET, HEAD, POST",
    "/v1/batches": "GET, HEAD, POST",
    "/v1/batches/batch_x/cancel": "POST",
}
REQUESTED = b"authorization, content-type, x-stainless-os, openai-organization, x-superfluid-qos"


def preflight(origin: bytes, method: bytes = b"POST", requested: bytes | None = REQUESTED) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", origin), (b"access-control-request-method", method)]
    return headers + ([(b"access-control-request-headers", requested)] if requested is not None else [])


async def rows() -> list[tuple[str, int]]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.values_list("endpoint", "status"))


def exposed(reply: Any) -> set[str]:
    return {h.strip().lower() for h in reply.headers.get("access-control-expose-headers", "").split(",") if h.strip()}


def cors_free(reply: Any) -> bool:
    return not any(name.startswith("access-control-") for name in reply.headers) and "origin" not in reply.headers.get("vary", "").lower()


# -- preflights -----------------------------------------------------------------------------


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED], SUPERFLUID_KEYS_REQUIRED=True)
@pytest.mark.parametrize("path", list(PATHS))
async def test_a_preflight_from_our_origin_is_answered_without_a_key_and_never_reaches_the_model(
    sim: SimWorker, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api import consumers

    def no_link() -> None:
        raise AssertionError("a preflight reached the engine")

    async with attached(sim):
        monkeypatch.setattr(consumers, "get_link", no_link)
        monkeypatch.setattr(consumers, "get_pool", no_link)
        for origin in OURS:
            reply = await request("OPTIONS", path, b"", preflight(origin, PATHS[path].split(",")[0].encode()))
            assert reply.status == 204, (path, origin, reply.status, reply.body[:200])
            assert reply.headers["access-control-allow-origin"] == origin.decode()
            assert "origin" in reply.headers["vary"].lower()
            assert reply.headers["access-control-allow-methods"] == PATHS[path]
            allowed = {h.strip().lower() for h in reply.headers["access-control-allow-headers"].split(",")}
            assert {"authorization", "content-type", "x-stainless-os", "openai-organization", "x-superfluid-qos"} <= allowed
            assert int(reply.headers["access-control-max-age"]) > 0
            assert "access-control-allow-credentials" not in reply.headers
            assert reply.body == b""
        # a preflight without requested headers still names those a client sends
        reply = await request("OPTIONS", path, b"", preflight(OURS[0], requested=None))
        assert reply.status == 204
        allowed = {h.strip().lower() for h in reply.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type", "x-api-key"} <= allowed
    assert await rows() == []  # a preflight is no request of the activity log's


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/files"])
async def test_a_preflight_from_a_foreign_origin_is_refused_and_a_plain_options_is_what_it_was(sim: SimWorker, path: str) -> None:
    async with attached(sim):
        reply = await request("OPTIONS", path, b"", preflight(b"http://evil.example"))
        assert reply.status == 403 and reply.json()["error"]["code"] == "origin_forbidden"
        assert cors_free(reply)
        plain = await request("OPTIONS", path)  # no Origin: no preflight, as before
        assert plain.status == 405 and plain.json()["error"]["code"] == "method_not_allowed"
        assert cors_free(plain)
        # Origin without Access-Control-Request-Method: no preflight either
        ours = await request("OPTIONS", path, b"", [(b"origin", b"http://localhost:3000")])
        assert ours.status == 405 and ours.headers["access-control-allow-origin"] == "http://localhost:3000"


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED])
@pytest.mark.parametrize("origin", FOREIGN + MALFORMED)
async def test_a_foreign_or_malformed_origin_never_gets_an_allow_origin(sim: SimWorker, origin: bytes) -> None:
    async with attached(sim):
        for path in ("/v1/chat/completions", "/v1/models", "/tokenize", "/v1/nowhere"):
            reply = await request("OPTIONS", path, b"", preflight(origin))
            assert reply.status != 204 and cors_free(reply), (path, reply.status, reply.headers)
        for method, path, body in (("POST", "/v1/chat/completions", chat_body(max_tokens=1)), ("GET", "/v1/models", b""), ("POST", "/v1/nowhere", b"")):
            reply = await request(method, path, body, [*JSON, (b"origin", origin)])
            assert cors_free(reply), (path, reply.status, reply.headers)


# -- actual replies ------------------------------------------------------------------------


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED])
async def test_a_reply_to_our_origin_lets_the_page_read_it_whole_and_streamed(sim: SimWorker) -> None:
    origin = [(b"origin", LISTED.encode())]
    async with attached(sim):
        plain = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2, frobnicate=1), [*JSON, *origin])
        streamed = await request("POST", "/v1/completions", b'{"model": "sim", "prompt": "hi", "max_tokens": 2, "stream": true}', [*JSON, *origin])
        models = await request("GET", "/v1/models", b"", origin)
        for reply in (plain, streamed, models):
            assert reply.status == 200, reply.body[:200]
            assert reply.headers["access-control-allow-origin"] == LISTED
            assert "origin" in reply.headers["vary"].lower()
            assert "access-control-allow-credentials" not in reply.headers
        assert streamed.headers["content-type"].startswith("text/event-stream") and streamed.sse_data()[-1] == "[DONE]"
        for reply in (plain, streamed):
            assert {"x-request-id", "x-superfluid-qos", "x-superfluid-ignored-params", "retry-after"} <= exposed(reply)
        # without Origin (curl, an SDK): nothing changes
        bare = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        assert bare.status == 200 and cors_free(bare)
        assert cors_free(await request("GET", "/v1/models"))


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED], SUPERFLUID_KEYS_REQUIRED=True)
async def test_an_error_reply_to_our_origin_is_readable_by_the_page(sim: SimWorker) -> None:
    origin = [(b"origin", b"http://localhost:3000")]
    async with attached(sim):
        for method, path, body in (
            ("POST", "/v1/chat/completions", chat_body(max_tokens=1)),
            ("POST", "/v1/embeddings", b'{"model": "sim", "input": "hi"}'),
            ("GET", "/v1/models", b""),
            ("GET", "/v1/files", b""),
            ("POST", "/v1/nowhere", b""),
        ):
            reply = await request(method, path, body, [*JSON, *origin])
            assert reply.status in (401, 404), (path, reply.status)
            assert reply.is_error_object()
            assert reply.headers["access-control-allow-origin"] == "http://localhost:3000", path
            assert "origin" in reply.headers["vary"].lower()


@override_settings(SUPERFLUID_RATE_LIMIT=1, SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_429_and_a_413_to_our_origin_are_readable_with_their_retry_after(sim: SimWorker) -> None:
    origin = [(b"origin", b"http://localhost:3000")]
    async with attached(sim):
        assert (await request("POST", "/v1/chat/completions", chat_body(max_tokens=1), [*JSON, *origin])).status == 200
        limited = await request("POST", "/v1/chat/completions", chat_body(max_tokens=1), [*JSON, *origin])
        assert limited.status == 429 and "retry-after" in limited.headers
        assert limited.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert {"retry-after", "x-request-id"} <= exposed(limited)
        big = await request("POST", "/v1/completions", b'{"prompt": "' + b"x" * 2000 + b'"}', [*JSON, *origin])
        assert big.status == 413 and big.headers["access-control-allow-origin"] == "http://localhost:3000"


# -- the pure decision, for any text a client may send as Origin --------------------------

SERIALIZED_OURS = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)


def acceptable(origin: str) -> bool:
    """An independent statement of who may get CORS: a serialized origin (scheme, host, port;
    no path, user or whitespace) on an allowed host with a real port, or the listed one."""
    if origin == LISTED:
        return True
    match = SERIALIZED_OURS.fullmatch(origin)
    return match is not None and (match.group(2) is None or 0 <= int(match.group(2)[1:]) <= 65535)


origin_text = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60),
    st.builds(
        "{}{}{}{}".format,
        st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "//", "http:/", ""]),
        st.sampled_from(["localhost", "127.0.0.1", "[::1]", "app.example.com", "evil.example", "localhost.evil.example", "user@localhost", ""]),
        st.sampled_from(["", ":3000", ":99999", ":", ":0", ":-1", ":3000 "]),
        st.sampled_from(["", "/", "/x", "?a", "#f", ",http://evil.example", " ", "\t", "%00"]),
    ),
)


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(origin=origin_text)
def test_only_a_well_formed_origin_of_ours_is_ever_allowed(origin: str) -> None:
    from api.edge import cors_origin

    got = cors_origin(origin)
    assert got is None or (got == origin.strip() and acceptable(got)), (origin, got)
    if acceptable(origin):
        assert got == origin


@override_settings(SUPERFLUID_ALLOWED_ORIGINS=[LISTED])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(origin=origin_text, preflighting=st.booleans())
def test_a_django_api_view_gives_an_allow_origin_only_to_an_acceptable_origin(origin: str, preflighting: bool) -> None:
    headers = {"HTTP_ORIGIN": origin, **({"HTTP_ACCESS_CONTROL_REQUEST_METHOD": "GET"} if preflighting else {})}
    # a preflight is answered (or refused) before the view; the GET is a 404 of the router's
    path = "/v1/batches/batch_x/cancel" if preflighting else "/v1/nowhere"
    reply = Client(HTTP_HOST="127.0.0.1:8000").generic("OPTIONS" if preflighting else "GET", path, **headers)
    if "Access-Control-Allow-Origin" in reply.headers:
        assert acceptable(origin.strip()) and reply.headers["Access-Control-Allow-Origin"] == origin.strip()
    elif acceptable(origin):
        pytest.fail(f"{origin!r} was not allowed")


# -- refusals in the protocol layer, before the application (api/edge.py) ----------------------


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000, SUPERFLUID_BODY_TIMEOUT=30)
@pytest.mark.parametrize("origin", [b"http://localhost:3000", b"http://evil.example", None])
async def test_a_413_or_408_answered_before_the_application_is_readable_by_our_origin_only(origin: bytes | None) -> None:
    from .test_request_bounds import connect, head

    def answer(raw: bytes) -> tuple[int, dict[str, str]]:
        status_line, _, rest = raw.partition(b"\r\n")
        lines = rest.partition(b"\r\n\r\n")[0].split(b"\r\n")
        return int(status_line.split()[1]), {k.decode().lower(): v.decode().strip() for k, _, v in (line.partition(b":") for line in lines)}

    extra = b"Origin: " + origin + b"\r\n" if origin is not None else b""
    for status, data, wait_s in ((413, head(10**12).replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n"), 0), (408, head(len(b"{}")).replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n"), 30)):
        _server, protocol, transport, clock = connect()
        protocol.dataReceived(data)
        clock.advance(wait_s)
        got, headers = answer(transport.value())
        assert got == status
        if origin == b"http://localhost:3000":
            assert headers["access-control-allow-origin"] == origin.decode() and "retry-after" in headers["access-control-expose-headers"]
        else:
            assert not any(name.startswith("access-control-") for name in headers)
