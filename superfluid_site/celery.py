"""The Celery app for the Batch API in Redis mode: ``celery -A superfluid_site worker``.

Its broker is ``CELERY_BROKER_URL``, else ``REDIS_URL`` (the same Redis the fleet uses). Tasks
(batches/tasks.py) are short (one batch line each), idempotent, and acknowledged late: a worker
killed mid-task leaves its task to be delivered again."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")

app = Celery("superfluid_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
