"""Several models behind one server: the web side of the model router.

Used when ``serve`` is given ``--config`` or ``--model`` more than once (one ``--model`` is the
single-worker server of ``superfluid_site.runtime.get_link``). Each resident model has its own
engine worker process (its own tick loop, lanes and KV pool) under its own supervisor, reached
over its own :class:`SocketTransport` on its own ``socketpair``; a crash of one model's worker is
restarted by its supervisor and never touches another's.

A request waits in the :class:`scheduler.core.router.Router` (``acquire``) until the router
dispatches it; it is then submitted to its model's transport, and ``release`` tells the router
its work ended. The router's load and unload actions start and stop workers here.

For the rest of the web side (health, /slots, the dashboard, key-policy caps, drain) the web
runtime installs the pool's :class:`PoolLink` as the event loop's link: it fans configuration out
to every model's transport and shows the snapshot of the model used last.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from scheduler.aio import spawn
from scheduler.core.router import BANDS, Dispatch, LoadBackoff, ModelSpec, ModelState, Router
from scheduler.models_config import ModelsConfig
from scheduler.worker.metrics import Histogram

from .client import SocketTransport, WorkerSockets
from .messages import Config, Hello, encode
from .transport import SNAPSHOT_LISTENERS, Transport

log = logging.getLogger("superfluid.pool")

TICK_S = 0.5  # how often TTLs are checked
UNLOAD_WAIT_S = 30.0  # a stopping worker gets this long before it is killed
LOAD_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # finite: /metrics adds +Inf (the count) itself


class Worker(Protocol):
    """What the pool needs of a model's worker supervisor (serve's ``WorkerSupervisor``)."""

    exited: threading.Event
    fatal: str | None
    on_fatal: Callable[[], None] | None
    restarts: int

    def start(self) -> None: ...
    def drain(self) -> None: ...
    def kill(self) -> None: ...


class ModelUnavailable(Exception):
    """A request's model could not be loaded (or is backed off after a failed load), or the
    server is shutting down."""

    def __init__(self, model: str, detail: str, dispatch: Dispatch | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.model = model
        self.detail = detail
        self.dispatch = dispatch  # the router's pick, where it had dispatched the request
        self.retry_after_s = retry_after_s  # the model's load backoff left: the 503's Retry-After


@dataclass
class PoolSetup:
    config: ModelsConfig
    spawn: Callable[[str, WorkerSockets], Worker]  # a supervisor, not yet started, for a model id
    ctx_sizes: dict[str, int] = field(default_factory=dict)  # per-lane context of each model
    lanes: dict[str, int] = field(default_factory=dict)


_SETUP: PoolSetup | None = None
_POOLS: dict[int, ModelPool] = {}


def configure(setup: PoolSetup | None) -> None:
    """serve: the models this process serves (None: the single-worker server)."""
    global _SETUP
    _SETUP = setup
    _POOLS.clear()


def model_lanes() -> dict[str, int]:
    """Each served model's lanes (its worker's --max-batch), by id; empty in the single-worker
    server. Read without an event loop (the admin's checks run in a thread)."""
    return dict(_SETUP.lanes) if _SETUP is not None else {}


def get_pool() -> ModelPool | None:
    """The running event loop's pool, made on first use; None in the single-worker server."""
    if _SETUP is None:
        return None
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(id(loop))
    if pool is None:
        pool = _POOLS[id(loop)] = ModelPool(_SETUP)
        pool.start()
    return pool


def all_pools() -> list[ModelPool]:
    return list(_POOLS.values())


_T = TypeVar("_T")


class _LatestLinks(Generic[_T]):
    """A pool link's attribute read from the link of the model used last (None before any):
    Transport's __init__ sets its own value, which a pool link has no use for and drops."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, pool_link: PoolLink, owner: type | None = None) -> _T | None:
        link = pool_link._latest()
        return getattr(link, self.name) if link is not None else None

    def __set__(self, pool_link: PoolLink, value: Any) -> None:
        pass


class PoolLink(Transport):
    """The event loop's link in a pool: what serve's drain, health, /slots, the dashboard and the
    key-policy caps see. Jobs are never submitted through it."""

    def __init__(self, pool: ModelPool) -> None:
        super().__init__()
        self.pool = pool
        self.worker_configs: dict[str, Config] = {}  # model id -> its worker's settings
        self._connected.set()

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _send(self, data: bytes) -> None:
        pass

    async def configure(self, config: Config) -> None:
        await self.configure_models({"": config})  # "": every model without settings of its own

    async def configure_models(self, configs: dict[str, Config]) -> None:
        """Each model's worker gets its own model's settings (its class-lane caps), now if it is
        loaded and when it is loaded later."""
        for config in configs.values():
            encode(config)
        self.worker_configs = dict(configs)
        self.worker_config = configs.get("") or next(iter(configs.values()), None)
        for model, link in list(self.pool.links.items()):
            if self.pool.links.get(model) is not link:
                continue  # unloaded while a send paused: its link is closed, configure would restart it
            config = self.config_for(model)
            if config is not None:
                await link.configure(config)

    def config_for(self, model: str) -> Config | None:
        return self.worker_configs.get(model) or self.worker_config

    def _latest(self) -> SocketTransport | None:
        model = self.pool.last_model
        return self.pool.links.get(model) if model else None

    # what the latest model's worker said (a worker away: crashed, restarting, its last words):
    # the dashboard shows a page opened meanwhile that snapshot as that old, not live. The pool
    # link itself is always "connected" (models load on demand), so its own snapshot_at (never
    # set) and connected told the page nothing.
    snapshot: _LatestLinks[dict[str, Any]] = _LatestLinks()
    snapshot_at: _LatestLinks[float] = _LatestLinks()
    hello: _LatestLinks[Hello] = _LatestLinks()

    @property
    def snapshot_connected(self) -> bool:
        link = self._latest()
        return link is None or bool(link.connected)


class ModelPool:
    def __init__(self, setup: PoolSetup, clock: Callable[[], float] = time.monotonic) -> None:
        self.setup = setup
        self.config = setup.config
        specs = [ModelSpec(m.id, priority=m.priority, ttl_s=m.ttl_s, lanes=setup.lanes.get(m.id, 0), pinned=m.fim) for m in self.config.models]
        self.router = Router(specs, self.config.router_config(), clock)
        self.links: dict[str, SocketTransport] = {}
        self.workers: dict[str, Worker] = {}
        self.stopping: list[Worker] = []  # workers of unloaded models not yet exited (see exited, kill)
        self.waiters: dict[str, asyncio.Future[Dispatch]] = {}
        self.link = PoolLink(self)
        self.last_model: str | None = None
        self.loads_total: dict[str, int] = {m.id: 0 for m in self.config.models}
        self.load_seconds = {m.id: Histogram(LOAD_BUCKETS_S) for m in self.config.models}
        self.last_used: dict[str, float] = {}  # wall-clock time, for the admin
        self.errors: dict[str, str] = {}  # the last load failure of each model
        self.draining = False
        self._drained: set[str] = set()  # models whose worker was told to drain (serve's shutdown)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._awaiting: dict[str, asyncio.Task[Any]] = {}  # model -> the wait for its worker's hello
        self._ticker: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the one it runs on, once started
        self.open_links: dict[str, Transport] = {}  # loaded and not yet closed, by model id
        # what the last router-only push showed (requests waiting, each model's state); None: a
        # worker's snapshots pushed the page since. At first the page shows nothing loaded.
        self._shown: tuple[bool, tuple[str, ...]] | None = (False, tuple(ModelState.UNLOADED.value for _ in self.router.models))

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="superfluid-router")
        for model in self.config.preload:
            self.router.request_load(model)
        self.kick()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.kick()
                self._push_router_queue()
            except Exception:  # the router must keep running
                log.exception("router tick failed")

    def _push_router_queue(self) -> None:
        """The dashboard is pushed when a worker's snapshot arrives. With no worker connected
        (none loaded, or the first still loading) none comes, and the page's router queue never
        showed the requests waiting for a load: while some wait, once more when none does, and
        when a model's state changes (the last loaded one unloaded), the router's view is pushed
        from here."""
        if any(link.connected for link in self.links.values()):
            self._shown = None  # the workers' snapshots push the page
            return
        waiting = any(band["depth"] for band in self.router.snapshot()["queue"].values())  # type: ignore[attr-defined]
        # and once when the models' states change with no worker left to push: the last loaded
        # model unloaded (its TTL, the admin's Unload) was shown loaded on an open page for good
        view = (waiting, tuple(self.router.state(m).value for m in self.router.models))
        if waiting or view != self._shown:
            self._shown = view
            for listener in SNAPSHOT_LISTENERS:
                listener(self.link.snapshot or {"router": "waiting for a load" if waiting else "idle"})

    def _spawn_task(self, coro: Any) -> None:
        spawn(self._tasks, coro)

    def drain(self) -> None:
        """serve's SIGTERM: nothing new. A request waiting for a lane of a loaded model was
        accepted: it still gets its turn there. One waiting for a model to load ends now (no
        worker starts any more). Each model's worker is told to drain once nothing of its own
        waits here or runs: it is never told while a request is on its way to it (its submit
        would be refused as the worker drains). Its link refuses submits from then on, not
        before: serve's drain leaves the links this pool holds to it (:meth:`holds`), since a
        link marked draining refuses the submit of a request the router dispatches after the
        signal."""
        self.draining = True
        for rid in self.router.drain():
            fut = self.waiters.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(ModelUnavailable("", "The server is shutting down."))
        for link in self.open_links.values():
            if not any(link is held for held in self.links.values()):  # being closed: its model is unloading, nothing goes to it
                link.draining = True
        self.kick()

    def holds(self, link: Transport) -> bool:
        """``link`` is one of this pool's models' links, whose drain the pool decides."""
        return any(link is held for held in self.open_links.values())

    def _drain_idle_workers(self) -> None:
        for model, worker in list(self.workers.items()):
            if model not in self._drained and self.router.idle(model):
                self._drained.add(model)
                link = self.links.get(model)
                if link is not None:
                    link.draining = True  # nothing more is submitted to it
                worker.drain()

    def fail_waiting(self, detail: str) -> None:
        """serve's drain deadline: every request still waiting here ends with ``detail``."""
        for rid, fut in list(self.waiters.items()):
            if self.router.cancel(rid) and not fut.done():
                fut.set_exception(ModelUnavailable("", detail))

    def exited(self) -> bool:
        """Every worker has exited, those of models being unloaded included."""
        return all(w.exited.is_set() for w in [*self.workers.values(), *self.stopping])

    def kill(self) -> None:
        for worker in [*self.workers.values(), *self.stopping]:
            worker.kill()

    # -- names -------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.config.names)

    def resolve(self, name: str) -> str | None:
        return self.config.resolve(name)

    def route(self, name: str, *, fim: bool) -> str | None:
        """The model id a request runs on: fill-in-the-middle on the ``--fim-model`` (if any),
        anything else on the model its ``model`` names (an id or an alias); None if unknown."""
        model_id = self.resolve(name)
        return None if model_id is None else self.config.route(model_id, fim=fim)

    # -- requests ----------------------------------------------------------------------

    async def acquire(self, model: str, priority: int, *, preempts: bool = False, jobs: int = 1) -> tuple[SocketTransport, Dispatch, str]:
        """Wait until the router dispatches this request (``jobs``: how many it runs at the
        worker, a lane each); the model's transport to submit it to. ``release(ticket)`` must
        follow once its work ended (done, failed or cancelled)."""
        if self.draining:
            raise ModelUnavailable(model, "The server is shutting down.")
        ticket = uuid.uuid4().hex
        fut: asyncio.Future[Dispatch] = asyncio.get_running_loop().create_future()
        try:
            self.router.submit(ticket, model, priority, preempts=preempts, jobs=jobs)
        except LoadBackoff as exc:  # its last load failed: refused at once, nothing evicted or loaded
            raise ModelUnavailable(model, self._backoff_detail(model, exc.retry_after_s), retry_after_s=exc.retry_after_s) from None
        self.waiters[ticket] = fut
        self.kick()
        try:
            dispatch = await fut
        except asyncio.CancelledError:
            self.waiters.pop(ticket, None)
            if not self.router.cancel(ticket):
                self.router.finished(ticket)  # dispatched as the client left
            self.kick()
            raise
        finally:
            self.waiters.pop(ticket, None)
        link = self.links.get(model)
        if link is None:  # its worker died for good between the dispatch and now (_load_failed)
            self.router.finished(ticket)
            self.kick()
            raise ModelUnavailable(model, self.errors.get(model) or f"The model {model!r} is not loaded.", dispatch)
        self.last_model = model
        self.last_used[model] = time.time()
        return link, dispatch, ticket

    def _backoff_detail(self, model: str, left_s: float) -> str:
        failed = self.errors.get(model) or f"The model {model!r} could not be loaded."
        return f"{failed} It is not loaded again for {math.ceil(left_s)} s (Retry-After) unless an admin loads it."

    def release(self, ticket: str) -> None:
        self.router.finished(ticket)
        self.kick()

    # -- the router's actions ----------------------------------------------------------

    def kick(self) -> None:
        actions = self.router.schedule()
        for model in actions.unload:
            self._unload(model)
        for model in actions.load:  # none once draining (Router.drain)
            self._load(model)
        for d in actions.dispatch:
            fut = self.waiters.get(d.request_id)
            if fut is None or fut.done():
                self.router.finished(d.request_id)
            else:
                fut.set_result(d)
        if self.draining:
            self._drain_idle_workers()

    def _load(self, model: str) -> None:
        sockets = WorkerSockets()
        link = SocketTransport(sockets=sockets)
        link.worker_config = self.link.config_for(model)
        self.open_links[model] = link  # serve's drain sees it (WebRuntime.links) until it is closed
        self.links[model] = link
        worker = self.setup.spawn(model, sockets)
        self.workers[model] = worker
        loop = asyncio.get_running_loop()
        worker.on_fatal = lambda: loop.call_soon_threadsafe(self._load_failed, model, worker)
        self.errors.pop(model, None)
        log.info("loading model %s", model)
        try:
            worker.start()
        except Exception as exc:  # no process or thread could be started (no descriptors, memory, threads)
            worker.fatal = f"its worker process could not be started ({exc})"
            worker.kill()  # a process it started before failing (its watching thread) runs no more
            loop.call_soon(self._load_failed, model, worker)  # after this kick's dispatches
            return
        link.start()
        self._awaiting[model] = spawn(self._tasks, self._await_loaded(model, link))

    def _stop_awaiting(self, model: str) -> None:
        """The wait for the model's worker's hello, cancelled: the load failed or the model is
        being unloaded, so its link never connects now and the wait would last for ever."""
        awaiting = self._awaiting.pop(model, None)
        if awaiting is not None:
            awaiting.cancel()

    async def _await_loaded(self, model: str, link: SocketTransport) -> None:
        timeout_s = self.config.load_timeout_s
        ready = await link.wait_connected(timeout_s)
        self._awaiting.pop(model, None)
        if self.links.get(model) is not link:
            return
        if not ready:  # a worker hung mid-load: its requests waited with no end
            worker = self.workers.get(model)
            if worker is not None:
                worker.fatal = f"its worker was not ready within {timeout_s:g} s (healthCheckTimeout)"
                worker.kill()
                self._load_failed(model, worker)
            return
        took = self.router.loaded(model)
        self._shown = None  # its worker's snapshots push the page from now on
        self.loads_total[model] += 1
        self.load_seconds[model].observe(took)
        self.last_model = self.last_model or model
        log.info("model %s loaded in %.2f s", model, took)
        self.kick()

    def _load_failed(self, model: str, worker: Worker) -> None:
        if self.workers.get(model) is not worker:
            return
        detail = f"The model {model!r} could not be loaded: {worker.fatal or 'its worker exited'}."
        self.errors[model] = detail
        log.error("%s", detail)
        self.workers.pop(model, None)
        self._stop_awaiting(model)
        link = self.links.pop(model, None)
        if link is not None:
            self._spawn_task(self._close(model, link))
        dropped = self.router.load_failed(model)
        left = self.router.backoff_left(model)
        for rid in dropped:
            fut = self.waiters.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(ModelUnavailable(model, detail, retry_after_s=left or None))
        self.kick()

    async def _close(self, model: str, link: SocketTransport) -> None:
        await link.stop()
        if self.open_links.get(model) is link:  # not a link a load since then has put there
            self.open_links.pop(model, None)

    def _unload(self, model: str) -> None:
        link = self.links.pop(model, None)
        worker = self.workers.pop(model, None)
        if worker is not None:
            self.stopping.append(worker)  # serve's exit still waits for it, or kills it
        self._stop_awaiting(model)
        log.info("unloading model %s", model)
        if self.last_model == model:
            self.last_model = next(iter(self.links), None)
        self._spawn_task(self._stop(model, link, worker))

    async def _stop(self, model: str, link: SocketTransport | None, worker: Worker | None) -> None:
        if link is not None:  # nothing is in flight: the router unloads only an idle model
            await self._close(model, link)
        if worker is not None:
            worker.drain()
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, worker.exited.wait, UNLOAD_WAIT_S):
                worker.kill()
            self.stopping.remove(worker)
        self.router.unloaded(model)
        self.kick()

    # -- admin ---------------------------------------------------------------------------

    def load(self, model: str) -> None:
        self.router.request_load(model)
        self.kick()

    def unload(self, model: str) -> None:
        self.router.request_unload(model)
        self.kick()

    def models_state(self) -> list[dict[str, Any]]:
        """Each configured model as the admin shows it."""
        snap = self.router.snapshot()["models"]  # type: ignore[index]
        out = []
        for m in self.config.models:
            s = snap[m.id]
            link = self.links.get(m.id)
            # a worker away (crashed, restarting) has no lanes in use: its last snapshot's are nobody's
            lanes = (link.snapshot or {}).get("lanes", []) if link is not None and getattr(link, "connected", True) else []
            state = s["state"]
            out.append(
                {
                    "id": m.id,
                    "aliases": list(m.aliases),
                    "path": str(m.path),
                    "state": "unloaded" if state == ModelState.UNLOADING.value else state,
                    "lanes": self.setup.lanes.get(m.id),
                    "lanes_in_use": sum(1 for lane in lanes if lane.get("state") != "idle"),
                    "waiting": s["waiting"],
                    "waiting_by_band": s["waiting_by_band"],
                    "running": s["inflight"],
                    "last_used": self.last_used.get(m.id),
                    "ttl_s": m.ttl_s,
                    "priority": m.priority,
                    "context_length": self.setup.ctx_sizes.get(m.id),
                    "loads": self.loads_total[m.id],
                    "requests": s["dispatched"],
                    "fim": m.fim,
                    "worker_restarts": self.workers[m.id].restarts if m.id in self.workers else 0,
                    "error": self.errors.get(m.id),
                    "load_failures": s["load_failures"],  # in a row; a successful load or the admin's Load resets it
                    "load_backoff_s": s["load_backoff_s"],  # seconds until a request may load it again (0: now)
                }
            )
        return out

    # -- metrics ---------------------------------------------------------------------------

    def router_stats(self) -> dict[str, Any]:
        """The router's figures for /metrics as plain numbers (api/metrics.py names them): what
        waits by band (at the router and at each resident model's worker), dispatches, reorders,
        model loads and load times, and each model's shown state."""
        queue = self.router.queue_by_band()
        depth = {b: queue[b][0] for b in BANDS}
        oldest = {b: queue[b][1] for b in BANDS}
        for link in list(self.links.values()):  # and what waits at each resident model's worker
            if not link.connected:  # its worker is away (crashed, restarting): its last queue is nobody's
                continue
            stats = (link.snapshot or {}).get("metrics") or {}
            for b, n in (stats.get("queue_depth_by_band") or {}).items():
                if b in depth:
                    depth[b] += int(n or 0)
            for b, w in (stats.get("queue_oldest_wait_s_by_band") or {}).items():
                if b in oldest:
                    oldest[b] = max(oldest[b], float(w or 0))

        def shown(m: str) -> ModelState:  # a worker being stopped is shown unloaded, as in the admin
            st = self.router.state(m)
            return ModelState.UNLOADED if st is ModelState.UNLOADING else st

        return {
            "queue_depth_by_band": depth,
            "queue_oldest_wait_s_by_band": {b: round(w, 3) for b, w in oldest.items()},
            "dispatched_by_band": dict(self.router.dispatched_by_band),
            "reorders": dict(self.router.reorders),
            "loads": dict(self.loads_total),
            "load_seconds": {m: h.stats() for m, h in self.load_seconds.items()},
            "states": {m: shown(m).value for m in self.loads_total},
            # each loaded model's latest worker snapshot: /metrics labels its families by model
            "snapshots": {m: link.snapshot for m, link in sorted(self.links.items()) if link.snapshot},
            # each loaded model's link: connected, worker restarts, requests it holds open
            "links": {
                m: {"connected": bool(link.connected), "restarts": int(link.worker_restarts), "inflight": link.requests_in_flight()}
                for m, link in sorted(self.links.items())
            },
        }


def router_stats() -> dict[str, Any] | None:
    """The pool's figures for /metrics, or None in the single-worker server."""
    pools = all_pools()
    return pools[0].router_stats() if pools else None

