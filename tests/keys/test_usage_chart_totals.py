"""A key's usage charts count the same rows as the totals beside them (keys/usage.py)."""

from __future__ import annotations

import datetime

import pytest

from activity.models import ActivityEntry
from keys import usage

NOW = datetime.datetime(2026, 12, 5, 12, 30, tzinfo=datetime.UTC)


def row(ago: datetime.timedelta, key: str = "k") -> ActivityEntry:
    return ActivityEntry(time=NOW - ago, endpoint="chat", key_name=key, status=200, prompt_tokens=10, completion_tokens=5)


@pytest.mark.django_db
def test_the_bars_add_up_to_the_totals_at_the_windows_start() -> None:
    """At 12:30 the 24 hours start at 12:30 yesterday: a request at 12:45 yesterday was in the
    "last 24 hours" figure and on no hourly bar (they began at 13:00); the same for the day
    the 30 days start in. An operator saw 2 requests in the table and one bar."""
    h, m = datetime.timedelta(hours=1), datetime.timedelta(minutes=1)
    ActivityEntry.objects.bulk_create(
        [
            row(23 * h + 45 * m),  # in both windows, in the hour the 24 hours start in
            row(5 * m),
            row(24 * h + 5 * m),  # before the 24 hours: on no hourly bar
            row(30 * 24 * h - 2 * h),  # in the day the 30 days start in
            row(30 * 24 * h + 2 * h),  # before the 30 days: on no bar
            row(5 * m, key="other"),
        ]
    )
    totals = usage.totals("k", NOW)
    for window, hours in (("24h", True), ("30d", False)):
        series = usage.buckets("k", hours, NOW)
        assert sum(b.requests for b in series) == totals[window]["requests"], window
        assert sum(b.tokens_in for b in series) == totals[window]["tokens_in"], window
        assert series[-1].start <= NOW < series[-1].start + (series[1].start - series[0].start)
        assert series[0].start <= NOW - usage.WINDOWS[window]
    assert totals["24h"]["requests"] == 2 and totals["30d"]["requests"] == 4
