"""Each served model as the admin page and the live dashboard show it, from the running server.

With several models (``serve --config``, repeated ``--model``, ``--fim-model``) the rows come from
the router's pool (``scheduler/link/pool.py``), read on the event loop that runs it; with one
model, from its worker's latest snapshot. ``model_action`` is the admin's load and unload: it asks
that router, on that loop, exactly as ``POST /v1/internal/models/<id>/load|unload`` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from scheduler.core.router import BANDS

READ_TIMEOUT_S = 5.0
ACTIONS = ("load", "unload")


class ActionRefused(Exception):
    """A load or unload the running server cannot do; the message says why, for the admin."""


def _lanes(snapshot: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [dict(lane) for lane in (snapshot or {}).get("lanes", [])]


def _in_use(lanes: list[dict[str, Any]]) -> int:
    return sum(1 for lane in lanes if lane.get("state") not in (None, "idle"))


def pool_view(pool: Any) -> dict[str, Any]:
    """Rows for every configured model and the router's queue by band; call on the pool's loop."""
    rows = []
    for m in pool.models_state():
        link = pool.links.get(m["id"])
        # a worker gone (crashed, restarting) has no lanes in use: its last snapshot's are nobody's
        lanes = _lanes(link.snapshot if link is not None and getattr(link, "connected", True) else None)
        rows.append({**m, "resident": m["state"] in ("loading", "loaded", "draining"), "lanes_in_use": _in_use(lanes), "lane_list": lanes})
    snap = pool.router.snapshot()
    return {"router": True, "scheduler": snap["scheduler"], "max_loaded_models": snap["max_loaded_models"], "queue": snap["queue"], "models": rows}


def single_view(link: Any) -> dict[str, Any]:
    """The one model of the single-worker server, from its worker's hello and latest snapshot."""
    snapshot = link.snapshot or {}
    hello = link.hello
    # the link keeps its last worker's hello: a worker gone (crashed, restarting) is not loaded
    connected = hello is not None and bool(getattr(link, "connected", True)) and not getattr(link, "draining", False)
    # and its last snapshot: a worker away has no lanes in use and nothing waiting at it (the
    # lost worker's lanes and queue are nobody's); its lane count and context stay as they were
    present = snapshot if hello is not None and getattr(link, "connected", True) else {}
    lanes = _lanes(present)
    metrics = present.get("metrics") or {}  # a scheduler.worker.metrics.WorkerStats
    depth = metrics.get("queue_depth_by_band") or {}
    oldest = metrics.get("queue_oldest_wait_s_by_band") or {}
    model = (hello.model if hello is not None else None) or snapshot.get("model") or "-"
    row: dict[str, Any] = {
        "id": model,
        "aliases": [],
        "state": "loaded" if connected else "unloaded",
        "resident": connected,
        "fim": False,
        "lanes": snapshot.get("n_lanes", len(lanes)) or None,
        "lanes_in_use": _in_use(lanes),
        "lane_list": lanes,
        "waiting": sum(int(depth.get(b, 0) or 0) for b in BANDS),
        "waiting_by_band": {b: int(depth.get(b, 0) or 0) for b in BANDS},
        "running": _in_use(lanes),
        "requests": None,
        "last_used": None,
        "ttl_s": 0.0,
        "context_length": snapshot.get("lane_ctx"),
        "loads": None,
        "error": None,
    }
    queue = {b: {"depth": row["waiting_by_band"][b], "oldest_wait_s": float(oldest.get(b, 0.0) or 0.0)} for b in BANDS}
    return {"router": False, "scheduler": None, "max_loaded_models": 1, "queue": queue, "models": [row]}


def _on_loop(loop: asyncio.AbstractEventLoop | None, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on ``loop`` (the state belongs to it), from a view's worker thread."""
    if loop is None or not loop.is_running() or getattr(loop, "_thread_id", None) == threading.get_ident():
        return fn(*args)

    async def call() -> Any:
        return fn(*args)

    return asyncio.run_coroutine_threadsafe(call(), loop).result(READ_TIMEOUT_S)


def served_state() -> dict[str, Any]:
    """What the admin's model page shows: the pool's models, else the single worker's model."""
    from scheduler.link.pool import all_pools
    from superfluid_site.runtime import all_runtimes

    for pool in all_pools():
        return _on_loop(pool.loop, pool_view, pool)  # type: ignore[no-any-return]
    for web in all_runtimes():
        if web.link is not None:  # the single-worker server's link
            return single_view(web.link)
    return {"router": False, "scheduler": None, "max_loaded_models": 1, "queue": {b: {"depth": 0, "oldest_wait_s": 0.0} for b in BANDS}, "models": []}


def model_action(name: str, action: str) -> str:
    """Ask the running server's router to ``load`` or ``unload`` the model ``name`` (an id or an
    alias); returns its id. A load happens as soon as a model slot is free or an idle model can
    go; an unload once the model's admitted work has finished (nothing running is cut). Raises
    ActionRefused without a router (one model: it stays loaded) or for an unknown model."""
    from scheduler.link.pool import all_pools

    if action not in ACTIONS:
        raise ActionRefused(f"Unknown action {action!r}.")
    pools = all_pools()
    if not pools:
        raise ActionRefused("This server serves one model without a router: it is loaded at start and stays loaded.")
    pool = pools[0]

    def act() -> str:
        model = pool.resolve(name)
        if model is None:
            raise ActionRefused(f"No model {name!r} is configured.")
        (pool.load if action == "load" else pool.unload)(model)
        return str(model)

    return str(_on_loop(pool.loop, act))
