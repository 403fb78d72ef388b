"""The Redis transport: many web heads and engine workers around one global queue.

The third implementation of :class:`scheduler.link.transport.Transport` (``serve --redis URL``).
Nothing here is a queue of our own: Redis holds the state and Lua scripts (``lua/``) change it
atomically, with Redis ``TIME`` as the one clock.

- A head *enqueues* a job (``enqueue.lua``): a hash ``job:ID`` and a member in the sorted set of
  its class, ``q:C``, scored so that the set's order is one worker's order inside a class (and in
  ``qa:C``, by arrival, where the oldest is found).
- A worker with a free lane *picks* (``pick.lua``): the best job over the classes its per-class
  lane caps allow (each class's first arrival by score, its oldest arrival and the jobs put back
  after a loss that head it, up to 8), with starvation aging across
  classes, in one step, so the order is global
  across heads and no two workers take the same job. The job is then *leased* to the worker
  (``leases``, renewed by ``renew.lua``) under a new *epoch*.
- A worker *emits* a job's messages (``emit.lua``) to one Redis Stream per job, ``s:ID``
  (trimmed, expiring): only the holder of the current epoch may, so a worker that lost its lease
  writes nothing more.
- A lease that runs out (the worker was killed) is *reaped* (``reap.lua``, run by every process):
  the epoch moves on and a ``lost`` marker goes on the stream. The head owning the job reads the
  deltas before the marker, then puts the job back at the front of its class, continuing after
  the text already delivered (the shared resubmission path, :meth:`JobHandle.resubmission`).
- A cancel (``cancel.lua``) takes a queued job out of the queue, or tells the worker holding it
  (pub/sub ``w:WORKER``). Lane caps the admin edits go to every worker through the ``config``
  key and channel. Each worker publishes its snapshot (``worker:ID``, expiring) for every head.

Redis unreachable: the head is "not connected" (requests get 503 with ``Retry-After``), jobs in
flight wait for it; when it returns, service resumes with no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.aio import spawn

from .fleet_stats import FleetTotals, combine_by_label
from .messages import (
    DUPLICATE_ID,
    ENGINE_CRASHED,
    ENGINE_UNAVAILABLE,
    SHUTTING_DOWN,
    Cancel,
    Config,
    Done,
    Error,
    Hello,
    Message,
    Rejected,
    Snapshot,
    Submit,
    decode,
    decode_or_drop,
    encode,
)
from .transport import MAX_CRASHES, SNAPSHOT_LISTENERS, JobHandle, Transport

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

    from scheduler.worker.loop import EngineWorker

log = logging.getLogger("superfluid.link")

LUA_DIR = Path(__file__).resolve().parent / "lua"
# A worker renews its jobs' leases and its snapshot every LEASE_MS / 3; a job whose lease lapses
# is given back to the queue, and a worker whose snapshot key (kept as long) lapses is gone.
LEASE_MS = 3000
PICKED_FIELDS = 4  # pick.lua's reply, per job taken: id, epoch, data, waited_ms
STREAM_MAXLEN = 20000  # entries a job stream keeps beyond its lane's context (stream_maxlen)
STREAM_TTL_S = 600  # a job's stream outlives its last write by this long
# the reason that ends a head's response to a job another head took over (_on_taken): its client
# left for that head, so nobody reads it here (and the request's activity row is that head's)
RESUMED_ELSEWHERE = "resumed_elsewhere"
READ_BLOCK_MS = 1000  # a head's XREAD on a job stream waits this long for an entry
CANCELS_WAIT_S = 2.0  # a stopping head waits this long for the cancels it still has to send
# A head says it is alive (``hb:HEAD``, set every poll, expiring after HEAD_TTL_MS). A running
# job whose head's key has lapsed is read by nobody: its worker stops it and ends its lease, so
# it is marked lost like a lost worker's job, and a client that resumes it on another head
# (Last-Event-ID, within the stream's TTL) has it put back in the queue there.
HEAD_TTL_MS = 30_000
KNOWN_WORKER_S = 24 * 3600.0  # a head forgets a worker id unseen this long (worker_restarts_total)
# how often a head reads the waits and band depths of the jobs in Redis (queued.lua), while any wait
QUEUED_READ_EVERY_S = 1.0
DEFAULT_PREFIX = "sf:"
NO_FLOOR = 4
N_CLASSES = 4
FLEET_SOURCE = "fleet"  # a head's snapshot's "worker": the whole fleet's counts, not one worker's


def stream_maxlen(lane_ctx: int) -> int:
    """Entries a job's stream keeps: all of its reply's (a delta a token at most, a lane's context
    of tokens at most, and its other messages), with room to spare. A head resuming a stream
    (Last-Event-ID) reads it from its start and skips the deltas its client has: a stream trimmed
    at its start (a reply longer than a fixed bound) sent that client the wrong text."""
    return STREAM_MAXLEN + max(0, int(lane_ctx))


def readable_snapshot(state: Any) -> bool:
    """Whether a worker's snapshot (``worker:ID``) is one a head can read: an object whose
    figures a fleet's view merges (tried with itself, and as it leaves) and whose hello fields
    are numbers. One that is not is left out of the fleet, as if that worker were away."""
    if not isinstance(state, dict):
        return False
    try:
        for field in ("n_lanes", "lane_ctx", "pid"):
            int(state.get(field, 0))
        totals = FleetTotals()
        totals.view({"a": state, "b": state})
        totals.view({})  # as it leaves: its counts are carried
    except (TypeError, ValueError, AttributeError, KeyError):
        return False
    return True


def last_tick_of(state: dict[str, Any]) -> dict[str, Any]:
    """A worker's snapshot's last tick (``metrics.last_tick``); {} where it has none readable."""
    metrics = state.get("metrics")
    last = metrics.get("last_tick") if isinstance(metrics, dict) else None
    return {k: v for k, v in last.items() if isinstance(v, int | float) and not isinstance(v, bool)} if isinstance(last, dict) else {}


def fleet_lane_ctx(workers: dict[str, dict[str, Any]]) -> int:
    """The context a fleet's request may use: the smallest of its live workers' (what every one of
    them can hold, whichever picks the job). With the first worker's, a fleet whose workers had
    different contexts (a rolling change of ``--ctx-size``) advertised, and checked requests
    against, one that another worker refused: a request within /v1/models' context_length was a
    400 ``context_length_exceeded`` when that worker took it."""
    sizes = []
    for state in workers.values():
        with contextlib.suppress(TypeError, ValueError):
            if int(state.get("lane_ctx", 0)) > 0:
                sizes.append(int(state.get("lane_ctx", 0)))
    return min(sizes, default=0)


def fleet_class_lanes(workers: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The fleet's cap on a class's lanes (the Queue panel's): each worker's cap (its lanes where
    it caps that class not) added, for the classes some worker caps."""
    caps: dict[str, int] = {}
    own = {wid: state.get("class_lanes") if isinstance(state.get("class_lanes"), dict) else {} for wid, state in workers.items()}
    for label in sorted({label for c in own.values() for label in c}):
        total = 0
        for wid, state in workers.items():
            with contextlib.suppress(TypeError, ValueError):
                lanes = int(state.get("n_lanes", 0))
                total += min(lanes, int(own[wid].get(label, lanes)))
        caps[label] = total
    return caps


