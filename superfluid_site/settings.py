"""superfluid settings: read from the environment, with embedded defaults that just work.

Every variable is listed in docs/configuration.md. The serving values below are the defaults of
``manage.py serve``'s flags and of the serving configuration (``superfluid_site/serving.py``):
serve builds that from its flags and nothing changes these settings at run time.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

import dj_database_url

from keys.binding import is_loopback
from superfluid_site.deploy import (
    allowed_hosts,
    browser_origins,
    csrf_trusted_origins,
    proxy_ssl_header,
    static_key_digest,
)
from superfluid_site.env import EnvError, env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent


DATA_DIR = Path(env_str("SUPERFLUID_DATA_DIR", str(BASE_DIR / "data"))).resolve()
# The data directory holds the database and the secret key: its owner's alone. A directory made
# here is 0700; an existing one keeps its mode (the operator chose it).
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _secret_key() -> str:
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    path = DATA_DIR / "secret_key"
    if not path.exists():
        # 0600 from birth, O_EXCL (never written through a file or link someone put there), and
        # complete before it has its name: a process starting beside this one reads a whole key
        tmp = DATA_DIR / f".secret_key.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(50))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # the other process won: use its key
        finally:
            os.unlink(tmp)
    return path.read_text().strip()


# Several processes write (serve, manage.py createkey/revokekey): transactions take the write lock
# up front, so two of them never deadlock on a lock upgrade ("database is locked"), and wait for it.
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}


def _database(url: str) -> dict[str, object]:
    """``DATABASE_URL`` as Django's DATABASES entry, through dj-database-url: query options
    (``?sslmode=require``, ``?connect_timeout=5``) become the connection's OPTIONS. Empty (or
    ``sqlite://`` alone) is the SQLite file in the data directory."""
    default = DATA_DIR / "superfluid.sqlite3"
    if not url or url.rstrip("/") == "sqlite:":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": default, "OPTIONS": dict(SQLITE_OPTIONS)}
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url))
    except ValueError as exc:
        raise EnvError(f"DATABASE_URL: {exc} (use sqlite:///path or postgres://user:pass@host:port/db)") from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        options = config.get("OPTIONS")
        config["OPTIONS"] = {**SQLITE_OPTIONS, **(options if isinstance(options, dict) else {})}
    return config


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = allowed_hosts("DJANGO_ALLOWED_HOSTS", env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]"))
# Browser origins allowed to call the generation endpoints besides those on an allowed host
# (api/edge.py), e.g. https://app.example.com
SUPERFLUID_ALLOWED_ORIGINS = browser_origins("SUPERFLUID_ALLOWED_ORIGINS", env_list("SUPERFLUID_ALLOWED_ORIGINS", ""))
CSRF_FAILURE_VIEW = "api.edge.csrf_failure"  # JSON under the API's paths
# -- behind a reverse proxy (docs/deployment.md) -------------------------------------------
# Origins whose forms (the admin's login) may POST here besides this host's own, e.g. the
# https:// address a TLS proxy serves us under
CSRF_TRUSTED_ORIGINS = csrf_trusted_origins("DJANGO_CSRF_TRUSTED_ORIGINS", env_list("DJANGO_CSRF_TRUSTED_ORIGINS", ""))
# Opt-in: trust this header to say the client reached the proxy over TLS. Only behind a proxy that
# always sets (or strips) it: otherwise any client could claim https.
SECURE_PROXY_SSL_HEADER = proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER", env_str("DJANGO_SECURE_PROXY_SSL_HEADER", ""))
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)  # opt-in: cookies only over https
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "scheduler",
    "api",
    "keys",
    "dashboard",
    "activity",
    "batches",
    "django_prometheus",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first
    "api.edge.RequestIdMiddleware",  # an X-Request-Id on every reply Django answers, its 500s too
    "django.middleware.security.SecurityMiddleware",
    "api.edge.CorsMiddleware",  # the API's replies to an allowed browser origin (its errors too)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "superfluid_site.middleware.PrometheusAfterMiddleware",  # last (django-prometheus's, method label bounded)
]

