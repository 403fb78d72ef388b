"""API key secrets: generated once, kept only as a SHA-256 digest plus a short display prefix.

A secret is ``sf-`` followed by 43 URL-safe characters (32 random bytes). It is shown once, when
its key is created; the database holds ``sha256(secret)`` in hex and the first characters for
people to recognise it by. Lookup hashes what the client sent and finds the key by digest, then
confirms with ``hmac.compare_digest`` so no comparison leaks how much of a digest matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_PREFIX = "sf-"
DISPLAY_CHARS = 8  # "sf-" + 5 characters of the random part


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    return secret[:DISPLAY_CHARS]


def digests_match(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


# What HTTP trims around a header's value and between the scheme and the token (RFC 9110 OWS):
# spaces and tabs only. str.strip() also drops what Latin-1 calls whitespace (0x85, 0xA0), the
# last byte of a UTF-8 secret ending in "à", "Р" or "х" as the server reads a header (Latin-1).
_OWS = " \t"


def secret_from_headers(headers: dict[str, str]) -> str | None:
    """The key a client presented: ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (names
    lower-cased). An empty value counts as none."""
    auth = headers.get("authorization", "").strip(_OWS)
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip(_OWS):
            return value.strip(_OWS)
    value = headers.get("x-api-key", "").strip(_OWS)
    return value or None
