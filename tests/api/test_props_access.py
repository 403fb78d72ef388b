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


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
@pytest.mark.parametrize(("path", "body"), [("/tokenize", b'{"content": "hi"}'), ("/detokenize", b'{"tokens": [1]}')])
async def test_a_key_that_may_not_use_the_served_model_does_not_tokenize_with_it(path: str, body: bytes) -> None:
    """Without ``model``, /tokenize and /detokenize use the first configured model's vocabulary:
    a key allowed only another model got that model's token ids (with several models: wrong ids
    for its own model, without a word), where /props and /v1/models/<id> are 404 for it."""
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=("other",)))
    everything = Key(id=2, name="open", digest=digest_of(OPEN), policy=Policy(name="q"))
    json_type = [(b"content-type", b"application/json")]
    async with attached(SimWorker(), keys={restricted.digest: restricted, everything.digest: everything}):
        refused = await request("POST", path, body, [*keyed(RESTRICTED), *json_type])
        assert refused.status == 404 and refused.is_error_object(), refused.body
        assert refused.json()["error"]["code"] == "model_not_found"
        named = await request("POST", path, body.replace(b"{", b'{"model": "sim", ', 1), [*keyed(RESTRICTED), *json_type])
        assert named.status == 404 and named.json()["error"]["code"] == "model_not_found"  # as it already was
        allowed = await request("POST", path, body, [*keyed(OPEN), *json_type])
        assert allowed.status == 200, allowed.body


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_with_several_models_tokenize_without_a_model_uses_the_keys_model_for_a_key_not_allowed_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key's own model's token ids: never the first configured model's ids for a key allowed
    only the second, nor (since s48) a 404 naming the first, a model it never asked for."""
    from types import SimpleNamespace

    from api import views

    pool = SimpleNamespace(config=SimpleNamespace(models=[SimpleNamespace(id="first"), SimpleNamespace(id=MODEL)]), names=lambda: ["first", MODEL])
    monkeypatch.setattr(views, "get_pool", lambda: pool)
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=(MODEL,)))
    json_type = [(b"content-type", b"application/json")]
    async with attached(SimWorker(), keys={restricted.digest: restricted}):
        unnamed = await request("POST", "/tokenize", b'{"content": "hi"}', [*keyed(RESTRICTED), *json_type])
        named = await request("POST", "/tokenize", b'{"content": "hi", "model": "sim"}', [*keyed(RESTRICTED), *json_type])
        assert named.status == 200 and named.json()["tokens"], named.body
        assert unnamed.status == 200 and unnamed.json() == named.json(), unnamed.body