ROOT_URLCONF = "superfluid_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "superfluid_site.wsgi.application"
ASGI_APPLICATION = "superfluid_site.asgi.application"
# Redis mode (serve --redis URL, or REDIS_URL): jobs go through the Redis queue
# (scheduler/link/redis_transport.py) and the Channels layer is channels_redis on the same server.
SUPERFLUID_REDIS_URL = env_str("REDIS_URL", "")


def channel_layers(redis_url: str) -> dict[str, dict[str, object]]:
    # redis-py 8 times reads out after 5 s by default; channels_redis blocks 5 s in BZPOPMIN
    if redis_url:
        return {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [{"address": redis_url, "socket_timeout": 30}], "prefix": "sf-channels:"}}}
    return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


CHANNEL_LAYERS = channel_layers(SUPERFLUID_REDIS_URL)

DATABASES = {"default": _database(env_str("DATABASE_URL", ""))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"


def _log_level(name: str, default: str) -> str:
    """A logging level's name in any case (``debug``); any other text stops the process naming
    the variable (logging itself refused it with "Unable to configure logger", naming none)."""
    level = env_str(name, default).strip().upper()
    if level not in logging.getLevelNamesMapping():
        raise EnvError(f"{name}={os.environ.get(name)!r} is not a logging level (use DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    return level


def _uncaught(record: logging.LogRecord) -> bool:
    """A ``django.request`` record of an exception a view did not catch (its 500), not the
    report Django also makes of every 4xx and 5xx answer (a 503 the server meant is no bug).
    Its line names the request's id, the ``X-Request-Id`` its 500 carried (api/edge.py)."""
    if record.exc_info is None:
        return False
    request_id = getattr(getattr(record, "request", None), "request_id", None)
    if request_id and isinstance(record.args, tuple) and not getattr(record, "request_id_named", False):
        record.msg, record.args = f"{record.msg} (request %s)", (*record.args, request_id)
        record.request_id_named = True
    return True


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"uncaught": {"()": "django.utils.log.CallbackFilter", "callback": _uncaught}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        "uncaught": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["uncaught"]},
    },
    "loggers": {
        "superfluid": {"handlers": ["console"], "level": _log_level("SUPERFLUID_LOG_LEVEL", "INFO"), "propagate": False},
        # a view's uncaught exception (the API's 500, "logged with its traceback": docs/api.md):
        # Django's own handlers print it only with DEBUG on or mail it to ADMINS
        "django.request": {"handlers": ["uncaught"], "level": "ERROR", "propagate": False},
    },
}

