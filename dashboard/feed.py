"""Feeds the live dashboard: worker snapshots pushed to this process's Channels group (``GROUP``).

The link client (``scheduler/link/client.py``) calls :func:`on_snapshot` for every snapshot the
worker sends (ten a second, and at once when a lane is taken or freed). This module keeps the
latest and sends it to the group at most every ``MIN_INTERVAL_S`` (the last one always goes out,
so a lane going idle is never lost), reduced to what the page draws (:func:`dashboard_state`);
on the in-memory layer, only while a dashboard is open.
No prompt or reply text is in a snapshot, so none reaches the page.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from scheduler.aio import spawn

log = logging.getLogger("superfluid.dashboard")

# This web process's own group: with Redis's shared layer (several heads) a page hears only the
# head it is connected to. A shared "lanes" group made every open page take every head's pushes
# (five a second each), alternating between heads whose lanes' keys differ (each knows only the
# keys of the jobs it submitted).
GROUP = f"lanes.{os.getpid()}.{uuid.uuid4().hex[:8]}"
MIN_INTERVAL_S = 0.2  # about five pushes a second


def lane_keys(loop: asyncio.AbstractEventLoop | None = None) -> dict[str, str | None]:
    """job id -> API key name of the jobs this web process has in flight (the worker's lanes
    may not say)."""
    from superfluid_site.runtime import runtime_of

    try:
        loop = loop or asyncio.get_running_loop()
    except RuntimeError:
        return {}
    web = runtime_of(loop)
    return web.in_flight_keys() if web is not None else {}


def source_of(state: Mapping[str, Any], model: str | None = None) -> str:
    """The worker a snapshot comes from: its Redis worker id, else its pid, after the model's id
    with several models. A restarted worker (its counters start again at zero) is a new one."""
    worker = state.get("worker") or f"{state.get('host') or ''}:{state.get('pid') or ''}"
    return f"{model}/{worker}" if model is not None else str(worker)


def worker_totals(state: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
    """One worker's cumulative counts (tokens, time to first token, the scheduler's counters) and
    which worker they are from (``source``; ``label``: the model's id with several models). The
    page's rates and events are differences between two pushes of one source only: counts of
    two workers are never compared."""
    stats: Mapping[str, Any] = state.get("metrics") or {}
    ttft: Mapping[str, Mapping[str, Any]] = stats.get("ttft_s") or {}
    return {
        "source": source_of(state, model),
        "label": model,
        "tokens": {
            "prefill": stats.get("prefill_tokens_total", 0),
            "decode": stats.get("decode_tokens_total", 0),
        },
        "ttft": {"sum": sum(h.get("sum", 0.0) for h in ttft.values()), "count": sum(int(h.get("count", 0)) for h in ttft.values())},
        "counters": dict(state.get("counters") or {}),
    }


def dashboard_state(state: Mapping[str, Any], keys: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """What the dashboard draws, from one worker snapshot (plain JSON, no histograms); ``keys``
    fills in the API key of lanes whose snapshot entry has none. ``totals`` holds the cumulative
    counts of every worker the charts and events cover: here that one worker (with several
    models, :func:`full_state` puts every resident model's there)."""
    stats: Mapping[str, Any] = state.get("metrics") or {}  # a scheduler.worker.metrics.WorkerStats
    last: Mapping[str, Any] = stats.get("last_tick") or {}
    totals = worker_totals(state)
    keys = keys or {}
    lanes = []
    for lane in state.get("lanes", []):
        if lane.get("job_id") and not lane.get("key") and keys.get(lane["job_id"]):
            lane = {**lane, "key": keys[lane["job_id"]]}
        lanes.append(lane)
    return {
        "t": time.time(),
        "model": state.get("model"),
        "engine": state.get("engine"),
        "n_lanes": state.get("n_lanes", len(state.get("lanes", []))),
        "lane_ctx": state.get("lane_ctx"),
        "draining": bool(state.get("draining", False)),
        "tick": state.get("tick", 0),
        "lanes": lanes,
        "queue_depth": dict(state.get("queue_depth") or {}),
        "class_lanes": dict(state.get("class_lanes") or {}),
        "parked": list(state.get("parked") or []),
        "pool": dict(state.get("pool") or {}),
        "counters": totals["counters"],
        "prefill_tokens_per_s": state.get("prefill_tokens_per_s", 0),
        "last_ttft_ms": (state.get("stats") or {}).get("last_ttft_ms", 0),
        "tick_info": {
            "prefill_budget": stats.get("prefill_budget_tokens", 0),
            "decode_grant": stats.get("decode_grant_tokens", 0),
            "step_tokens": stats.get("prefill_step_tokens", 0),
            "last_prefill_tokens": last.get("prefill_tokens", 0),
            "last_decode_tokens": last.get("decode_tokens", 0),
            "last_lanes": last.get("lanes", 0),
            "last_seconds": last.get("seconds", 0.0),
        },
        "tokens": totals["tokens"],
        "ttft": totals["ttft"],
        "totals": [totals],
        # Redis mode: every worker (host, lanes) and the global queue by class, an empty fleet once
        # no worker is left (the page then says so); absent otherwise
        **({"fleet": list(state["fleet"]), "global_queue": dict(state.get("global_queue") or {})} if state.get("fleet") is not None else {}),
    }


def worker_away(state: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's last snapshot once it is gone (crashed, restarting): its lanes idle, nothing
    queued or parked at it, none of its KV in use; its model, lane count and context as they were."""
    lanes = [{"lane": lane.get("lane", i), "state": "idle"} for i, lane in enumerate(state.get("lanes") or [])]
    pool = {"blocks_total": (state.get("pool") or {}).get("blocks_total", 0)}
    return {**state, "lanes": lanes, "queue_depth": {}, "parked": [], "pool": pool}


def models_view(loop: asyncio.AbstractEventLoop | None = None) -> dict[str, Any]:
    """With several models (the router's pool on this event loop): every resident model's lanes
    (``models``) and the router's queue by band (``router_queue``); ``{}`` without a pool."""
    from scheduler.link.pool import all_pools

    from .served import pool_view

    try:
        loop = loop or asyncio.get_running_loop()
    except RuntimeError:
        return {}
    pool = next((p for p in all_pools() if p.loop is loop), None)
    if pool is None:
        return {}
    view = pool_view(pool)
    models = [
        {
            "id": m["id"],
            "fim": bool(m.get("fim")),
            "state": m["state"],
            "n_lanes": m.get("lanes") or len(m["lane_list"]),
            "lanes_in_use": m["lanes_in_use"],
            "waiting": m["waiting"],
            "lanes": [{"lane": lane.get("lane"), "state": lane.get("state"), "class": lane.get("class")} for lane in m["lane_list"]],
        }
        for m in view["models"]
        if m["resident"]
    ]
    return {"models": models, "router_queue": view["queue"]}


def full_state(state: Mapping[str, Any], loop: asyncio.AbstractEventLoop | None = None) -> dict[str, Any]:
    """What one push carries: the snapshot's view and, with several models, the router's. With
    several models every resident worker sends snapshots; the page's lanes panel draws the model
    used last (the pool link's), so it does not flip between models at each snapshot, and
    ``totals`` holds every resident model's counts (the charts and events: all models, each
    model's rates from its own counts only)."""
    from scheduler.link.pool import all_pools

    try:
        loop = loop or asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    pool = next((p for p in all_pools() if loop is not None and p.loop is loop), None)
    if pool is None:
        return {**dashboard_state(state, lane_keys(loop)), **models_view(loop)}
    if pool.link.snapshot:
        state = pool.link.snapshot
        latest = pool.links.get(pool.last_model) if pool.last_model else None
        if latest is not None and not getattr(latest, "connected", True):
            state = worker_away(state)  # other models' snapshots keep the page live: not its lost worker's jobs
    totals = [worker_totals(link.snapshot, model) for model, link in list(pool.links.items()) if link.snapshot]
    return {**dashboard_state(state, lane_keys(loop)), "totals": totals, **models_view(loop)}


class SnapshotFeed:
    """Throttled pushes of the latest snapshot to the group, on the event loop that calls it."""

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.min_interval_s = min_interval_s
        self.latest: Mapping[str, Any] | None = None
        self.sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._last_sent = float("-inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending = False  # a push is on its way to the layer
        self._due = False  # a push fell due meanwhile: it goes (the latest) once that one is sent

    def on_snapshot(self, state: Mapping[str, Any] | None) -> None:
        if not state:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if loop is not self._loop:  # a new loop (tests): forget the old one's timer
            self._loop, self._handle, self._last_sent = loop, None, float("-inf")
            self._sending = self._due = False
        self.latest = state
        self._schedule(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            return  # a push is already due; it takes the latest snapshot
        delay = max(0.0, self._last_sent + self.min_interval_s - loop.time())
        self._handle = loop.call_later(delay, self._push)

    def _push(self) -> None:
        loop = self._loop
        self._handle = None
        if loop is None or self.latest is None:
            return
        if self._sending:
            # the last push is not sent yet (a shared layer slow to answer): one push at a time,
            # the latest once it is. Each push was a task of its own: behind a hung Redis they
            # piled up, each holding its state, and arrived in any order, an older state last.
            self._due = True
            return
        self._last_sent = loop.time()
        try:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            if layer is None or _nobody_watching(layer):
                return
            message = {"type": "lanes.update", "state": full_state(self.latest, loop)}
        except Exception:
            log.exception("dashboard feed: could not prepare a push")
            return
        self._sending = True
        spawn(self._tasks, self._send(layer, message, loop))  # on self._loop: _push runs there

    async def _send(self, layer: Any, message: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        try:
            await layer.group_send(GROUP, message)
            self.sent += 1
        except Exception:
            log.exception("dashboard feed: group_send failed")
        finally:
            if loop is self._loop:
                self._sending = False
                if self._due:
                    self._due = False
                    self._schedule(loop)


def _nobody_watching(layer: Any) -> bool:
    """No dashboard is open on this process's in-memory layer (the embedded default), so there
    is nothing to prepare; a shared layer (Redis) may have watchers on other heads: always push."""
    from channels.layers import InMemoryChannelLayer

    groups = getattr(layer, "groups", None)  # its members by group; unknown shape: push
    return isinstance(layer, InMemoryChannelLayer) and isinstance(groups, dict) and not groups.get(GROUP)


feed = SnapshotFeed()


def on_snapshot(state: Mapping[str, Any] | None) -> None:
    """Hook for the link client: a worker snapshot arrived. Never raises into the link's reader."""
    try:
        feed.on_snapshot(state)
    except Exception:
        log.exception("dashboard feed: snapshot dropped")
