"""The activity writer's queue while the database takes no row (an outage): bounded, and the
rows it drops are counted in the log (activity/writer.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from activity import log as activity_log
from activity import writer as activity_writer
from activity.log import entry_fields
from api.records import RequestRecord


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[activity_writer.ActivityWriter, threading.Event, list[str]]]:
    """A writer of its own whose database does not answer until the event is set; the rows it
    then stores, by request id."""
    writer = activity_writer.ActivityWriter()
    monkeypatch.setattr(activity_writer, "_writer", writer)
    monkeypatch.setattr(activity_writer, "MAX_QUEUED", 3)
    gate, taken = threading.Event(), threading.Event()
    stored: list[str] = []

    def store(rows: Any, touches: Any) -> None:
        taken.set()
        gate.wait(10)
        stored.extend(r["request_id"] for r in rows)

    monkeypatch.setattr(activity_writer, "_store", store)
    monkeypatch.setattr(activity_log, "maybe_prune", lambda now=None: 0)  # no database here
    logger = logging.getLogger("superfluid.activity")  # it does not propagate to the root
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id="first", status=200)))
    assert taken.wait(10)  # the thread holds "first" and waits on the database
    try:
        yield writer, gate, stored
    finally:
        gate.set()
        writer.flush()


def submit(n: int) -> None:
    for i in range(n):
        activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id=f"q{i}", status=200)))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "superfluid.activity" and r.levelno >= logging.WARNING]


def test_the_queue_is_bounded_during_an_outage_and_the_rows_it_drops_are_counted(outage: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A database that took nothing for long (a failover, a host gone) let the writer's queue
    grow by a row per request without end: the web process's memory grew with it. It keeps
    MAX_QUEUED rows, the newest; the ones dropped are said in the log, when dropping starts and
    how many when the database takes rows again."""
    writer, gate, stored = outage
    submit(7)
    assert writer.pending == 3 and writer.dropped == 4
    assert len(errors(caplog)) == 1 and "dropping the oldest" in errors(caplog)[0], errors(caplog)
    gate.set()
    assert writer.flush()
    assert stored == ["first", "q4", "q5", "q6"]
    assert "activity log: 4 entries dropped" in errors(caplog)[-1], errors(caplog)


def test_rows_dropped_during_an_outage_the_process_exits_in_are_counted_at_exit(outage: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    writer, gate, stored = outage
    monkeypatch.setattr(activity_writer, "EXIT_FLUSH_S", 0.2)
    submit(5)
    activity_writer._flush_at_exit()
    said = " | ".join(errors(caplog))
    assert "activity log: 2 entries dropped" in said and "4 entries not written at exit" in said, said
