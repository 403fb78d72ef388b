"""What every reply at the API's edge shares: JSON errors, allowed methods, Host and Origin.

Django's own 400/403/404/405/500 pages are HTML; under the API's paths (``/v1``, ``/health``,
``/slots``, ``/metrics``) every one of them is an OpenAI error object instead. The generation
endpoints are Channels consumers, which Django's Host check never sees: ``check_host_and_origin``
gives them the same check, and refuses a browser request from a page whose origin is not one of
ours (a DNS-rebinding or cross-site page driving the keyless loopback default: the class of
Ollama's CVE-2024-28224).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import split_domain_port, validate_host
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from scheduler.engines.chat import chat_text_chars
from superfluid_site.serving import serving

from .errors import (
    ApiError,
    anthropic_error_body,
    method_not_allowed,
    not_found,
    request_timeout,
    request_too_large,
    server_error,
    unsupported_content_encoding,
)
from .schemas import MAX_CHARS_PER_TOKEN

# /infill, /completion(s): llama-server's native generation routes (consumers); what Django
# answers below them (/infill/, a bad Host there) was its HTML page
API_PREFIXES = (
    "/v1", "/health", "/slots", "/metrics", "/tokenize", "/detokenize", "/props", "/infill", "/completion", "/completions",
    "/apply-template", "/running", "/unload", "/api/models", "/responses",
    # llama-server's names without /v1, its native embeddings, the routes it answers 501 when not enabled
    "/chat/completions", "/models", "/embedding", "/embeddings", "/rerank", "/reranking", "/lora-adapters",
)  # fmt: skip


def one_leading_slash(path: str) -> str:
    """``path`` with its leading slashes as one, as Channels' router takes them (it serves
    ``//v1/chat/completions``)."""
    return "/" + path.lstrip("/")


def is_api_path(path: str) -> bool:
    # leading slashes as one, as the router takes them: Django's 404 for //v1/models was its HTML page
    path = one_leading_slash(path)
    return any(path == p or path.startswith(p + "/") for p in API_PREFIXES)


