"""What is kept about each generation request once it ends: no prompt or reply text, ever."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

access_log = logging.getLogger("superfluid.access")


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


async def record_request(record: RequestRecord) -> None:
    """One content-free access-log line per generation request."""
    access_log.info(
        "%s %s status=%s key=%s model=%s class=%s priority=%s finish=%s error=%s prompt=%s completion=%s "
        "queue_wait_ms=%s ttft_ms=%s total_ms=%s",
        record.endpoint,
        record.request_id or "-",
        record.status,
        record.key_name or "-",
        record.model or "-",
        record.qos or "-",
        record.priority,
        record.finish_reason or "-",
        record.error_code or "-",
        record.usage.get("prompt_tokens", "-"),
        record.usage.get("completion_tokens", "-"),
        record.timing.get("queue_wait_ms", "-"),
        record.timing.get("ttft_ms", "-"),
        record.timing.get("total_ms", "-"),
    )
