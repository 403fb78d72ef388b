"""A bug in one of the API's Django views (/tokenize, /props, /slots, the Batch API's routes,
...) answers the documented 500 error object, and its traceback reaches serve's console, as
docs/api.md promises ("a bug on our side; logged with its traceback").

Seen on a real server: a /tokenize that failed answered 500 and serve's log held nothing at all.
Django logs an uncaught exception on ``django.request``, whose only handlers in its default
configuration print with DEBUG on or mail ADMINS; this project sets neither, so the traceback was
lost. The consumers' routes (chat, completions) log theirs on ``superfluid.api`` and did not
lose them."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from scheduler.engines.models import default_model_path
from tests.edge.inproc import JSON, SimWorker, application, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def console_output(*names: str) -> Iterator[io.StringIO]:
    """What the settings' console handlers (serve's stderr) print of the records of loggers
    ``names``, each handler along their propagation chains written to one buffer meanwhile."""
    application()  # (its first import sets Django up, and so its logging, again)
    buf = io.StringIO()
    swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
    for name in names:
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            for h in logger.handlers:
                if type(h) is logging.StreamHandler and h.get_name() in ("console", "uncaught") and all(h is not s for s, _ in swapped):
                    # not setStream, which flushes the stream it replaces: a handler set up while
                    # an earlier test's captured stderr was sys.stderr holds that closed stream
                    with h.lock or contextlib.nullcontext():
                        swapped.append((h, h.stream))
                        h.stream = buf
            logger = logger.parent if logger.propagate else None
    try:
        yield buf
    finally:
        for h, stream in swapped:
            with h.lock or contextlib.nullcontext():
                h.stream = stream


async def test_an_uncaught_error_in_an_api_view_is_logged_with_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from api import views

    async def broken(model: Any = None) -> Any:
        raise RuntimeError("a bug in the view, s46")

    monkeypatch.setattr(views, "_vocab", broken)
    async with attached(SimWorker()):
        with console_output("django.request", "django", "superfluid.api") as out:
            first = await request("POST", "/tokenize", b'{"content": "hi"}', JSON)
            second = await request("POST", "/tokenize", b'{"content": "hi"}', JSON)
    for reply in (first, second):
        assert reply.status == 500 and reply.is_error_object() and reply.json()["error"]["type"] == "server_error"
        assert reply.headers.get("x-request-id"), reply.headers  # (s47: a view's 500 had none)
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    err = out.getvalue()
    assert "Traceback (most recent call last)" in err and err.count("RuntimeError: a bug in the view, s46") == 2, err
    assert "/tokenize" in err  # which request it was
    # each traceback is preceded by the line naming its request's id, the one its 500 carried
    first_at, second_at = err.index(first.headers["x-request-id"]), err.index(second.headers["x-request-id"])
    assert first_at < err.index("Traceback") < second_at, err


async def test_a_documented_5xx_answer_is_not_logged_as_an_error(tmp_path: Path) -> None:
    """A 503 the server answers on purpose (here /tokenize for a model whose file cannot be read,
    which serve's log names once, on ``superfluid.api``) is no bug: Django reports every 5xx
    answer on ``django.request``, and the console prints only those with a traceback."""
    cut = tmp_path / "cut.gguf"
    with open(default_model_path(), "rb") as f:
        cut.write_bytes(f.read(2_000_000))
    with override_settings(SUPERFLUID_MODEL_PATH=str(cut)):
        async with attached(SimWorker()):
            with console_output("django.request", "django", "superfluid.api") as out:
                reply = await request("POST", "/tokenize", b'{"content": "hi"}', JSON)
    assert reply.status == 503, reply.body
    err = out.getvalue()
    assert "could not be read" in err  # superfluid.api's line
    assert "Service Unavailable" not in err and "django.request" not in err and "Traceback" not in err, err
