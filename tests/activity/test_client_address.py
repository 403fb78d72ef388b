"""The client address an activity row keeps, as the database's IP column takes it."""

from __future__ import annotations

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
