"""Django system checks for a serving configuration that cannot work (``manage.py check``). Their
ids are stable; docs/configuration.md lists them. ``serve``, ``runengine`` and ``checkengine``
leave out the ``superfluid`` ones, which read the variables their flags override, and check
their flags instead (scheduler/management/options.py: FlagsCommand); the ``superfluid-settings``
one (E004: numbers no flag sets) runs before they start.

- ``superfluid.E001``: ``--class-lanes`` (``SUPERFLUID_CLASS_LANES``) does not parse, names an
  unknown class or gives a cap outside 1..``--max-batch``.
- ``superfluid.E002``: ``--model`` (``SUPERFLUID_MODEL``) is missing or unreadable.
- ``superfluid.E004``: a number only the environment sets (``SUPERFLUID_ENGINE_WAIT_S``, the
  activity retention, the Batch API's bounds) is outside its range.
- ``superfluid.E005`` (a ``database`` check: ``migrate`` and ``serve`` run it): the database
  applied some, not all, of the migrations a squashed migration replaces. Their files are gone,
  so Django would skip the rest of that app's history silently and leave its tables short.
- ``superfluid.W001``: keys are required (``SUPERFLUID_REQUIRE_KEY``, or ``SUPERFLUID_HOST``
  beyond loopback) and no usable API key exists (in the database, ``SUPERFLUID_API_KEY`` with a
  policy that exists, or the ``--key-policy`` file): every API request would get 401.

The registered check reads the environment (what every flag defaults to); each helper takes its
values as arguments, so the same rules apply to flags given on the command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core import checks
from django.core.management.base import CommandError

from superfluid_site.env import EnvError, env_bool, env_int, env_str


def class_lanes_errors(spec: str, max_batch: int) -> list[checks.CheckMessage]:
    from scheduler.management.options import parse_class_lanes

    try:
        parse_class_lanes(spec, max_batch)
    except CommandError as exc:
        return [checks.Error(str(exc), hint="e.g. --class-lanes background=2,agent=6 (SUPERFLUID_CLASS_LANES)", id="superfluid.E001")]
    return []


def model_errors(path_text: str) -> list[checks.CheckMessage]:
    """An explicit model path that cannot be read (the bundled default is the package's)."""
    if not path_text:
        return []
    path = Path(path_text).expanduser()
    hint = "--model (SUPERFLUID_MODEL) takes a GGUF file or an MLX model folder"
    if not path.exists():
        return [checks.Error(f"--model {path}: no such file or directory", hint=hint, id="superfluid.E002")]
    mode = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, mode):
        return [checks.Error(f"--model {path}: not readable by this user", hint=hint, id="superfluid.E002")]
    return []


def usable_key_exists(policy_file: str = "") -> bool:
    """Whether the database holds an API key that is neither revoked nor expired (False before
    the first migration: none exists yet), SUPERFLUID_API_KEY sets a static one whose policy
    (``SUPERFLUID_API_KEY_POLICY``) exists, or the ``--key-policy`` file ``policy_file`` lists one."""
    from django.conf import settings
    from django.db import DatabaseError
    from django.utils import timezone

    from keys.models import ApiKey, KeyPolicy

    file_policies: set[str] = set()
    if policy_file:
        from keys.policyfile import PolicyFileError, load_policy_file

        try:
            from_file = load_policy_file(policy_file)
        except PolicyFileError:
            pass  # serve refuses the file itself; its keys are no keys
        else:
            if from_file:
                return True
            file_policies = set(from_file.policies)
    static_policy = str(getattr(settings, "SUPERFLUID_API_KEY_POLICY", "") or "")
    if getattr(settings, "SUPERFLUID_API_KEY_SHA256", "") and (not static_policy or static_policy in file_policies):
        return True
    try:
        if getattr(settings, "SUPERFLUID_API_KEY_SHA256", "") and KeyPolicy.objects.filter(name=static_policy).exists():
            return True  # a policy that exists nowhere refuses the static key (keys/runtime.py: static_key)
        usable = ApiKey.objects.filter(revoked=False).exclude(expires__lte=timezone.now())
        return usable.exists()
    except DatabaseError:
        return False


