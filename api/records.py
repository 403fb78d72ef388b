"""What is kept about each generation request once it ends: no prompt or reply text, ever.

``record_request()`` runs once per request, when its response has ended. It writes one
content-free access-log line, counts the request in /metrics (``api/metrics.py``) and stores a
row in the activity log (``activity/writer.py``: a thread of its own writing in batches), so
neither the event loop nor Django's sync thread ever waits on the database for it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

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
        ("held_wait_ms", timing.get("held_wait_ms")),
        ("ttft_ms", timing.get("ttft_ms")),
        ("total_ms", timing.get("total_ms")),
        ("preemptions", timing.get("preemptions")),
    ]
    rendered = " ".join(f"{k}={'-' if v is None or v == '' else _value(v)}" for k, v in fields)
    return f"{record.endpoint} {_value(record.request_id or '-')} {rendered}"


_PLAIN = re.compile(r'[^\s"=\\\x00-\x1f\x7f-\x9f\u2028\u2029]+')


def _value(value: object) -> str:
    """A field's value as it is, or quoted (JSON) where it has a space, a quote, an ``=`` or a
    control character: a key or model name with a newline wrote a second, made-up line, and one
    with a space a line no parser split right."""
    text = str(value)
    return text if _PLAIN.fullmatch(text) else json.dumps(text)


async def record_request(record: RequestRecord) -> None:
    """The access-log line, the /metrics counters, and the activity-log row of one request.

    Nothing here waits on the database: the row goes to the activity writer's queue (its own
    thread and connection, writing in batches), so a burst of finished or dropped requests
    never holds up another request's disconnect."""
    record_now(record)


def record_now(record: RequestRecord) -> None:
    """``record_request`` for a caller that is not a coroutine (the edge's refusals in the
    protocol layer, api/edge.py); it never blocks either."""
    access_log.info("%s", access_line(record))
    try:
        from .metrics import observe_record

        observe_record(record)
    except Exception:
        log.exception("could not count the request in /metrics")
    try:
        from activity.log import entry_fields
        from activity.writer import submit

        submit(entry_fields(record))
    except Exception:
        log.exception("could not queue the activity log entry for %s", record.request_id or record.endpoint)
