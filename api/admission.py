"""Who may ask for what: a request's class, priority and lane kind, decided before it is queued.

Today: the QoS header, the priority header, the server's defaults and the batch-invariant gate.
Key policies (auth, max class, rate and concurrency limits) plug in here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from scheduler.core.qos import QosClass, UnknownQosClass, band_of, class_of_priority, parse_priority, parse_qos

from .errors import ApiError, invalid_request
from .schemas import GenerationRequest


@dataclass
class Admission:
    """What a request was granted. ``release()`` must be called when its response ends."""

    qos: QosClass
    priority: int
    batch_invariant: bool = False
    key_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def band(self) -> str:
        return band_of(self.priority)

    async def release(self) -> None:
        return None


def resolve_class(headers: dict[str, str], request: GenerationRequest) -> tuple[QosClass, int]:
    """Class from x-superfluid-qos, else from the priority header's band, else the default."""
    raw_priority = headers.get("x-llamaswap-priority")
    priority = parse_priority(raw_priority)
    if request.suffix is not None:
        return QosClass.COMPLETION, priority  # fill-in-the-middle always runs as completion
    raw_qos = headers.get("x-superfluid-qos") if settings.SUPERFLUID_HTTP_QOS_HEADER else None
    if raw_qos is not None:
        try:
            return parse_qos(raw_qos), priority
        except UnknownQosClass as exc:
            raise invalid_request(str(exc), param="x-superfluid-qos", code="invalid_qos_class") from None
    if raw_priority is not None:
        return class_of_priority(priority), priority
    return parse_qos(settings.SUPERFLUID_HTTP_DEFAULT_QOS), priority


def wants_batch_invariant(headers: dict[str, str]) -> bool:
    return headers.get("x-superfluid-batch-invariant", "").strip().lower() in ("1", "true", "yes")


async def admit(headers: dict[str, str], client: tuple[str, int] | None, request: GenerationRequest) -> Admission:
    """Decide class, priority and lane kind for one request, or raise an ApiError."""
    qos, priority = resolve_class(headers, request)
    batch_invariant = wants_batch_invariant(headers)
    if batch_invariant and not settings.SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT:
        raise ApiError(
            403,
            "Batch-invariant lanes are not allowed for this client.",
            type="permission_error",
            param="x-superfluid-batch-invariant",
            code="batch_invariant_forbidden",
        )
    return Admission(qos=qos, priority=priority, batch_invariant=batch_invariant)
