"""llama-swap's routes for its loaded models (GET /running, GET /unload, POST
/api/models/unload[/<model>]) over the several-models pool, through the real ASGI application:
a llama-swap user's scripts and tools answered 404 here although superfluid reads their
config. The pool is the real one with stand-in worker processes (tests/link)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import pytest

from api import views
from scheduler.link.pool import ModelPool
from superfluid_site.serving import installed, serving
from tests.edge.inproc import request
from tests.link.test_pool_lifecycle import until, used_once
from tests.observability.test_several_models_gauges import pool_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def pool(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ModelPool]:
    """Models a and b, both loaded (one request each, ended), as api/views.py's pool."""
    p = pool_of()
    monkeypatch.setattr(views, "get_pool", lambda: p)
    try:
        await used_once(p, "a")
        await used_once(p, "b")
        yield p
    finally:
        p.kill()


def states(pool: ModelPool) -> dict[str, str]:
    return {m: s["state"] for m, s in pool.router.snapshot()["models"].items()}  # type: ignore[index]


async def test_running_lists_the_loaded_models_as_llama_swap_does(pool: ModelPool) -> None:
    reply = await request("GET", "/running")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    running = reply.json()["running"]
    assert [(r["model"], r["state"]) for r in running] == [("a", "ready"), ("b", "ready")]
    assert set(running[0]) == {"model", "state", "cmd", "proxy", "ttl", "name", "description"}


async def test_a_model_unloaded_by_name_or_all_at_once_leaves_running(pool: ModelPool) -> None:
    reply = await request("POST", "/api/models/unload/a")
    assert (reply.status, reply.body) == (200, b"OK")
    await until(lambda: states(pool)["a"] == "unloaded", "a unloaded")
    assert [r["model"] for r in (await request("GET", "/running")).json()["running"]] == ["b"]
    reply = await request("POST", "/api/models/unload")
    assert reply.status == 200 and reply.json() == {"msg": "ok"}
    await until(lambda: states(pool)["b"] == "unloaded", "b unloaded")
    assert (await request("GET", "/running")).json() == {"running": []}


async def test_get_unload_unloads_every_model(pool: ModelPool) -> None:
    reply = await request("GET", "/unload")
    assert (reply.status, reply.body) == (200, b"OK")
    await until(lambda: set(states(pool).values()) == {"unloaded"}, "every model unloaded")


async def test_get_unload_from_another_sites_page_is_refused_and_unloads_nothing(pool: ModelPool) -> None:
    """An <img src=".../unload"> on any page the user opens sends no Origin (so no CORS check
    stops it) but does send Sec-Fetch-Site: on loopback without keys it unloaded every model."""
    for site in (b"cross-site", b"same-site"):
        reply = await request("GET", "/unload", headers=[(b"sec-fetch-site", site), (b"sec-fetch-mode", b"no-cors")])
        assert reply.status == 403 and reply.is_error_object() and reply.json()["error"]["code"] == "origin_forbidden"
    assert not any(m.unload_requested for m in pool.router.models.values())  # what an unload sets at once
    assert states(pool) == {"a": "loaded", "b": "loaded"}
    typed = await request("GET", "/unload", headers=[(b"sec-fetch-site", b"none"), (b"sec-fetch-mode", b"navigate")])
    assert typed.status == 200  # the URL typed into the address bar


async def test_an_unknown_model_is_a_404_error_object_and_wrong_methods_are_405(pool: ModelPool) -> None:
    reply = await request("POST", "/api/models/unload/nope")
    assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"
    for method, path in (("GET", "/api/models/unload"), ("POST", "/running"), ("DELETE", "/unload")):
        reply = await request(method, path)
        assert reply.status == 405 and reply.is_error_object(), (method, path)
    assert states(pool) == {"a": "loaded", "b": "loaded"}


async def test_the_single_model_server_has_no_such_routes() -> None:
    for method, path in (("GET", "/running"), ("GET", "/unload"), ("POST", "/api/models/unload")):
        reply = await request(method, path)
        assert reply.status == 404 and reply.is_error_object() and json.loads(reply.body)["error"]["code"] == "not_found"


async def test_where_keys_are_required_they_need_an_admin_key(pool: ModelPool) -> None:
    with installed(dataclasses.replace(serving(), keys_required=True)):
        for method, path in (("GET", "/running"), ("GET", "/unload"), ("POST", "/api/models/unload"), ("POST", "/api/models/unload/a")):
            reply = await request(method, path)
            assert reply.status == 401 and reply.json()["error"]["code"] == "invalid_api_key", (method, path)
    assert states(pool) == {"a": "loaded", "b": "loaded"}
