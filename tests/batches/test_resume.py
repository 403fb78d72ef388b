"""The embedded runner's resume of batches a previous run of the server left unfinished."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError
from django.utils import timezone

from batches import runner
from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db(transaction=True)


def left_running() -> Batch:
    """A batch a previous run of the server was running when it stopped: in progress, its one
    line still leased to that (gone) process."""
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(
        endpoint="/v1/completions", input_file=f, owner="", total=1, status="in_progress",
        in_progress_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=24),
    )
    Line.objects.create(batch=b, index=0, custom_id="c0", body={"model": "sim", "prompt": "p"}, claimed_until=timezone.now() + timedelta(hours=1))
    return b


async def test_a_resume_the_database_refused_is_tried_again_at_the_next_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded resume marked itself done before it read the database: one failure there
    (SQLite busy past its timeout at the first Batch API request after a restart) left every
    unfinished batch in progress, never run, for the life of the process."""
    b = await sync_to_async(left_running)()
    monkeypatch.setattr(runner, "_resumed", False)
    monkeypatch.setattr(runner, "celery_mode", lambda: False)
    started: list[str] = []

    async def start(batch_id: str) -> None:
        started.append(batch_id)

    monkeypatch.setattr(runner, "start", start)
    real = runner.finalize_if_done
    fails = [OperationalError("database is locked")]

    def finalize_once_locked(batch_id: str) -> Any:
        if fails:
            raise fails.pop()
        return real(batch_id)

    monkeypatch.setattr(runner, "finalize_if_done", finalize_once_locked)
    await runner.resume_local()  # the first request: the database erred (logged; the request goes on)
    assert started == [] and not fails
    await runner.resume_local()  # the next request resumes the batch
    assert started == [b.id]
    assert await Line.objects.filter(batch=b, claimed_until__isnull=True).acount() == 1
