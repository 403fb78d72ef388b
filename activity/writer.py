"""The activity log's writer: one thread with its own database connection, writing in batches.

Nothing a request does waits on the database. ``record_request()`` hands the row to
:func:`submit` (a queue append) and returns; this thread takes whatever has queued, up to
``BATCH`` rows, and writes them with one ``bulk_create``. Key last-used times ride along (one
UPDATE per batch). A burst of a thousand finished requests is a handful of INSERTs, and a
client's disconnect never queues behind them on Django's single sync thread, where Channels
and ``sync_to_async(thread_sensitive=True)`` would otherwise put both.

Rows are never dropped while the database keeps up; if it fails, the batch is retried with
growing pauses (up to ``RETRIES`` times) before it is logged and given up. A batch the
database refuses for a row's data is written row by row: only that row is given up. At interpreter exit
the writer gets ``EXIT_FLUSH_S`` to write what is queued; the rows it could not are counted in
the log. While the database takes no row (an outage) or far fewer than come, the queue keeps at
most ``MAX_QUEUED`` rows, the newest: the oldest are dropped, said in the log when dropping
starts, and counted in it when the database takes rows again (or at exit).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import threading
import time
from collections import deque
from typing import Any

log = logging.getLogger("superfluid.activity")

BATCH = 500
RETRIES = 5
EXIT_FLUSH_S = 5.0
MAX_QUEUED = 100_000  # rows queued at most (about 1 KB each) while the database takes none


class ActivityWriter:
    def __init__(self) -> None:
        self._rows: deque[dict[str, Any]] = deque()
        self._touches: dict[int, datetime.datetime] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._writing = 0  # the rows of the batch the thread has taken and not yet written
        self._thread: threading.Thread | None = None
        self.written = 0
        self.failed = 0
        self.dropped = 0  # rows dropped from a full queue (MAX_QUEUED), in all
        self._dropping = 0  # of those, the ones the log has not counted yet

    # -- from any thread (the event loop) ------------------------------------------------

    def submit(self, fields: dict[str, Any]) -> None:
        """Queue one activity row (the kwargs of an ActivityEntry)."""
        with self._cond:
            full = len(self._rows) >= MAX_QUEUED
            if full:  # the database takes none: the oldest row goes, counted
                self._rows.popleft()
                self.dropped += 1
                self._dropping += 1
            first_dropped = full and self._dropping == 1
            self._rows.append(fields)
            self._start()
            self._cond.notify()
        if first_dropped:
            log.error("activity log: %d entries queued and the database takes none: dropping the oldest (counted when it takes them again)", MAX_QUEUED)

    def touch(self, key_id: int, when: datetime.datetime) -> None:
        """Queue a key's last-used time (the latest per key wins)."""
        with self._cond:
            self._touches[key_id] = when
            self._start()
            self._cond.notify()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is written (or given up); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._rows or self._touches or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def report_dropped(self) -> None:
        """Count in the log the rows dropped from a full queue since it last did."""
        with self._cond:
            dropped, self._dropping = self._dropping, 0
        if dropped:
            log.error("activity log: %d entries dropped: %d were queued while the database took none", dropped, MAX_QUEUED)

    @property
    def unwritten(self) -> int:
        """The rows queued and those of the batch being written."""
        with self._cond:
            return len(self._rows) + self._writing

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._rows)

    # -- the writer thread -----------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="activity-writer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        from django.db import connection

        while True:
            with self._cond:
                self._writing = 0  # the last batch is written or given up
                idle = not self._rows and not self._touches
                if idle:
                    self._busy = False
                    self._cond.notify_all()
            if idle:
                connection.close()  # idle: give the connection back, as a request's end would
            with self._cond:
                while not self._rows and not self._touches:
                    self._cond.wait()
                self._busy = True
                rows = [self._rows.popleft() for _ in range(min(BATCH, len(self._rows)))]
                touches, self._touches = self._touches, {}
                self._writing = len(rows)
            self._write(rows, touches)

    def _write(self, rows: list[dict[str, Any]], touches: dict[int, datetime.datetime]) -> None:
        from django.db import DataError, IntegrityError, connection

        for attempt in range(RETRIES + 1):
            try:
                _store(rows, touches)
                with self._cond:  # in the database: not "unwritten" at exit while the prune runs
                    self.written += len(rows)
                    self._writing = max(0, self._writing - len(rows))
                self.report_dropped()
                _prune_if_due()
                return
            except (DataError, IntegrityError):  # a row the database refuses: not the others
                if len(rows) > 1 or (rows and touches):  # one refused row: not the keys' times
                    self._write_each(rows, touches)
                    return
                self.failed += 1
                log.exception("could not write an activity log entry; giving it up: %r", rows)
                return
            except Exception:
                connection.close()  # a broken connection is opened afresh on the next try
                if attempt == RETRIES:
                    self.failed += len(rows)
                    log.exception("could not write %d activity log entries; giving them up", len(rows))
                    return
                time.sleep(min(2.0, 0.05 * 2**attempt))


    def _write_each(self, rows: list[dict[str, Any]], touches: dict[int, datetime.datetime]) -> None:
        """A batch the database refused for its data: each row on its own, so that one bad row
        costs only itself (the keys' times on their own first: not given up with a bad row)."""
        if touches:
            self._write([], touches)
        for row in rows:
            self._write([row], {})


def _store(rows: list[dict[str, Any]], touches: dict[int, datetime.datetime]) -> None:
    """One transaction for the rows and the keys' times, so a batch that fails part way and is
    written again is never written twice."""
    from django.db import transaction

    from keys.models import ApiKey

    from .models import ActivityEntry

    with transaction.atomic():
        if rows:
            ActivityEntry.objects.bulk_create([ActivityEntry(**fields) for fields in rows])
        for key_id, when in touches.items():
            ApiKey.objects.filter(pk=key_id).update(last_used=when)


def _prune_if_due() -> None:
    """The hourly prune, after a batch is written, on its own: never a reason to write it again."""
    from .log import maybe_prune

    try:
        maybe_prune()
    except Exception:  # tried again at the next interval; the rows are written
        log.exception("could not prune the activity log")


_writer = ActivityWriter()


def get_writer() -> ActivityWriter:
    return _writer


def submit(fields: dict[str, Any]) -> None:
    _writer.submit(fields)


def flush(timeout_s: float = 10.0) -> bool:
    return _writer.flush(timeout_s)


@atexit.register
def _flush_at_exit() -> None:
    # whatever is queued, and the batch the thread is writing now: the thread is a daemon, so a
    # batch it had taken (nothing left "pending") was cut off by the exit, its rows lost (a
    # drain's last requests, ended as serve stopped); what the database did not take in time is
    # lost with the process: said in the log, not silently
    written = _writer.flush(EXIT_FLUSH_S)
    _writer.report_dropped()
    unwritten = _writer.unwritten  # none where only the prune after the last batch was cut off
    if not written and unwritten:
        log.error("activity log: %d entries not written at exit: the database did not take them within %g s", unwritten, EXIT_FLUSH_S)
