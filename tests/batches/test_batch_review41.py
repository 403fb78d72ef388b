"""Review 41 of the Batch API against what OpenAI's client and documented behaviour lead a user
to expect: ``expires_at`` is exactly the completion window after ``created_at``."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from batches import views
from batches.models import Batch, File

pytestmark = pytest.mark.django_db(transaction=True)


def input_file(n: int, owner: str = "") -> File:
    data = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}) + "\n" for i in range(n))
    f: File = File.objects.create(purpose="batch", filename="in.jsonl", bytes=len(data), content=data.encode(), owner=owner)
    return f


def test_expires_at_is_exactly_the_24_hour_window_after_created_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """``expires_at`` was "now" read at the start of the create plus 24 h, and ``created_at`` the
    time the batch's id names, read later (after the lines were parsed and the input file's row
    was locked: another batch being created from the same file holds it while it writes its
    lines). A second boundary between the two readings made the window 86399 s, or less under a
    wait for the lock; OpenAI's ``expires_at`` is ``created_at`` plus the window. Here the clock
    moves 0.6 s at each reading, from a time 0.7 s past a second."""
    f = input_file(2)
    start = datetime(2030, 1, 1, 0, 0, 0, 700_000, tzinfo=UTC)
    ticks = itertools.count()
    monkeypatch.setattr(timezone, "now", lambda: start + timedelta(seconds=0.6 * next(ticks)))
    b = views._create("", "localhost", f.id, "/v1/completions", "24h", None)
    shown = views.batch_object(Batch.objects.get(pk=b.id))
    assert shown["expires_at"] - shown["created_at"] == 24 * 3600, shown
    assert b.expires_at == b.created_at + timedelta(hours=24)
