"""Routes whose ``model`` is optional (llama-server's /completion, /infill, /embedding, /tokenize,
/detokenize, /apply-template, the input_tokens routes, /props) with several models: a body that
names none takes the first model the caller's key may use, not the first configured, which a
key allowed only another model was refused (403 on the generation routes, 404 on the others)
naming a model it never asked for. Keyless and single-model behaviour is unchanged (the other
tests of these routes). In process (tests/edge/inproc.py), a stand-in pool of two models."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import override_settings

from api.admission import key_first
from keys.credentials import digest_of
from keys.runtime import Key, Policy
from tests.api.test_infill import FimSimWorker
from tests.api.test_llama_server_aliases_s48 import embedding_engine
from tests.edge.inproc import JSON, MODEL, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = "first"  # configured before MODEL, which the restricted key alone may use
RESTRICTED = "sf-restricted-0123456789"


def keyed(secret: str) -> list[tuple[bytes, bytes]]:
    return [*JSON, (b"authorization", f"Bearer {secret}".encode())]


def keys(allowed: tuple[str, ...] = (MODEL,)) -> dict[str, Key]:
    key = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=allowed))
    return {key.digest: key}


def two_models(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """FIRST then MODEL (with an alias each) as the consumers and views see them; the models
    the router was asked for."""
    from api import consumers, views
    from scheduler.core.qos import band_of
    from scheduler.core.router import Dispatch
    from superfluid_site.runtime import get_link

    asked: list[str] = []
    names = {FIRST: FIRST, "first-alias": FIRST, MODEL: MODEL, "sim-alias": MODEL}

    class Pool:
        draining = False
        config = SimpleNamespace(models=[SimpleNamespace(id=FIRST, path="first.gguf"), SimpleNamespace(id=MODEL, path="sim.gguf")])
        setup = SimpleNamespace(ctx_sizes={FIRST: 512, MODEL: 512}, lanes={FIRST: 2, MODEL: 2})
        links: dict[str, Any] = {}

        def names(self) -> list[str]:
            return list(names)

        def resolve(self, name: str) -> str | None:
            return names.get(name)

        def route(self, name: str, *, fim: bool) -> str | None:
            return names.get(name)

        async def acquire(self, model: str, priority: int, *, preempts: bool = False, jobs: int = 1) -> Any:
            asked.append(model)
            return get_link(), Dispatch("r", model, priority, band_of(priority), 0.0, 0.0), 1

        def release(self, ticket: object) -> None:
            pass

    pool = Pool()
    monkeypatch.setattr(consumers, "get_pool", lambda: pool)
    monkeypatch.setattr(views, "get_pool", lambda: pool)
    return asked


def test_key_first_moves_the_keys_first_model_to_the_front_and_keeps_the_rest() -> None:
    names = [FIRST, "first-alias", MODEL, "sim-alias"]
    assert key_first(names, None) == names
    assert key_first(names, Policy(name="any")) == names
    assert key_first(names, Policy(name="p", allowed_models=(MODEL,))) == [MODEL, FIRST, "first-alias", "sim-alias"]
    assert key_first(names, Policy(name="p", allowed_models=("sim-alias",)))[0] == "sim-alias"
    assert key_first(names, Policy(name="p", allowed_models=("nothing",))) == names  # refused naming the first, as before


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", {"prompt": "hi", "n_predict": 3}),
        ("/infill", {"input_prefix": "def f(", "input_suffix": ")", "n_predict": 3}),
        ("/embedding", {"content": "hello"}),
    ],
)
async def test_a_generation_route_without_a_model_runs_on_the_first_model_the_key_may_use(
    monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    asked = two_models(monkeypatch)
    async with attached(FimSimWorker(), keys=keys()) as (link, _rt):
        embedding_engine(link)
        reply = await request("POST", path, json.dumps(body).encode(), keyed(RESTRICTED))
    assert reply.status == 200, reply.body  # was 403 model_forbidden: "may not use the model `first`"
    assert asked == [MODEL]


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"content": "hi"}),
        ("/detokenize", {"tokens": [104, 105]}),
        ("/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses/input_tokens", {"input": "hi"}),
    ],
)
async def test_a_counting_route_without_a_model_uses_the_first_model_the_key_may_use(
    monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    two_models(monkeypatch)
    async with attached(FimSimWorker(), keys=keys()):
        reply = await request("POST", path, json.dumps(body).encode(), keyed(RESTRICTED))
        named = await request("POST", path, json.dumps({**body, "model": MODEL}).encode(), keyed(RESTRICTED))
    assert reply.status == 200, reply.body  # was 404 model_not_found naming `first`
    assert reply.json() == named.json()


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_props_without_a_model_is_the_first_model_the_key_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    two_models(monkeypatch)
    async with attached(FimSimWorker(), keys=keys()):
        reply = await request("GET", "/props", headers=keyed(RESTRICTED))
    assert reply.status == 200 and reply.json()["model_alias"] == MODEL, reply.body  # was 404 naming `first`


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_a_key_that_may_use_no_served_model_is_refused_naming_the_first_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = two_models(monkeypatch)
    async with attached(FimSimWorker(), keys=keys(("elsewhere",))):
        completion = await request("POST", "/completion", b'{"prompt": "hi"}', keyed(RESTRICTED))
        tokenize = await request("POST", "/tokenize", b'{"content": "hi"}', keyed(RESTRICTED))
        props = await request("GET", "/props", headers=keyed(RESTRICTED))
    assert completion.status == 403 and completion.json()["error"]["code"] == "model_forbidden"
    assert f"`{FIRST}`" in completion.json()["error"]["message"] and asked == []
    for reply in (tokenize, props):
        assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found", reply.body
        assert FIRST in reply.json()["error"]["message"]
