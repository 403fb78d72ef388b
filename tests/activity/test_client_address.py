"""The client address an activity row keeps, as the database's IP column takes it."""

from __future__ import annotations

from typing import Any

import pytest

from activity import log as activity_log
from activity.models import ActivityEntry
from api.records import RequestRecord

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(("peer", "kept"), [("fe80::1%eth0", "fe80::1"), ("fe80::abcd%3", "fe80::abcd"), ("127.0.0.1", "127.0.0.1"),
                                            ("::1", "::1"), ("batch:batch_x", None), ("", None)])
def test_a_link_local_clients_row_keeps_its_address_without_the_zone(peer: str, kept: str | None) -> None:
    """A client reaching the server at a link-local IPv6 address has its peer address with the
    interface (``fe80::1%eth0``: the socket gives it so). The row kept it whole, which
    PostgreSQL's ``inet`` refuses: the row was given up (docs/operations.md: no value a client
    sends can lose its row), and SQLite's stored an address no IP filter matches."""
    fields = activity_log.entry_fields(RequestRecord(endpoint="chat", request_id="r", client_ip=peer, status=200))
    assert fields["client_ip"] == kept
    ActivityEntry.objects.create(**fields)
    assert ActivityEntry.objects.get(request_id="r").client_ip == kept


def test_the_admin_finds_a_keyless_clients_rows_by_its_address(admin_client: Any) -> None:
    """A keyless caller asking why their request waited knows their address, not a request id;
    the list searched request ids, keys, models and error codes only."""
    for rid, ip in (("mine-1", "10.1.2.3"), ("mine-2", "10.1.2.3"), ("theirs", "10.1.2.30"), ("v6", "2001:db8::7")):
        ActivityEntry.objects.create(**activity_log.entry_fields(RequestRecord(endpoint="chat", request_id=rid, client_ip=ip, status=200)))

    def found(q: str) -> set[str]:
        page = admin_client.get("/admin/activity/activityentry/", {"q": q})
        assert page.status_code == 200
        return {row.request_id for row in page.context["cl"].result_list}

    assert found("10.1.2.3") >= {"mine-1", "mine-2"} and "v6" not in found("10.1.2.3")  # and 10.1.2.30: it contains it
    assert found("2001:db8::7") == {"v6"}
