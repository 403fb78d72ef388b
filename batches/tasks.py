"""Redis mode: a batch's lines on Celery. ``start_batch`` moves the batch to ``in_progress`` and
starts ``SUPERFLUID_BATCH_CONCURRENCY`` chains of ``run_line``; each ``run_line`` claims one line
under a lease, runs it through the consumer (batches/runner.py, the same code as the embedded
mode), records it once, and sends the next ``run_line`` of its chain. While lines are leased
elsewhere (running, or their worker died and the lease has not run out) a chain looks again
after ``RECHECK_S``; the chain that finds nothing left finalizes the batch.

Every task is short and idempotent: redelivered (acks_late) it claims afresh; a line already
recorded is never counted again."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from celery import shared_task

from . import runner
from .models import Line

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
def start_batch(batch_id: str) -> None:
    runner.begin(batch_id)
    if not Line.objects.filter(batch_id=batch_id, claimed_until__isnull=False).exists():  # not started before
        for _ in range(runner.concurrency()):
            run_line.delay(batch_id)
    runner.finalize_if_done(batch_id)


@shared_task(acks_late=True, ignore_result=True)
def run_line(batch_id: str) -> None:
    try:
        more = run_async(runner.run_next(batch_id))
    except Exception:  # claiming or finalizing (the database erred): the chain goes on, later
        log.exception("batch %s: the runner failed; its chain goes on in %d s", batch_id, RECHECK_S)
        run_line.apply_async((batch_id,), countdown=RECHECK_S)
        return
    if more:
        run_line.delay(batch_id)
        return
    if runner.finalize_if_done(batch_id):
        return
    from .models import Batch

    if Batch.objects.filter(pk=batch_id, status__in=("in_progress", "cancelling")).exists():
        run_line.apply_async((batch_id,), countdown=RECHECK_S)  # lines leased elsewhere: look again
