"""API errors in OpenAI's wire format.

Every failure the HTTP layer reports is an :class:`ApiError`: an HTTP status plus OpenAI's error
envelope ``{"error": {"message", "type", "param", "code"}}``. Official SDKs key their exception
classes off the status and read ``type``/``param``/``code`` from the envelope, so these must stay
consistent with what OpenAI itself sends.

The ``code`` values used across the API are deliberately few:

``invalid_json``, ``missing_required_parameter``, ``invalid_type``, ``invalid_value``,
``unsupported_value``, ``unsupported_parameter``, ``unsupported_content``, ``unknown_parameter``,
``model_not_found``, ``context_length_exceeded``, ``request_too_large``, ``request_timeout``, ``engine_unavailable``,
``method_not_allowed``, ``not_found``, ``unsupported_content_encoding``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ApiError(Exception):
    """An error to return to the client as an OpenAI-style JSON error body.

    ``status`` is the HTTP status; ``message``, ``type``, ``param`` and ``code`` go into the
    envelope verbatim; ``headers`` are extra response headers (``Retry-After``, ``Allow``).
    """

    status: int
    message: str
    type: str
    param: str | None
    code: str | None
    headers: dict[str, str]

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # noqa: A002 - mirrors the wire field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.model: str | None = None  # the model a 404 model_not_found names (the client's word): for its activity row

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}`` (all four keys always
        present; absent ones are ``None``, as OpenAI sends them)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, type={self.type!r}, param={self.param!r}, "
            f"code={self.code!r}, message={self.message!r})"
        )


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error``: the request is malformed or asks for something unsupported."""
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    """404 ``model_not_found`` on param ``model``, worded as OpenAI words it."""
    error = ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )
    error.model = model
    return error


def context_length_exceeded(message: str, param: str = "messages") -> ApiError:
    """400 ``context_length_exceeded``; ``param`` is ``"messages"`` (chat) or ``"prompt"``
    (completions)."""
    return ApiError(400, message, param=param, code="context_length_exceeded")


def request_too_large(limit_bytes: int) -> ApiError:
    """413 ``request_too_large``: the HTTP body exceeded ``limit_bytes``."""
    return ApiError(
        413,
        f"Request body too large: the limit is {limit_bytes} bytes.",
        code="request_too_large",
    )


def unsupported_content_encoding(coding: str) -> ApiError:
    """415 ``unsupported_content_encoding``: the body came compressed (``Content-Encoding``)."""
    return ApiError(
        415,
        f"Request bodies sent with Content-Encoding '{coding}' are not supported: send the body uncompressed.",
        code="unsupported_content_encoding",
    )


def request_timeout(timeout_s: float) -> ApiError:
    """408 ``request_timeout``: the request (line, headers and body) did not arrive in time."""
    return ApiError(
        408,
        f"The request did not arrive within {timeout_s:g} seconds (--body-timeout); nothing was queued.",
        code="request_timeout",
    )


def engine_unavailable(message: str, retry_after: float | None = None) -> ApiError:
    """503 ``server_error``/``engine_unavailable``: no engine can take the request right now.

    ``retry_after`` (seconds) becomes a ``Retry-After`` header, rounded up to a whole second
    because the header only carries integers; SDKs honour it when retrying.
    """
    headers = {} if retry_after is None else {"Retry-After": str(max(0, math.ceil(retry_after)))}
    return ApiError(503, message, type=SERVER_ERROR, code="engine_unavailable", headers=headers)


def server_error(
    message: str = "The server had an error while processing your request.",
) -> ApiError:
    """500 ``server_error``: a bug or unexpected failure on our side."""
    return ApiError(500, message, type=SERVER_ERROR)


def method_not_allowed(
    method: str, allowed: Iterable[str] = ("POST",), path: str | None = None
) -> ApiError:
    """405 for a known route hit with the wrong HTTP method; sets the ``Allow`` header (which
    RFC 9110 requires on a 405) from ``allowed``. ``path`` only enriches the message."""
    allow = ", ".join(allowed)
    where = f" for {path}" if path else ""
    return ApiError(
        405,
        f"Method {method or '?'} is not allowed{where}; allowed: {allow}.",
        code="method_not_allowed",
        headers={"Allow": allow},
    )


def not_found(path: str, method: str | None = None) -> ApiError:
    """404 for an unknown route, worded like OpenAI's ``Invalid URL (POST /v1/foo)`` (the method
    is left out when not given)."""
    target = f"{method} {path}" if method else path
    return ApiError(404, f"Invalid URL ({target})", code="not_found")


# Anthropic's error types by HTTP status (its Messages API's routes answer Anthropic's error
# objects, api/anthropic.py; here, a leaf, so the protocol layer's refusals (api/edge.py) can too) (the SDK picks its exception class by the status;
# Claude Code shows the message). A status not here is an api_error.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "invalid_request_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def anthropic_error_body(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}`` (with the
    request's id, as Anthropic's carry one)."""
    body: dict[str, Any] = {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body
