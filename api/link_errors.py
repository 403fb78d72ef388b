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
    # a lone surrogate never gets here (api/schemas.py refuses it): what the link could not carry
    # is a request nested too deeply for the encoder, or more than a link line holds
    m.UNENCODABLE: "The request could not be passed to the engine: it is nested too deeply or too large.",
}


def link_error(event: m.Rejected | m.Error) -> ApiError:
    """The ApiError for a job the worker refused or failed (an unknown reason is a 500)."""
    if isinstance(event, m.Error) and event.reason == m.UNENCODABLE:
        # the worker could not put the job's output on the link (a NaN logprob from the model):
        # the server's failure, not the request's (it was a 400 blaming a lone surrogate)
        return ApiError(500, event.detail or "The response could not be encoded.", type=SERVER_ERROR, code=m.ENGINE_ERROR)
    status, type_, code = _STATUS.get(event.reason, (500, SERVER_ERROR, event.reason or "server_error"))
    detail = _DEFAULT_DETAIL.get(event.reason) or event.detail or "The server had an error while processing your request."
    param = event.param if isinstance(event, m.Rejected) else None
    return ApiError(status, detail, type=type_, param=param, code=code)
