"""superfluid settings: read from the environment, with embedded defaults that just work.

Every variable is listed in docs/configuration.md. Serving flags (``manage.py serve --...``)
override the SUPERFLUID_* values at start-up.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


DATA_DIR = Path(env_str("SUPERFLUID_DATA_DIR", str(BASE_DIR / "data"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


# Several processes write (serve, manage.py createkey/revokekey): transactions take the write lock
# up front, so two of them never deadlock on a lock upgrade ("database is locked"), and wait for it.
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}


def _database(url: str) -> dict[str, object]:
    if not url:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA_DIR / "superfluid.sqlite3", "OPTIONS": SQLITE_OPTIONS}
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": unquote(parsed.path) or DATA_DIR / "superfluid.sqlite3", "OPTIONS": SQLITE_OPTIONS}
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parsed.path.lstrip("/"),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
        }
    raise ValueError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (sqlite:// or postgres://)")


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

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
    "django_prometheus",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",  # last
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
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

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

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "superfluid": {"handlers": ["console"], "level": env_str("SUPERFLUID_LOG_LEVEL", "INFO"), "propagate": False},
    },
}

# -- serving (manage.py serve sets these from its flags) ---------------------------------
SUPERFLUID_SOCKET = env_str("SUPERFLUID_SOCKET", str(DATA_DIR / "engine.sock"))
SUPERFLUID_MODELS: list[str] = []  # model ids the worker serves; filled from the worker's hello
SUPERFLUID_HTTP_DEFAULT_QOS = env_str("SUPERFLUID_HTTP_DEFAULT_QOS", "agent")
SUPERFLUID_HTTP_QOS_HEADER = env_bool("SUPERFLUID_HTTP_QOS_HEADER", True)
SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT = env_bool("SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT", False)
SUPERFLUID_MAX_BODY_BYTES = env_int("SUPERFLUID_MAX_BODY_BYTES", 8 * 1024 * 1024)
SUPERFLUID_ENGINE_WAIT_S = env_int("SUPERFLUID_ENGINE_WAIT_S", 120)
SUPERFLUID_STRICT_PARAMS = env_bool("SUPERFLUID_STRICT_PARAMS", False)  # unknown request parameters: 400 instead of ignored
SUPERFLUID_MAX_BATCH = env_int("SUPERFLUID_MAX_BATCH", 8)  # the worker's lanes; class-lane caps are checked against it
# -- keys and admission (docs/keys.md) ------------------------------------------------------
SUPERFLUID_REQUIRE_KEY = env_bool("SUPERFLUID_REQUIRE_KEY", False)
SUPERFLUID_KEYS_REQUIRED = SUPERFLUID_REQUIRE_KEY  # serve also sets it when binding beyond loopback
SUPERFLUID_RATE_LIMIT = env_int("SUPERFLUID_RATE_LIMIT", 0)  # per-IP requests/minute without a key limit; 0 = off
SUPERFLUID_COMPLETION_RATE = env_str("SUPERFLUID_COMPLETION_RATE", "10/s")  # FIM token bucket per client
SUPERFLUID_COMPLETION_BURST = env_int("SUPERFLUID_COMPLETION_BURST", 20)

# -- observability ------------------------------------------------------------------------
SUPERFLUID_ACTIVITY_RETENTION_DAYS = env_int("SUPERFLUID_ACTIVITY_RETENTION_DAYS", 30)  # 0 keeps every row
