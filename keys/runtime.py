"""The web process's view of keys, policies and class-lane caps, kept fresh without a restart.

Each event loop (one per daphne process) holds a :class:`KeyRuntime`: an in-memory snapshot of
every key, policy and cap, so admission never waits on the database. A background task reads
``ConfigVersion`` every ``POLL_S`` (or at once when ``keys.actions`` pokes it after a commit in this
process) and reloads everything when the number moved; then it pushes the class-lane caps for the
served model to the engine worker (``Transport.configure``, which sends them again after every
reconnect). A change made anywhere, the admin or ``manage.py revokekey`` in another process, so
reaches admission and the worker within about ``POLL_S`` plus one reload.

Rate buckets, concurrency slots and the queue bound live here too: per process, in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from scheduler.core.qos import QosClass
from scheduler.link.transport import Transport, cancel_task
from superfluid_site.serving import serving

from .limits import BucketSet, ConcurrencySlots, DrainMeter
from .snapshot import STATIC_KEY_ID, STATIC_KEY_NAME, Key, Policy, Snapshot

if TYPE_CHECKING:
    from .policyfile import FileKeys

__all__ = ["STATIC_KEY_ID", "STATIC_KEY_NAME", "Key", "KeyRuntime", "Policy", "Snapshot", "load_snapshot", "static_key"]

log = logging.getLogger("superfluid.keys")

POLL_S = 0.25
LAST_USED_EVERY_S = 60.0  # last_used is written at most this often per key


def read_version() -> int:
    """The ``ConfigVersion`` number: one read by primary key, in SQL (the ORM's query building
    costs ten times the read, and this runs four times a second for the life of the server)."""
    from django.db import connection

    from .models import ConfigVersion

    meta, quote = ConfigVersion._meta, connection.ops.quote_name
    column = meta.get_field("version").column
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {quote(column)} FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)} = %s", [1])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def policy_of(p: Any) -> Policy:
    """The runtime's frozen copy of a ``KeyPolicy`` row."""
    return Policy(
        name=p.name,
        default_class=QosClass(p.default_class),
        max_class=QosClass(p.max_class),
        allow_batch_invariant=p.allow_batch_invariant,
        rate_limit_rpm=p.rate_limit_rpm,
        max_concurrent=p.max_concurrent,
        priority_offset=p.priority_offset,
        allowed_models=tuple(p.model_list),
        is_admin=p.is_admin,
        share_prefix_cache=p.share_prefix_cache,
        allow_pin_prefix=p.allow_pin_prefix,
    )


def static_key(from_file: FileKeys | None = None) -> Key | None:
    """The key of ``SUPERFLUID_API_KEY`` (None without one), following the policy named by
    ``SUPERFLUID_API_KEY_POLICY``: an admin policy, else one of the --key-policy file's, else,
    when unnamed, the server's defaults. A named policy that exists nowhere refuses the key (it
    would otherwise get more than it was meant to) and says so in the log."""
    digest = str(getattr(settings, "SUPERFLUID_API_KEY_SHA256", "") or "")
    if not digest:
        return None
    name = str(getattr(settings, "SUPERFLUID_API_KEY_POLICY", "") or "")
    policy: Policy | None = None
    if name:
        from .models import KeyPolicy

        row = KeyPolicy.objects.filter(name=name).first()
        if row is not None:
            policy = policy_of(row)
        else:
            # the file's policies, also one no file key follows (the file a container holds for it)
            policy = from_file.policies.get(name) if from_file is not None else None
        if policy is None:
            log.error("SUPERFLUID_API_KEY_POLICY names no policy %r: the static key is refused until one exists", name)
            return None
    return Key(id=STATIC_KEY_ID, name=STATIC_KEY_NAME, digest=digest, policy=policy)


