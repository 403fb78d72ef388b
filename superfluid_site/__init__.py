# The Celery app (Redis mode's Batch API), loaded with Django so that tasks are sent through it
from .celery import app as celery_app

__all__ = ("celery_app",)
