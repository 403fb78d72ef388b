"""The embedded runner (batches/runner.py run_batch) when the database errs: a batch still ends."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from batches import runner
from batches.models import Batch, Line
from tests.batches.test_runner_lines import make_batch
from tests.edge.inproc import SimWorker, attached

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("cancel", [False, True])
async def test_a_line_whose_lease_could_not_be_given_up_still_runs_and_the_batch_ends(monkeypatch: pytest.MonkeyPatch, cancel: bool) -> None:
    """The database errs twice in a row: as a line's result is written, and as its runner gives
    up its lease. The line stayed leased with no runner; the other claimers found nothing to
    claim and ended, and the batch stayed ``in_progress`` (or, cancelled meanwhile,
    ``cancelling``) for good in the embedded mode, against run_next's promise. Now the claimers
    start again once the lease has run out."""
    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    monkeypatch.setattr(runner, "FAILED_LINE_PAUSE_S", 0.01)
    monkeypatch.setattr(runner, "lease", lambda: timedelta(seconds=3))  # longer than the other lines take
    monkeypatch.setattr(runner, "concurrency", lambda: 1)
    real_record, real_filter = runner.record, Line.objects.filter
    failing = {"record": 1, "release": 0}

    def record(*args: Any) -> None:
        if failing["record"]:
            failing["record"], failing["release"] = 0, 1  # the release that follows fails too
            if cancel:
                runner.cancel(Line.objects.get(pk=args[0]).batch_id)
            raise OperationalError("database is locked")
        real_record(*args)

    class Unreleasable:
        async def aupdate(self, **_fields: Any) -> int:
            raise OperationalError("database is locked")

    def line_filter(*args: Any, **kwargs: Any) -> Any:
        if failing["release"] and set(kwargs) == {"pk", "done"}:  # the runner giving up its line's lease
            failing["release"] = 0
            return Unreleasable()
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(runner, "record", record)
    monkeypatch.setattr(Line.objects, "filter", line_filter)
    b = await sync_to_async(make_batch)(3)  # line 0's result is lost; lines 1 and 2 run meanwhile
    async with attached(SimWorker()):
        await asyncio.wait_for(runner.run_batch(b.id), 30)
    assert failing == {"record": 0, "release": 0}
    b = await Batch.objects.aget(pk=b.id)
    if cancel:
        assert b.status == "cancelled" and b.completed < 3, (b.status, b.completed)
    else:
        assert (b.status, b.completed, b.failed) == ("completed", 3, 0)


async def test_a_batch_whose_start_the_database_refused_once_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded runner's first step (``validating`` to ``in_progress``) erred once (SQLite
    busy past its timeout): the runner's task ended with the error and the batch stayed
    ``validating`` for good, until the server restarted. Now the step is tried again."""
    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    monkeypatch.setattr(runner, "FAILED_LINE_PAUSE_S", 0.01)
    real_begin, failing = runner.begin, [1]

    def begin(batch_id: str) -> None:
        if failing:
            failing.pop()
            raise OperationalError("database is locked")
        real_begin(batch_id)

    b = await sync_to_async(make_batch)(2)
    await Batch.objects.filter(pk=b.id).aupdate(status="validating", in_progress_at=None)  # as created
    monkeypatch.setattr(runner, "begin", begin)
    async with attached(SimWorker()):
        await asyncio.wait_for(runner.run_batch(b.id), 30)
    b = await Batch.objects.aget(pk=b.id)
    assert not failing and (b.status, b.completed) == ("completed", 2)
