"""Django system checks for a serving configuration that cannot work (``manage.py check``, and
before ``serve`` or ``runengine`` start). Their ids are stable; docs/configuration.md lists them.

- ``superfluid.E001``: ``--class-lanes`` (``SUPERFLUID_CLASS_LANES``) does not parse, names an
  unknown class or gives a cap outside 1..``--max-batch``.
- ``superfluid.E002``: ``--model`` (``SUPERFLUID_MODEL``) is missing or unreadable.
- ``superfluid.W001``: keys are required (``SUPERFLUID_REQUIRE_KEY``, or ``SUPERFLUID_HOST``
  beyond loopback) and no usable API key exists: every API request would get 401.

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


def usable_key_exists() -> bool:
    """Whether the database holds an API key that is neither revoked nor expired (False before
    the first migration: none exists yet), or SUPERFLUID_API_KEY sets a static one."""
    from django.conf import settings
    from django.db import DatabaseError
    from django.utils import timezone

    from keys.models import ApiKey

    if getattr(settings, "SUPERFLUID_API_KEY_SHA256", ""):
        return True
    try:
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


@checks.register("superfluid")
def check_serving_environment(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        max_batch = env_int("SUPERFLUID_MAX_BATCH", 8)
        messages = class_lanes_errors(env_str("SUPERFLUID_CLASS_LANES", ""), max_batch)
        messages += model_errors(env_str("SUPERFLUID_MODEL", ""))
        messages += binding_warnings(env_str("SUPERFLUID_HOST", "127.0.0.1"), env_bool("SUPERFLUID_REQUIRE_KEY", False))
    except EnvError as exc:
        return [checks.Error(str(exc), id="superfluid.E003")]
    return messages
