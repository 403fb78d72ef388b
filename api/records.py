"""What is kept about each generation request once it ends: no prompt or reply text, ever.

``record_request()`` runs once per request, when its response has ended. It writes one
content-free access-log line, counts the request in /metrics (``api/metrics.py``) and stores a
row in the activity log (``activity/``) from a worker thread, so the event loop never waits on
the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

access_log = logging.getLogger("superfluid.access")
log = logging.getLogger("superfluid.activity")


@dataclass
class RequestRecord:
    """Filled in as a request goes through the API; written once when its response ends."""

    endpoint: str
    started_s: float = field(default_factory=time.time)
    request_id: str | None = None
    model: str | None = None
    key_name: str | None = None
    client_ip: str | None = None
    qos: str | None = None
    priority: int | None = None
    band: str | None = None
    stream: bool = False
    status: int = 0
    error_code: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # prompt_tokens, completion_tokens, cached_tokens
    timing: dict[str, Any] = field(default_factory=dict)  # queue_wait_ms, ttft_ms, total_ms, preemptions
    serial: dict[str, Any] = field(default_factory=dict)  # serial_priority, serial_band, serial_score, serial_queue_wait_ms

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def access_line(record: RequestRecord) -> str:
    """One line per generation: identifiers, decisions, counts and timings; no text."""
    usage, timing, serial = record.usage, record.timing, record.serial
    fields = [
        ("status", record.status),
        ("key", record.key_name),
        ("model", record.model),
        ("class", record.qos),
        ("priority", record.priority),
        ("band", record.band),
        ("score", serial.get("serial_score")),
        ("stream", int(record.stream)),
        ("finish", record.finish_reason),
        ("error", record.error_code),
        ("prompt", usage.get("prompt_tokens")),
        ("cached", usage.get("cached_tokens")),
        ("completion", usage.get("completion_tokens")),
        ("queue_wait_ms", timing.get("queue_wait_ms")),
        ("ttft_ms", timing.get("ttft_ms")),
        ("total_ms", timing.get("total_ms")),
        ("preemptions", timing.get("preemptions")),
    ]
    rendered = " ".join(f"{k}={'-' if v is None or v == '' else v}" for k, v in fields)
    return f"{record.endpoint} {record.request_id or '-'} {rendered}"


_pending: set[asyncio.Task[None]] = set()


def _activity_write(record: RequestRecord) -> None:
    from activity.log import write

    write(record)


# Django's thread for sync code: rows are written one at a time, never on the event loop
_write_activity = sync_to_async(_activity_write, thread_sensitive=True)


async def record_request(record: RequestRecord) -> None:
    """The access-log line, the /metrics counters, and the activity-log row of one request."""
    access_log.info("%s", access_line(record))
    try:
        from .metrics import observe_record

        observe_record(record)
    except Exception:
        log.exception("could not count the request in /metrics")
    # shielded: a second cancel of the response task must not lose the row
    task = asyncio.get_running_loop().create_task(_store(record))
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    await asyncio.shield(task)


async def _store(record: RequestRecord) -> None:
    try:
        await _write_activity(record)
    except Exception:
        log.exception("could not write the activity log entry for %s", record.request_id or record.endpoint)