def binding_warnings(host: str, require_key: bool, has_keys: Callable[[], bool] = usable_key_exists) -> list[checks.CheckMessage]:
    from keys.binding import is_loopback

    if not require_key and is_loopback(host):
        return []
    if has_keys():
        return []
    why = "--require-key is set" if require_key else f"--host {host} binds beyond loopback, so every request needs a key"
    return [
        checks.Warning(
            f"{why}, and no usable API key exists: every API request will get 401",
            hint="create one with: python manage.py createkey NAME",
            id="superfluid.W001",
        )
    ]


# (setting, least value, what 0 or the least value means): the numbers no flag checks
SETTING_BOUNDS: tuple[tuple[str, int, str], ...] = (
    ("SUPERFLUID_ENGINE_WAIT_S", 0, "seconds a request waits for an engine worker"),
    ("SUPERFLUID_ACTIVITY_RETENTION_DAYS", 0, "days of activity log kept; 0 keeps every row"),
    ("SUPERFLUID_BATCH_CONCURRENCY", 1, "lines of one batch in flight at once"),
    ("SUPERFLUID_BATCH_MAX_FILE_BYTES", 0, "the largest batch input file; 0 = SUPERFLUID_MAX_BODY_BYTES"),
    ("SUPERFLUID_BATCH_MAX_LINES", 1, "the most requests in one batch input file"),
    ("SUPERFLUID_BATCH_LEASE_S", 1, "seconds a running batch line is its runner's"),
    ("SUPERFLUID_BATCH_STALL_S", 1, "seconds before a stalled batch gets new chains"),
)


def setting_range_errors(values: dict[str, Any]) -> list[checks.CheckMessage]:
    """A value below its bound was clamped or misread where it is used, without a word: a
    negative SUPERFLUID_BATCH_MAX_FILE_BYTES refused every batch file with 413, a 0 lease or
    concurrency became 1, a negative engine wait answered 503 at once while a worker started."""
    messages: list[checks.CheckMessage] = []
    for name, low, meaning in SETTING_BOUNDS:
        value = values.get(name)
        if value is not None and value < low:
            messages.append(checks.Error(f"{name}={value}: must be {low} or more ({meaning})", id="superfluid.E004"))
    return messages


@checks.register("superfluid")
def check_serving_environment(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        max_batch = env_int("SUPERFLUID_MAX_BATCH", 8)
        messages = class_lanes_errors(env_str("SUPERFLUID_CLASS_LANES", ""), max_batch)
        messages += model_errors(env_str("SUPERFLUID_MODEL", ""))
        policy_file = env_str("SUPERFLUID_KEY_POLICY", "")
        messages += binding_warnings(env_str("SUPERFLUID_HOST", "127.0.0.1"), env_bool("SUPERFLUID_REQUIRE_KEY", False), lambda: usable_key_exists(policy_file))
    except EnvError as exc:
        return [checks.Error(str(exc), id="superfluid.E003")]
    return messages


@checks.register("superfluid-settings")
def check_setting_ranges(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    return setting_range_errors({name: getattr(settings, name, None) for name, _low, _meaning in SETTING_BOUNDS})


def part_squashed_errors(connection: Any) -> list[checks.CheckMessage]:
    """superfluid.E005 for one database connection: each squashed migration whose replaced
    migrations the database applied only in part."""
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    recorder = MigrationRecorder(connection)
    if not recorder.has_table():
        return []
    applied = set(recorder.applied_migrations())
    messages: list[checks.CheckMessage] = []
    for (app, name), migration in sorted(MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items()):
        replaced = [tuple(key) for key in migration.replaces]
        missing = [key[1] for key in replaced if key not in applied]
        if missing and len(missing) < len(replaced):
            messages.append(
                checks.Error(
                    f"the database applied part of {app}.{name}: not {', '.join(missing)}",
                    hint="migrate it with superfluid at commit 59ff922, the last that has those migrations, then with this one",
                    id="superfluid.E005",
                )
            )
    return messages


@checks.register(checks.Tags.database)
def check_squashed_history(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.db import connections

    return [message for alias in databases or () for message in part_squashed_errors(connections[alias])]
