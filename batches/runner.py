"""Runs a batch's lines: each one goes through the same consumer, admission and queue as an HTTP
request to its endpoint (api/consumers.py, called in-process with an ASGI scope), as its batch's
key and at the background class, so a batch never delays interactive work.

Runners claim the next pending line under a lease (``Line.claimed_until``), run it, and write its
result once (a line already done is never counted again): in the embedded mode
``SUPERFLUID_BATCH_CONCURRENCY`` coroutines in the web process's event loop do this; in Redis
mode as many chains of short Celery tasks (batches/tasks.py) do it, each task one line. A 429 or
503 (limits, a full queue, no engine) is waited out (its Retry-After) and retried, not failed.
A cancel is seen through the database (polled), so it reaches lines running in any process:
no new line is claimed, and lines in flight get the disconnect an HTTP client's would send,
which cancels their jobs. The runner that finds no line left finalizes: the output and error
files, then ``completed`` (or ``cancelled``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import weakref
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from superfluid_site.serving import serving

from .models import Batch, File, Line

log = logging.getLogger("superfluid.batches")

POLL_S = 0.5  # how often a running line looks for a cancel
FAILED_LINE_PAUSE_S = 1.0  # before a line that failed in the runner is claimed again
RETRY_CAP_S = 30.0  # the longest wait before retrying a line refused with 429/503

_local: dict[str, asyncio.Task[None]] = {}  # embedded mode: the batches this process runs


START_BATCH = "batches.tasks.start_batch"  # the Celery task that begins a batch (batches/tasks.py)


def concurrency() -> int:
    return max(1, int(getattr(settings, "SUPERFLUID_BATCH_CONCURRENCY", 4)))


def lease() -> timedelta:
    """How long a claimed line is its runner's (``SUPERFLUID_BATCH_LEASE_S``): renewed every
    third of it while the line runs or waits for a retry, so that only a runner that died (a
    Celery worker killed mid-line), or stalled that long, leaves the line to be run again."""
    return timedelta(seconds=max(1, int(getattr(settings, "SUPERFLUID_BATCH_LEASE_S", 120))))


def renew_s() -> float:
    return lease().total_seconds() / 3


def celery_mode() -> bool:
    return bool(serving().redis_url)


async def start(batch_id: str) -> None:
    """Begin a batch just created: Celery tasks in Redis mode, else in this event loop."""
    if celery_mode():
        from superfluid_site.celery import app

        if not app.conf.broker_url:  # serve --redis URL without REDIS_URL in the environment
            app.conf.broker_url = serving().redis_url
        try:
            # by name: batches.tasks drives this module, so importing it here would be a circle
            await asyncio.to_thread(app.send_task, START_BATCH, args=[batch_id])  # never blocks the event loop on Redis
        except Exception as exc:  # the broker is unreachable: the batch fails, visibly
            log.warning("batch %s: could not reach the Celery broker: %s", batch_id, exc)
            await Batch.objects.filter(pk=batch_id, status="validating").aupdate(
                status="failed", failed_at=timezone.now(),
                errors={"object": "list", "data": [{"code": "broker_unavailable", "message": "The batch queue (Redis) could not be reached; create the batch again.", "param": None, "line": None}]})
        return
    task = asyncio.get_running_loop().create_task(run_batch(batch_id))
    _local[batch_id] = task
    task.add_done_callback(lambda _t: _local.pop(batch_id, None))


_resumed = False
_resume_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _resume_lock() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    return _resume_locks.setdefault(loop, asyncio.Lock())


async def resume_local() -> None:
    """Embedded mode, once per process (on its first Batch API request): batches a previous run
    of the server left unfinished go on here. Their lines' leases were that process's, which is
    gone, so they are given up first."""
    global _resumed
    if _resumed or celery_mode():
        return

    def unfinished() -> list[str]:
        ids = list(Batch.objects.filter(status__in=("validating", "in_progress", "cancelling")).values_list("pk", flat=True))
        Line.objects.filter(batch_id__in=ids, done=False).update(claimed_until=None)
        return [i for i in ids if not finalize_if_done(i)]

    async with _resume_lock():  # one resume at a time: a second would clear the leases of lines the first started
        if _resumed:
            return
        try:
            pending = await sync_to_async(unfinished)()
        except Exception:  # the database erred (SQLite busy): not marked done, the next request tries again
            log.exception("resuming unfinished batches failed; the next Batch API request tries again")
            return
        _resumed = True
    for batch_id in pending:
        if batch_id not in _local:
            log.info("batch %s: resumed", batch_id)
            await start(batch_id)


async def run_batch(batch_id: str) -> None:
    """The embedded runner: N claimers until no line is left, then finalize. A line still
    leased once every claimer has ended has no runner (its lease could not be given up: the
    database erred again): the claimers start again once that lease has run out."""
    while True:  # the database erred (SQLite busy): tried again, not left "validating" for good
        try:
            await sync_to_async(begin)(batch_id)
            break
        except Exception:
            log.exception("batch %s: could not start it; it is tried again after a pause", batch_id)
            await asyncio.sleep(FAILED_LINE_PAUSE_S)
    try:
        while True:
            await asyncio.gather(*(_claimer(batch_id) for _ in range(concurrency())))
            wait = await sync_to_async(orphaned_lease_s)(batch_id)
            if wait is None:
                break
            await asyncio.sleep(wait)
    finally:
        await sync_to_async(finalize_if_done)(batch_id)


def orphaned_lease_s(batch_id: str) -> float | None:
    """Seconds until the last lease on a pending line of the running (or cancelling) batch runs
    out, or None when no pending line is leased."""
    if not Batch.objects.filter(pk=batch_id, status__in=("in_progress", "cancelling")).exists():
        return None
    now = timezone.now()
    until = Line.objects.filter(batch_id=batch_id, done=False, claimed_until__gte=now).order_by("-claimed_until").values_list("claimed_until", flat=True).first()
    return None if until is None else (until - now).total_seconds() + 0.01


async def _claimer(batch_id: str) -> None:
    while True:
        try:
            if not await run_next(batch_id):
                return
        except Exception:  # claiming or finalizing (the database erred): this claimer goes on
            log.exception("batch %s: the runner failed; it goes on after a pause", batch_id)
            await asyncio.sleep(FAILED_LINE_PAUSE_S)


# -- state, in the database ----------------------------------------------------------------


def begin(batch_id: str) -> None:
    Batch.objects.filter(pk=batch_id, status="validating").update(status="in_progress", in_progress_at=timezone.now())


def cancel(batch_id: str) -> tuple[Batch, bool]:
    """Cancel the batch: (it as it is now, whether this call began the cancel). One that had
    already ended, or is expiring, is left as it was (the view answers 409, as OpenAI does).
    One past its window that no runner has looked at since expires here first, as a claim
    would expire it: it ends ``expired``, not ``cancelled``."""
    current_status(batch_id)
    now = timezone.now()
    began = Batch.objects.filter(pk=batch_id, status__in=("validating", "in_progress")).update(status="cancelling", cancelling_at=now) == 1
    finalize_if_done(batch_id)  # nothing in flight: cancelled at once
    return Batch.objects.get(pk=batch_id), began


def current_status(batch_id: str) -> str:
    """The batch's status as its runners see it. One still running past its ``expires_at`` (the
    completion window) expires here: it goes on as a cancel does (no new line starts, the lines
    in flight are cancelled, those that finished are kept) and ends ``expired``."""
    row = Batch.objects.filter(pk=batch_id).values_list("status", "expires_at").first()
    if row is None:
        return "failed"
    status, expires_at = row
    now = timezone.now()
    if status == "in_progress" and expires_at is not None and now >= expires_at:
        if Batch.objects.filter(pk=batch_id, status="in_progress").update(status="cancelling", expired_at=now, finalizing_at=now):
            log.info("batch %s: its completion window ran out; it expires", batch_id)
        return "cancelling"
    return str(status)


def claim(batch_id: str) -> Line | None:
    """The next pending line whose lease is free, leased to the caller; None when the batch is
    not running or none is left to claim."""
    now = timezone.now()
    with transaction.atomic():
        # the batch row locked first: a cancel or an expiry (an UPDATE of it, on another head)
        # waits until the lease is taken, and then sees the line in flight (PostgreSQL; SQLite
        # takes its write lock at the transaction's start)
        _lock(batch_id)
        if current_status(batch_id) != "in_progress":
            return None
        line = claimable(batch_id, now).select_for_update().first()
        if line is None:
            return None
        line.claimed_until = now + lease()
        line.save(update_fields=["claimed_until"])
        return line


def claimable(batch_id: str, now: Any) -> Any:
    """The batch's pending lines whose lease is free, in input order (read through the partial
    index ``batch_line_pending``: the done lines are never walked)."""
    return Line.objects.filter(batch_id=batch_id, done=False).filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)).order_by("index")


def record(line_id: int, ok: bool, result: dict[str, Any]) -> None:
    """A line's result, written once: the counts move only for the first write, and not at all
    once the batch has ended (a runner that stalled past its lease: no file holds it)."""
    with transaction.atomic():
        batch_id = Line.objects.filter(pk=line_id).values_list("batch_id", flat=True).first()
        if batch_id is None:
            return
        _lock(batch_id)
        if not Batch.objects.filter(pk=batch_id, status__in=("in_progress", "cancelling")).exists():
            return
        if Line.objects.filter(pk=line_id, done=False).update(done=True, ok=ok, result=result) != 1:
            return
        Batch.objects.filter(pk=batch_id).update(**({"completed": F("completed") + 1} if ok else {"failed": F("failed") + 1}))


def _lock(batch_id: str) -> None:
    """Hold the batch's row until the caller's transaction ends (a no-op on SQLite)."""
    list(Batch.objects.select_for_update().filter(pk=batch_id).values_list("pk", flat=True))


def finalize_if_done(batch_id: str) -> bool:
    """When no line is pending (or the batch is cancelling and none is in flight), write the
    output and error files and end the batch. Only one caller wins the transition."""
    now = timezone.now()
    with transaction.atomic():  # the first caller to move it on wins; readers see the end with its files
        b = Batch.objects.select_for_update().filter(pk=batch_id).first()  # no claim or record meanwhile
        if b is None or b.status not in ("in_progress", "cancelling"):
            return False
        pending = Line.objects.filter(batch_id=batch_id, done=False)
        if b.status == "in_progress" and pending.exists():
            return False
        if b.status == "cancelling" and pending.filter(claimed_until__gte=now).exists():
            return False  # lines still in flight; their runners finalize when they end
        final = "completed" if b.status == "in_progress" else "expired" if b.expired_at is not None else "cancelled"
        if b.status == "in_progress":
            if Batch.objects.filter(pk=batch_id, status="in_progress").update(status="finalizing", finalizing_at=now) != 1:
                return False
        elif Batch.objects.filter(pk=batch_id, status="cancelling").update(status=final) != 1:
            return False
        out, err = [], []
        late = 0  # an expired batch's lines that never ran: in the error file, as OpenAI's are
        lines = Line.objects.filter(batch_id=batch_id).order_by("index")
        for done, ok, result, custom_id in (lines if final == "expired" else lines.filter(done=True)).values_list("done", "ok", "result", "custom_id"):
            if not done:
                late += 1
                result = _expired(custom_id)
            (out if ok else err).append(json.dumps(result) + "\n")
        fields: dict[str, Any] = {"status": final}
        if final == "expired":
            fields["failed"] = F("failed") + late
        else:
            fields[f"{final}_at"] = timezone.now()
        for rows, purpose, name in ((out, "batch_output", "output"), (err, "batch_output", "errors")):
            if rows:
                data = "".join(rows).encode()
                f = File.objects.create(purpose=purpose, filename=f"{batch_id}_{name}.jsonl", bytes=len(data), content=data, owner=b.owner)
                fields["output_file" if name == "output" else "error_file"] = f
        Batch.objects.filter(pk=batch_id).update(**fields)
    return True


# -- one line ------------------------------------------------------------------------------


async def run_next(batch_id: str) -> bool:
    """Claim one line and run it; False when there was none to claim. A line that fails in here
    (the database or the key runtime erred: not the request, whose errors are its result) is
    given up and claimed again after a pause: the chain goes on, and the batch is not left
    ``in_progress`` for good.

    Its database connection is checked before and after, as Django does around a request: the
    calls here share a thread that no request ends (a Celery worker's loop, batches/tasks.py),
    and a connection the database dropped (a restart, an idle timeout) would fail every later
    line there, for good."""
    await sync_to_async(close_old_connections)()
    try:
        return await _run_next(batch_id)
    finally:
        await sync_to_async(close_old_connections)()


async def _run_next(batch_id: str) -> bool:
    line = await sync_to_async(claim)(batch_id)
    if line is None:
        return False
    try:
        b = await Batch.objects.aget(pk=batch_id)
        ok, result = await run_line(b, line)
        if result is not None:
            await sync_to_async(record)(line.pk, ok, result)
        else:  # cancelled in flight: not a result; the line stays pending and its lease is given up
            await Line.objects.filter(pk=line.pk, done=False).aupdate(claimed_until=None)
    except Exception:
        log.exception("batch %s: line %d failed in the runner; it runs again", batch_id, line.index)
        with contextlib.suppress(Exception):  # else its lease lapses
            await Line.objects.filter(pk=line.pk, done=False).aupdate(claimed_until=None)
        await asyncio.sleep(FAILED_LINE_PAUSE_S)
    await sync_to_async(finalize_if_done)(batch_id)
    return True


def batch_client(batch_id: str) -> str:
    """The client a batch's lines are counted as where a client's address would be (the per-IP
    --rate-limit bucket, a keyless client's concurrency slot): the batch itself. Every batch's
    lines were 127.0.0.1, one bucket for every key's batches and every real loopback client."""
    return f"batch:{batch_id}"


async def _principal(owner: str, batch_id: str) -> Any:
    """The batch's key as it is now (revoked or deleted since: its lines get 401), or no key."""
    from api.admission import Principal, invalid_api_key, keys_required
    from superfluid_site.runtime import key_runtime

    snapshot = await key_runtime().ready()
    if not owner:
        if keys_required():
            raise invalid_api_key("This batch was created without an API key, and keys are now required.")
        return Principal(key=None, client_ip=batch_client(batch_id))
    key = next((k for k in snapshot.keys_by_digest.values() if k.name == owner), None)
    if key is None or key.revoked or key.is_expired(timezone.now()):
        raise invalid_api_key(f"The API key that created this batch ({owner}) is no longer valid.")
    return Principal(key=key, client_ip=batch_client(batch_id))


def _expired(custom_id: str) -> dict[str, Any]:
    return {"id": "batch_req_" + secrets.token_hex(12), "custom_id": custom_id, "response": None,
            "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}}


def _output(line: Line, status: int, request_id: str | None, body: Any) -> dict[str, Any]:
    return {"id": "batch_req_" + secrets.token_hex(12), "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": request_id or "", "body": body}, "error": None}


async def run_line(b: Batch, line: Line) -> tuple[bool, dict[str, Any] | None]:
    """(ok, the output line) for one request, or (False, None) when the batch was cancelled
    while it ran."""
    from api.errors import ApiError

    while True:
        try:  # as the key is now, at each try: one revoked while its line waited is refused
            principal = await _principal(b.owner, b.id)
        except ApiError as exc:  # no request was made: an id of its own, as the consumer gives one
            return False, _output(line, exc.status, "req_" + secrets.token_hex(12), exc.body())
        status, headers, body = await _call(b, line, principal)
        if status is None:
            return False, None
        if not _retried(status, body):
            break
        if await sync_to_async(current_status)(b.id) != "in_progress":
            return False, None  # refused for now, and the batch is being cancelled: not a result
        try:
            wait = float(headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        if await _cancelled_within(b.id, min(max(wait, 0.2), RETRY_CAP_S)):
            return False, None
        await _renew(line)  # refusals can go on longer than a lease
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {"error": {"message": body.decode("utf-8", "replace"), "type": "server_error", "param": None, "code": None}}
    return 200 <= status < 300, _output(line, status, headers.get("x-request-id"), parsed)


def _retried(status: int, body: bytes) -> bool:
    """A refusal for now: 429 (a rate limit or the key's concurrency), or 503 with no engine to
    take it (restarting, swapping) or a full queue (``--max-queue``). Any other 503 is the line's
    own result: one whose
    job was in flight through two worker crashes (``engine_crashed``) would crash it again, and
    one past its deadline would wait as long again."""
    if status == 429:
        return True
    if status != 503:
        return False
    try:
        return json.loads(body)["error"]["code"] in ("engine_unavailable", "queue_full")
    except (ValueError, TypeError, KeyError):
        return False


async def _renew(line: Line) -> None:
    """The line's lease, from now: it is not claimed again while it runs or waits for a retry."""
    await Line.objects.filter(pk=line.pk, done=False).aupdate(claimed_until=timezone.now() + lease())


async def _cancelled_within(batch_id: str, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        if await sync_to_async(current_status)(batch_id) != "in_progress":
            return True
        await asyncio.sleep(min(POLL_S, max(0.0, end - loop.time())))
    return False


async def _call(b: Batch, line: Line, principal: Any) -> tuple[int | None, dict[str, str], bytes]:
    """The line through its endpoint's consumer: (status, headers, body), or status None when
    the batch was cancelled first (the consumer got a disconnect and cancelled the job)."""
    from api.consumers import ChatCompletionsConsumer, CompletionsConsumer, EmbeddingsConsumer
    from api.errors import ApiError
    from scheduler.core.qos import QosClass

    # the route's own consumer (its parsing, validation and reply), as for an HTTP request to it
    consumers = {"/v1/chat/completions": ChatCompletionsConsumer, "/v1/completions": CompletionsConsumer,
                 "/v1/embeddings": EmbeddingsConsumer}
    url = b.endpoint
    consumer = consumers.get(url)
    if consumer is None:  # stored by a later version (a downgrade): the line fails, never retried
        error = ApiError(400, f"This server cannot run batch lines for '{url}'.", param="endpoint", code="invalid_value")
        return error.status, {"content-type": "application/json"}, json.dumps(error.body()).encode()
    # UTF-8, as a client sends it: escaped (json.dumps's default) a line of kanji or emoji took
    # two or three times its bytes, and one the body bound takes over HTTP was refused 413
    payload = json.dumps(line.body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": url, "raw_path": url.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", (b.host or "localhost").encode("latin-1")), (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode())],
        "client": ("127.0.0.1", 0), "server": None,
        "superfluid.principal": principal, "superfluid.qos": QosClass.BACKGROUND,
    }
    disconnect = asyncio.Event()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    status: int | None = None
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    finished = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers.update({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])})
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                finished.set()

    loop = asyncio.get_running_loop()
    every = renew_s()
    renew_at = loop.time() + every
    app = asyncio.create_task(consumer.as_asgi()(scope, receive, send))
    try:
        while not finished.is_set() and not app.done():
            waiter = asyncio.create_task(finished.wait())
            await asyncio.wait({app, waiter}, timeout=min(POLL_S, every), return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not finished.is_set() and loop.time() >= renew_at:
                await _renew(line)
                renew_at = loop.time() + every
            if not finished.is_set() and not app.done() and await sync_to_async(current_status)(b.id) != "in_progress":
                disconnect.set()  # what a client's disconnect does: the consumer cancels the job
                await asyncio.wait({app}, timeout=10)
                if not finished.is_set():  # a reply complete meanwhile (during the look) is kept: its line ended
                    return None, {}, b""
    finally:
        disconnect.set()  # after the reply, as daphne's disconnect: the consumer ends
        if not app.done():
            await asyncio.wait({app}, timeout=10)
            app.cancel()
    if status is None:
        return 500, {}, json.dumps({"error": {"message": "The request ended without a response.", "type": "server_error", "param": None, "code": None}}).encode()
    return status, headers, b"".join(chunks)
