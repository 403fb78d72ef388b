"""POST /v1/batches/{id}/cancel of a batch whose completion window ran out: it cannot be
cancelled, as one that ended cannot (409, the SDK's ConflictError), and it still ends
``expired``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from batches import runner
from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's first Batch API request resumes what a previous run left, its leases
    given up: not these batches, whose lines in flight stand for a runner of this test."""
    monkeypatch.setattr(runner, "_resumed", True)


def make_batch(n: int) -> Batch:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="", total=n)
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body={}) for i in range(n)])
    runner.begin(b.id)
    return b


def cancel(batch_id: str) -> Any:
    return Client().post(f"/v1/batches/{batch_id}/cancel")


def test_a_cancel_while_the_batch_expires_is_409_and_the_batch_still_expires() -> None:
    """A batch winding down as its window ran out (shown ``finalizing``, a line in flight) was
    answered 200 with the batch as it was, as if the cancel had been taken, though nothing was
    cancelled and it ended ``expired``. It is 409, as for every batch that cannot be cancelled."""
    b = make_batch(3)
    first, _second = runner.claim(b.id), runner.claim(b.id)
    runner.record(first.pk, True, {"id": "batch_req_x", "custom_id": "c0", "response": {"status_code": 200, "request_id": "r", "body": {}}, "error": None})
    Batch.objects.filter(pk=b.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert runner.claim(b.id) is None  # the runner saw the window run out: c1 winds down
    assert Client().get(f"/v1/batches/{b.id}").json()["status"] == "finalizing"
    r = cancel(b.id)
    assert r.status_code == 409, r.content
    error = r.json()["error"]
    assert error["message"] == "Cannot cancel a batch with status 'finalizing'." and error["type"] == "invalid_request_error"
    b.refresh_from_db()
    assert (b.status, b.cancelling_at) == ("cancelling", None) and b.expired_at is not None
    Line.objects.filter(batch=b, done=False).update(claimed_until=None)  # c1's runner gave it up
    assert runner.finalize_if_done(b.id)
    shown = Client().get(f"/v1/batches/{b.id}").json()
    assert (shown["status"], shown["cancelled_at"], shown["request_counts"]) == ("expired", None, {"total": 3, "completed": 1, "failed": 2})


def test_a_cancel_of_a_batch_past_its_window_that_no_runner_looked_at_finds_it_expired() -> None:
    """A batch past its ``expires_at`` expires when a runner next looks. A cancel that came
    first made it ``cancelled`` (200), its unrun lines in no file; OpenAI's batch past its window
    is expired and cannot be cancelled. The cancel now sees the window as a runner does."""
    b = make_batch(2)
    Batch.objects.filter(pk=b.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = cancel(b.id)
    assert r.status_code == 409, r.content
    assert r.json()["error"]["message"] == "Cannot cancel a batch with status 'expired'."
    b = Batch.objects.select_related("error_file").get(pk=b.id)
    assert (b.status, b.cancelled_at, b.failed) == ("expired", None, 2)
    assert [json.loads(x)["error"]["code"] for x in bytes(b.error_file.content).decode().splitlines()] == ["batch_expired"] * 2


def test_a_cancel_within_the_window_still_cancels_and_a_second_cancel_is_the_batch() -> None:
    b = make_batch(2)
    runner.claim(b.id)  # a line in flight: the cancel waits for it
    r = cancel(b.id)
    assert (r.status_code, r.json()["status"]) == (200, "cancelling")
    again = cancel(b.id)
    assert (again.status_code, again.json()["status"]) == (200, "cancelling")
