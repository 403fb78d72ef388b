"""A secret with characters beyond ASCII (SUPERFLUID_API_KEY asks only for 16 characters without
spaces; the --key-policy file's digest is the SHA-256 of the secret's UTF-8): the server reads a
header's bytes as Latin-1 (api/consumers.py, Django), so a client that sends the secret as UTF-8,
as curl and most tools do, presented another string and was refused however right its key."""

from __future__ import annotations

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
