"""A very long activity-log retention (SUPERFLUID_ACTIVITY_RETENTION_DAYS, pruneactivity --days)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

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
