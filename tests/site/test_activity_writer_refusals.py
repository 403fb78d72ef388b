"""The activity writer: a batch of one row the database refuses keeps its keys' last-used times."""

from __future__ import annotations

import asyncio

import pytest
from django.utils import timezone

from activity import log as activity_log
from activity import writer as activity_writer
from activity.models import ActivityEntry
from api.records import RequestRecord


@pytest.mark.django_db(transaction=True)
async def test_a_refused_batch_of_one_row_keeps_its_keys_last_used_times() -> None:
    """A batch of two split row by row and kept the keys' times; a batch of ONE refused row (a
    quiet server: one request finished, its row refused) gave the times up with the row, so the
    key's "last used" in the admin stayed at its older value."""
    from keys.models import ApiKey

    key = await ApiKey.objects.acreate(name="k", prefix="sf-k", digest="k" * 64)
    when = timezone.now()
    bad = {**activity_log.entry_fields(RequestRecord(endpoint="chat", request_id="one", status=200)), "status": -1}
    writer = activity_writer.ActivityWriter()  # one batch, as the writer's thread takes it
    await asyncio.to_thread(writer._write, [bad], {key.pk: when})
    assert [r async for r in ActivityEntry.objects.values_list("request_id", flat=True)] == []
    assert writer.failed == 1
    assert (await ApiKey.objects.aget(pk=key.pk)).last_used == when