def error_response(exc: ApiError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for key, value in (exc.headers or {}).items():
        response[key] = str(value)
    return response


def api_route(methods: Iterable[str] = ("GET", "HEAD")) -> Callable[[Callable[..., Awaitable[HttpResponse]]], Callable[..., Awaitable[HttpResponse]]]:
    """An API view: no CSRF token (callers authenticate with a bearer key, never a cookie), but
    a browser request from a foreign origin is refused as at the consumers (on loopback without
    keys, any page the user opens could otherwise upload files or unload models); a preflight
    from an allowed origin is 204 before any key is looked at (CORS, below); a JSON 405 with
    ``Allow`` for any other method."""
    allowed = tuple(methods)

    def wrap(view: Callable[..., Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
        @functools.wraps(view)
        async def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                check_origin(request.headers.get("origin"))
            except ApiError as exc:
                return error_response(exc)
            preflight = preflight_response(request, allowed)
            if preflight is not None:
                return preflight
            if request.method not in allowed:
                return error_response(method_not_allowed(request.method or "", allowed, request.path))
            try:
                if request.method == "POST":  # the one method here whose body is read
                    check_content_encoding(request.headers.get("content-encoding"))
            except ApiError as exc:
                return error_response(exc)
            return await view(request, *args, **kwargs)

        return csrf_exempt(inner)

    return wrap


@csrf_exempt
async def unknown_route(request: HttpRequest, rest: str = "") -> JsonResponse:
    return error_response(not_found(request.path, request.method))


# -- Django's error handlers (superfluid_site/urls.py): JSON under the API's paths ------------


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.bad_request(request, exception)  # type: ignore[arg-type]
    # the Host header is the usual cause (DisallowedHost); request.get_host() would raise again
    message = str(exception) if exception is not None and "HTTP_HOST" in str(exception) else "The request could not be understood."
    return error_response(ApiError(400, message, code="invalid_host" if "HTTP_HOST" in message else "bad_request"))


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.permission_denied(request, exception)  # type: ignore[arg-type]
    return error_response(ApiError(403, "You may not access this resource.", type="permission_error", code="forbidden"))


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.page_not_found(request, exception)  # type: ignore[arg-type]
    return error_response(not_found(request.path, request.method))


def server_failure(request: HttpRequest) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.server_error(request)
    return error_response(server_error())


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if not is_api_path(request.path):
        from django.views.csrf import csrf_failure as django_csrf_failure

        return django_csrf_failure(request, reason)
    return error_response(ApiError(403, f"CSRF verification failed: {reason}", type="permission_error", code="forbidden"))


# -- Host and Origin for the Channels consumers ------------------------------------------------


def allowed_hosts() -> list[str]:
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:  # what Django itself allows in this case
        hosts = [".localhost", "127.0.0.1", "[::1]"]
    return hosts


def host_allowed(host: str) -> bool:
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed_hosts())


def origin_allowed(origin: str) -> bool:
    """An ``Origin`` is ours when its host is an allowed host (any port, as Channels' own
    AllowedHostsOriginValidator decides) or it is listed in SUPERFLUID_ALLOWED_ORIGINS.
    ``null`` (a sandboxed frame, a file:// page) never is."""
    origin = origin.strip()
    if origin in getattr(settings, "SUPERFLUID_ALLOWED_ORIGINS", ()):
        return True
    try:
        parts = urlsplit(origin)
        hostname = parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not hostname:
        return False
    if ":" in hostname:  # an IPv6 literal: ALLOWED_HOSTS spells it in brackets
        hostname = f"[{hostname}]"
    return validate_host(hostname, allowed_hosts())


def check_host_and_origin(headers: dict[str, str], scope: dict[str, Any]) -> None:
    """400 ``invalid_host`` for a Host outside ALLOWED_HOSTS, 403 ``origin_forbidden`` for a
    browser request from a foreign origin; as Django does, a missing Host falls back to the
    address the server listens on, and a header sent more than once is its values joined with
    commas (so ``Host: evil`` before ``Host: ours`` is refused here as Django's views refuse it,
    not judged by the last alone)."""
    host, origin = joined_header(scope, b"host", headers), joined_header(scope, b"origin", headers)
    if host is None:
        server = scope.get("server")
        host = f"{server[0]}:{server[1]}" if server and server[1] is not None else (str(server[0]) if server else "")
    if not host_allowed(host):
        raise ApiError(400, f"Invalid HTTP_HOST header: {host!r}. You may need to add it to DJANGO_ALLOWED_HOSTS.", code="invalid_host")
    check_origin(origin)


def joined_header(scope: dict[str, Any], name: bytes, headers: dict[str, str]) -> str | None:
    """Every value of header ``name`` in the scope, joined with commas (Django's META does the
    same); ``headers`` when the scope carries none (an in-process caller's)."""
    values = [v.decode("latin-1") for k, v in scope.get("headers") or [] if k.lower() == name]
    if not values:
        return headers.get(name.decode())
    return ",".join(values)


def check_content_encoding(coding: str | None) -> None:
    """415 for a body sent compressed (``Content-Encoding: gzip``, several joined with commas):
    bodies are read as sent, and a gzipped one was reported as JSON that does not parse."""
    if coding is not None and any(c.strip().lower() not in ("", "identity") for c in coding.split(",")):
        raise unsupported_content_encoding(coding.strip())


def check_origin(origin: str | None) -> None:
    """403 ``origin_forbidden`` for a browser request (it sends ``Origin``) from a page that is
    not ours; a request without ``Origin`` (curl, an SDK) passes."""
    if origin is not None and not origin_allowed(origin):
        raise ApiError(403, f"Requests from the origin {origin!r} are not allowed.", type="permission_error", code="origin_forbidden", param="origin")


# -- CORS for the origins we accept ------------------------------------------------------------
# CORS for the browser origins the API accepts (``origin_allowed``: an allowed host's, or
# one listed in SUPERFLUID_ALLOWED_ORIGINS). Without it a page from such an origin could send a
# request but never read the answer, and its preflight (``OPTIONS`` with
# ``Access-Control-Request-Method``, sent before any request carrying a key or a JSON body) got
# 405, or 401 where keys are required, so the request itself was never sent.
#
# A preflight from an accepted origin is 204 with the methods its path takes, the headers asked
# for and a max age, before any key is looked at; every reply to a request from such an origin
# (errors and streams included) names that origin in ``Access-Control-Allow-Origin`` and exposes
# the headers a client reads. Keys travel in headers, never in cookies: no
# ``Access-Control-Allow-Credentials``. A request without ``Origin`` is answered as before; a
# foreign origin keeps its 403 ``origin_forbidden`` and gets no CORS header.

CORS_MAX_AGE_S = 600
# what a client reads from a reply: the request's id, its class, the parameters it ignored, how
# long to wait after a 429 or 503, the methods a 405 allows
CORS_EXPOSED = ("x-request-id", "x-superfluid-qos", "x-superfluid-ignored-params", "retry-after", "allow")
# allowed on a preflight that names none: what the openai SDKs and the API's own headers use
CORS_REQUEST_HEADERS = (
    "authorization, content-type, x-api-key, x-superfluid-qos, x-llamaswap-priority, x-superfluid-batch-invariant, "
    "x-superfluid-pin-prefix, last-event-id, openai-organization, openai-project, openai-beta, x-stainless-arch, "
    "x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-retry-count, x-stainless-runtime, "
    "x-stainless-runtime-version, x-stainless-timeout"
)
# a serialized origin (RFC 6454): scheme, host, port; no user, path, query or fragment
_SERIALIZED = re.compile(r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{1,5})?", re.IGNORECASE)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name


def cors_origin(origin: str | None) -> str | None:
    """``origin`` (stripped) when it is a well-formed origin the API accepts, else None: a
    foreign one, ``null``, or something no browser sends (a path, a user, two origins, a port
    beyond 65535) never gets an ``Access-Control-Allow-Origin``."""
    if origin is None:
        return None
    origin = origin.strip()
    if not _SERIALIZED.fullmatch(origin):
        return None
    try:
        urlsplit(origin).port  # noqa: B018 (a port beyond 65535 raises)
    except ValueError:
        return None
    return origin if origin_allowed(origin) else None


def is_preflight(method: str | None, origin: str | None, request_method: str | None) -> bool:
    return method == "OPTIONS" and origin is not None and request_method is not None


def cors_request_headers(requested: str | None) -> str:
    """The header names a preflight asked for (names only, so echoing them allows no more than
    the page could send anyway); the usual ones when it asked for none."""
    names = [name.strip().lower() for name in (requested or "").split(",")]
    names = [name for name in names if _TOKEN.fullmatch(name)]
    return ", ".join(dict.fromkeys(names)) if names else CORS_REQUEST_HEADERS


def cors_preflight_headers(origin: str, methods: Iterable[str], requested: str | None) -> list[tuple[str, str]]:
    """The headers of a 204 answering a preflight from ``origin`` (an allowed one)."""
    return [
        ("Access-Control-Allow-Origin", origin),
        ("Vary", "Origin"),
        ("Access-Control-Allow-Methods", ", ".join(methods)),
        ("Access-Control-Allow-Headers", cors_request_headers(requested)),
        ("Access-Control-Max-Age", str(CORS_MAX_AGE_S)),
    ]


def cors_headers(origin: str | None) -> list[tuple[str, str]]:
    """The headers every reply to a request from ``origin`` carries: none unless it is allowed."""
    allowed = cors_origin(origin)
    if allowed is None:
        return []
    return [("Access-Control-Allow-Origin", allowed), ("Vary", "Origin"), ("Access-Control-Expose-Headers", ", ".join(CORS_EXPOSED))]


def with_cors_headers(headers: Iterable[tuple[bytes, bytes]], origin: str | None) -> list[tuple[bytes, bytes]]:
    """ASGI ``headers`` plus ``cors_headers(origin)`` (those a preflight's reply has already
    set are not repeated)."""
    out = list(headers)
    have = {name.lower() for name, _ in out}
    for name, value in cors_headers(origin):
        if name.lower().encode() not in have:
            out.append((name.lower().encode(), value.encode("latin-1")))
    return out


def preflight_response(request: HttpRequest, methods: Iterable[str]) -> HttpResponse | None:
    """A Django view's answer to a preflight from an allowed origin; None for any other request."""
    origin = cors_origin(request.headers.get("origin"))
    if origin is None or not is_preflight(request.method, origin, request.headers.get("access-control-request-method")):
        return None
    response = HttpResponse(status=204)
    for name, value in cors_preflight_headers(origin, methods, request.headers.get("access-control-request-headers")):
        response[name] = value
    return response


class _ReplyMiddleware:
    """A middleware that sees each request before its view (``before``) and the reply Django
    answers after it (``after``: the view's, or its 404, 405 or 500), sync or async alike."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        self.before(request)
        return self.after(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        self.before(request)
        response: Awaitable[HttpResponse] = self.get_response(request)
        return self.after(request, await response)

    def before(self, request: HttpRequest) -> None:
        pass

    def after(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        return response


class CorsMiddleware(_ReplyMiddleware):
    """The CORS headers of every reply under the API's paths that Django answers (its views, its
    404s, 405s and 500s; settings.MIDDLEWARE); the consumers add their own (api/consumers.py)."""

    def after(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if not is_api_path(request.path) or "origin" not in request.headers:
            return response
        for name, value in cors_headers(request.headers.get("origin")):
            if name == "Vary":
                patch_vary_headers(response, ("Origin",))
            elif not response.has_header(name):
                response[name] = value
        return response


class RequestIdMiddleware(_ReplyMiddleware):
    """An ``X-Request-Id`` on every reply Django answers (its views, 404s, 405s and 500s), as the
    consumers give every reply of theirs one (api/consumers.py): ``request.request_id``, set
    before the view runs, so the traceback of a view's uncaught exception names it too
    (settings.LOGGING's ``uncaught`` filter) and a client's report of a 500 finds its log lines."""

    def before(self, request: HttpRequest) -> None:
        request.request_id = uuid.uuid4().hex  # type: ignore[attr-defined]

    def after(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if not response.has_header("X-Request-Id"):
            response["X-Request-Id"] = request.request_id  # type: ignore[attr-defined]
        return response


# -- daphne's own errors -----------------------------------------------------------------------


def protocol_error_reply(status: int, status_text: bytes, detail: str, request_id: str | None = None) -> list[dict[str, Any]]:
    """The ASGI messages for an error daphne answers itself, before any application runs (an
    invalid header name or value, a path that is not ASCII, an application that failed to
    start): an OpenAI error object instead of daphne's HTML page."""
    exc = ApiError(status, f"{status_text.decode('ascii', 'replace')}: {detail}", type="invalid_request_error" if status < 500 else "server_error", code="bad_request" if status < 500 else None)
    return [
        {"type": "http.response.start", "status": status, "headers": [(b"Content-Type", b"application/json"), *([(b"X-Request-Id", request_id.encode())] if request_id else [])]},
        {"type": "http.response.body", "body": json.dumps(exc.body()).encode()},
    ]


def install_protocol_errors() -> None:
    """Make daphne's server-level error pages JSON (``serve`` calls this before it starts)."""
    from daphne.http_protocol import WebRequest

    def basic_error(self: Any, status: int, status_text: bytes, body: str) -> None:
        if getattr(self, "_response_started", False) and not self.finished:
            # the application failed after its reply began (daphne's checker calls this): no
            # error can replace that reply, and starting one raised out of the checker, which
            # then never ran again (no crash answered, no application reaped). The reply is cut
            # short instead, its last chunk never sent, so the client sees it incomplete.
            if self.channel is not None:
                self.channel.loseConnection()
            return
        for message in protocol_error_reply(status, status_text, body, edge_request_id(self)):
            self.handle_reply(message)
        if getattr(self, "application_queue", None) is None:
            # daphne refused it before the application saw it (a header byte or name, the path or
            # query string): its row and count say so, as for Twisted's own 400s
            _record_unprocessed(self, status, "bad_request" if status < 500 else "server_error")

    WebRequest.basic_error = basic_error
    # Twisted would parse a multipart or form body itself and, when it is not one, answer an
    # empty 400; the application reads bodies itself, so leave them to it
    WebRequest._parsePOSTFormSubmission = property(lambda self: False, lambda self, value: None)

    from twisted.web.http import HTTPChannel

    def bad_request_and_disconnect(self: Any) -> None:
        # a request line, header or chunk Twisted cannot parse: still an error object, then close
        refuse_unparsable(self, unparsable("The HTTP request could not be parsed."))

    def line_length_exceeded(self: Any, line: bytes) -> None:
        # a request line or header line over Twisted's limit: LineReceiver's default closes the
        # connection without a word
        if getattr(self, "_HTTPChannel__first_line", 0):
            self._sf_line = line  # the request line: its path names the request's row
        refuse_unparsable(self, unparsable(f"A request line or header line is longer than {self.MAX_LENGTH} bytes."))

    _replace(HTTPChannel, _respondToBadRequestAndDisconnect=bad_request_and_disconnect, lineLengthExceeded=line_length_exceeded)
    install_request_bounds()


def _replace(cls: type, **methods: Any) -> None:
    """Put ``methods`` on daphne's or Twisted's ``cls`` in place of its own."""
    for name, method in methods.items():
        setattr(cls, name, method)


def unparsable(detail: str) -> ApiError:
    """400 ``bad_request``: HTTP the server cannot parse (answered before any route)."""
    return ApiError(400, f"Bad Request: {detail}", code="bad_request")


def refuse_unparsable(channel: Any, exc: ApiError) -> None:
    """Answer ``exc`` for the request Twisted is parsing on ``channel`` and close the connection.
    That request's answer is this one: its arrival deadline (and the channel's request-line
    deadline) is cancelled, so no 408 follows the 400 on a connection whose client is slow to
    read it, and its activity row says ``bad_request`` rather than ``client_disconnected``. A
    request already answered (refused) or being answered gets no second reply."""
    _cancel_deadline(channel, name="_sf_line_deadline")
    request = channel.requests[-1] if getattr(channel, "requests", None) else None
    if request is not None and (getattr(request, "_sf_refused", False) or getattr(request, "_sf_processing", False)):
        channel.loseConnection()
        return
    if request is not None:
        request._sf_refused = True
        _cancel_deadline(request)
        _drop_body(request)
        _record_unprocessed(request, exc.status, exc.code or exc.type)
        request_id = edge_request_id(request)
    else:
        # a request line too long for Twisted to make a request of: an id all the same, and the
        # row of the generation request its line names
        request_id = uuid.uuid4().hex
        record_line_refusal(channel, line_target(getattr(channel, "_sf_line", b"")), exc.status, exc.code or exc.type, request_id)
    if channel.transport is not None:
        path = _request_path(request) if request is not None else line_target(getattr(channel, "_sf_line", b""))
        channel.transport.write(raw_error_reply(exc, request_id=request_id, path=path))
    channel.loseConnection()


def record_line_refusal(channel: Any, target: bytes, status: int, code: str, request_id: str) -> None:
    """``record_edge_refusal`` for a request refused before Twisted made a request of it (its
    request line too long, or not whole in time): ``target``, its path from the line."""
    started = getattr(channel, "_sf_line_started", None)
    client = _peer(channel.transport) if channel.transport is not None else None
    try:
        open_s = _seconds(channel) - started if started is not None else 0.0
        record_edge_refusal(target, str(client[0]) if client else None, status, code, open_s, request_id=request_id)
    except Exception:
        logging.getLogger("superfluid.api").exception("could not record a request ended at the edge")


def line_target(line: bytes) -> bytes:
    """The request-target of a request line (b"" for a line without one): the path of a request
    whose line Twisted refused (a target not printable ASCII, say a query string in UTF-8; a
    method or version it does not take; a line over its limit), which names its activity row."""
    parts = line.split(b" ")
    return parts[1] if len(parts) > 1 else b""


# -- bodies that are too large or arrive too slowly, refused where they are read ------------------

# Twisted reads the whole request (headers and body, into memory or a temporary file) before
# daphne hands any of it to the application, and its only clock is an idle timeout that every
# byte resets: a body trickled in a byte a minute held its connection and buffer forever, and an
# oversized one was read whole before the consumer saw its Content-Length. These bounds work in
# that layer, on daphne's request object, and refuse at once: a JSON error, the connection
# closed, nothing of the request handed to the application (so nothing is queued).

GENERATION_PATHS = {
    "/v1/chat/completions": "chat", "/v1/completions": "completions", "/infill": "infill", "/completion": "completions",
    "/completions": "completions", "/v1/embeddings": "embeddings",
    "/v1/responses": "chat", "/responses": "chat",  # (api/responses_api.py: chat requests in the Responses API's shapes)
    "/v1/messages": "chat",  # Anthropic's Messages API (api/anthropic.py): a chat
    "/chat/completions": "chat", "/embedding": "embeddings", "/embeddings": "embeddings",
}  # fmt: skip


# Routes whose errors are another API's error objects (api/anthropic.py: Anthropic's)
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


def raw_error_reply(exc: ApiError, origin: str | None = None, request_id: str | None = None, path: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response for ``exc`` that closes the connection; readable by a page
    from ``origin`` (the request's ``Origin``) when that is an allowed one (CORS, below);
    ``request_id``: its ``X-Request-Id``, the id its activity row holds; ``path``: the request's
    target, whose route's error shape it has (Anthropic's on /v1/messages)."""
    from http import HTTPStatus

    body = exc.body()
    if path and routed_path(path) in ANTHROPIC_PATHS:
        body = anthropic_error_body(exc.status, exc.message, request_id)
    payload = json.dumps(body).encode()
    head = [f"HTTP/1.1 {exc.status} {HTTPStatus(exc.status).phrase}", "Content-Type: application/json", "Connection: close", f"Content-Length: {len(payload)}"]
    head += [f"{k}: {v}" for k, v in (exc.headers or {}).items()]
    head += [f"X-Request-Id: {request_id}"] if request_id else []
    head += [f"{k}: {v}" for k, v in cors_headers(origin)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload


def routed_path(path: bytes) -> str:
    """The path a request line's target is routed by, as daphne and Channels' router take it:
    without its query, %-escapes decoded, leading slashes as one (``//v1/chat/completions`` and
    ``/v1/chat/complet%69ons`` are served as ``/v1/chat/completions``)."""
    return one_leading_slash(unquote(path.split(b"?", 1)[0].decode("latin-1")))


def record_edge_refusal(
    path: bytes, client_ip: str | None, status: int, code: str, open_s: float = 0.0, headers: dict[str, str] | None = None, request_id: str | None = None
) -> None:
    """The access-log line, /metrics count and activity row of a generation request that ended
    before it reached the application (refused, or its client left while sending it): the
    activity log says why, and how long it had been open (``open_s``, from its first byte);
    ``headers`` (names lower-cased), those it had sent: its row and count name its key."""
    endpoint = GENERATION_PATHS.get(routed_path(path))
    if endpoint is None:  # the activity log keeps generation requests only
        return
    from .records import RequestRecord, record_now

    open_s = max(0.0, open_s)
    record = RequestRecord(endpoint=endpoint, started_s=time.time() - open_s, request_id=request_id, client_ip=client_ip, status=status, error_code=code)
    record.key_name = key_name_of(headers or {})
    record.timing["total_ms"] = round(open_s * 1000, 1)
    record_now(record)


def key_name_of(headers: dict[str, str]) -> str | None:
    """The name of the key a request the edge refused came with (``headers``: names
    lower-cased), as the application's row of a refused request names it: None without one, or
    with one the keys this event loop has read do not know, or refuse (revoked, expired). The
    keys as read already: an edge refusal never waits for them."""
    from keys.credentials import secret_from_headers
    from superfluid_site.runtime import runtime_of

    secret = secret_from_headers(headers)
    if secret is None:
        return None
    try:
        web = runtime_of(asyncio.get_running_loop())
    except RuntimeError:  # off the event loop: no keys read here
        return None
    keys = web.keys_if_made() if web is not None else None
    if keys is None or not keys.loaded.is_set():
        return None
    key = keys.snapshot.lookup(secret)
    if key is None or key.revoked or key.is_expired(timezone.now()):
        return None
    return key.name


def _sent_headers(request: Any) -> dict[str, str]:
    """The headers a daphne request has received so far, names lower-cased (the last of
    repeated ones wins, as the consumers read the key headers, the only ones read from these:
    ``key_name_of``; the consumers read their scheduling headers by the first)."""
    raw = getattr(request, "requestHeaders", None)
    if raw is None:
        return {}
    return {bytes(name).decode("latin-1").lower(): bytes(values[-1]).decode("latin-1") for name, values in raw.getAllRawHeaders() if values}


def edge_request_id(request: Any) -> str:
    """The id of a request the protocol layer answers itself: its reply's ``X-Request-Id`` and
    its activity row's, one for the request however many times it is asked."""
    request_id: str | None = getattr(request, "_sf_request_id", None)
    if request_id is None:
        request_id = request._sf_request_id = uuid.uuid4().hex
    return request_id


def _request_path(request: Any) -> bytes:
    """The target of a request the protocol layer ends: the channel holds the path until the
    request is whole; then the request does (daphne's own refusals come after that); a request
    line Twisted refused gave neither: its raw line's."""
    channel = getattr(request, "channel", None)
    return getattr(channel, "_path", None) or vars(request).get("uri") or line_target(getattr(channel, "_sf_line", b""))


def _record_unprocessed(request: Any, status: int, code: str) -> None:
    """``record_edge_refusal`` for a request the protocol layer ends (never logged twice)."""
    if getattr(request, "_sf_recorded", False):
        return
    request._sf_recorded = True
    channel = getattr(request, "channel", None)
    # daphne sets client_addr only in process(), which such a request never reaches
    client = getattr(request, "client_addr", None) or (_peer(channel.transport) if channel is not None and channel.transport is not None else None)
    path = _request_path(request)
    try:
        started = getattr(request, "_sf_started", None)
        open_s = _seconds(channel) - started if started is not None else 0.0
        record_edge_refusal(path, str(client[0]) if client else None, status, code, open_s, _sent_headers(request), edge_request_id(request))
    except Exception:
        logging.getLogger("superfluid.api").exception("could not record a request ended at the edge")


def _seconds(channel: Any) -> float:
    """The time on the clock the channel's deadlines run on (the reactor's; a test's clock)."""
    seconds = getattr(getattr(getattr(channel, "callLater", None), "__self__", None), "seconds", None)
    return float(seconds()) if callable(seconds) else time.time()


LINGER_S = 5.0  # how long a refused request's connection still drains what the client sends


def _cancel_deadline(request: Any, *, linger: bool = False, name: str = "_sf_deadline") -> None:
    for attr in (name, "_sf_linger") if linger else (name,):
        call = getattr(request, attr, None)
        setattr(request, attr, None)
        if call is not None and call.active():
            call.cancel()


def refuse_unread(request: Any, exc: ApiError) -> None:
    """Answer ``exc`` now and close the connection, reading no more of the request; the
    application never sees it."""
    if getattr(request, "_sf_refused", False):
        return
    request._sf_refused = True
    _cancel_deadline(request)
    _drop_body(request)
    channel = request.channel
    if channel is None or channel.transport is None:
        return
    transport = channel.transport
    headers = getattr(request, "requestHeaders", None)
    origins = headers.getRawHeaders(b"origin") if headers is not None else None
    transport.write(raw_error_reply(exc, b",".join(origins).decode("latin-1") if origins else None, edge_request_id(request), _request_path(request)))
    if hasattr(transport, "loseWriteConnection"):
        # a client that sends its whole body before it reads would get a connection reset, not
        # this answer, were the socket closed on unread bytes: close our side once the answer is
        # out, drop what still arrives (never buffered), and let go after LINGER_S whatever
        transport.loseWriteConnection()
        request._sf_linger = channel.callLater(LINGER_S, _let_go, transport)
    else:
        channel.loseConnection()
    _record_unprocessed(request, exc.status, exc.code or exc.type)


def _let_go(transport: Any) -> None:
    """The end of a refused request's linger: the connection goes now. Not ``loseConnection``,
    which waits until the client has read everything written, so a client that never reads
    (its window full of earlier replies) held the connection, with the request's idle timeout
    off once its body had ended, for as long as it liked."""
    abort = getattr(transport, "abortConnection", None)
    (abort if abort is not None else transport.loseConnection)()


def _drop_body(request: Any) -> None:
    """What was buffered of a refused request's body (a temporary file when long) goes now."""
    content = getattr(request, "content", None)
    if content is not None:
        content.close()
        request.content = io.BytesIO()


def _peer(transport: Any) -> tuple[str, int] | None:
    """The client's (host, port) from the connection, as daphne would name it."""
    try:
        peer = transport.getPeer()
    except Exception:
        return None
    host = getattr(peer, "host", None)
    return (str(host), int(getattr(peer, "port", 0) or 0)) if host else None


def body_limit(path: bytes | None) -> tuple[int, int]:
    """(the bound on a request's body, the limit its 413 names): ``--max-body-bytes``, but a
    batch file's upload (``/v1/files``) has its own, SUPERFLUID_BATCH_MAX_FILE_BYTES (by default
    ``--max-body-bytes``) for the file plus the multipart around it, as batches/asgi.py bounds
    it: a file of the size allowed, or a larger limit set for batch files, was refused here."""
    if routed_path(path or b"") == "/v1/files":
        from batches.asgi import ENVELOPE_BYTES, upload_limit

        limit = upload_limit()
        return limit, limit - ENVELOPE_BYTES
    return serving().max_body_bytes, serving().max_body_bytes


def install_request_bounds() -> None:
    """``--max-body-bytes`` and ``--body-timeout`` in the protocol layer (``serve`` calls this
    through ``install_protocol_errors``). The clock starts at the request line: request line,
    headers and body together must arrive within ``SUPERFLUID_BODY_TIMEOUT`` seconds, else 408
    ``request_timeout``; a ``Content-Length`` over ``SUPERFLUID_MAX_BODY_BYTES`` is 413
    ``request_too_large`` before any body byte is read, and a chunked body is cut off at it.
    The request line itself is timed from its first byte (Twisted makes the request object only
    once the line is whole), so a line trickled a byte at a time does not hold a connection."""
    from daphne.http_protocol import WebRequest
    from twisted.web.http import HTTPChannel

    if getattr(WebRequest, "_sf_bounded", False):
        return
    WebRequest._sf_bounded = True
    original_data, original_channel_lost, original_line = HTTPChannel.dataReceived, HTTPChannel.connectionLost, HTTPChannel.lineReceived
    original_choose = HTTPChannel._maybeChooseTransferDecoder

    def line_timed_out(channel: Any) -> None:
        channel._sf_line_deadline = None
        if channel.requests:
            return  # the line arrived: its request has its own deadline
        # no request yet: the 408, an id of its own, and the close; a row where the line as far as
        # it came names a generation path whole (a space after it)
        request_id = uuid.uuid4().hex
        parts = bytes(getattr(channel, "_buffer", b"")).split(b"\r\n", 1)[0].split(b" ")
        if len(parts) > 2:
            record_line_refusal(channel, parts[1], 408, "request_timeout", request_id)
        channel.transport.write(raw_error_reply(request_timeout(float(serving().body_timeout)), request_id=request_id, path=parts[1] if len(parts) > 2 else b""))
        channel.transport.loseConnection()

    def data_received(self: Any, data: bytes) -> None:
        # the first bytes of a request (none in progress): its line's clock starts
        if not self.requests and getattr(self, "_sf_line_deadline", None) is None:
            self._sf_line_started = _seconds(self)  # the request's start, for its record if refused
            timeout = float(serving().body_timeout)
            if timeout > 0:
                self._sf_line_deadline = self.callLater(timeout, lambda: line_timed_out(self))
        original_data(self, data)

    def line_received(self: Any, line: bytes) -> None:
        if line and getattr(self, "_HTTPChannel__first_line", 0):
            self._sf_line = line  # a request line: kept for the row of a request refused on it
        original_line(self, line)

    def channel_lost(self: Any, reason: Any) -> None:
        _cancel_deadline(self, name="_sf_line_deadline")
        original_channel_lost(self, reason)

    def choose_transfer_decoder(self: Any, header: bytes, data: bytes) -> bool:
        # Twisted turns a Content-Length of digits into an int, and Python refuses more than 4300
        # digits: the ValueError escaped the parser and the connection dropped without an answer.
        # Any length of 19 digits or more is beyond every bound: it gets its 413 like any other.
        if header == b"Content-Length" and data.isdigit():
            digits = data.lstrip(b"0") or b"0"
            data = digits if len(digits) < 19 else b"9" * 19
        return bool(original_choose(self, header, data))

    original_init, original_got_length = WebRequest.__init__, WebRequest.gotLength
    original_chunk, original_process, original_lost = WebRequest.handleContentChunk, WebRequest.process, WebRequest.connectionLost

    def timed_out(self: Any) -> None:
        self._sf_deadline = None
        if not getattr(self, "_sf_processing", False):
            refuse_unread(self, request_timeout(float(serving().body_timeout)))

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        self._sf_refused, self._sf_processing, self._sf_deadline, self._sf_linger, self._sf_size = False, False, None, None, 0
        original_init(self, *args, **kwargs)
        timeout = float(serving().body_timeout)
        if self.channel is None:
            return
        self._sf_started = _seconds(self.channel)
        if getattr(self.channel, "_sf_line_deadline", None) is not None:  # timed from its line's first byte
            self._sf_started = getattr(self.channel, "_sf_line_started", self._sf_started)
        # the request line is whole: what is left of its time goes on to headers and body
        line = getattr(self.channel, "_sf_line_deadline", None)
        if timeout > 0 and line is not None and line.active():
            timeout = max(0.001, line.getTime() - line.seconds())
        _cancel_deadline(self.channel, name="_sf_line_deadline")
        if timeout > 0:
            self._sf_deadline = self.channel.callLater(timeout, lambda: timed_out(self))

    def got_length(self: Any, length: int | None) -> None:
        if length is not None and self.requestHeaders.hasHeader(b"Content-Length"):
            # the application reads the length the body was framed by, not 4,000 leading zeros
            self.requestHeaders.setRawHeaders(b"Content-Length", [b"%d" % length])
        self._sf_bounds = limit, named = body_limit(getattr(self.channel, "_path", None))
        original_got_length(self, 0 if length is not None and length > limit else length)
        if length is not None and length > limit:
            refuse_unread(self, request_too_large(named))
            # Twisted answers "Expect: 100-continue" right after this: a 100 Continue written
            # after the 413 (and its Connection: close) asked the client for a body never read
            self.requestHeaders.removeHeader(b"Expect")

    def handle_content_chunk(self: Any, data: bytes) -> None:
        if self._sf_refused:
            return  # what arrives after the refusal is dropped, never buffered
        self._sf_size += len(data)
        limit, named = getattr(self, "_sf_bounds", None) or body_limit(None)
        if self._sf_size > limit:
            refuse_unread(self, request_too_large(named))
            return
        original_chunk(self, data)

    def process(self: Any) -> Any:
        _cancel_deadline(self)
        if self._sf_refused:
            return None
        self._sf_processing = True
        # daphne makes a client's Daphne-Root-Path the scope's root_path: one the path is not
        # under made Channels' router raise (a 500 and a traceback, at any client's will), one not
        # ASCII made daphne's own processing raise. The API is served at / (serve sets no root).
        self.requestHeaders.removeHeader(b"Daphne-Root-Path")
        return original_process(self)

    def connection_lost(self: Any, reason: Any) -> None:
        _cancel_deadline(self, linger=True)
        if not self._sf_refused and not self._sf_processing and self.channel is not None:
            # the client left while sending it: the application never saw it; its row says so
            _record_unprocessed(self, 499, "client_disconnected")
        original_lost(self, reason)

    _replace(
        HTTPChannel,
        dataReceived=data_received,
        lineReceived=line_received,
        connectionLost=channel_lost,
        _maybeChooseTransferDecoder=choose_transfer_decoder,
    )
    _replace(
        WebRequest,
        __init__=init,
        gotLength=got_length,
        handleContentChunk=handle_content_chunk,
        process=process,
        connectionLost=connection_lost,
    )


# -- choices: every one carries the whole request -------------------------------------------

# n choices of several prompts are one job each, and each job carries the request's messages,
# tools and schemas: what reaches the engine is about the body times the number of jobs.
EXPANDED_BODIES = 2  # at most this many times --max-body-bytes in all


def check_expanded_size(request: Any, body_bytes: int) -> None:
    """413 ``request_too_large`` when ``n`` times the prompts would send more than
    EXPANDED_BODIES bodies' worth to the engine (32 copies of an 8 MB body: 200 MB over the
    link, seconds of the event loop encoding it, every copy tokenised). Embeddings are exempt:
    all their inputs go to the worker as one job, each input once (no copies to bound)."""
    if request.endpoint == "embeddings":
        return
    jobs = request.n * (len(request.prompts) if request.prompts else 1)
    limit = EXPANDED_BODIES * serving().max_body_bytes
    if jobs > 1 and serving().max_body_bytes > 0 and body_bytes * jobs > limit:
        raise ApiError(
            413,
            f"This request asks for {jobs} completions (n times the prompts), each carrying its {body_bytes}-byte body: "
            f"more than {limit} bytes in all. Ask for fewer choices or send a smaller body.",
            param="n",
            code="request_too_large",
        )


# -- a prompt too long to fit, told without tokenising it ---------------------------------------

# MAX_CHARS_PER_TOKEN (api/schemas.py, imported above): a prompt with more characters than
# lane_ctx times it cannot fit, and is refused before the worker spends any time tokenising it.


def check_prompt_size(request: Any, lane_ctx: int) -> None:
    """400 ``context_length_exceeded`` for a prompt that cannot fit the lane's context whatever
    the tokeniser: more characters than ``lane_ctx * MAX_CHARS_PER_TOKEN``, or as many chat
    messages or token ids as ``lane_ctx`` tokens (each message takes at least one; a prompt of
    ``lane_ctx`` tokens leaves no room for one generated token, and the worker refuses it too).
    An embeddings input (``param`` ``input``) generates nothing: it may fill the context, as the
    worker allows, and only more than ``lane_ctx`` token ids is refused here."""
    embeddings = request.endpoint == "embeddings"
    param = "messages" if request.messages is not None else "input" if embeddings else "prompt"
    if request.messages is not None:
        parts = len(request.messages)
        chars = chat_text_chars(request.messages, request.tools, request.chat_template_kwargs)
    elif isinstance(request.prompt, list):
        parts, chars = len(request.prompt), 0
    else:
        parts, chars = 0, len(request.prompt or "")
    chars += len(request.suffix or "")
    chars += len(getattr(request, "fim_prompt", None) or "") + sum(len(f) + len(t) for f, t in getattr(request, "fim_extra", None) or [])  # /infill
    too_many = parts > lane_ctx if embeddings else parts >= lane_ctx
    if too_many or chars > lane_ctx * MAX_CHARS_PER_TOKEN:
        what = f"{parts} messages" if request.messages is not None and too_many else f"{parts} tokens" if too_many else f"{chars} characters"
        raise ApiError(
            400,
            f"This model's maximum context length is {lane_ctx} tokens. However, your {param} holds {what}, "
            f"more than can fit. Please reduce the length of the {param}.",
            param=param,
            code="context_length_exceeded",
        )
