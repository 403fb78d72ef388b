"""A secret with characters beyond ASCII (SUPERFLUID_API_KEY asks only for 16 characters without
spaces; the --key-policy file's digest is the SHA-256 of the secret's UTF-8): the server reads a
header's bytes as Latin-1 (api/consumers.py, Django), so a client that sends the secret as UTF-8,
as curl and most tools do, presented another string and was refused however right its key."""

from __future__ import annotations

import pytest
from django.test import override_settings

from api.admission import authenticate
from tests.keys.test_admission import IP, expect, key, runtime

SECRET = "clé-secrète-du-conteneur-0123"  # what the operator put in SUPERFLUID_API_KEY


def as_the_server_reads(sent: bytes) -> str:
    return sent.decode("latin-1")  # how api/consumers.py and Django's ASGI request decode a header


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_a_secret_beyond_ascii_is_accepted_as_utf8_or_latin1_bytes_and_nothing_else_matches() -> None:
    rt = runtime(key(SECRET, "container"))
    for sent in (SECRET.encode("utf-8"), SECRET.encode("latin-1")):  # curl; http.client (requests)
        for headers in ({"authorization": "Bearer " + as_the_server_reads(sent)}, {"x-api-key": as_the_server_reads(sent)}):
            assert (await authenticate(headers, IP, rt)).key_name == "container", (sent, headers)
    for wrong in (SECRET.replace("é", "e"), SECRET + "é", SECRET.encode("utf-8").decode("latin-1").encode("utf-8").decode("latin-1")):
        await expect("invalid_api_key", authenticate({"x-api-key": wrong}, IP, rt))


@pytest.mark.parametrize("secret", ["clé-du-conteneur-voilà", "ключ-доступа-Р", "ключ-доступа-х", "conteneur-ÅÅ"])
@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_a_secret_whose_utf8_ends_in_a_byte_latin1_calls_whitespace_is_accepted(secret: str) -> None:
    """Its last UTF-8 byte is 0xA0 (à, Р) or 0x85 (х, Å): read as Latin-1, that is NO-BREAK SPACE
    or NEXT LINE, which Python's str.strip() drops, so the key the client sent lost a byte and
    was refused. HTTP trims only spaces and tabs around a header's value."""
    rt = runtime(key(secret, "container"))
    sent = as_the_server_reads(secret.encode("utf-8"))
    for headers in ({"authorization": "Bearer " + sent}, {"x-api-key": sent}, {"x-api-key": f" {sent}\t"}):
        assert (await authenticate(headers, IP, rt)).key_name == "container", headers