def load_snapshot() -> Snapshot:
    """Everything admission needs, in one read (the tables are small). The version is read first:
    a change committed meanwhile leaves newer rows under an older number, read again next poll."""
    from .models import ApiKey, ClassLaneCap

    version = read_version()
    policies: dict[int, Policy] = {}
    keys: dict[str, Key] = {}
    for row in ApiKey.objects.select_related("policy"):
        policy = None
        if row.policy is not None:
            policy = policies.get(row.policy.pk)
            if policy is None:
                policy = policies[row.policy.pk] = policy_of(row.policy)
        keys[row.digest] = Key(id=row.pk, name=row.name, digest=row.digest, policy=policy, expires=row.expires, revoked=row.revoked)
    from .models import KeyPolicy
    from .policyfile import file_keys

    from_file = file_keys()
    static = static_key(from_file)
    if static is not None:  # the database's keys win
        keys.setdefault(static.digest, static)
    # limits, concurrency slots, the prefix-cache scope, metrics, files and batches go by key and
    # policy names: a file key that shares either with the database's would share all of them
    # with another holder. The admin refuses such names; one made before the file named it is
    # left out here, loudly.
    taken = {k.name for k in keys.values()}
    db_policies = set(KeyPolicy.objects.values_list("name", flat=True))
    for digest, key in from_file.items():  # --key-policy FILE: the database's keys win
        clash = key.name in taken or (key.policy is not None and key.policy.name in db_policies)
        if clash and digest not in keys:
            log.error("the --key-policy file's key %r is not loaded: its name or its policy's is an admin key's or policy's", key.name)
            continue
        keys.setdefault(digest, key)
    caps: dict[str, dict[QosClass, int]] = {}
    for cap in ClassLaneCap.objects.all():
        caps.setdefault(cap.model, {})[QosClass(cap.qos_class)] = cap.max_lanes
    return Snapshot(version=version, keys_by_digest=keys, class_lanes=caps)


def _guarded(fn: Any) -> Any:
    """Run a DB read; on failure drop this thread's connection so the next try opens a new one."""

    def run(*args: Any) -> Any:
        from django.db import close_old_connections, connection

        close_old_connections()
        try:
            return fn(*args)
        except Exception:
            connection.close()
            raise

    return run


# The version check, POLL_S apart for the life of the server, runs on a thread of its own whose
# connection stays open between checks (closed after a failure, and when a runtime stops).
# Through sync_to_async, the ORM and a fresh connection each time, a check cost ~2.3 ms against
# 0.15-0.45 ms now (mostly the thread's wake-up): about a quarter of the web process's CPU at one
# stream (docs/benchmarks.md).
_VERSION_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="superfluid-keys-version")


def _read_version_keeping_the_connection() -> int:
    """The version, on the thread's kept connection. A kept connection can go stale between
    checks (a database restart, a server's idle timeout): on a database error it is replaced and
    the read, which changes nothing, tried once more; a second failure closes it and raises."""
    from django.db import DatabaseError, connection

    try:
        return read_version()
    except DatabaseError:
        connection.close()
    try:
        return read_version()
    except Exception:
        connection.close()
        raise


def _close_version_connection() -> None:
    from django.db import connection

    connection.close()


async def _read_version() -> int:
    return await asyncio.get_running_loop().run_in_executor(_VERSION_THREAD, _read_version_keeping_the_connection)


_load_snapshot = sync_to_async(_guarded(load_snapshot), thread_sensitive=True)


def _within(caps: dict[str, int], lanes: int | None) -> dict[str, int]:
    """``caps`` with each cap at most ``lanes`` (None: unknown, as they are)."""
    return caps if not lanes else {name: min(n, lanes) for name, n in caps.items()}