def load_scripts() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(LUA_DIR.glob("*.lua"))}


def redis_url_from_env() -> str:
    return os.environ.get("REDIS_URL", "")


class Scripts:
    """The Lua scripts registered on a client (sync or asyncio): ``scripts.pick(args)``."""

    def __init__(self, client: Any) -> None:
        self._scripts = {name: client.register_script(body) for name, body in load_scripts().items()}

    def __getattr__(self, name: str) -> Any:
        script = self._scripts[name]
        return lambda args, client=None: script(keys=[], args=[str(a) for a in args], client=client)


# =============================================================================================
# the web head
# =============================================================================================


def reconnecting_client(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio Redis client (the heads' link, the shared limits) whose commands, on a
    connection error, reconnect and run once more. After a Redis restart every idle pooled
    connection is dead and fails once when drawn ("Connection closed by server"): the command
    never reached the new server, and without the retry each dead connection failed one request
    or flipped the link to "unreachable" for a poll (503s while Redis was up; found by the fleet
    test). Not on timeouts: a script that timed out may have run. Redis really away fails the
    second attempt too."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return aioredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)), **options)


class RedisTransport(Transport):
    """A web head's link: jobs go to the Redis queue, their events come back on their streams."""

    _hello_counts_restarts = False  # the fleet's new worker ids are counted instead (_tick)
    queue_at_worker = False  # jobs wait in Redis: serve's drain waits for them before the worker's

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        aging_divisor_s: float = 60.0,
        reconnect_timeout_s: float = 120.0,
        poll_s: float = 0.25,
        head_ttl_ms: int = HEAD_TTL_MS,
    ) -> None:
        super().__init__(reconnect_timeout_s=reconnect_timeout_s)
        self.url = url
        self.prefix = prefix
        self.aging_divisor_s = aging_divisor_s
        self.poll_s = poll_s
        self.head_ttl_ms = head_ttl_ms
        self.head_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.redis_ok = False
        self.workers: dict[str, dict[str, Any]] = {}  # worker id -> its last snapshot
        self._fleet_totals = FleetTotals()
        # every worker id seen, with when it was last seen (None: none seen yet); an id never
        # seen before is a worker process that joined (one restarted by its supervisor has a new
        # id): superfluid_worker_restarts_total, "times a new engine worker process said hello".
        # An id seen again after a gap (a stalled worker, Redis restarted empty) is the same
        # process; one unseen for KNOWN_WORKER_S is forgotten.
        self._known_workers: dict[str, float] | None = None
        self.global_queue: dict[str, int] = {}
        # the jobs in Redis: each class's and band's longest wait, each band's requests (queued.lua)
        self.global_waits: dict[str, dict[str, Any]] = {}
        self._queued_read_at = -math.inf  # when queued.lua last ran (QUEUED_READ_EVERY_S)
        self._lane_ctx = 0  # the largest lane context of the workers seen (stream_maxlen)
        # the fleet's "stats" (_fleet_stats): the most lanes busy at once, and the last TTFT (of
        # the worker whose count of first tokens rose last), with each worker's count so far
        self._peak_lanes = 0
        self._last_ttft_ms: float | None = None
        self._ttft_counts: dict[str, int] = {}
        self._client: aioredis.Redis | None = None
        self._scripts: Scripts | None = None
        self._task: asyncio.Task[None] | None = None
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._loss_counted: dict[str, int] = {}  # job id -> the epoch of its last loss counted (_on_job_lost)
        self._before_own_marker: set[str] = set()  # jobs attached here whose own "taken" marker is not read yet
        self._forgetting: set[asyncio.Task[None]] = set()
        # a cancel, or the config, whose send failed while the link counted as connected (a
        # pooled connection that died with a Redis restart): sent by the next tick that reaches Redis
        self._unsent_cancels: list[bytes] = []
        self._config_unsent = False

    # -- lifecycle ----------------------------------------------------------------------

    def _redis(self) -> aioredis.Redis:
        if self._stopped:
            # a cancel or a reader after stop() would open a client nobody closes
            raise ConnectionError("the Redis link is stopped")
        if self._client is None:
            # named, so Redis's CLIENT LIST tells which head holds which connection
            self._client = reconnecting_client(self.url, health_check_interval=5, client_name=f"head:{self.head_id}")
            self._scripts = Scripts(self._client)
        return self._client

    @property
    def scripts(self) -> Scripts:
        self._redis()
        assert self._scripts is not None
        return self._scripts

    _stopped = False

    def start(self) -> None:
        self._stopped = False
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="superfluid-redis-link")

    async def stop(self) -> None:
        if self._abandoning:  # the cancels of clients that just left, on their way: the process exits
            await asyncio.wait(list(self._abandoning), timeout=CANCELS_WAIT_S)  # next, and they with it
        if self._unsent_cancels and self._client is not None:  # the jobs of clients a drain failed
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send_unsent_cancels(), CANCELS_WAIT_S)
        self._stopped = True
        # readers leave by themselves once their XREAD returns (at most its block time): one
        # cancelled inside a command can leave redis-py's pool waiting forever on its release.
        # A stream's DELETE from finish() is waited for too: closing the client under it would
        # make its retry open a new connection that nothing closes.
        pending = [*self._readers.values(), *self._forgetting]
        if pending:
            await asyncio.wait(pending, timeout=READ_BLOCK_MS / 1000 + 2)
        # Bounded too: a stop that hangs holds up the server's shutdown (and, in tests, the run).
        while tasks := [t for t in [self._task, *self._readers.values(), *self._forgetting] if t is not None]:
            self._task = None
            self._readers.clear()
            self._forgetting.clear()
            for task in tasks:
                task.cancel()
            done, stuck = await asyncio.wait(tasks, timeout=5.0)
            for task in done:  # retrieved, so that none is reported as never retrieved
                if not task.cancelled():
                    task.exception()
            if stuck:
                log.warning("Redis link: %d task(s) did not stop within 5 s of their cancel: %s", len(stuck), sorted(t.get_name() for t in stuck))
                break
        if self._client is not None:
            try:
                await asyncio.wait_for(self._client.aclose(), 5.0)
            except Exception as exc:  # TimeoutError too: the process goes on without it
                log.warning("Redis link: closing the client failed: %r", exc)
            self._client = None

    async def wait_connected(self, timeout_s: float) -> bool:
        """Redis unreachable answers at once (the caller answers 503 with Retry-After); a
        fleet with no worker yet is waited for, as the local link waits for its worker."""
        self.start()
        if self._task is not None and not self.redis_ok and self._checked_once:
            return False
        return await super().wait_connected(timeout_s)

    _checked_once = False
    retry_after_s = 5.0  # what a 503 tells clients while Redis or every worker is away

    @property
    def unavailable_detail(self) -> str:
        if not self.redis_ok:
            return "The queue (Redis) is unreachable; retry after the time in the Retry-After header."
        return "No engine worker is running; retry after the time in the Retry-After header."

    async def _run(self) -> None:
        """Reap lapsed leases, read the fleet, keep ``connected`` true while Redis answers and a
        worker is alive."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._tick()
                self.redis_ok = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # redis down, or a reply we cannot read
                if self.redis_ok or not self._checked_once:
                    log.warning("Redis at %s unreachable: %s", self.url, exc)
                self.redis_ok = False
                self._connected.clear()
                if self._lost_since is None:
                    self._lost_since = loop.time()
                self._check_lost_deadline(loop.time())
            self._checked_once = True
            await asyncio.sleep(self.poll_s)

    async def _tick(self) -> None:
        client = self._redis()
        # first: a job this head enqueues (only once a tick has passed) finds its head alive
        await client.set(f"{self.prefix}hb:{self.head_id}", "1", px=self.head_ttl_ms)
        # as bytes: a member that is not UTF-8 (a broken peer's) failed every tick ("Redis unreachable")
        ids = [m if isinstance(m, bytes) else str(m).encode() for m in await client.smembers(self.prefix + "workers")]
        raw = await client.mget([self.prefix.encode() + b"worker:" + i for i in ids]) if ids else []
        workers: dict[str, dict[str, Any]] = {}
        for member, blob in zip(ids, raw, strict=False):
            if blob is None:
                await client.srem(self.prefix + "workers", member)
                continue
            wid = member.decode(errors="replace")
            with contextlib.suppress(ValueError):
                state = json.loads(blob)
                if readable_snapshot(state):  # another (a broken peer's) failed every tick: "Redis unreachable"
                    workers[wid] = state
        for state in workers.values():  # the longest stream a worker writes: a lost marker trims none of it
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                self._lane_ctx = max(self._lane_ctx, int(state.get("lane_ctx", 0)))
        await self.scripts.reap([self.prefix, stream_maxlen(self._lane_ctx), STREAM_TTL_S])
        pipe = client.pipeline()
        for c in range(N_CLASSES):
            pipe.zcard(f"{self.prefix}q:{c}")
        depths = await pipe.execute()
        from scheduler.core.qos import BAND_SPACING, QosClass

        self.global_queue = {QosClass(c).label: int(n) for c, n in enumerate(depths)}
        now = time.monotonic()
        if not any(depths):  # nothing waits in Redis: nothing to read
            self.global_waits = {}
        elif now >= self._queued_read_at + QUEUED_READ_EVERY_S:
            # queued.lua reads every queued job (a field read each), and Redis runs nothing else
            # meanwhile: every head's poll doing it four times a second held Redis for a long queue
            self._queued_read_at = now
            self.global_waits = self._queue_waits(await self.scripts.queued([self.prefix, BAND_SPACING // 2]))
        if self._known_workers is not None:  # every worker id never seen before: a new process
            self.worker_restarts += len(workers.keys() - self._known_workers.keys())
        if workers or self._known_workers is not None:  # the first workers seen are no restart
            known = {wid: seen for wid, seen in (self._known_workers or {}).items() if now - seen < KNOWN_WORKER_S}
            self._known_workers = known | dict.fromkeys(workers, now)
        self.workers = workers
        self._publish_fleet()
        loop = asyncio.get_running_loop()
        if workers:
            first = workers[sorted(workers)[0]]
            hello = Hello(model=first.get("model", ""), engine=first.get("engine", ""), n_lanes=int(first.get("n_lanes", 0)), lane_ctx=fleet_lane_ctx(workers), pid=int(first.get("pid", 0)), tool_format=str(first.get("tool_format") or "hermes"), reasoning_format=str(first.get("reasoning_format") or "none"))
            if not self.connected:
                await self._became_connected(hello)
            else:
                # the fleet's first worker as it is now: the one first seen may have left (a
                # rolling restart) while others kept the fleet up, and its model, context (what
                # requests are checked against, /v1/models' context_length) and pid (/health)
                # were kept until no worker was left
                self.hello = hello
                await self._send_again()
        else:
            if self.connected:
                self._connected.clear()
                self._lost_since = loop.time()
            self._check_lost_deadline(loop.time())
        await self._send_unsent_cancels()  # Redis answers: with or without a worker alive

    @staticmethod
    def _queue_waits(raw: Any) -> dict[str, dict[str, Any]]:
        """queued.lua's reply as WorkerStats fields: ``queue_oldest_wait_s_by_class``,
        ``queue_depth_by_band`` and ``queue_oldest_wait_s_by_band`` of the jobs in Redis."""
        from scheduler.core.qos import QosClass

        body = json.loads(raw)
        by_band = body.get("band") or {}
        return {
            "queue_oldest_wait_s_by_class": {QosClass(int(c)).label: round(float(ms) / 1000, 3) for c, ms in (body.get("class") or {}).items()},
            "queue_depth_by_band": {b: int(v[0]) for b, v in by_band.items()},
            "queue_oldest_wait_s_by_band": {b: round(float(v[1]) / 1000, 3) for b, v in by_band.items()},
        }

    def _with_global_queue(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The workers' merged ``metrics`` with the jobs waiting in Redis added: the depth by
        class and by band summed, the longest waits the longest of either (as one worker's own
        queue counts them: a fleet-wide alert on llamaswap_scheduler_queue_depth or an oldest
        wait sees the jobs in Redis, where most of them wait)."""
        waiting = dict(metrics.get("queue_depth_by_class") or {})  # the workers' own queues, summed
        for label, n in self.global_queue.items():
            waiting[label] = waiting.get(label, 0) + int(n)
        out = {**metrics, "queue_depth_by_class": waiting}
        for field, value in self.global_waits.items():
            out[field] = combine_by_label(out.get(field) or {}, value, largest=field != "queue_depth_by_band")
        return out

    def _publish_fleet(self) -> None:
        """The snapshot the dashboard, /slots, /v1/internal/state and /metrics read: the whole
        fleet as one server. Its lanes are every worker's, numbered across the fleet (``lane``),
        each with its ``worker``, ``host``, the worker's own index (``worker_lane``) and context
        (``lane_ctx``); ``n_lanes`` counts them all; ``queue_depth`` (and the metrics'
        ``queue_depth_by_class``) is every job waiting for a lane: those in Redis
        (``global_queue``, beside it) plus each worker's own queue; ``parked`` is every worker's;
        ``draining`` only once every worker drains (``fleet`` says which one does, and each
        worker's model, context and ``stats``); ``stats`` the fleet's (:meth:`_fleet_stats`).
        Statistics, counters and KV pool are the fleet's (scheduler/link/fleet_stats.py: summed,
        the counts of workers that left carried); ``fleet`` lists each worker. Before, all but
        the statistics were the first worker's (by id): the dashboard's Queue panel read "total
        0" while jobs waited in Redis, and /slots listed one worker's lanes. With no worker left
        (after there was one): no lanes, an empty fleet, the queue in Redis and the counts so
        far, so that the dashboard and /metrics do not go on showing the last worker's busy lanes."""
        metrics, counters, pool = self._fleet_totals.view(self.workers)
        queue = {label: int(n) for label, n in self.global_queue.items()}
        if not self.workers:
            if self.snapshot is not None and self.snapshot.get("fleet"):
                last = self.snapshot
                gone = {k: last[k] for k in ("model", "engine", "lane_ctx", "worker") if k in last}
                metrics = self._with_global_queue({k: v for k, v in metrics.items() if not k.startswith("queue_")})
                self.snapshot = {**gone, "n_lanes": 0, "lanes": [], "fleet": [], "global_queue": dict(self.global_queue), "queue_depth": queue, "parked": [], "metrics": metrics, "counters": counters}
                for listener in SNAPSHOT_LISTENERS:
                    listener(self.snapshot)
            return
        fleet: list[dict[str, Any]] = []
        lanes: list[dict[str, Any]] = []
        parked: list[dict[str, Any]] = []
        prefill_rate = 0.0
        for wid in sorted(self.workers):
            state = self.workers[wid]
            host = state.get("host", "")
            fleet.append({
                "worker": wid, "host": host, "pid": state.get("pid"), "lanes": state.get("lanes", []), "n_lanes": state.get("n_lanes", 0),
                "model": state.get("model", ""), "lane_ctx": state.get("lane_ctx"), "draining": bool(state.get("draining", False)),
                "stats": dict(state.get("stats") or {}), "last_tick": last_tick_of(state),
            })  # fmt: skip
            for lane in state.get("lanes") or []:
                if isinstance(lane, dict):
                    lanes.append({**lane, "lane": len(lanes), "worker": wid, "host": host, "worker_lane": lane.get("lane"), "lane_ctx": state.get("lane_ctx")})
            parked += [{**p, "worker": wid, "host": host} for p in state.get("parked") or [] if isinstance(p, dict)]
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                for label, n in (state.get("queue_depth") or {}).items():
                    queue[label] = queue.get(label, 0) + int(n)
            with contextlib.suppress(TypeError, ValueError):
                prefill_rate += float(state.get("prefill_tokens_per_s") or 0)
        metrics = self._with_global_queue(metrics)
        base = dict(self.workers[sorted(self.workers)[0]])
        base.update(worker=FLEET_SOURCE, metrics=metrics, counters=counters, pool=pool, fleet=fleet)
        # draining: the fleet takes no new work only once every worker drains (one worker's drain,
        # a rolling restart's, is its own: the fleet panel marks it)
        active = sum(1 for lane in lanes if lane.get("job_id"))
        base.update(draining=all(w["draining"] for w in fleet), lanes=lanes, n_lanes=len(lanes), lanes_active=active, queue_depth=queue, parked=parked, prefill_tokens_per_s=prefill_rate)
        # the header's context and the Queue panel's caps: the fleet's, not the first worker's
        base.update(lane_ctx=fleet_lane_ctx(self.workers), class_lanes=fleet_class_lanes(self.workers))
        base["stats"] = self._fleet_stats(metrics, active)
        base["global_queue"] = dict(self.global_queue)
        self.snapshot = base
        for listener in SNAPSHOT_LISTENERS:
            listener(base)

    def _fleet_stats(self, metrics: dict[str, Any], active: int) -> dict[str, Any]:
        """The fleet's ``stats`` (one worker's: peak lanes, tokens, last TTFT; each worker's own
        are in its ``fleet`` entry): the counts are the fleet's (``metrics``: summed, carried
        when a worker leaves), the peak the most lanes busy at once seen here or at any one
        worker, the last TTFT that of the worker whose count of first tokens rose last."""
        counts: dict[str, int] = {}
        peak, ticks = self._peak_lanes, 0.0
        for wid in sorted(self.workers):
            state = self.workers[wid]
            stats = state.get("stats") or {}
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                peak = max(peak, int(stats.get("peak_lanes_active") or 0))
                ticks += float(stats.get("tick_seconds_total") or 0)
                count = sum(int(h.get("count", 0)) for h in ((state.get("metrics") or {}).get("ttft_s") or {}).values())
                seen = self._ttft_counts.get(wid)
                counts[wid] = count
                if stats.get("last_ttft_ms") and ((seen is None and self._last_ttft_ms is None) or (seen is not None and count > seen)):
                    self._last_ttft_ms = float(stats["last_ttft_ms"])
        self._ttft_counts = counts
        self._peak_lanes = max(peak, active)
        totals = {k: metrics.get(k, 0) for k in ("requests_total", "prompt_tokens_total", "completion_tokens_total", "rejected_total", "engine_errors_total")}
        return {**totals, "peak_lanes_active": self._peak_lanes, "tick_seconds_total": round(ticks, 6), "last_ttft_ms": self._last_ttft_ms or 0.0}

    async def _became_connected(self, hello: Hello) -> None:
        """The first worker is there (or Redis is back): send the config and every job that was
        never enqueued. Jobs already in Redis keep their place and their readers."""
        await self._greet(hello)
        await self._send_again()

    async def _send_again(self) -> None:
        """Send what did not reach Redis: every job not enqueued yet (its submit failed, or came
        while Redis was away), the cancels that failed, and the latest config if its send
        failed. A submit that failed while the link counted as connected was otherwise never
        sent again: its client waited for nothing until its own timeout (found by the fleet
        test after a Redis restart)."""
        for handle in list(self.inflight.values()):
            if handle.sent_on == -1:
                handle.sent_on = self._connection
                await self._send(encode(handle.submit), resend=True)
        await self._send_unsent_cancels()
        if self.worker_config is not None and not self._config_unsent:
            # Redis restarted empty between two polls (never seen away): without this the config
            # it lost would reach no worker started from then on
            self._config_unsent = not await self._redis().exists(self.prefix + "config")
        if self._config_unsent and self.worker_config is not None:
            self._config_unsent = False
            await self._send(encode(self.worker_config))

    async def _send_unsent_cancels(self) -> None:
        cancels, self._unsent_cancels = self._unsent_cancels, []
        for data in cancels:
            await self._send(data)  # one that fails again is kept for the next tick

    async def cancel(self, handle: JobHandle) -> None:
        """Sent whether or not a worker is alive: the job waits in Redis, not in a worker, and
        would otherwise run for nobody (ahead of newer work, once aged) when one comes back.
        Not for a job another head took over (its client is there now)."""
        self.open.discard(handle.job_id)
        if self.inflight.pop(handle.job_id, None) is not None and not handle.handed_over:
            await self._send_cancel(handle.job_id)

    def _fail(self, handle: JobHandle, reason: str, detail: str) -> None:
        """The client gets the error; the job, wherever it is in Redis, is cancelled at the next
        tick (no worker for ``reconnect_timeout_s``, the job lost twice, or vanished)."""
        super()._fail(handle, reason, detail)
        self._unsent_cancels.append(encode(Cancel(handle.job_id)))

    # -- carrying -----------------------------------------------------------------------

    async def _send(self, data: bytes, *, resend: bool = False) -> None:
        """``resend``: a submit this head sent before, whose first attempt may have run in Redis
        although its reply was lost (see enqueue.lua)."""
        if self._stopped:
            return  # shutting down: a job left behind is given back when its lease lapses
        try:
            message = decode(data)
        except ValueError:
            return
        try:
            if isinstance(message, Submit):
                await self._enqueue(message, requeue=False, expect_epoch=-1, resend=resend)
            elif isinstance(message, Cancel):
                await self.scripts.cancel([self.prefix, message.id, self.head_id])
                # its reader sees the job gone when its XREAD returns, and deletes the stream
            elif isinstance(message, Config):
                client = self._redis()
                body = json.dumps({"class_lanes": message.class_lanes})
                await client.set(self.prefix + "config", body)
                await client.publish(self.prefix + "config", body)
        except Exception as exc:
            log.warning("Redis: could not send %s (sent again when Redis answers): %s", message.type, exc)
            if isinstance(message, Submit):
                handle = self.inflight.get(message.id)
                if handle is not None:
                    handle.sent_on = -1
            elif isinstance(message, Cancel):
                self._unsent_cancels.append(data)
            elif isinstance(message, Config):
                self._config_unsent = True  # the latest config goes, not this one

    async def _enqueue(self, message: Submit, *, requeue: bool, expect_epoch: int, resend: bool = False) -> None:
        args = [self.prefix, message.id, int(message.qos), int(message.priority), self.aging_divisor_s, encode(message).decode(), self.head_id]
        waited = message.waited_ms if isinstance(message.waited_ms, int | float) and not isinstance(message.waited_ms, bool) else 0
        extra = [str(message.request_of or ""), max(0.0, float(waited))]  # for queued.lua
        epoch = int(await self.scripts.enqueue([*args, 1 if requeue else 0, expect_epoch, 1 if resend else 0, *extra]))
        handle = self.inflight.get(message.id)
        if handle is None:
            return
        if epoch == -2:
            self.inflight.pop(message.id, None)
            handle.events.put_nowait(Rejected(message.id, DUPLICATE_ID, f"duplicate job id {message.id}"))
            return
        if epoch < 0:
            return  # fenced: someone else moved the job on
        if message.id not in self._readers:
            self._readers[message.id] = asyncio.get_running_loop().create_task(self._read(handle), name=f"redis-stream-{message.id}")

    # -- resuming a stream on another head (Last-Event-ID) --------------------------------

    resumable = True  # the consumers give SSE ids and accept Last-Event-ID on this link

    async def remember_stream(self, job_id: str, meta: dict[str, Any]) -> None:
        """What another head needs to go on with this job's SSE stream if this head dies (the
        reply's id and created, the key, a digest of the body): ``r:ID``, expiring with the stream."""
        key = f"{self.prefix}r:{job_id}"
        try:
            await self._redis().set(key, json.dumps(meta), ex=STREAM_TTL_S)
        except Exception as exc:  # no resume for this one; the stream itself goes on
            log.warning("Redis: could not note stream %s for resuming: %s", job_id, exc)

    async def stream_meta(self, job_id: str) -> dict[str, Any] | None:
        raw = await self._redis().get(f"{self.prefix}r:{job_id}")
        try:
            meta = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return meta if isinstance(meta, dict) else None

    async def attach(self, job_id: str) -> tuple[JobHandle, dict[str, Any]] | None:
        """Follow a job another head submitted (its client reconnected here with Last-Event-ID):
        its stream is read again from the start, so the handle sees every event in order (the
        caller skips what the client already has), and this head takes the job over (a lost
        worker's job is given back from here). None: no such stream (expired, finished, unknown)."""
        meta = await self.stream_meta(job_id)
        data = await self._redis().hget(f"{self.prefix}job:{job_id}", "data")
        if meta is None or job_id in self.inflight:
            return None
        submit: Message = Submit(id=job_id, request={})
        if data is not None:
            with contextlib.suppress(ValueError):
                submit = decode(data)
        if not isinstance(submit, Submit):
            return None
        # this head reads the job from now on: its worker keeps running it after the first
        # head's key lapses (renew.lua)
        await self.scripts.adopt([self.prefix, job_id, self.head_id])
        # its key as the first head had it (the dashboard's lanes and /slots name it)
        key = meta.get("key")
        handle = JobHandle(job_id=job_id, submit=submit, sent_on=self._connection, key=key if isinstance(key, str) else None)
        self.inflight[job_id] = handle
        self._before_own_marker.add(job_id)  # the stream's history: earlier heads' "taken" markers
        self.open.add(job_id)
        self._readers[job_id] = asyncio.get_running_loop().create_task(self._read(handle), name=f"redis-stream-{job_id}")
        return handle, meta

    async def _read(self, handle: JobHandle) -> None:
        """Follow one job's stream until its end (Done, Error, Rejected) or its cancel."""
        job_id = handle.job_id
        key = f"{self.prefix}s:{job_id}"
        last = "0-0"
        quiet_since = time.monotonic()
        try:
            while job_id in self.inflight and not self._stopped:
                try:
                    reply = await self._redis().xread({key: last}, count=256, block=READ_BLOCK_MS)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    await asyncio.sleep(self.poll_s)
                    continue
                try:
                    if not reply:
                        if time.monotonic() - quiet_since > 5.0 and self.redis_ok:
                            quiet_since = time.monotonic()
                            await self._check_vanished(handle, key)
                        continue
                    quiet_since = time.monotonic()
                    for _stream, entries in reply:
                        for entry_id, fields in entries:
                            raw = fields.get(b"m") or fields.get("m") or b""
                            await self._entry(handle, raw if isinstance(raw, bytes) else raw.encode())
                            last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id  # acted on
                            if job_id not in self.inflight:
                                break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # acting on an entry met Redis away: read it again, act again
                    log.warning("Redis: could not act on job %s's stream (trying again): %s", job_id, exc)
                    await asyncio.sleep(self.poll_s)
        finally:
            self._readers.pop(job_id, None)
            self._loss_counted.pop(job_id, None)
            self._before_own_marker.discard(job_id)
            if job_id not in self.open and not handle.handed_over:  # answered or cancelled; else finish() deletes it
                # the client as it is: a reader that left because the head stopped finds the
                # link stopped (``_redis`` refuses), and stop() closes the client only after it
                await self._forget(job_id, self._client)

    async def _forget(self, job_id: str, client: aioredis.Redis | None = None) -> None:
        """The web side is done with this job: its stream and resume note go. (Not as soon as
        its last event is read: until the client has it all, another head may have to resume it.)"""
        with contextlib.suppress(Exception):
            await (client if client is not None else self._redis()).delete(f"{self.prefix}s:{job_id}", f"{self.prefix}r:{job_id}")

    def finish(self, handle: JobHandle) -> None:
        super().finish(handle)
        if handle.job_id not in self._readers and not self._stopped and not handle.handed_over:
            # the client taken now: a stop() that comes before the task first runs waits for it,
            # and the task asking for the client then found the link stopped and sent nothing
            spawn(self._forgetting, self._forget(handle.job_id, self._redis()))

    async def _check_vanished(self, handle: JobHandle, key: str) -> None:
        """Redis restarted empty (or the job expired): fail the job instead of waiting forever."""
        client = self._redis()
        if await client.exists(f"{self.prefix}job:{handle.job_id}") or await client.exists(key):
            return
        self._fail(handle, ENGINE_UNAVAILABLE, "The job was lost by the queue (Redis restarted without it).")

    async def _entry(self, handle: JobHandle, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            return
        if isinstance(body, dict) and body.get("type") == "taken":
            self._on_taken(handle, body.get("head"))
            return
        if isinstance(body, dict) and body.get("type") == "lost":
            try:
                epoch = int(body.get("epoch", -1))
            except (TypeError, ValueError):  # not reap.lua's: acted on again, it stalled the reader for good
                log.warning("dropping a malformed lost marker on job %s's stream", handle.job_id)
                return
            await self._on_job_lost(handle, epoch)
            return
        message = decode_or_drop(raw, "a worker")
        if message is None:
            return
        # a field of the wrong type: dropped, not taken for Redis away (the reader would act on
        # the same entry again, forever)
        self._apply_from_worker(message, handle)

    def _on_taken(self, handle: JobHandle, head: Any) -> None:
        """A head took the job over (adopt.lua's marker). This head's own: what came before it
        on the stream was history. Another's, after this head had it: its client resumed the
        stream there (it left this head, seen here or not), so this head stops reading the job
        and ends its response, sends no cancel, keeps the stream and writes no activity row:
        the request is counted once, by the head that has it now."""
        job_id = handle.job_id
        if head == self.head_id:
            self._before_own_marker.discard(job_id)
            return
        if not isinstance(head, str) or job_id in self._before_own_marker or self.inflight.get(job_id) is not handle:
            return
        handle.handed_over = True
        self.inflight.pop(job_id, None)
        log.info("job %s: its client resumed the stream on head %s, which has it now", job_id, head)
        handle.events.put_nowait(Error(job_id, RESUMED_ELSEWHERE, "The stream was resumed on another server (Last-Event-ID)."))

    async def _on_job_lost(self, handle: JobHandle, epoch: int) -> None:
        """The worker holding this job stopped renewing its lease (it died): put the job back at
        the front of its class, continuing after the text already delivered; a job in flight
        during two losses in a row fails with engine_crashed."""
        if self.draining:
            self._fail(handle, "shutdown", "The server shut down before this request finished.")
            return
        state, now = await self._redis().hmget(f"{self.prefix}job:{handle.job_id}", ["state", "epoch"])
        if state != b"lost" or now is None or int(now) != epoch:
            return  # a marker already acted on (a stream read again after a head took the job over)
        # counted once per loss (its marker's epoch), before the requeue: one that fails is made
        # again when the stream's reader reads the marker again, and one whose reply was lost
        # (it ran) finds the job queued then, not lost, and is not back here to count it
        if self._loss_counted.get(handle.job_id) != epoch:
            self._loss_counted[handle.job_id] = epoch
            handle.crashes += 1
        if handle.crashes >= MAX_CRASHES:
            log.error("job %s was in flight during %d worker losses in a row; failing it", handle.job_id, handle.crashes)
            # the client's error first; the job's cancel goes at the next tick (again until sent)
            self._fail(handle, ENGINE_CRASHED, "The engine worker crashed twice while running this request; it is not retried.")
            return
        again = self._resubmission(handle)
        if again is None:
            return
        await self._enqueue(again[0], requeue=True, expect_epoch=epoch)
        log.warning("job %s lost its worker; resumed it after %d tokens", handle.job_id, handle.delivered_tokens)

    def _on_message(self, message: Message) -> None:
        if isinstance(message, Snapshot):
            return  # heads read the fleet from Redis
        super()._on_message(message)


# =============================================================================================
# the engine worker
# =============================================================================================


def _connection_class() -> type:
    from scheduler.worker.server import Connection, encode_or_error

    class JobConnection(Connection):
        """A job's way back: what the worker queues for it is emitted to its stream."""

        def __init__(self, job_id: str, epoch: int) -> None:
            super().__init__(0, None)
            self.job_id, self.epoch = job_id, epoch
            self.terminal = False
            self.give_back = False  # refused unrun by this draining worker: see giveback.lua
            self.sent = 0  # messages Redis has appended for this job in this epoch (emit.lua's ``first``)
            self.qos = N_CLASSES - 1

        def queue(self, message: Message) -> None:
            if isinstance(message, Rejected) and message.reason == SHUTTING_DOWN and self.sent == 0 and not self.outbox:
                # picked as this worker began to drain: not the client's answer, the job goes
                # back to the queue for another worker (the link's flush gives it back)
                self.give_back = True
                return
            self.outbox.append(encode_or_error(message))
            if isinstance(message, (Done, Error, Rejected)):
                self.terminal = True

        def flush(self) -> None:  # the link flushes every job's connection in one round trip
            pass

    return JobConnection


class RedisWorkerLink:
    """The worker's end (in place of ``LinkServer``): pulls jobs when lanes are free, emits
    their messages, renews their leases, takes cancels and config, publishes snapshots."""

    def __init__(
        self,
        worker: EngineWorker,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        starvation_s: float = 2.0,
        preemption: bool = True,
        lease_ms: int = LEASE_MS,
    ) -> None:
        import redis

        self.worker, self.url, self.prefix = worker, url, prefix
        self.starvation_s, self.preemption, self.lease_ms = starvation_s, preemption, lease_ms
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.host = socket.gethostname()
        self.client: redis.Redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self.scripts = Scripts(self.client)
        self.connections: list[Any] = []  # what the worker loop iterates (none: jobs emit here)
        self.held: dict[str, Any] = {}  # job id -> JobConnection, from pick to its last message
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._snapshot: dict[str, Any] | None = None
        self._conn_cls = _connection_class()
        self._control = self._conn_cls("", 0)  # the connection config messages arrive on
        self._emit_failing = False
        self._puller: threading.Thread | None = None
        # names each pick (pick.lua's token); kept after a failed call, so that the next call
        # gets the jobs a pick whose reply was lost took, instead of leaving them leased to nobody
        self._pick_token = 0

    # -- the LinkServer interface the worker loop uses -----------------------------------

    def start(self) -> None:
        with contextlib.suppress(Exception):
            raw = self.client.get(self.prefix + "config")
            if raw:
                self._config(raw)
        for target, name in ((self._pull_loop, "redis-pull"), (self._renew_loop, "redis-renew"), (self._control_loop, "redis-control")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            if target == self._pull_loop:
                self._puller = thread

    def close(self, flush_s: float = 5.0) -> None:
        """Stop pulling; what a job still has to send (a flush that failed last) is sent again
        for up to ``flush_s``, then this worker leaves the fleet."""
        self._stop.set()
        self._wake.set()
        if self._puller is not None and self._puller is not threading.current_thread():
            self._puller.join(2.0)  # a pick under way lands in ``held`` first, to be given back
        deadline = time.monotonic() + flush_s
        self._give_back(unstarted=True)
        while self._unsent() and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(Exception):
                self.flush()
                self._give_back(unstarted=True)
        with contextlib.suppress(Exception):
            self.client.srem(self.prefix + "workers", self.worker_id)
            self.client.delete(self.prefix + "worker:" + self.worker_id)
            self.client.hdel(self.prefix + "free", self.worker_id)

    def broadcast(self, message: Message) -> None:
        if isinstance(message, Snapshot):
            self._snapshot = message.state

    def flush(self) -> None:
        """On the tick thread: every job's queued messages, one script call per job, one round
        trip for all. A job this worker no longer holds (its lease lapsed, or it was cancelled)
        is cancelled here. When the round trip fails, every job keeps its messages and the next
        flush (the next turn of the loop, within 50 ms) sends them again: each batch carries the
        number of its first message, so Redis appends only what it does not have yet."""
        if self.worker.draining:  # only a draining worker refuses jobs to give back
            self._give_back()
        with self._lock:
            pending = [c for c in self.held.values() if c.outbox]
        if not pending:
            return
        pipe = self.client.pipeline(transaction=False)
        maxlen = stream_maxlen(self.worker.engine.lane_ctx)
        batches = []
        for conn in pending:
            batch, conn.outbox = conn.outbox, []
            batches.append(batch)
            lines = [line.decode().rstrip("\n") for line in batch]
            self.scripts.emit([self.prefix, conn.job_id, conn.epoch, self.worker_id, 1 if conn.terminal else 0, maxlen, STREAM_TTL_S, conn.sent, *lines], client=pipe)
        try:
            results = pipe.execute(raise_on_error=False)
        except Exception as exc:
            results = [exc] * len(pending)
        failed = None
        for conn, batch, ok in zip(pending, batches, results, strict=True):
            if isinstance(ok, Exception):  # not sent, or its reply lost: sent again next time
                conn.outbox[:0] = batch  # before anything queued meanwhile
                failed = ok
                continue
            conn.sent += len(batch)
            if ok == 0 and not conn.terminal:
                self._drop(conn)  # fenced: stop working on it
            elif conn.terminal:
                self._release(conn.job_id, conn)
        if (failed is not None) != self._emit_failing:  # said once when it starts and once when it ends
            self._emit_failing = failed is not None
            if failed is not None:
                log.warning("Redis: could not emit jobs' events (sending them again until it works): %s", failed)
            else:
                log.warning("Redis: jobs' events are emitted again")

    def _unsent(self) -> bool:
        with self._lock:
            return any(c.outbox or c.give_back for c in self.held.values())

    def _give_back(self, *, unstarted: bool = False) -> None:
        """Put back in the Redis queue the jobs this worker refused because it is draining (and
        with ``unstarted``, as a drained worker leaves, every job it holds that never reached
        its lanes: picked as it began to drain, they were still in its inbox). On a failed call
        they are given back at the next flush, or their leases lapse and a head puts them back."""
        worker = self.worker
        unstarted = unstarted and worker.draining  # never after a crash: a job that crashes workers is counted (MAX_CRASHES)
        with self._lock:
            jobs = [
                c for c in self.held.values()
                if c.give_back or (unstarted and c.sent == 0 and not c.outbox and not c.terminal
                                   and c.job_id not in worker.contexts and c.job_id not in worker.preparing)
            ]
        if not jobs:
            return
        try:
            self.scripts.giveback([self.prefix, self.worker_id, *(c.job_id for c in jobs)])
        except Exception as exc:
            log.warning("Redis: could not give back jobs (again at the next flush): %s", exc)
            return
        with self._lock:
            for conn in jobs:
                self.held.pop(conn.job_id, None)
        log.info("Redis: gave back %d job(s) picked as this worker began to drain", len(jobs))

    # -- threads --------------------------------------------------------------------------

    def _release(self, job_id: str, conn: Any = None) -> None:
        """``conn``: only if it is still the one held for the job (not a newer pick of it)."""
        with self._lock:
            if conn is None or self.held.get(job_id) is conn:
                self.held.pop(job_id, None)
        self._wake.set()

    def _drop(self, conn: Any) -> None:
        """Redis says this run of a job is no longer ours (fenced, lost, given to another pick):
        the worker stops it by its connection, at once, not by the job's id. This worker may
        have picked the same job again already (it stalled past its lease, a head requeued the
        job, and it was the one to take it): a cancel by id would stop the new run, and the old
        run still there would have the new Submit refused as a duplicate."""
        from scheduler.worker.server import RUN_ENDED

        self._release(conn.job_id, conn)
        self.worker.inbox.put((conn, RUN_ENDED))
        self.worker.interrupt.set()

    def _usage(self) -> list[int]:
        from scheduler.core.qos import QosClass

        use = [0] * N_CLASSES
        with self._lock:
            for conn in self.held.values():
                use[conn.qos] += 1
        caps = self.worker.scheduler.config.class_lanes
        return use + [caps.get(QosClass(c), self.worker.engine.n_lanes) for c in range(N_CLASSES)]

    def _pull_loop(self) -> None:
        n_lanes = self.worker.engine.n_lanes
        while not self._stop.is_set():
            self._wake.wait(0.2)
            self._wake.clear()
            if self.worker.draining:
                continue
            try:
                while self._pull_once(n_lanes):
                    pass
            except Exception as exc:
                log.warning("Redis: could not pull jobs: %s", exc)
                self._stop.wait(0.5)

    def _pull_once(self, n_lanes: int) -> bool:
        from scheduler.worker.server import RUN_ENDED

        usage = self._usage()
        use, caps = usage[:N_CLASSES], usage[N_CLASSES:]
        with self._lock:
            held = len(self.held)
            running = [c.qos for c in self.held.values()]
        free = n_lanes - held
        floor = NO_FLOOR
        n = free
        if free <= 0:
            urgent = sum(1 for q in running if q <= 1)
            if not self.preemption or not running or max(running) <= 1 or urgent >= n_lanes:
                return False
            floor, n = max(running), 1  # ask to preempt our lowest running class
        reply = self.scripts.pick([self.prefix, self.worker_id, n, self.starvation_s, self.lease_ms, floor, *caps, *use, self._pick_token])
        self._pick_token += 1  # answered: the next call is a new pick
        if not reply:
            return False
        for i in range(0, len(reply), PICKED_FIELDS):
            job_id = reply[i].decode() if isinstance(reply[i], bytes) else str(reply[i])
            epoch = int(reply[i + 1])
            data = reply[i + 2] if isinstance(reply[i + 2], bytes) else str(reply[i + 2]).encode()
            waited_ms = int(reply[i + 3])  # in the Redis queue; -1: resumed after its worker was lost (pick.lua)
            conn = self._conn_cls(job_id, epoch)
            try:
                message = decode(data)
                if not isinstance(message, Submit):
                    raise ValueError("not a submit")
            except ValueError as exc:
                log.error("job %s in Redis is not a submit: %s", job_id, exc)
                conn.queue(Error(job_id, "invalid_job", "The engine worker could not read this job."))
                with self._lock:
                    self.held[job_id] = conn
                continue
            try:
                conn.qos = max(0, min(N_CLASSES - 1, int(message.qos)))
            except (TypeError, ValueError):
                conn.qos = N_CLASSES - 1
            if waited_ms > 0 and isinstance(message.waited_ms, (int, float)) and not isinstance(message.waited_ms, bool):
                # its queue wait and time to first token count from when its head queued it
                message = dataclasses.replace(message, waited_ms=message.waited_ms + waited_ms)
            if waited_ms < 0:
                self.worker.mark_counted(job_id)
            self.worker._on_message(message)
            with self._lock:
                stale = self.held.get(job_id)
                self.held[job_id] = conn
                # in the inbox as it is held: a cancel that takes it out of ``held`` (the control
                # thread) queues its Cancel after it. One that came between the two went in first,
                # found no such job, and the job then ran to its last token for nobody.
                if stale is not None:  # our own earlier run of it, lost while we stalled: it stops first
                    self.worker.inbox.put((stale, RUN_ENDED))
                self.worker.inbox.put((conn, message))
            if stale is not None:
                self.worker.interrupt.set()
                self._wake.set()
            if conn.qos <= 1:
                self.worker.interrupt.set()
        return free > 0 and len(reply) // PICKED_FIELDS >= n

    def _renew_loop(self) -> None:
        # the first turn at once: heads see a new worker (its snapshot) without waiting a period
        while not self._stop.is_set():
            self._renew_once()
            if self._stop.wait(self.lease_ms / 3000.0):
                return

    def _renew_once(self) -> None:
        with self._lock:
            renewed = dict(self.held)  # the runs asked about: a newer pick of one is not dropped
            ids = list(renewed)
            free = self.worker.engine.n_lanes - len(ids)
        try:
            gone, headless = self.scripts.renew([self.prefix, self.worker_id, self.lease_ms, free, *ids])
            self._publish_snapshot()
        except Exception as exc:
            log.warning("Redis: could not renew leases: %s", exc)
            return
        for raw in [*gone, *headless]:
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            conn = renewed.get(job_id)
            if conn is not None and not conn.terminal:
                if raw in headless:
                    log.warning("job %s: its web head is gone and nobody reads it; stopped (resumable on another head)", job_id)
                self._drop(conn)

    def _publish_snapshot(self) -> None:
        state = dict(self._snapshot or {})
        if not state:
            hello = self.worker.hello()
            state = {"model": hello.model, "engine": hello.engine, "n_lanes": hello.n_lanes, "lane_ctx": hello.lane_ctx, "pid": hello.pid, "tool_format": hello.tool_format, "reasoning_format": hello.reasoning_format}
        state["host"] = self.host
        state["worker"] = self.worker_id
        body = json.dumps(state, default=str)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.prefix + "worker:" + self.worker_id, body, px=self.lease_ms)
        pipe.sadd(self.prefix + "workers", self.worker_id)
        pipe.execute()

    def _control_loop(self) -> None:
        """Cancels for our jobs, admin config for every worker, and "a job arrived" wake-ups."""
        while not self._stop.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.prefix + "w:" + self.worker_id, self.prefix + "config", self.prefix + "new")
                raw = self.client.get(self.prefix + "config")  # what changed while we were away
                if raw:
                    self._config(raw)
                while not self._stop.is_set():
                    item = pubsub.get_message(timeout=0.5)
                    if item is None:
                        continue
                    channel = item["channel"].decode() if isinstance(item["channel"], bytes) else item["channel"]
                    data = item["data"].decode() if isinstance(item["data"], bytes) else str(item["data"])
                    if channel == self.prefix + "new":
                        self._wake.set()
                    elif channel == self.prefix + "config":
                        self._config(data)
                    elif data.startswith("cancel "):
                        job_id = data[len("cancel "):]
                        with self._lock:
                            conn = self.held.pop(job_id, None)
                        if conn is not None:
                            self.worker.inbox.put((conn, Cancel(job_id)))
                            self.worker.interrupt.set()
                            self._wake.set()
            except Exception as exc:
                log.warning("Redis: control channel lost: %s", exc)
                self._stop.wait(0.5)

    def _config(self, raw: str | bytes) -> None:
        try:
            body = json.loads(raw)
            config = Config(class_lanes=dict(body.get("class_lanes") or {}))
        except (ValueError, TypeError, AttributeError):
            log.warning("Redis: ignoring a malformed config")
            return
        self.worker.inbox.put((self._control, config))
