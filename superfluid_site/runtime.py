"""The web process's per-event-loop state: one :class:`WebRuntime` per event loop.

A web runtime owns what the request path keeps between requests on its loop: the link to the
engine worker (a ``Transport``: ``scheduler/link/``), the links of the models a pool has loaded
(so a drain sees every response still open) and the key runtime (``keys/runtime.py``: keys,
policies, rate buckets, concurrency slots). daphne runs one event loop, so a server has one web
runtime; a test's event loop gets its own. Other parts reach them through :func:`web_runtime`
(the running loop's, made on first use), :func:`runtime_of` (a given loop's, if any) and
:func:`all_runtimes` -- never through a module's private dictionary -- or through the front doors
below: :func:`get_link`, :func:`install`, :func:`current`, :func:`all_links`, :func:`key_runtime`,
:func:`poke_keys`.

This module is the top of the web side's layers: it imports the link's transports, the model
pool and the key runtime (inside functions, so importing it touches neither Django nor the link),
and none of them imports it back; the key runtime is handed its link when it is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keys.runtime import KeyRuntime
    from scheduler.link.pool import ModelPool
    from scheduler.link.transport import Transport


class WebRuntime:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.link: Transport | None = None  # the loop's link (a pool's PoolLink with several models)
        self._keys: KeyRuntime | None = None

    # -- the link -------------------------------------------------------------------------

    def install_link(self, link: Transport) -> Transport:
        """Make ``link`` this loop's link and start it (get_link, the pool, tests)."""
        self.link = link
        link.start()
        return link

    def get_link(self) -> Transport:
        """The loop's link, made on first use: with several models the pool's; else the worker
        sockets serve hands over, or the serving configuration's socket path; the Redis queue
        when it names one (``--redis``)."""
        if self.link is not None:
            return self.link
        from scheduler.link.pool import get_pool

        pool = get_pool()
        if pool is not None:
            return self.install_link(pool.link)
        from scheduler.link.client import WORKER_SOCKETS, SocketTransport
        from superfluid_site.serving import serving

        link: Transport
        if serving().redis_url:
            from scheduler.link.redis_transport import RedisTransport

            link = RedisTransport(serving().redis_url)
        elif WORKER_SOCKETS.active:
            link = SocketTransport(sockets=WORKER_SOCKETS)
        else:
            link = SocketTransport(serving().socket)
        return self.install_link(link)

    def pools(self) -> list[ModelPool]:
        from scheduler.link.pool import all_pools

        return [pool for pool in all_pools() if pool.loop is self.loop]

    def links(self) -> list[Transport]:
        """Every link of this loop: its own, then its pool's per-model ones not yet closed."""
        own = [self.link] if self.link is not None else []
        return own + [link for pool in self.pools() for link in pool.open_links.values()]

    def in_flight_keys(self) -> dict[str, str | None]:
        """job id -> API key name of the jobs in flight on this loop's links (the dashboard's
        lanes, /slots). With several models the loop's link is the pool's PoolLink, which never
        submits a job: each job is on its model's own link, and every one is read (job ids are
        uuids, unique across models, so one map serves every model's lanes)."""
        return {job_id: handle.key for link in self.links() for job_id, handle in list(link.inflight.items())}

    # -- the keys -------------------------------------------------------------------------

    @property
    def keys(self) -> KeyRuntime:
        """The key runtime, made and started on first use."""
        if self._keys is None:
            from keys.runtime import KeyRuntime

            self._keys = KeyRuntime(self.loop, link=self.get_link)
        self._keys.start()
        return self._keys

    def set_keys(self, keys: KeyRuntime | None) -> None:
        """Use ``keys`` as this loop's key runtime (tests: a fixed snapshot); None: made anew."""
        self._keys = keys

    def keys_if_made(self) -> KeyRuntime | None:
        return self._keys


_runtimes: dict[int, WebRuntime] = {}
_lock = threading.Lock()  # poke_all reads from other threads


def web_runtime() -> WebRuntime:
    """The running event loop's web runtime, made on first use."""
    loop = asyncio.get_running_loop()
    with _lock:
        rt = _runtimes.get(id(loop))
        if rt is None or rt.loop is not loop:  # an id reused after a loop closed
            rt = _runtimes[id(loop)] = WebRuntime(loop)
    return rt


def runtime_of(loop: asyncio.AbstractEventLoop) -> WebRuntime | None:
    """``loop``'s web runtime, if one was made (no new one)."""
    with _lock:
        rt = _runtimes.get(id(loop))
    return rt if rt is not None and rt.loop is loop else None


def all_runtimes() -> list[WebRuntime]:
    with _lock:
        return list(_runtimes.values())


def forget(loop: asyncio.AbstractEventLoop) -> WebRuntime | None:
    """Drop ``loop``'s web runtime (tests, after stopping its link); returns it."""
    with _lock:
        return _runtimes.pop(id(loop), None)


# -- front doors: the running loop's link and key runtime -------------------------------------


def get_link() -> Transport:
    """The running event loop's link to the engine worker(s), made on first use."""
    return web_runtime().get_link()


def install(link: Transport) -> Transport:
    """Make ``link`` the running event loop's link and start it (tests install an in-process one)."""
    return web_runtime().install_link(link)


def current() -> Transport | None:
    """The running event loop's link, if one was made."""
    rt = runtime_of(asyncio.get_running_loop())
    return rt.link if rt is not None else None


def all_links() -> list[Transport]:
    """Every link of every web runtime in this process (serve's drain)."""
    return [link for rt in all_runtimes() for link in rt.links()]


def key_runtime() -> KeyRuntime:
    """The running event loop's key runtime, started on first use."""
    return web_runtime().keys


def poke_keys() -> None:
    """Ask every key runtime in this process to re-read now (called after a commit; any thread)."""
    for web in all_runtimes():
        rt = web.keys_if_made()
        if rt is None:
            continue
        with contextlib.suppress(RuntimeError):  # a loop that has closed
            rt.loop.call_soon_threadsafe(rt.poke.set)
