"""Writing the activity log (from ``api/records.py``) and keeping it within its retention."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import math
import time
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

log = logging.getLogger("superfluid.activity")

PRUNE_INTERVAL_S = 3600.0
PRUNE_BATCH = 5000  # rows per DELETE statement
PRUNE_BATCHES_PER_WRITE = 4  # the server's prune: statements per batch the writer writes


class RequestRecord(Protocol):
    """The plain fields of one finished request that its row keeps (``api.records.RequestRecord``
    has them; this app imports nothing of the API)."""

    endpoint: str
    started_s: float
    request_id: str | None
    model: str | None
    key_name: str | None
    client_ip: str | None
    qos: str | None
    priority: int | None
    band: str | None
    stream: bool
    status: int
    error_code: str | None
    finish_reason: str | None
    usage: dict[str, Any]
    timing: dict[str, Any]
    serial: dict[str, Any]


_last_prune: float | None = None
_pruning = False  # the server's prune has more to delete: it goes on at the next write


def retention_days() -> int:
    return int(getattr(settings, "SUPERFLUID_ACTIVITY_RETENTION_DAYS", 30))


def _ip(value: str | None) -> str | None:
    """A client address the database's IP type accepts, or None (a Unix socket peer, say). A
    link-local IPv6 peer's zone (``fe80::1%eth0``) is dropped: PostgreSQL's ``inet`` refuses it."""
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0])) if value else None
    except ValueError:
        return None


INT32_MAX = 2**31 - 1


def _int32(value: int | None) -> int | None:
    """An integer the IntegerField columns hold on every database (PostgreSQL's is int32;
    SQLite's int64 raised OverflowError beyond it): clamped, never lost."""
    return None if value is None else max(-INT32_MAX - 1, min(INT32_MAX, int(value)))


def entry_fields(record: RequestRecord) -> dict[str, Any]:
    """The row for one request: identifiers, decisions, timings and counts; no text."""
    usage, timing, serial = record.usage or {}, record.timing or {}, record.serial or {}

    def num(d: dict[str, Any], key: str) -> Any:
        value = d.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return _int32(value)
        return value if isinstance(value, float) and math.isfinite(value) else None

    def count(d: dict[str, Any], key: str) -> int | None:  # an integer column: a float is rounded into it
        value = num(d, key)
        return None if value is None else _int32(round(value))

    return {
        "time": datetime.datetime.fromtimestamp(record.started_s, tz=datetime.UTC),
        "request_id": (record.request_id or "")[:64],
        "key_name": (record.key_name or "")[:200],
        "client_ip": _ip(record.client_ip),
        "model": (record.model or "")[:200],
        "endpoint": record.endpoint[:32],
        "stream": bool(record.stream),
        "qos_class": record.qos or "",
        "priority": _int32(record.priority),
        "band": record.band or "",
        "serial_priority": count(serial, "serial_priority"),
        "serial_band": str(serial.get("serial_band") or "")[:16],
        "serial_score": num(serial, "serial_score"),
        "serial_queue_wait_ms": num(serial, "serial_queue_wait_ms"),
        "queue_wait_ms": num(timing, "queue_wait_ms"),
        "held_wait_ms": num(timing, "held_wait_ms"),
        "ttft_ms": num(timing, "ttft_ms"),
        "total_ms": num(timing, "total_ms"),
        "prompt_tokens": count(usage, "prompt_tokens"),
        "cached_tokens": count(usage, "cached_tokens"),
        "completion_tokens": count(usage, "completion_tokens"),
        "preemptions": count(timing, "preemptions") or 0,
        "finish_reason": (record.finish_reason or "")[:32],
        "status": max(0, int(record.status or 0)),
        "error_code": (record.error_code or "")[:64],
    }


def write(record: RequestRecord) -> None:
    """Store one request's row (sync: run it through sync_to_async), pruning at most hourly."""
    from .models import ActivityEntry

    ActivityEntry.objects.create(**entry_fields(record))
    maybe_prune()


def prune(days: int | None = None, max_batches: int | None = None) -> int:
    """Delete rows older than ``days`` (default: the retention setting; 0 keeps everything), at
    most ``PRUNE_BATCH`` rows a statement, each on its own: a lowered retention on a large log
    never holds the table (on SQLite the whole database) locked for all of its old rows, and
    other writers get in between. ``max_batches`` stops it after that many (the rest: later)."""
    deleted = _prune(days, max_batches)
    if deleted:
        log.info("activity log: pruned %d entries older than %d days", deleted, retention_days() if days is None else days)
    return deleted


def _prune(days: int | None, max_batches: int | None) -> int:
    from .models import ActivityEntry

    days = retention_days() if days is None else days
    if days <= 0:
        return 0
    try:
        cutoff = timezone.now() - datetime.timedelta(days=days)
    except OverflowError:  # a cutoff before year 1: no row is that old
        return 0
    deleted, batches = 0, 0
    while max_batches is None or batches < max_batches:
        # the oldest PRUNE_BATCH rows (the time index), by primary key: a bounded statement
        oldest = ActivityEntry.objects.filter(time__lt=cutoff).order_by("time").values("pk")[:PRUNE_BATCH]
        count, _ = ActivityEntry.objects.filter(pk__in=oldest).delete()
        deleted, batches = deleted + count, batches + 1
        if count < PRUNE_BATCH:
            break
    return deleted


def maybe_prune(now: float | None = None) -> int:
    """The server's prune, at most hourly as it writes; one that has more to delete than
    ``PRUNE_BATCHES_PER_WRITE`` batches goes on at the writer's next batch, so the writer
    never spends minutes deleting while no request's row is written."""
    global _last_prune, _pruning
    now = time.monotonic() if now is None else now
    if not _pruning and _last_prune is not None and now - _last_prune < PRUNE_INTERVAL_S:
        return 0
    if not _pruning:
        _last_prune = now
    _pruning = False  # a prune that fails is tried again at the next interval, not at each write
    deleted = prune(max_batches=PRUNE_BATCHES_PER_WRITE)
    _pruning = deleted >= PRUNE_BATCHES_PER_WRITE * PRUNE_BATCH
    return deleted
