"""The activity log's retention (SUPERFLUID_ACTIVITY_RETENTION_DAYS, pruneactivity --days): a very long one, and a prune of many rows."""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from activity import log as activity_log


@pytest.mark.django_db
@pytest.mark.parametrize("days", [1_000_000, 10**10])
def test_a_retention_longer_than_the_calendar_keeps_everything_instead_of_raising(days: int) -> None:
    """SUPERFLUID_ACTIVITY_RETENTION_DAYS=1000000 ("keep it all, practically") made every hourly
    prune raise OverflowError (the cutoff fell before year 1), logged as "could not prune the
    activity log" each hour, and `manage.py pruneactivity --days 1000000` end in a traceback."""
    assert activity_log.prune(days) == 0
    out = io.StringIO()
    call_command("pruneactivity", "--days", str(days), stdout=out)
    assert "deleted 0 activity entries" in out.getvalue()


def _old_and_new_rows(old: int, new: int) -> None:
    from activity.models import ActivityEntry

    now = timezone.now()
    ActivityEntry.objects.bulk_create(
        [ActivityEntry(endpoint="chat", request_id=f"old{i}", time=now - datetime.timedelta(days=40, seconds=i)) for i in range(old)]
        + [ActivityEntry(endpoint="chat", request_id=f"new{i}", time=now - datetime.timedelta(days=1, seconds=i)) for i in range(new)]
    )


def _deletes(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("DELETE")]


@pytest.mark.django_db
def test_a_prune_of_many_rows_deletes_them_in_bounded_batches_not_one_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowered retention on a large log deleted every old row in ONE statement, holding the
    table (on SQLite the whole database: keys, the admin, the writer's next batch) locked for
    all of it. It deletes PRUNE_BATCH rows a statement, each on its own, until none is left."""
    from activity.models import ActivityEntry

    monkeypatch.setattr(activity_log, "PRUNE_BATCH", 4)
    _old_and_new_rows(old=11, new=3)
    with CaptureQueriesContext(connection) as queries:
        assert activity_log.prune(30) == 11
    assert sorted(ActivityEntry.objects.values_list("request_id", flat=True)) == ["new0", "new1", "new2"]
    assert len(_deletes(queries)) >= 3, _deletes(queries)  # 4 + 4 + 3 rows
    out = io.StringIO()
    call_command("pruneactivity", "--days", "0", stdout=out)  # 0 keeps everything
    assert ActivityEntry.objects.count() == 3


@pytest.mark.django_db
def test_the_servers_hourly_prune_of_a_long_backlog_goes_on_across_the_writers_batches(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The writer's thread prunes after a batch: a backlog of millions of rows (a lowered
    retention) kept it deleting for minutes while no request's row was written. It deletes a
    bounded share per written batch and goes on with the next one, not an hour later."""
    from activity.models import ActivityEntry

    monkeypatch.setattr(activity_log, "PRUNE_BATCH", 2)
    monkeypatch.setattr(activity_log, "PRUNE_BATCHES_PER_WRITE", 2)
    monkeypatch.setattr(activity_log, "_last_prune", None)
    monkeypatch.setattr(activity_log, "_pruning", False)
    settings.SUPERFLUID_ACTIVITY_RETENTION_DAYS = 30
    _old_and_new_rows(old=9, new=2)
    assert activity_log.maybe_prune(now=1000.0) == 4
    assert activity_log.maybe_prune(now=1001.0) == 4  # the next batch written: not an hour later
    assert activity_log.maybe_prune(now=1002.0) == 1
    assert activity_log.maybe_prune(now=1003.0) == 0  # done: the next one in an hour
    _old_and_new_rows(old=1, new=0)
    assert activity_log.maybe_prune(now=1004.0) == 0
    assert activity_log.maybe_prune(now=1000.0 + activity_log.PRUNE_INTERVAL_S + 1) == 1
    assert ActivityEntry.objects.filter(request_id__startswith="old").count() == 0
