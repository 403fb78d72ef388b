"""The activity log: one row per generation request, and never any prompt or reply text."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ActivityEntry(models.Model):
    time = models.DateTimeField(default=timezone.now, help_text="When the request arrived.")
    request_id = models.CharField(max_length=64, blank=True)
    key_name = models.CharField("key", max_length=200, blank=True, help_text="API key name; empty without one.")
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    endpoint = models.CharField(max_length=32)
    stream = models.BooleanField(default=False)
    qos_class = models.CharField("class", max_length=16, blank=True)
    priority = models.IntegerField(null=True, blank=True)
    band = models.CharField(max_length=16, blank=True)
    # the serial dispatch decision (request priority): what it won with and how long it waited
    serial_priority = models.IntegerField(null=True, blank=True)
    serial_band = models.CharField(max_length=16, blank=True)
    serial_score = models.FloatField("score", null=True, blank=True)
    serial_queue_wait_ms = models.FloatField(null=True, blank=True)
    queue_wait_ms = models.FloatField(null=True, blank=True)
    held_wait_ms = models.FloatField(
        null=True,
        blank=True,
        help_text="Of the queue wait, the time a lane was free that the request's class could not take: its "
        "class-lane cap reached, or background held under critical memory pressure. The rest waited for a lane.",
    )
    ttft_ms = models.FloatField("TTFT ms", null=True, blank=True)
    total_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.IntegerField(null=True, blank=True)
    cached_tokens = models.IntegerField(null=True, blank=True)
    completion_tokens = models.IntegerField(null=True, blank=True)
    preemptions = models.IntegerField(default=0)
    finish_reason = models.CharField(max_length=32, blank=True)
    status = models.PositiveSmallIntegerField("HTTP status", default=0)
    error_code = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-time"]
        verbose_name = "activity entry"
        verbose_name_plural = "activity log"
        indexes = [
            models.Index(fields=["time"], name="activity_time"),
            models.Index(fields=["key_name", "time"], name="activity_key_time"),
            models.Index(fields=["qos_class", "time"], name="activity_class_time"),
        ]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.endpoint} {self.key_name or '-'} {self.status}"