# -- serving (defaults of serve's flags and of superfluid_site/serving.py's ServingConfig) --
SUPERFLUID_SOCKET = env_str("SUPERFLUID_SOCKET", str(DATA_DIR / "engine.sock"))
SUPERFLUID_MODELS: list[str] = []  # model ids served; serve names them, else the worker's hello does
SUPERFLUID_HTTP_DEFAULT_QOS = env_str("SUPERFLUID_HTTP_DEFAULT_QOS", "agent")
SUPERFLUID_HTTP_QOS_HEADER = env_bool("SUPERFLUID_HTTP_QOS_HEADER", True)
SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT = env_bool("SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT", False)
SUPERFLUID_MAX_BODY_BYTES = env_int("SUPERFLUID_MAX_BODY_BYTES", 8 * 1024 * 1024)
SUPERFLUID_BODY_TIMEOUT = env_float("SUPERFLUID_BODY_TIMEOUT", 30)  # seconds, as --body-timeout (2.5 too) a request (line, headers, body) may take to arrive; 0 = no bound
SUPERFLUID_ENGINE_WAIT_S = env_int("SUPERFLUID_ENGINE_WAIT_S", 120)
SUPERFLUID_MAX_QUEUE = env_int("SUPERFLUID_MAX_QUEUE", 256)  # waiting requests per model beyond the lanes; 0 = no bound
SUPERFLUID_CLIENT_CONCURRENCY = env_int("SUPERFLUID_CLIENT_CONCURRENCY", 32)  # in flight per keyless client address; 0 = no bound
SUPERFLUID_STRICT_PARAMS = env_bool("SUPERFLUID_STRICT_PARAMS", False)  # unknown request parameters: 400 instead of ignored
SUPERFLUID_SSE_KEEPALIVE = env_float("SUPERFLUID_SSE_KEEPALIVE", 15)  # seconds a stream may send nothing before a keepalive event; 0 = none
SUPERFLUID_REASONING_FORMAT = env_str("SUPERFLUID_REASONING_FORMAT", "auto")  # --reasoning-format: none leaves a reply's reasoning in content
SUPERFLUID_PREFILL_ASSISTANT = not env_bool("SUPERFLUID_NO_PREFILL_ASSISTANT", False)  # --no-prefill-assistant: a last assistant turn is a turn, not a prefill
SUPERFLUID_MAX_BATCH = env_int("SUPERFLUID_MAX_BATCH", 8)  # the worker's lanes; class-lane caps are checked against it
# -- keys and admission (docs/keys.md) ------------------------------------------------------
SUPERFLUID_REQUIRE_KEY = env_bool("SUPERFLUID_REQUIRE_KEY", False)
# What serve derives from its flags, from the same environment, for the processes without them (a
# Celery worker running batch lines): keys are required beyond loopback, and --key-policy's file
SUPERFLUID_KEYS_REQUIRED = SUPERFLUID_REQUIRE_KEY or not is_loopback(env_str("SUPERFLUID_HOST", "127.0.0.1"))
SUPERFLUID_KEY_POLICY_FILE = os.path.abspath(env_str("SUPERFLUID_KEY_POLICY", "")) if env_str("SUPERFLUID_KEY_POLICY", "") else ""
# A static key from the environment (containers), accepted beside the admin's keys under the
# name SUPERFLUID_API_KEY. Only its SHA-256 is kept here; the secret itself is never stored.
SUPERFLUID_API_KEY_SHA256 = static_key_digest("SUPERFLUID_API_KEY", env_str("SUPERFLUID_API_KEY", ""))
# The admin's (or --key-policy file's) policy the static key follows; empty = the server's defaults
SUPERFLUID_API_KEY_POLICY = env_str("SUPERFLUID_API_KEY_POLICY", "")
SUPERFLUID_RATE_LIMIT = env_int("SUPERFLUID_RATE_LIMIT", 0)  # per-IP requests/minute without a key limit; 0 = off
SUPERFLUID_COMPLETION_RATE = env_str("SUPERFLUID_COMPLETION_RATE", "10/s")  # FIM token bucket per client
SUPERFLUID_COMPLETION_BURST = env_int("SUPERFLUID_COMPLETION_BURST", 20)

# -- observability ------------------------------------------------------------------------
SUPERFLUID_ACTIVITY_RETENTION_DAYS = env_int("SUPERFLUID_ACTIVITY_RETENTION_DAYS", 30)  # 0 keeps every row

# -- the Batch API (docs/api.md) -------------------------------------------------------------
SUPERFLUID_BATCH_CONCURRENCY = env_int("SUPERFLUID_BATCH_CONCURRENCY", 4)  # lines of one batch in flight at once
SUPERFLUID_BATCH_MAX_FILE_BYTES = env_int("SUPERFLUID_BATCH_MAX_FILE_BYTES", 0)  # 0 = SUPERFLUID_MAX_BODY_BYTES
SUPERFLUID_BATCH_MAX_LINES = env_int("SUPERFLUID_BATCH_MAX_LINES", 50_000)
# a line's lease on its runner (renewed every third of it while it runs): a dead runner's line runs again after this
SUPERFLUID_BATCH_LEASE_S = env_int("SUPERFLUID_BATCH_LEASE_S", 120)
# Redis mode: a running batch none of whose Celery tasks has run for this long gets new chains
SUPERFLUID_BATCH_STALL_S = env_int("SUPERFLUID_BATCH_STALL_S", 600)
# Redis mode runs batches on Celery (celery -A superfluid_site worker, docs/operations.md)
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or SUPERFLUID_REDIS_URL  # else serve --redis's URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True  # a task is acknowledged after it ran: a killed worker's task is delivered again
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one task at a time per worker process: the lines stay bounded
CELERY_TASK_IGNORE_RESULT = True  # results live in the database (batches.Line), not in a result backend
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
