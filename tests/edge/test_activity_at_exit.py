"""The activity log at the process's exit: the rows of the last requests (a drain's, ended as
serve stopped) are written before the process exits, the batch being written included."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from activity import writer as activity_writer
from activity.log import entry_fields
from api.records import RequestRecord

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_row_the_writer_is_storing_as_the_process_exits_is_written_before_it_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's thread is a daemon: at exit, only rows still queued were waited for. A batch
    the thread had already taken (nothing left "pending") while the database took its time was
    cut off by the exit, its rows lost: a drain's last requests, whose rows were queued just
    before serve returned, had none."""
    writer = activity_writer.ActivityWriter()
    monkeypatch.setattr(activity_writer, "_writer", writer)
    taken, answers = threading.Event(), threading.Event()
    real_store = activity_writer._store

    def slow_store(rows: Any, touches: Any) -> None:  # the database answers once the exit waits for it
        taken.set()
        answers.wait(10)
        real_store(rows, touches)

    monkeypatch.setattr(activity_writer, "_store", slow_store)
    activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id="last", status=503, error_code="engine_unavailable")))
    assert taken.wait(10) and writer.pending == 0  # the thread has the row: none is left pending
    real_wait = writer._cond.wait

    def exit_waits(timeout: float | None = None) -> bool:
        answers.set()
        return real_wait(timeout)

    monkeypatch.setattr(writer._cond, "wait", exit_waits)
    activity_writer._flush_at_exit()
    written_by_exit = writer.written
    answers.set()
    assert writer.flush()
    assert written_by_exit == 1
