"""The web process's per-event-loop state: one :class:`WebRuntime` per event loop.

A web runtime owns what the request path keeps between requests on its loop: the link to the
engine worker (a ``Transport``: ``scheduler/link/``), the links of the models a pool has loaded
(so a drain sees every response still open) and the key runtime (``keys/runtime.py``: keys,
policies, rate buckets, concurrency slots). daphne runs one event loop, so a server has one web
runtime; a test's event loop gets its own. Other parts reach them through :func:`web_runtime`
(the running loop's, made on first use), :func:`runtime_of` (a given loop's, if any) and
:func:`all_runtimes` -- never through a module's private dictionary.

Importing this module touches neither Django nor the link; the key runtime is made on first use.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keys.runtime import KeyRuntime
    from scheduler.link.transport import Transport


class WebRuntime:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.link: Transport | None = None  # the loop's link (a pool's PoolLink with several models)
        self.model_links: dict[str, Transport] = {}  # a pool's per-model links, by model id
        self._keys: KeyRuntime | None = None

    # -- the link -------------------------------------------------------------------------

    def install_link(self, link: Transport) -> Transport:
        """Make ``link`` this loop's link and start it (get_link, the pool, tests)."""
        self.link = link
        link.start()
        return link

    def add_model_link(self, model: str, link: Transport) -> None:
        self.model_links[model] = link

    def remove_model_link(self, model: str) -> None:
        self.model_links.pop(model, None)

    def links(self) -> list[Transport]:
        """Every link of this loop: its own, then the pool's per-model ones."""
        return ([self.link] if self.link is not None else []) + list(self.model_links.values())

    def in_flight_keys(self) -> dict[str, str | None]:
        """job id -> API key name of the jobs in flight on this loop's link (the dashboard's lanes)."""
        if self.link is None:
            return {}
        return {job_id: handle.key for job_id, handle in list(self.link.inflight.items())}

    # -- the keys -------------------------------------------------------------------------

    @property
    def keys(self) -> KeyRuntime:
        """The key runtime, made and started on first use."""
        if self._keys is None:
            from keys.runtime import KeyRuntime

            self._keys = KeyRuntime(self.loop)
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
