"""Typed reads of the environment, shared by the settings and the serving flags' defaults.

Every helper returns its ``default`` when the variable is unset or empty, and raises
:class:`EnvError` (a ValueError) naming the variable when its value is not of the type asked:
a typo in a boolean stops the process instead of silently meaning "off".
"""

from __future__ import annotations

import math
import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class EnvError(ValueError):
    """An environment variable holds a value of the wrong type."""


def _raw(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw == "" else raw


def env_str(name: str, default: str) -> str:
    raw = _raw(name)
    return default if raw is None else raw


def env_bool(name: str, default: bool) -> bool:
    raw = _raw(name)
    if raw is None:
        return default
    if raw.strip().lower() in TRUE:
        return True
    if raw.strip().lower() in FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    """A finite number (``0.5``, ``30``); NaN and infinity are refused, as is any other text."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise EnvError(f"{name}={raw!r} is not a finite number")
    return value


def env_list(name: str, default: str) -> list[str]:
    """A comma-separated list, blanks dropped."""
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]
