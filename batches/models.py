"""The OpenAI Batch API's files and batches, and each batch's lines (their results land here one
by one, so a line that ran is never run again: the Celery tasks are idempotent)."""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMED_FILE_ID = re.compile(r"file-([0-9a-f]{13})[0-9a-f]{12}")
_TIMED_BATCH_ID = re.compile(r"batch_([0-9a-f]{13})[0-9a-f]{12}")


def _timed_digits() -> str:
    """25 hex digits: now (microseconds since 1970, 13 digits) and 12 random ones."""
    micros = (timezone.now() - _EPOCH) // timedelta(microseconds=1)
    return f"{micros:013x}{secrets.token_hex(6)}"


def _named_time(pattern: re.Pattern[str], ident: str) -> datetime | None:
    m = pattern.fullmatch(ident)
    return _EPOCH + timedelta(microseconds=int(m.group(1), 16)) if m else None


def _file_id() -> str:
    """``file-`` and 25 hex digits: its creation time (microseconds since 1970, 13 digits) and
    12 random ones. The file's ``created_at`` is that time (File.save), so a list's cursor
    naming a file deleted since is still a place in the list (file_time). Files made before
    had 24 random digits: their ids name no time."""
    return "file-" + _timed_digits()


def file_time(file_id: str) -> datetime | None:
    """The creation time a file id names (``_file_id``), or None for an id of another form."""
    return _named_time(_TIMED_FILE_ID, file_id)


def _batch_id() -> str:
    """``batch_`` and 25 hex digits, as a file's id (``_file_id``): the batch list's cursor naming
    a batch deleted since (the admin deletes batches) is still a place in the list (batch_time).
    Batches made before had 24 random digits: their ids name no time."""
    return "batch_" + _timed_digits()


def batch_time(batch_id: str) -> datetime | None:
    """The creation time a batch id names (``_batch_id``), or None for an id of another form."""
    return _named_time(_TIMED_BATCH_ID, batch_id)


def _save_at_named_time(row: models.Model, named: datetime | None, save: Any, *args: Any, **kwargs: Any) -> None:
    """``save(*args, **kwargs)`` (the model's Model.save); a new row whose id names a time gets
    that time as its ``created_at``, exactly (``auto_now_add`` sets its own clock's reading at the
    insert, a little later)."""
    if named is None or not row._state.adding:
        save(*args, **kwargs)
        return
    with transaction.atomic(using=kwargs.get("using")):  # no reader sees the other time
        save(*args, **kwargs)
        type(row)._default_manager.using(row._state.db).filter(pk=row.pk).update(created_at=named)
    row.created_at = named  # type: ignore[attr-defined]


class JSONText(models.TextField):  # type: ignore[type-arg]
    """A JSON value kept as its text. PostgreSQL's ``jsonb`` (a JSONField) sorts an object's keys
    (a line's JSON schema would come back with its properties reordered, and structured output
    follows their order) and refuses U+0000 in a string (a line or a reply holding one could
    not be stored); the text keeps both exactly, on every database."""

    def from_db_value(self, value: str | None, _expression: Any, _connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def to_python(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value)


class File(models.Model):
    id = models.CharField(primary_key=True, max_length=64, default=_file_id, editable=False)
    purpose = models.CharField(max_length=32)  # batch (uploaded), batch_output (written here)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveIntegerField(default=0)
    content = models.BinaryField()
    owner = models.CharField(max_length=200, blank=True, default="", help_text="The API key's name; empty without a key.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """As Model.save; a new file's ``created_at`` is then the time its id names."""
        _save_at_named_time(self, file_time(self.id), super().save, *args, **kwargs)


class Batch(models.Model):
    STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]

    id = models.CharField(primary_key=True, max_length=64, default=_batch_id, editable=False)
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=16, default="24h")
    status = models.CharField(max_length=16, default="validating", choices=[(s, s) for s in STATUSES])
    # A file may be deleted (DELETE /v1/files/{id}) once the batch has ended (its lines are kept
    # apart from it); the batch still names it, as OpenAI's does: ``input_file_id`` is a required
    # string in its Batch object, and a strictly typed client failed to read a null there. So
    # these references hold no database constraint and a file's delete leaves them as they are.
    input_file = models.ForeignKey(File, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="batches")
    output_file = models.ForeignKey(File, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+")
    error_file = models.ForeignKey(File, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+")
    owner = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="", help_text="The Host the batch was created under; its lines are sent with it.")
    metadata = JSONText(null=True, blank=True)
    errors = JSONText(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)  # set when its window ran out: ends expired

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"{self.id} {self.status} {self.completed + self.failed}/{self.total}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """As Model.save; a new batch's ``created_at`` is then the time its id names."""
        _save_at_named_time(self, batch_time(self.id), super().save, *args, **kwargs)


class Line(models.Model):
    """One request of a batch: pending until its result (or error) is written."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    body = JSONText()
    claimed_until = models.DateTimeField(null=True, blank=True)  # a runner's lease on it
    done = models.BooleanField(default=False)
    ok = models.BooleanField(default=False)
    result = JSONText(null=True, blank=True)  # the output (or error) file's line

    class Meta:
        ordering = ["batch", "index"]
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="batch_line_index")]
        # a claim (the first pending line) and a finalize's check (any pending?) read the pending
        # lines in order without walking past the done ones: linear, not quadratic, in a batch's
        # size (bench/batch_claim.py)
        indexes = [models.Index(fields=["batch", "index"], condition=Q(done=False), name="batch_line_pending")]
