"""Redis mode: a batch's lines on Celery. ``start_batch`` moves the batch to ``in_progress`` and
starts ``SUPERFLUID_BATCH_CONCURRENCY`` chains of ``run_line``; each ``run_line`` claims one line
under a lease, runs it through the consumer (batches/runner.py, the same code as the embedded
mode), records it once, and sends the next ``run_line`` of its chain. While lines are leased
elsewhere (running, or their worker died and the lease has not run out) a chain looks again
after ``RECHECK_S``; the chain that finds nothing left finalizes the batch.

Every task is short and idempotent: redelivered (acks_late) it claims afresh; a line already
recorded is never counted again.

A chain ends for good when the broker loses its next task (a publish that failed while Redis was
away, a Redis restarted without persistence). Every worker process runs a sweep for that: each
task marks its batch alive in Redis for ``SUPERFLUID_BATCH_STALL_S`` (600 s); a batch still
running with no mark left and no line leased gets new chains (the sweeper that sets the mark
again first does it, so two workers never both do), and one past its completion window is
expired there, since no chain is left to notice it. A batch whose start task was lost (still
``validating`` a stall time after it was created) is started again.

Chains that were not lost but only waited in the broker past the stall time (a backlog) look
lost too. So that they do not add up with the new ones, each sweep that acts starts a new
generation of the batch's chains (``GEN``, beside the alive mark) and its tasks carry it: a task
of an older generation ends at once, and the batch keeps ``SUPERFLUID_BATCH_CONCURRENCY``
chains however many stalls it went through."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.utils import timezone

from . import runner
from .models import Batch, Line

log = logging.getLogger("superfluid.batches")

T = TypeVar("T")
RECHECK_S = 5

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this worker process's own event loop (one link to Redis per process)."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="batches-loop", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _loop).result()


@shared_task(name=runner.START_BATCH, acks_late=True, ignore_result=True)
def start_batch(batch_id: str, gen: int = 0) -> None:
    if not _current(batch_id, gen):
        return  # a sweep started the batch again meanwhile: that start's task goes on
    runner.begin(batch_id)
    if not Line.objects.filter(batch_id=batch_id, claimed_until__isnull=False).exists():  # not started before
        for _ in range(runner.concurrency()):
            run_line.delay(batch_id, gen)
    runner.finalize_if_done(batch_id)


ALIVE = "superfluid:batch-alive:"  # + batch id: a task of the batch ran within the stall time
GEN = "superfluid:batch-gen:"  # + batch id: the generation of its chains, raised by each sweep that acts
GEN_TTL_S = 3 * 24 * 3600  # past a batch's 24 h window (which ends it) with room to spare

# a task of generation ARGV[1]: 0 (it ends at once) when a sweep has started a newer one; else
# the batch is marked alive, and a generation Redis lost (a restart) is set to the task's again
CURRENT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local mine = tonumber(ARGV[1])
if mine < current then return 0 end
if mine > current then redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
elseif mine > 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[2])
return 1
"""


def stall_s() -> int:
    return max(1, int(getattr(settings, "SUPERFLUID_BATCH_STALL_S", 600)))


_redis: Any = None


def _broker() -> Any:
    """A client to the broker's Redis (the sweep's marks live beside the tasks they watch)."""
    global _redis
    if _redis is None:
        import redis

        from superfluid_site.celery import app

        _redis = redis.Redis.from_url(app.conf.broker_url, socket_timeout=5.0, socket_connect_timeout=2.0)
    return _redis


def _current(batch_id: str, gen: int) -> bool:
    """Whether a task of the batch's chains of generation ``gen`` goes on (False: a sweep has
    started newer ones); one that goes on marks the batch alive. When the broker cannot be
    reached the task goes on (a missing mark only makes the sweep look at the batch)."""
    try:
        return bool(_broker().eval(CURRENT, 2, GEN + batch_id, ALIVE + batch_id, int(gen), stall_s(), GEN_TTL_S))
    except Exception as exc:
        log.warning("batch %s: could not mark it alive in Redis: %s", batch_id, exc)
        return True


