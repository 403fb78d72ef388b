"""Deployment settings read from the environment: behind a TLS proxy, in a container.

Pure functions (no Django): the settings module calls them, ``serve`` calls
:func:`with_bound_host`, and the tests call them directly. Every one raises
:class:`~superfluid_site.env.EnvError` naming the variable when its value cannot be right, so a
typo stops the process instead of leaving a deployment that quietly refuses every login.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from urllib.parse import urlsplit

from superfluid_site.env import EnvError

STATIC_KEY_MIN_CHARS = 16  # a static key shorter than this is refused at start
_HEADER_NAME = re.compile(r"^[A-Za-z0-9]+(?:-+[A-Za-z0-9]+)*$")  # letters and digits, hyphens between


def _origin(name: str, value: str, schemes: tuple[str, ...] = ()) -> str:
    """``value`` as a browser sends it in ``Origin`` (lower case, no default port, no path), which
    Django and api/edge.py compare as text: ``https://LLM.example.com`` or ``https://llm.example.com:443``
    matched no browser, and every login (every request from that page) got 403. ``schemes``: the
    only ones allowed (none: any, e.g. a browser extension's ``chrome-extension://ID``)."""
    try:
        parts = urlsplit(value)
    except ValueError:  # an unclosed [ of an IPv6 address
        parts = urlsplit("")
    if not parts.scheme or (schemes and parts.scheme not in schemes) or not parts.netloc or parts.path not in ("", "/"):
        raise EnvError(f"{name}: {value!r} is not an origin (write it as https://host or https://host:port)")
    default_port = {"https": ":443", "http": ":80"}.get(parts.scheme)
    if default_port is None:  # a host of another scheme is opaque to a browser: kept as written
        return f"{parts.scheme}://{parts.netloc}"
    return f"{parts.scheme}://{parts.netloc.lower().removesuffix(default_port)}"


def csrf_trusted_origins(name: str, values: list[str]) -> list[str]:
    """``DJANGO_CSRF_TRUSTED_ORIGINS``: each a scheme and a host (``https://llm.example.com``,
    ``https://*.example.com``), as Django requires since 4.0."""
    return [_origin(name, value, ("http", "https")) for value in values]


def browser_origins(name: str, values: list[str]) -> list[str]:
    """``SUPERFLUID_ALLOWED_ORIGINS``: each an origin as a browser sends it; no wildcards (the API
    compares each whole origin, so ``https://*.example.com`` matched nothing)."""
    for value in values:
        if "*" in value:
            raise EnvError(f"{name}: {value!r}: list each origin, e.g. https://app.example.com (no wildcards)")
    return [_origin(name, value) for value in values]


def proxy_ssl_header(name: str, raw: str) -> tuple[str, str] | None:
    """``DJANGO_SECURE_PROXY_SSL_HEADER``: the header the proxy sets on requests that came to it
    over TLS, ``X-Forwarded-Proto`` (meaning ``X-Forwarded-Proto: https``) or ``Name=value``;
    Django's SECURE_PROXY_SSL_HEADER (``("HTTP_X_FORWARDED_PROTO", "https")``). Empty: off."""
    raw = raw.strip()
    if not raw:
        return None
    header, sep, value = raw.partition("=")
    header, value = header.strip(), value.strip() if sep else "https"
    if not _HEADER_NAME.match(header) or not value:
        raise EnvError(f"{name}={raw!r}: write the header's name, e.g. X-Forwarded-Proto, or Name=value")
    return "HTTP_" + header.upper().replace("-", "_"), value


def static_key_digest(name: str, raw: str) -> str:
    """``SUPERFLUID_API_KEY``: only its SHA-256 is kept (the settings never hold the secret, so
    no debug page, log line or settings dump can show it). Empty: no static key."""
    secret = raw.strip()
    if not secret:
        return ""
    if len(secret) < STATIC_KEY_MIN_CHARS or any(c.isspace() for c in secret):
        raise EnvError(f"{name} must be at least {STATIC_KEY_MIN_CHARS} characters without spaces (e.g. python -c \"import secrets; print('sf-' + secrets.token_urlsafe(32))\")")
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def allowed_hosts(name: str, values: list[str]) -> list[str]:
    """``DJANGO_ALLOWED_HOSTS``: host names as Django matches them, the Host header's name without
    its port. A bare IPv6 address (``fd00::1``) is written in brackets, as a Host header spells
    it; an entry with a port, a scheme or a path matched no request, and every one got 400."""
    hosts: list[str] = []
    for value in values:
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            pass
        else:
            value = f"[{address.compressed}]" if address.version == 6 else address.compressed
        if value.startswith("[") and value.endswith("]"):
            try:
                value = f"[{ipaddress.IPv6Address(value[1:-1]).compressed}]"
            except ValueError:
                raise EnvError(f"{name}: {value!r} is not an IPv6 address") from None
        elif ":" in value or "/" in value:
            raise EnvError(f"{name}: {value!r}: list host names without a scheme, port or path (llm.example.com, [fd00::1]); Django matches the name alone")
        hosts.append(value)
    return hosts


def with_bound_host(allowed: list[str], host: str) -> list[str]:
    """``ALLOWED_HOSTS`` plus the address ``serve --host`` binds, so ``http://HOST:PORT/`` (what
    serve prints) answers. A wildcard bind (``0.0.0.0``, ``::``) names no host: the names people
    reach it by go in DJANGO_ALLOWED_HOSTS."""
    host = host.strip().strip("[]")
    if not host or "*" in allowed:
        return list(allowed)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        entry = host.lower()
    else:
        if address.is_unspecified:
            return list(allowed)
        entry = f"[{address.compressed}]" if address.version == 6 else address.compressed
    return list(allowed) if entry in allowed else [*allowed, entry]
