"""/props under --require-key, in-process (tests/edge/inproc.py): a key sees the model there as
/v1/models lists it, with one model as with several (whose /props was already 404 for a model
the key may not use)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from tests.edge.inproc import MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

RESTRICTED, OPEN = "sf-restricted-0123456789", "sf-open-0123456789"


def keyed(secret: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {secret}".encode())]


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_a_key_that_may_not_use_the_served_model_does_not_see_it_in_props() -> None:
    """A key allowed only another model got the served model's name, lanes and context from
    /props while /v1/models listed nothing for it and /v1/models/<id> was 404."""
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=("other",)))
    everything = Key(id=2, name="open", digest=digest_of(OPEN), policy=Policy(name="q"))
    async with attached(SimWorker(), keys={restricted.digest: restricted, everything.digest: everything}):
        assert (await request("GET", "/v1/models", headers=keyed(RESTRICTED))).json()["data"] == []
        props = await request("GET", "/props", headers=keyed(RESTRICTED))
        assert props.status == 404 and props.is_error_object(), props.body
        assert props.json()["error"]["code"] == "model_not_found"
        allowed = await request("GET", "/props", headers=keyed(OPEN))
        assert allowed.status == 200 and allowed.json()["model_alias"] == MODEL