class KeyRuntime:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, watch: bool = True, link: Callable[[], Transport] | None = None) -> None:
        self.loop = loop
        self.link = link  # the loop's link to the worker, made on first use (None: no worker, tests)
        self.watch = watch  # False: a fixed snapshot (tests)
        self.snapshot = Snapshot()
        self.loaded = asyncio.Event()
        self.poke = asyncio.Event()
        self.buckets = BucketSet()  # requests per minute: ("key", name) or ("ip", address)
        self.completion_buckets = BucketSet()  # fill-in-the-middle, per key name or client IP
        self.slots = ConcurrencySlots()  # per key name
        self.client_slots = ConcurrencySlots()  # keyless clients, per address (--client-concurrency)
        self.in_flight = ConcurrencySlots()  # admitted and not yet ended, per model (--max-queue)
        self.drain = DrainMeter()  # how fast admitted requests end: Retry-After for a full queue
        self.sent_caps: dict[str, dict[str, int]] | None = None  # model -> caps last sent
        self._last_used: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one refresh at a time

    def start(self) -> None:
        if self._task is None and self.watch:
            self._task = self.loop.create_task(self._run(), name="superfluid-keys")

    async def ready(self, timeout_s: float = 10.0) -> Snapshot:
        """The snapshot, after the first load has finished. When a change was committed in this
        process (the admin) and not yet read, read it first: the next request sees it."""
        self.start()
        if not self.loaded.is_set():  # asyncio.timeout: wait_for can swallow a cancel (transport.py)
            async with asyncio.timeout(timeout_s):
                await self.loaded.wait()
        # A poke not yet read, or one the watcher has just taken and is reading now (it clears
        # the poke before its read): either way this request waits for that read.
        if self.watch and (self.poke.is_set() or self._lock.locked()):
            self.poke.clear()
            with contextlib.suppress(Exception):  # the watcher logs failures and tries again
                async with asyncio.timeout(timeout_s):
                    await self.refresh()
        return self.snapshot

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None
        await self.loop.run_in_executor(_VERSION_THREAD, _close_version_connection)

    async def _run(self) -> None:
        while True:
            self.poke.clear()  # before reading: a change committed during the read pokes again
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("could not read keys and policies; keeping the last ones")
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that lands
            # as the poke arrives, and the watcher went on polling under serve's exit for good
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self.poke.wait()

    async def refresh(self) -> None:
        async with self._lock:
            if not self.loaded.is_set() or await _read_version() != self.snapshot.version:
                self.snapshot = await _load_snapshot()
                self.loaded.set()
            await self.push_caps()

    def served_model(self) -> str:
        if serving().models:
            return str(serving().models[0])
        hello = self.link().hello if self.link is not None else None
        return str(hello.model) if hello else ""

    async def push_caps(self) -> None:
        """Send each served model's caps to its worker when they changed (the link client sends
        them again by itself after a reconnect, and to a model's worker when it is loaded)."""
        if self.link is None:
            return
        from scheduler.link.pool import model_lanes

        models = serving().models or (self.served_model(),)
        lanes = model_lanes()
        # an all-models cap is checked against the largest model's lanes: above a smaller
        # model's lanes it means all of them there (its worker would ignore it, and keep its
        # --class-lanes cap)
        caps = {model: _within(self.snapshot.caps_for(model), lanes.get(model)) for model in models}
        if caps == self.sent_caps:
            return
        from scheduler.link.messages import Config

        await self.link().configure_models({model: Config(class_lanes=dict(c)) for model, c in caps.items()})
        self.sent_caps = caps
        shown = {model: c or "(the flags' caps)" for model, c in caps.items()}
        log.info("class-lane caps sent to the engine worker: %s", shown[models[0]] if len(models) == 1 else shown)

    def touch(self, key: Key) -> None:
        """Note that ``key`` was used: written to the database at most once a minute per key."""
        if key.id < 0:
            return  # a --key-policy file's key: no database row to write
        now = time.monotonic()
        last = self._last_used.get(key.id)
        if last is not None and now - last < LAST_USED_EVERY_S:
            return
        self._last_used[key.id] = now
        from activity.writer import get_writer

        get_writer().touch(key.id, timezone.now())  # written by the activity writer's thread
