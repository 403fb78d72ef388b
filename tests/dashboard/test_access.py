"""Who may see the dashboard: staff only, on the page and on its websocket; what the feed pushes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard import feed as dashboard_feed
from dashboard.feed import dashboard_state
from superfluid_site.runtime import forget

ORIGIN = (b"origin", b"http://127.0.0.1:8000")


def make_user(username: str, *, staff: bool) -> Any:
    return get_user_model().objects.create_user(username, password="pw-" + username, is_staff=staff)


def session_cookie(user: Any) -> bytes:
    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}".encode()


def application() -> Any:
    from superfluid_site.asgi import application as app

    return app


async def close_dashboard(comm: WebsocketCommunicator) -> None:
    """Close a dashboard websocket and stop the link to the worker that opening it started."""
    await comm.disconnect()
    web = forget(asyncio.get_running_loop())
    if web is not None and web.link is not None:
        await web.link.stop()


@contextlib.asynccontextmanager
async def staff_dashboard(username: str) -> AsyncIterator[WebsocketCommunicator]:
    """A staff user's open dashboard websocket; at the end it is closed and the link to the
    worker that opening it started is stopped."""
    user = await sync_to_async(make_user)(username, staff=True)
    cookie = await sync_to_async(session_cookie)(user)
    comm = WebsocketCommunicator(application(), "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    try:
        assert connected
        yield comm
    finally:
        await close_dashboard(comm)


@pytest.mark.django_db
def test_anonymous_and_non_staff_users_are_sent_to_the_login_page(client: Client) -> None:
    r = client.get("/dashboard/")
    assert r.status_code == 302 and r["Location"] == "/admin/login/?next=/dashboard/"
    client.force_login(make_user("carol", staff=False))
    r = client.get("/dashboard/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")


@pytest.mark.django_db
def test_staff_get_the_page_with_its_script_and_no_external_resource(client: Client) -> None:
    client.force_login(make_user("sam", staff=True))
    r = client.get("/dashboard/")
    assert r.status_code == 200
    body = r.content.decode()
    assert 'id="lanes"' in body and "/ws/dashboard/" in body and "chart-decode" in body
    assert not any(f'{attr}="{scheme}' in body for attr in ("src", "href") for scheme in ("http:", "https:", "//"))  # offline: nothing from a CDN


@pytest.mark.django_db(transaction=True)
async def test_the_websocket_refuses_anonymous_users() -> None:
    comm = WebsocketCommunicator(application(), "/ws/dashboard/", headers=[ORIGIN])
    connected, code = await comm.connect()
    assert not connected and code == 4403


@pytest.mark.django_db(transaction=True)
async def test_the_websocket_refuses_non_staff_users_and_foreign_origins() -> None:
    user = await sync_to_async(make_user)("nina", staff=False)
    cookie = await sync_to_async(session_cookie)(user)
    comm = WebsocketCommunicator(application(), "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert not connected
    staff = await sync_to_async(make_user)("sid", staff=True)
    cookie = await sync_to_async(session_cookie)(staff)
    comm = WebsocketCommunicator(application(), "/ws/dashboard/", headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert not connected


@pytest.mark.django_db(transaction=True)
async def test_staff_receive_snapshots_pushed_by_the_feed(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    async with staff_dashboard("sue") as comm:
        state = {
            "model": "m",
            "tick": 7,
            "lanes": [{"lane": 0, "state": "prefill", "job_id": "j", "class": "agent", "prompt_tokens": 100, "prompt_done": 40, "generated": 0}],
            "queue_depth": {"agent": 2},
            "counters": {"preemptions": 1},
            "metrics": {"decode_tokens_total": 55, "last_tick": {"tick": 6, "prefill_tokens": 40, "decode_tokens": 0, "lanes": 1, "seconds": 0.05}},
        }
        for tick in range(3):  # bursts are throttled: the latest one is what arrives
            dashboard_feed.on_snapshot({**state, "tick": 7 + tick})
        message = await comm.receive_json_from(timeout=3)
        assert message["type"] == "state"
        got = message["state"]
        assert got["lanes"][0]["state"] == "prefill" and got["queue_depth"] == {"agent": 2}
        assert got["tokens"]["decode"] == 55 and got["tick_info"]["last_prefill_tokens"] == 40
        assert got["tick"] in (7, 9)
        if got["tick"] == 7:
            assert (await comm.receive_json_from(timeout=3))["state"]["tick"] == 9
        assert "metrics" not in got


@pytest.mark.django_db(transaction=True)
async def test_with_no_dashboard_open_the_feed_prepares_no_push_and_one_opened_later_gets_pushes(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    feed = dashboard_feed.feed
    sent = feed.sent
    dashboard_feed.on_snapshot({"model": "m", "tick": 41, "lanes": []})
    for _ in range(100):  # the push falls due within MIN_INTERVAL_S
        if feed._handle is None and not feed._tasks:
            break
        await asyncio.sleep(0.01)
    assert feed._handle is None and feed.sent == sent  # nobody in the group: nothing prepared or sent
    async with staff_dashboard("otto") as comm:
        dashboard_feed.on_snapshot({"model": "m", "tick": 42, "lanes": []})
        message = await comm.receive_json_from(timeout=3)
        assert message["state"]["tick"] == 42 and feed.sent == sent + 1


def test_dashboard_state_from_a_real_worker_snapshot_is_plain_json_without_text() -> None:
    """A simulated worker serves a request whose prompt and reply are distinctive: what the
    page receives carries its lane, tokens and TTFT, and neither text."""
    import json

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.sim import FakeClock, SimEngine
    from scheduler.link.messages import Delta, Message, Submit
    from scheduler.worker.loop import EngineWorker

    class Conn:
        def __init__(self) -> None:
            self.sent: list[Message] = []

        def queue(self, message: Message) -> None:
            self.sent.append(message)

    clock = FakeClock()
    worker = EngineWorker(SimEngine(n_lanes=2, lane_ctx=512, clock=clock), SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    conn = Conn()
    prompt = "zebra-quokka-secret " * 6
    request = {"endpoint": "completions", "prompt": prompt, "max_tokens": 40, "temperature": 0}
    worker.handle(conn, Submit(id="j1", request=request, qos=2, priority=0))  # type: ignore[arg-type]
    for _ in range(6):
        worker.run_tick()
    reply = "".join(m.text for m in conn.sent if isinstance(m, Delta))
    assert reply  # the job has produced text by now, and still runs
    out = dashboard_state(worker.snapshot())
    text = json.dumps(out, allow_nan=False)
    assert [lane["state"] for lane in out["lanes"]] == ["decode", "idle"]
    assert out["tokens"]["decode"] > 0 and out["tokens"]["prefill"] >= len(prompt.split())
    assert out["ttft"]["count"] == 1
    assert "zebra" not in text and "quokka" not in text and reply.strip()[:12] not in text


def test_dashboard_state_names_the_key_of_a_lane_from_the_web_side_when_the_worker_does_not() -> None:
    state = {"lanes": [{"lane": 0, "state": "decode", "job_id": "j1"}, {"lane": 1, "state": "decode", "job_id": "j2", "key": "bob"}, {"lane": 2, "state": "idle"}]}
    lanes = dashboard_state(state, {"j1": "alice", "j2": "mallory"})["lanes"]
    assert [lane.get("key") for lane in lanes] == ["alice", "bob", None]


@pytest.mark.django_db(transaction=True)
async def test_a_failed_renewal_of_the_pages_group_membership_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An open page renews its group membership (memberships expire); one renewal that failed
    (Redis away for a moment) used to end the renewals, and a page left open for a day then
    stopped updating."""
    from channels.layers import get_channel_layer

    from dashboard import consumers

    monkeypatch.setattr(consumers, "GROUP_REFRESH_S", 0.01)
    layer = get_channel_layer()
    real, calls = layer.group_add, {"n": 0}

    async def flaky(group: str, channel: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the first renewal
            raise ConnectionError("Connection closed by server.")
        await real(group, channel)

    monkeypatch.setattr(layer, "group_add", flaky)
    async with staff_dashboard("rita"):
        for _ in range(200):
            if calls["n"] >= 4:
                break
            await asyncio.sleep(0.01)
    assert calls["n"] >= 4  # joined, failed once, renewed since


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("frame", [{"text_data": "not json{"}, {"bytes_data": b"\x00\x01"}], ids=["text", "bytes"])
async def test_a_frame_the_page_sends_is_ignored_and_the_socket_still_gets_pushes(settings, tmp_path, frame: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    """The page only listens. A frame that was not JSON, or binary, killed the consumer before its
    disconnect ran: its channel stayed in the group (renewed hourly), so the feed built its
    pushes for nobody from then on."""
    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    async with staff_dashboard("frank") as comm:
        await comm.send_to(**frame)
        dashboard_feed.on_snapshot({"model": "m", "tick": 3, "lanes": []})
        assert (await comm.receive_json_from(timeout=3))["state"]["tick"] == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["logout", "demoted"])
async def test_an_open_dashboard_is_closed_once_its_user_logs_out_or_loses_staff(settings, tmp_path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:  # type: ignore[no-untyped-def]
    """The user was checked only when the socket connected: after a logout, or with staff status
    taken away, the page went on getting every push (lanes, key names, queues)."""
    from dashboard import consumers

    monkeypatch.setattr(consumers, "STAFF_RECHECK_S", 0.05)
    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    user = await sync_to_async(make_user)("lou", staff=True)
    client = Client()
    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    comm = WebsocketCommunicator(application(), "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    try:
        assert connected
        if how == "logout":
            await sync_to_async(client.logout)()
        else:
            await sync_to_async(get_user_model().objects.filter(pk=user.pk).update)(is_staff=False)
        closed = await comm.receive_output(timeout=3)
        assert closed == {"type": "websocket.close", "code": consumers.CLOSE_FORBIDDEN}
    finally:
        await close_dashboard(comm)


def test_each_web_process_pushes_to_a_group_of_its_own() -> None:
    """With Redis's shared Channels layer every head pushed to one group "lanes": an open page
    took every head's pushes, alternating between heads that know different lanes' keys."""
    import subprocess
    import sys

    code = "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'superfluid_site.settings'); django.setup(); from dashboard.feed import GROUP; print(GROUP)"
    groups = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.strip() for _ in range(2)}
    assert len(groups) == 2 and all(g.startswith("lanes.") and len(g) < 100 for g in groups)


@pytest.mark.django_db(transaction=True)
async def test_a_page_whose_first_state_fails_still_gets_pushes_and_leaves_nothing_behind(settings, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The state sent on connect (the link's latest snapshot, with several models the router's
    view) raised out of connect: the consumer ended without its disconnect, the page got no push
    again, and its channel stayed in the group with its membership renewal and its user check
    running for the life of the process."""
    from channels.layers import get_channel_layer

    from dashboard import consumers
    from dashboard.feed import full_state as real
    from superfluid_site.runtime import get_link

    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    get_link().snapshot = {"model": "m", "tick": 1, "lanes": []}
    calls = {"n": 0}

    def first_fails(state: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a router caught mid-swap")
        return real(state)

    monkeypatch.setattr(consumers, "full_state", first_fails)

    def lingering() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if any(n in repr(t) for n in ("_keep_membership", "_watch_user"))]

    async with staff_dashboard("vic") as comm:
        assert calls["n"] == 1
        assert len(lingering()) == 2  # the page's renewal and user check run while it is open
        dashboard_feed.on_snapshot({"model": "m", "tick": 2, "lanes": []})
        assert (await comm.receive_json_from(timeout=3))["state"]["tick"] == 2
    for _ in range(200):  # the disconnect's group_discard and the tasks' cancellation land
        if not get_channel_layer().groups.get(dashboard_feed.GROUP) and not lingering():
            break
        await asyncio.sleep(0.01)
    assert not get_channel_layer().groups.get(dashboard_feed.GROUP)
    assert not lingering()


@pytest.mark.django_db(transaction=True)
async def test_with_several_models_and_none_loaded_a_page_gets_a_first_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no model loaded no worker sends snapshots, so the pool's link has none: the page got
    no state at all (no Models or Router queue panel) and, with nothing to tell it that no worker
    runs, said "no update for N s" from three seconds on."""
    from pathlib import Path

    from scheduler.link import pool as pool_mod
    from scheduler.link.pool import ModelPool, PoolSetup
    from scheduler.models_config import ModelsConfig, ServedModel
    from superfluid_site.runtime import web_runtime

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None))  # type: ignore[arg-type]
    pool.loop = asyncio.get_running_loop()
    monkeypatch.setitem(pool_mod._POOLS, -1, pool)
    web_runtime().link = pool.link
    assert pool.link.snapshot is None
    async with staff_dashboard("nell") as comm:
        message = await comm.receive_json_from(timeout=3)
        assert message["type"] == "state" and message["state"]["models"] == []
        assert set(message["state"]["router_queue"]) == {"interactive", "normal", "batch"}


@pytest.mark.django_db(transaction=True)
async def test_a_page_opened_while_the_worker_is_away_gets_its_last_state_with_its_age(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The first state of a page opened after the worker died was the dead worker's last
    snapshot, busy lanes and all, and the page called it "live" for three seconds before
    dimming it. It now comes with its age, and the page shows it that old at once."""
    from superfluid_site.runtime import get_link

    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    link = get_link()
    assert not link.connected
    link.snapshot = {"model": "m", "tick": 7, "lanes": []}
    link.snapshot_at = time.monotonic() - 12.0  # the worker died 12 s ago
    async with staff_dashboard("ada") as comm:
        first = await comm.receive_json_from(timeout=3)
        assert first["state"]["tick"] == 7 and first["age_ms"] >= 12_000
        # pushes from a worker (a connected one's snapshots) carry no age: they are current
        dashboard_feed.on_snapshot({"model": "m", "tick": 8, "lanes": []})
        pushed = await comm.receive_json_from(timeout=3)
        assert pushed["state"]["tick"] == 8 and "age_ms" not in pushed
