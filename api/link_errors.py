"""The web side's reading of the worker's reasons: each link reason becomes an HTTP status and an
OpenAI error object here, and nowhere else (the worker knows nothing of HTTP)."""

from __future__ import annotations

from scheduler.link import messages as m

from .errors import INVALID_REQUEST, SERVER_ERROR, ApiError

# reason -> (status, type, code); the code is the reason unless named
_STATUS: dict[str, tuple[int, str, str]] = {
    m.EMPTY_PROMPT: (400, INVALID_REQUEST, m.EMPTY_PROMPT),
    m.INVALID_MESSAGES: (400, INVALID_REQUEST, m.INVALID_MESSAGES),
    m.INVALID_PROMPT: (400, INVALID_REQUEST, m.INVALID_PROMPT),
    m.FIM_UNSUPPORTED: (400, INVALID_REQUEST, m.FIM_UNSUPPORTED),
    m.CONTEXT_LENGTH_EXCEEDED: (400, INVALID_REQUEST, m.CONTEXT_LENGTH_EXCEEDED),
    m.UNSUPPORTED_PARAMETER: (400, INVALID_REQUEST, m.UNSUPPORTED_PARAMETER),
    m.INVALID_VALUE: (400, INVALID_REQUEST, m.INVALID_VALUE),
    m.GRAMMAR_TOO_SLOW: (400, INVALID_REQUEST, m.GRAMMAR_TOO_SLOW),
    m.UNENCODABLE: (400, INVALID_REQUEST, "invalid_value"),
    m.SHUTTING_DOWN: (503, SERVER_ERROR, "engine_unavailable"),
    m.SHUTDOWN: (503, SERVER_ERROR, "engine_unavailable"),
    m.ENGINE_UNAVAILABLE: (503, SERVER_ERROR, "engine_unavailable"),
    m.ENGINE_CRASHED: (503, SERVER_ERROR, m.ENGINE_CRASHED),
    m.DEADLINE_EXCEEDED: (503, SERVER_ERROR, m.DEADLINE_EXCEEDED),
    m.ENGINE_ERROR: (500, SERVER_ERROR, m.ENGINE_ERROR),
    m.DUPLICATE_ID: (500, SERVER_ERROR, m.DUPLICATE_ID),
    m.INVALID_JOB: (500, SERVER_ERROR, m.INVALID_JOB),
}

_DEFAULT_DETAIL = {
    m.UNENCODABLE: "The request contains text that cannot be encoded as UTF-8 (a lone surrogate).",
}


def link_error(event: m.Rejected | m.Error) -> ApiError:
    """The ApiError for a job the worker refused or failed (an unknown reason is a 500)."""
    status, type_, code = _STATUS.get(event.reason, (500, SERVER_ERROR, event.reason or "server_error"))
    detail = _DEFAULT_DETAIL.get(event.reason) or event.detail or "The server had an error while processing your request."
    param = event.param if isinstance(event, m.Rejected) else None
    return ApiError(status, detail, type=type_, param=param, code=code)
