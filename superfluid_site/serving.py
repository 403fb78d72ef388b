"""The web process's serving configuration: one frozen value, built once, read through one owner.

``manage.py serve`` checks its flags, builds a :class:`ServingConfig` from them
(``scheduler/management/commands/serve.py``) and :func:`install`\\ s it before the web server
starts; the parts that need a serving value (admission, the consumers, the edge's body bounds,
the views, the batch runner, the key runtime, the link) read it with :func:`serving`. Nothing
writes ``settings.X`` at run time.

Without an installed configuration (tests, ``manage.py`` commands other than ``serve``),
:func:`serving` returns the one the Django settings describe (:meth:`ServingConfig.from_settings`,
read again at each call), so ``override_settings`` and pytest-django's ``settings`` fixture keep
setting these values in tests; :func:`installed` is the context manager for a test that wants a
whole configuration.

Two values Django and Channels read from the settings themselves: ``ALLOWED_HOSTS`` (``serve``
adds the host it binds, known only after the settings were loaded) and ``CHANNEL_LAYERS``
(Redis with ``--redis``). :func:`override_django_settings` is the one place that changes them,
through Django's ``override_settings`` so that ``setting_changed`` reaches the caches that hold
them (Channels' layers).

Importing this module reads no setting; only :meth:`ServingConfig.from_settings` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# llama-server's reasoning_format values, a request's and --reasoning-format's: all but none split
# the reasoning out (its deepseek-legacy sets a reasoning_in_content that its parsers never read:
# common/chat.cpp, server-schema.cpp)
REASONING_FORMAT_VALUES = ("auto", "deepseek", "deepseek-legacy", "none")


@dataclass(frozen=True)
class ServingConfig:
    """What the web side serves with. Field names are the settings' without ``SUPERFLUID_``."""

    models: tuple[str, ...] = ()  # ids the server answers to (serve: --model/--config); else from the worker's hello
    model_path: str = ""  # /tokenize's vocabulary (several models: the first configured one's)
    # several models: each id and alias -> its model's path (a token-id prompt's echo is read
    # with its own model's vocabulary); one model: empty, model_path serves
    model_paths: tuple[tuple[str, str], ...] = ()
    redis_url: str = ""  # --redis: the link, shared limits and the batch runner go through Redis
    socket: str = ""  # runengine --socket PATH: the link to a worker started by hand
    http_default_qos: str = "agent"
    http_qos_header: bool = True
    http_allow_batch_invariant: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout: float = 30  # seconds; 0 = no bound
    engine_wait_s: float = 120
    max_queue: int = 256
    client_concurrency: int = 32
    strict_params: bool = False
    sse_keepalive: float = 15  # seconds a stream may send nothing before its keepalive event; 0 = none
    reasoning_format: str = "auto"  # --reasoning-format: auto/deepseek split a reply's reasoning out, none leaves it
    prefill_assistant: bool = True  # not --no-prefill-assistant: a chat's last assistant turn is a prefill its reply continues
    max_batch: int = 8  # the worker's lanes (several models: the largest)
    require_key: bool = False
    keys_required: bool = False  # --require-key, or serve binds beyond loopback
    key_policy_file: str = ""  # absolute path of --key-policy, "" without one
    rate_limit: int = 0
    completion_rate: str = "10/s"
    completion_burst: int = 20

    @classmethod
    def from_settings(cls, **changes: Any) -> ServingConfig:
        """The configuration the Django settings describe (``SUPERFLUID_<FIELD>``; a setting that
        is absent keeps the field's default), with ``changes`` applied."""
        from django.conf import settings

        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = "SUPERFLUID_" + f.name.upper()
            if hasattr(settings, name):
                values[f.name] = getattr(settings, name)
        values["models"] = tuple(values.get("models", ()))
        values.update(changes)
        return cls(**values)


_installed: ServingConfig | None = None


def serving() -> ServingConfig:
    """The configuration this process serves with: serve's, else the settings' (read now)."""
    return _installed if _installed is not None else ServingConfig.from_settings()


def install(config: ServingConfig | None) -> None:
    """Make ``config`` the process's configuration (serve, once, before the server starts);
    ``None`` goes back to the settings'."""
    global _installed
    _installed = config


@contextlib.contextmanager
def installed(config: ServingConfig) -> Iterator[ServingConfig]:
    """``config`` installed for the block (tests), the previous one afterwards."""
    before = _installed
    install(config)
    try:
        yield config
    finally:
        install(before)


def override_django_settings(**values: Any) -> None:
    """Change settings that Django or Channels read themselves (``ALLOWED_HOSTS``,
    ``CHANNEL_LAYERS``) for the rest of the process: serve's one call, before the server starts."""
    from django.test.utils import override_settings

    override_settings(**values).enable()
