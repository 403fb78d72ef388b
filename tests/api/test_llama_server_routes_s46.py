"""llama-server's native routes (/health, /props, ...) as its clients read them, in-process
(tests/edge/inproc.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.engines.sim import FakeClock, SimEngine
from tests.edge.inproc import SimWorker, attached, request


@pytest.mark.parametrize(
    ("link", "status", "message"),
    [
        (SimpleNamespace(draining=False, connected=False), "loading", "Loading model"),
        (SimpleNamespace(draining=True, connected=True), "draining", "Server is shutting down"),
    ],
)
async def test_health_while_not_ready_is_a_503_with_llama_servers_error_object(
    monkeypatch: pytest.MonkeyPatch, link: SimpleNamespace, status: str, message: str
) -> None:
    """llama-server answers /health 503 ``{"error": {"code": 503, "message": "Loading model",
    "type": "unavailable_error"}}`` while it loads; this was ``{"status": "loading"}`` alone, so
    a client of llama-server reading ``error.message`` (as every other 503 here has it) found
    none. The ``status`` this API documents stays beside it."""
    from api import views

    monkeypatch.setattr(views, "get_pool", lambda: None)
    monkeypatch.setattr(views, "get_link", lambda: link)
    reply = await request("GET", "/health")
    assert reply.status == 503 and reply.is_error_object(), reply.body
    body = reply.json()
    assert body["status"] == status
    assert body["error"]["type"] == "unavailable_error" and body["error"]["code"] == 503
    assert body["error"]["message"] == message


@pytest.mark.django_db(transaction=True)
async def test_props_gives_the_chat_template_chats_are_rendered_with() -> None:
    """llama-server's /props has ``chat_template`` (SillyTavern derives its instruct template
    from it, llama.cpp's web UI shows it); this /props had none. The simulated engine has no
    template of its own: it is ChatML, as chats on such a model are rendered."""
    from scheduler.engines.chat import CHATML

    async with attached(SimWorker()):
        props = (await request("GET", "/props")).json()
    assert props["chat_template"] == CHATML


class TemplatedSim(SimEngine):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


class TemplatedWorker(SimWorker):
    engine_class = TemplatedSim


@pytest.mark.django_db(transaction=True)
async def test_props_gives_the_models_own_chat_template() -> None:
    async with attached(TemplatedWorker()):
        props = (await request("GET", "/props")).json()
    assert props["chat_template"] == TemplatedSim(n_lanes=1, lane_ctx=64, clock=FakeClock()).chat_template


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("states", "status"), [(["decode", "prefill"], 503), (["decode", "idle"], 200), ([], 503)])
async def test_slots_fail_on_no_slot_is_503_when_no_lane_is_idle(monkeypatch: pytest.MonkeyPatch, states: list[str], status: int) -> None:
    """llama-server's ``/slots?fail_on_no_slot=1`` answers 503 ``no slot available`` when no slot
    is idle (proxies and load balancers poll it to send a request elsewhere); it was ignored here:
    200 with every lane busy. Without the parameter the lanes come back as before."""
    from api import views

    lanes = [{"lane": i, "state": s, "job_id": None if s == "idle" else f"j{i}"} for i, s in enumerate(states)]
    link = SimpleNamespace(snapshot={"lanes": lanes, "lane_ctx": 512}, connected=True)
    monkeypatch.setattr(views, "get_link", lambda: link)
    reply = await request("GET", "/slots?fail_on_no_slot=1")
    assert reply.status == status, reply.body
    if status == 503:
        assert reply.is_error_object() and reply.json()["error"]["type"] == "unavailable_error"
        assert reply.json()["error"]["message"] == "no slot available"
    plain = await request("GET", "/slots")
    assert plain.status == 200 and [s["is_processing"] for s in plain.json()] == [s != "idle" for s in states]
    empty = await request("GET", "/slots?fail_on_no_slot=")  # llama-server reads an empty value as none
    assert empty.status == 200 and empty.json() == plain.json()


@pytest.mark.django_db(transaction=True)
async def test_v1_health_is_health_as_on_llama_server() -> None:
    """llama-server answers ``/v1/health`` as ``/health`` (a client given the ``/v1`` base URL
    checks ``{base}/health``); it was a 404 here."""
    async with attached(SimWorker()):
        plain, under_v1 = await request("GET", "/health"), await request("GET", "/v1/health")
        wrong = await request("POST", "/v1/health")
    assert under_v1.status == plain.status == 200 and under_v1.json()["status"] == "ok"
    assert wrong.status == 405 and wrong.is_error_object()


def test_the_chat_template_is_in_the_hello_not_in_every_snapshot() -> None:
    """The template is said once, in the hello (/props reads it there); the snapshots, sent each
    time a lane is taken or freed, stay as small as before."""
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.worker.loop import EngineWorker

    engine = TemplatedSim(n_lanes=1, lane_ctx=64, clock=FakeClock())
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=64), model_name="m", clock=engine.clock)
    assert worker.hello().chat_template == engine.chat_template
    assert "chat_template" not in worker.snapshot()
