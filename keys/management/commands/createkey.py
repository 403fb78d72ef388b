"""Create an API key from a script: ``manage.py createkey NAME [policy flags]``.

The new secret is the last line printed; it exists nowhere else afterwards.

- ``--policy P``: the key follows policy P; P is created from the policy flags when it does not
  exist (giving policy flags for an existing P is an error: edit it in the admin).
- policy flags without ``--policy``: a policy named after the key is created with them.
- no policy flags and no ``--policy``: the key follows the server's defaults.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from keys import actions
from keys.models import ApiKey, KeyPolicy
from keys.policyfile import PolicyFileError
from scheduler.core.qos import UnknownQosClass, parse_qos
from superfluid_site.serving import serving

MAX_EXPIRES_DAYS = 36_500  # a hundred years
POLICY_FLAGS = ("qos_class", "max_class", "rpm", "max_concurrent", "batch_invariant", "admin", "priority_offset", "models")


def _qos(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        return int(parse_qos(value))
    except UnknownQosClass as exc:
        raise CommandError(f"{flag}: {exc}") from None


def _errors(exc: ValidationError) -> str:
    if hasattr(exc, "message_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
    return " ".join(exc.messages)


class Command(BaseCommand):
    help = "Create an API key and print its secret (the last line). It is shown only this once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="the key's unique name (what logs and metrics show)")
        parser.add_argument("--policy", help="policy to follow (created from the flags below when missing)")
        parser.add_argument("--class", dest="qos_class", help="default class: interactive, completion, agent, background")
        parser.add_argument("--max-class", help="best class x-superfluid-qos may ask for (default: the default class)")
        parser.add_argument("--rpm", type=int, help="requests per minute (0 = unlimited)")
        parser.add_argument("--max-concurrent", type=int, help="requests in flight at once (0 = unlimited)")
        parser.add_argument("--batch-invariant", action="store_true", default=None, help="may ask for batch-invariant lanes")
        parser.add_argument("--admin", action="store_true", default=None, help="may use admin routes and see every key's metrics")
        parser.add_argument("--priority-offset", type=int, help="tier offset added to X-LlamaSwap-Priority (-39..39)")
        parser.add_argument("--models", help="comma-separated model ids the key may use (default: all)")
        parser.add_argument("--owner", default="", help="who holds the key")
        parser.add_argument("--notes", default="")
        parser.add_argument("--expires-days", type=float, help="expire after this many days")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"a key named {name!r} exists already")
        policy_given = any(options[f] is not None for f in POLICY_FLAGS)
        try:
            with transaction.atomic():
                policy = self._policy(options, options["policy"], policy_given)
                expires = None
                days = options["expires_days"]
                if days is not None:
                    if not 0 < days <= MAX_EXPIRES_DAYS:  # NaN too; inf and huge overflowed the date with a traceback
                        raise CommandError(f"--expires-days must be more than 0 and at most {MAX_EXPIRES_DAYS}; got {days}")
                    expires = timezone.now() + timedelta(days=days)
                key = ApiKey(name=name, policy=policy, owner=options["owner"], notes=options["notes"], expires=expires)
                secret = actions.create_key(key)
        except ValidationError as exc:
            raise CommandError(_errors(exc)) from None
        except PolicyFileError as exc:  # a new key's name is checked against the file's keys
            raise CommandError(f"the key-policy file {serving().key_policy_file} (SUPERFLUID_KEY_POLICY): {exc}") from None
        self.stdout.write(f"created key {name!r} ({key.prefix}…), policy: {policy.name if policy else 'server defaults'}")
        self.stdout.write("the secret follows; it is not stored and will not be shown again:")
        self.stdout.write(secret)

    def _policy(self, options: dict[str, Any], policy_name: str | None, policy_given: bool) -> KeyPolicy | None:
        if policy_name is None and not policy_given:
            return None
        name = policy_name or options["name"]
        existing = KeyPolicy.objects.filter(name=name).first()
        if existing is not None:
            if policy_given:
                raise CommandError(f"policy {name!r} exists already; edit it in the admin, or leave out the policy flags")
            return existing
        default = _qos(options["qos_class"], "--class")
        if default is None:
            default = int(parse_qos(serving().http_default_qos))
        best = _qos(options["max_class"], "--max-class")
        policy = KeyPolicy(
            name=name,
            default_class=default,
            max_class=default if best is None else best,
            allow_batch_invariant=bool(options["batch_invariant"]),
            rate_limit_rpm=options["rpm"] or 0,
            max_concurrent=options["max_concurrent"] or 0,
            priority_offset=options["priority_offset"] or 0,
            allowed_models=options["models"] or "",
            is_admin=bool(options["admin"]),
        )
        if policy.rate_limit_rpm < 0 or policy.max_concurrent < 0:
            raise CommandError("--rpm and --max-concurrent must be 0 or more")
        return actions.save_policy(policy)
