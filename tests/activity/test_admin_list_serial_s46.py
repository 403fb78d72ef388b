"""The activity admin's list shows why a request waited: the request-priority seed names
``serial_priority`` and ``serial_band`` (beside the score and the wait) as what an operator reads
for that, and the list had only the score and the wait (the priority and band it was dispatched
with were on each row's detail page alone)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from activity.models import ActivityEntry

pytestmark = pytest.mark.django_db


def _table(page: Any) -> tuple[str, str]:
    table = page.content.decode().split('id="result_list"')[1].split("</table>")[0]
    header, body = table.split("</thead>")
    return header, body


def test_the_list_shows_the_serial_priority_and_band(admin_client: Any) -> None:
    ActivityEntry.objects.create(endpoint="chat", request_id="waited", qos_class="background", priority=-73, band="batch",
                                 serial_priority=-73, serial_band="batch", serial_score=-12.5, serial_queue_wait_ms=98765.0, status=200)
    header, body = _table(admin_client.get("/admin/activity/activityentry/"))
    assert "Serial priority" in header and "Serial band" in header, header
    assert body.count("-73") == 2 and body.count(">batch<") == 2, body


def test_the_serial_band_filter_lists_fixed_bands_and_reads_no_distinct(admin_client: Any) -> None:
    ActivityEntry.objects.create(endpoint="chat", request_id="a", key_name="key-a", band="normal", serial_priority=-60, serial_band="batch", status=200)
    ActivityEntry.objects.create(endpoint="chat", request_id="b", key_name="key-b", band="normal", serial_priority=0, serial_band="normal", status=200)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/activity/activityentry/", {"serial_band": "batch"})
    assert page.status_code == 200
    assert "By serial band" in page.content.decode()
    _header, body = _table(page)
    assert "key-a" in body and "key-b" not in body, body
    assert not any("DISTINCT" in q["sql"] and "serial_band" in q["sql"] for q in queries.captured_queries)
