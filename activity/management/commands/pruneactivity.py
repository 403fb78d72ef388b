from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from activity.log import prune, retention_days


class Command(BaseCommand):
    help = "Delete activity log entries older than the retention (SUPERFLUID_ACTIVITY_RETENTION_DAYS, default 30)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--days", type=int, default=None, help="keep this many days instead of the setting")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"] if options["days"] is not None else retention_days()
        if days < 0:
            raise CommandError("--days must be 0 (keep everything) or more")
        deleted = prune(days)
        if days == 0:
            self.stdout.write("retention is 0 days: the activity log is kept whole")
        else:
            self.stdout.write(f"deleted {deleted} activity entries older than {days} days")
