"""Revoke an API key by name: the running server refuses it within a second."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from keys import actions
from keys.models import ApiKey


class Command(BaseCommand):
    help = "Revoke an API key; requests with it get 401 from then on (within a second on a running server)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="the key's name")

    def handle(self, *args: Any, **options: Any) -> None:
        key = ApiKey.objects.filter(name=options["name"]).first()
        if key is None:
            raise CommandError(f"no key named {options['name']!r}")
        actions.revoke_keys([key])
        self.stdout.write(f"revoked key {key.name!r} ({key.prefix}…)")