def _next_gen(client: Any, batch_id: str) -> int:
    """A new generation of the batch's chains: the older ones' tasks end when they run."""
    pipe = client.pipeline()
    pipe.incr(GEN + batch_id)
    pipe.expire(GEN + batch_id, GEN_TTL_S)
    return int(pipe.execute()[0])


def sweep() -> list[str]:
    """One look at every running batch; returns the ids given new chains (or started again: one
    still ``validating`` a stall time after it was created lost its start task). A batch with a line
    leased (a task runs it, or its worker died and the lease has not run out) or marked alive
    is left alone; a cancelling one, or one past its window, is finalized when nothing is in
    flight; any other gets ``SUPERFLUID_BATCH_CONCURRENCY`` new chains, by the one sweeper that
    sets its mark first."""
    kicked = []
    client = _broker()
    # a batch whose start task was lost: still validating a stall time after it was created
    stale = timezone.now() - timedelta(seconds=stall_s())
    for batch_id in list(Batch.objects.filter(status="validating", created_at__lt=stale).values_list("pk", flat=True)):
        if client.set(ALIVE + batch_id, "1", ex=stall_s(), nx=True):
            log.warning("batch %s: its start was lost; it is started again", batch_id)
            start_batch.delay(batch_id, _next_gen(client, batch_id))
            kicked.append(batch_id)
    for batch_id in list(Batch.objects.filter(status__in=("in_progress", "cancelling")).values_list("pk", flat=True)):
        if client.exists(ALIVE + batch_id):
            continue
        if Line.objects.filter(batch_id=batch_id, done=False, claimed_until__gte=timezone.now()).exists():
            continue
        if runner.current_status(batch_id) != "in_progress":  # one past its window expires here
            runner.finalize_if_done(batch_id)  # cancelling: the chains that would end it are gone
            continue
        if runner.finalize_if_done(batch_id):
            continue  # every line done: its last chain was lost before it finalized
        if not client.set(ALIVE + batch_id, "1", ex=stall_s(), nx=True):
            continue  # another worker's sweep took it
        log.warning("batch %s: none of its tasks ran for %d s; it gets new chains", batch_id, stall_s())
        gen = _next_gen(client, batch_id)  # its chains still queued (a backlog), if any, end when they run
        for _ in range(runner.concurrency()):
            run_line.delay(batch_id, gen)
        kicked.append(batch_id)
    return kicked


def _sweep_loop() -> None:
    period = max(0.2, stall_s() / 10)
    while True:
        time.sleep(period)
        try:
            sweep()
        except Exception as exc:  # the database or Redis away: the next turn tries again
            log.warning("batch sweep failed: %s", exc)
        finally:
            from django.db import close_old_connections

            close_old_connections()


@worker_ready.connect
def _start_sweep(**_kwargs: Any) -> None:
    threading.Thread(target=_sweep_loop, name="batch-sweep", daemon=True).start()


@shared_task(acks_late=True, ignore_result=True)
def run_line(batch_id: str, gen: int = 0) -> None:
    if not _current(batch_id, gen):
        return  # a chain a sweep took for lost (it waited in a backlog): newer ones run the batch
    try:
        more = run_async(runner.run_next(batch_id))
    except Exception:  # claiming or finalizing (the database erred): the chain goes on, later
        log.exception("batch %s: the runner failed; its chain goes on in %d s", batch_id, RECHECK_S)
        run_line.apply_async((batch_id, gen), countdown=RECHECK_S)
        return
    if more:
        run_line.delay(batch_id, gen)
        return
    if runner.finalize_if_done(batch_id):
        return
    if Batch.objects.filter(pk=batch_id, status__in=("in_progress", "cancelling")).exists():
        run_line.apply_async((batch_id, gen), countdown=RECHECK_S)  # lines leased elsewhere: look again
