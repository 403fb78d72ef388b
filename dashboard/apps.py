from django.apps import AppConfig


class DashboardConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "dashboard"
    verbose_name = "Live dashboard"

    def ready(self) -> None:
        from scheduler.link.client import SNAPSHOT_LISTENERS

        from .feed import on_snapshot

        if on_snapshot not in SNAPSHOT_LISTENERS:
            SNAPSHOT_LISTENERS.append(on_snapshot)
