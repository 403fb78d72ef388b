"""Channels HTTP consumers for the generation endpoints: submit to the worker, stream back.

The response runs in its own task so that the consumer keeps receiving ASGI messages: when the
client disconnects (``http.disconnect``) the task is cancelled and the job with it, which frees
the lane at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from scheduler.core.qos import QosClass, band_of
from scheduler.link.messages import FIM_UNSUPPORTED, Delta, Done, Error, Rejected
from scheduler.link.pool import ModelUnavailable, get_pool
from scheduler.link.transport import JobHandle, Transport
from superfluid_site.runtime import get_link
from superfluid_site.serving import serving

from . import responses
from .admission import Admission, Principal, admit, authenticate, key_first
from .edge import (
    check_content_encoding,
    check_expanded_size,
    check_host_and_origin,
    check_prompt_size,
    cors_origin,
    cors_preflight_headers,
    is_preflight,
    joined_header,
    with_cors_headers,
)
from .errors import ApiError, engine_unavailable, invalid_request, method_not_allowed, request_too_large, server_error
from .link_errors import link_error
from .reasoning import HARMONY_UNSPLIT
from .records import RequestRecord, record_request
from .schemas import (
    GenerationRequest,
    NativeOptions,
    parse_chat_request,
    parse_completion_request,
    parse_embeddings_request,
    parse_infill,
    parse_native_completion_request,
)

log = logging.getLogger("superfluid.api")

T = TypeVar("T")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]

# Headers of which a request sent twice is read by its first value: the request-priority seed's
# X-LlamaSwap-Priority as llama-swap reads it (Go's Header.Get: the first), and x-superfluid-qos
# with it, so that the two headers that pick a request's class agree on which line counts. (The
# key headers keep the last, on every route: docs/api.md, "Headers".)
FIRST_WINS = frozenset({"x-llamaswap-priority", "x-superfluid-qos"})


def _declared_length(scope: dict[str, Any]) -> int:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class StreamingConsumer(AsyncHttpConsumer):
    """Reads the body (bounded), then answers from a task that a disconnect cancels."""

    # No channel: nothing sends an API request channel-layer messages. Channels gives every
    # consumer one by default; on channels_redis (Redis mode) that is a receive blocking on Redis
    # for the request's whole life, whose cancel held a finished consumer open for up to 10 s.
    channel_layer_alias = None
    stream_end = responses.SSE_DONE  # what ends a stream (after its last frame, or an error frame)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._size = 0
        self._task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.preflight = False  # a browser's CORS preflight, answered without a key or a row
        self.record = RequestRecord(endpoint=getattr(self, "endpoint", "http"))
        self.admission: Admission | None = None
        self.first_token_s: float | None = None  # when the first token reached this side (wall clock)
        self.sends: dict[str, tuple[JobHandle, int]] = {}  # each job and the connection it was first sent on
        self.tokens_seen: dict[str, int] = {}  # job id -> completion tokens its last delta counted
        self.stream_handle: JobHandle | None = None  # the job of a single-choice stream (Redis mode: another head may take it over)
        self.choices_per_prompt = 1  # n of a request of several choices: its jobs go prompt by prompt, n each
        self.resumed_after_tokens = False  # a stream resumed here whose client had tokens from its first head

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The application itself ended without handling an http.disconnect (cancelled: daphne
            # kills one at shutdown, or one that outlived its close timeout; or failed): the
            # response runs in a task of its own, which ran on for nobody, its job on a lane and
            # its key's places held until it finished. Stopped here as a disconnect stops it; one
            # that a disconnect already cancelled is left to finish its clean-up.
            task = self._task
            if task is not None and not task.done() and not task.cancelling():
                task.cancel()
                await asyncio.wait([task])

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first closes old database connections on Django's single sync
        # thread, before every message: under a burst a disconnect queued there behind database
        # work, past daphne's close timeout, and its cancel never reached the worker. These
        # consumers never touch the database (rows go to the activity writer's own thread).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message: dict[str, Any]) -> None:
        chunk = message.get("body", b"")
        self._size += len(chunk)
        limit = serving().max_body_bytes
        # a Content-Length over the bound is refused before any of the body is kept
        if self._size > limit or (not self.body and _declared_length(self.scope) > limit):
            await self.send_error(request_too_large(limit))
            self.record.timing = self.seen_timing()  # how long it was open, as every refusal's row
            client = self.scope.get("client")
            self.record.client_ip = client[0] if client else None
            with contextlib.suppress(ApiError):  # its row names the key it came with (none when that is refused)
                self.record.key_name = (await authenticate(self.headers(), client)).key_name
            await record_request(self.record)  # the activity log says why it failed
            raise StopConsumer()
        self.body.append(chunk)
        if not message.get("more_body") and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._respond(b"".join(self.body)))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        raise StopConsumer()

    async def _respond(self, body: bytes) -> None:
        client = self.scope.get("client")
        self.record.client_ip = client[0] if client else None
        try:
            await self.handle(body)
        except ApiError as exc:
            if exc.model is not None and not self.record.model:  # a 404 model_not_found: what the client asked for
                self.record.model = exc.model
            await self.send_error(exc)
        except asyncio.CancelledError:
            self.record.error_code = self.record.error_code or "client_disconnected"
            self.record.status = self.record.status or 499
            raise
        except Exception:
            log.exception("request failed")
            await self.send_error(server_error("The server had an error while processing your request."))
        finally:
            if not self.record.timing:  # no Done came (the client left, an error, a refusal): what this side saw
                self.record.timing = self.seen_timing()
            if not self.record.usage:  # no Done: what was accepted and generated for it counts, for its key too
                self.record.usage = self.seen_usage()
            if self.stream_handle is not None and self.stream_handle.handed_over:
                # its client resumed the stream on another head (Last-Event-ID), whose row and
                # counts are the request's: counted here too, it was counted twice
                log.info("stream %s went on on another head; its activity row is that head's", self.record.request_id)
            elif not self.preflight:  # a preflight is no request of the activity log's
                await record_request(self.record)  # first: it never waits, so nothing can cut it off
            if self.admission is not None:
                if self.refused_before_the_engine():  # the server's reason, not the caller's: no quota spent
                    self.admission.refund()
                await self.admission.release()

    def refused_before_the_engine(self) -> bool:
        """Whether this admitted request was answered 503 ``engine_unavailable`` before any worker
        worked on it: none accepted a job of it (the model did not load, its worker was gone, the
        server is shutting down). Its rate token goes back (docs/keys.md); a 400 from the
        engine's checks, a crash, a deadline, a client that left, or a job a worker had accepted
        (its prompt prefilled) keep theirs spent."""
        if self.record.status != 503 or self.record.error_code != "engine_unavailable" or any(self.tokens_seen.values()):
            return False
        return all(handle.prompt_tokens is None for handle, _ in self.sends.values())

    def seen_usage(self) -> dict[str, Any]:
        """The usage of a request that ended without the worker's Done (its client left, an
        error): each prompt's tokens as its worker accepted it (a row had no prompt size for
        a client that gave up during its prefill), and the completion tokens its last streamed
        pieces counted."""
        usage: dict[str, Any] = {}
        n = max(1, self.choices_per_prompt)
        prompts: dict[int, int] = {}
        for i, (handle, _) in enumerate(self.sends.values()):  # in choice order: prompt by prompt, n each
            if handle.prompt_tokens is not None:
                prompts.setdefault(i // n, handle.prompt_tokens)
        if prompts:
            usage["prompt_tokens"] = sum(prompts.values())
        if self.tokens_seen:
            usage["completion_tokens"] = sum(self.tokens_seen.values())
        return usage

    def saw_delta(self, event: Delta, *, reached_client: bool = True) -> None:
        """Note a delta as this side saw it: its job's tokens so far and, when it is the first
        to reach the client, the time to the first token (for the row of a request that ends
        without the worker's Done)."""
        self.tokens_seen[event.id] = event.tokens
        if reached_client and self.first_token_s is None:
            self.first_token_s = time.time()

    def seen_timing(self) -> dict[str, Any]:
        """The timing of a request that ended without the worker's Done (its client left, an
        error, a refusal): the time it was open and, if one came, when its first token reached
        this side (the answer to "why did my request wait" for a client that gave up waiting, or
        one that waited for a model that never loaded)."""
        now = time.time()
        # a resumed stream whose client had tokens from the first head: when is not known here
        first = None if self.resumed_after_tokens else self.first_token_s
        return {
            "total_ms": round((now - self.record.started_s) * 1000, 1),
            "ttft_ms": round((first - self.record.started_s) * 1000, 1) if first is not None else None,
            # as its jobs' deltas said (and the workers lost before): why a client that left waited
            "preemptions": sum(h.preemptions + h.preemptions_lost for h, _ in self.sends.values()),
        }

    async def send_json(self, status: int, obj: dict[str, Any] | list[Any], extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.record.status = status
        await self.send_response(status, json.dumps(obj).encode(), headers=JSON_HEADERS + (extra_headers or []))
        self.headers_sent = True

    async def send_error(self, exc: ApiError) -> None:
        self.record.error_code = exc.code or exc.type
        if not self.headers_sent:
            self.record.status = exc.status
        if self.headers_sent:  # the stream has begun: an error frame, then [DONE] (where the route sends one)
            await self.send_body(responses.sse_error(exc) + self.stream_end)
            return
        extra = [(k.lower().encode(), str(v).encode()) for k, v in (exc.headers or {}).items()]
        # refused before any job had an id (a bad body, a limit, no engine): an id of its own,
        # in the header and in its activity row, so every response names one (a batch's
        # error lines carry it as their request_id)
        self.record.request_id = self.record.request_id or uuid.uuid4().hex
        extra.append((b"x-request-id", self.record.request_id.encode()))
        await self.send_json(exc.status, exc.body(), extra)

    def headers(self) -> dict[str, str]:
        """Request headers, names lower-cased. Of a repeated header the last wins, but for the
        scheduling headers (FIRST_WINS) the first, as llama-swap reads its priority header (Go's
        ``Header.Get``)."""
        out: dict[str, str] = {}
        for k, v in self.scope.get("headers", []):
            name = k.decode("latin-1").lower()
            if name not in FIRST_WINS or name not in out:
                out[name] = v.decode("latin-1")
        return out

    def origin(self) -> str | None:
        """The request's ``Origin``, several joined with commas (as check_host_and_origin judges it)."""
        values = [v.decode("latin-1") for k, v in self.scope.get("headers", []) if k.lower() == b"origin"]
        return ",".join(values) if values else None

    async def send_headers(self, *, status: int = 200, headers: Any = None) -> None:
        # every reply to an allowed browser origin (errors and streams too) lets its page read it
        given = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        await super().send_headers(status=status, headers=with_cors_headers(given, self.origin()))

    async def answer_preflight(self, methods: tuple[str, ...]) -> bool:
        """A CORS preflight from an allowed origin: 204 with what the page may send, before any
        key is looked at and without reaching the engine (api/edge.py). False for any other
        request (a plain ``OPTIONS`` is a 405 as before)."""
        headers = self.headers()
        origin = cors_origin(self.origin())
        if origin is None or not is_preflight(self.scope.get("method"), origin, headers.get("access-control-request-method")):
            return False
        self.preflight = True
        self.record.status = 204
        allowed = cors_preflight_headers(origin, methods, headers.get("access-control-request-headers"))
        await self.send_response(204, b"", headers=[(name.lower().encode(), value.encode("latin-1")) for name, value in allowed])
        self.headers_sent = True
        return True


class GenerationConsumer(StreamingConsumer):
    endpoint = "chat"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ignored: list[str] = []  # the body's parameters this server ignores (a response header names them)
        self.lane_ctx: Callable[[GenerationRequest], int] | None = None  # set for the parse (parse_off_loop)
        self.router_serial: dict[str, Any] | None = None  # several models: the router's pick
        self.engine_wait_ms = 0.0  # one model: the wait for its worker to connect
        self.tool_format = "hermes"  # how the model writes tool calls (its worker's Hello): note_tool_format
        self.reasoning_format = "none"  # ... and its reasoning (api/reasoning.py)

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        config = serving()
        return parse_chat_request(body, models=models, strict=config.strict_params, prefill=config.prefill_assistant)

    def keepalive_event(self) -> bytes:
        """What a stream sends after ``--sse-keepalive`` seconds without an event: an SSE comment,
        which every client skips and which resets the idle timers between them and this server
        (a proxy's read timeout, nginx's 60 s by default; an HTTP client's read timeout). A route
        whose clients count only events (/v1/responses, /v1/messages) sends one of its own."""
        return b": keepalive\n\n"

    async def beating(self, get: Callable[[], Awaitable[T]]) -> T:
        """``await get()`` in a stream whose headers went out: for as long as it waits (queued
        behind other jobs, a long prompt read, a lane parked), the keepalive event every
        ``--sse-keepalive`` seconds. ``get`` is an ``asyncio.Queue``'s wait (the job's events,
        JobHandle.next_events): a beat cancels it and waits again, and a cancelled wait takes
        nothing from the queue, so no event is lost. (A timeout around each wait: ~4 us a token
        on the web side, where a task watched by ``asyncio.wait`` cost ~20.)"""
        interval = serving().sse_keepalive
        if interval <= 0:
            return await get()
        while True:
            beat = asyncio.timeout(interval)
            try:
                async with beat:
                    return await get()
            except TimeoutError:
                if not beat.expired():
                    raise  # (the wait's own)
                await self.send_body(self.keepalive_event(), more_body=True)

    async def handle(self, body: bytes) -> None:
        check_host_and_origin(self.headers(), self.scope)  # Django's Host check never sees a consumer
        if await self.answer_preflight(("POST",)):
            return
        # the key next: a missing or wrong one is 401 before the body is looked at
        # an in-process caller (batches/runner.py: a Batch API line) puts its owner's principal and
        # the background class in the scope; no HTTP client can set scope keys
        self.principal: Principal = self.scope.get("superfluid.principal") or await authenticate(self.headers(), self.scope.get("client"))
        self.record.key_name = self.principal.key_name
        if self.scope.get("method") != "POST":
            raise method_not_allowed(self.scope.get("method", ""))
        check_content_encoding(joined_header(self.scope, b"content-encoding", {}))
        pool = get_pool()
        link = get_link()
        if link.draining or (pool is not None and pool.draining):
            raise engine_unavailable("The server is shutting down.")
        if pool is None:
            began = time.monotonic()
            if not await link.wait_connected(serving().engine_wait_s):
                raise engine_unavailable(getattr(link, "unavailable_detail", "The engine worker is not running."), retry_after=getattr(link, "retry_after_s", None))
            # a wait for the worker to come back (a restart, a start): its times count it, as
            # they count a wait at the router, or the row said it hardly waited
            self.engine_wait_ms = round((time.monotonic() - began) * 1000, 1)
            assert link.hello is not None
            request = await self.parse_off_loop(body, [link.hello.model], lambda _r: link.hello.lane_ctx if link.hello else 0)
        else:
            # an id or an alias (else 404 model_not_found); fill-in-the-middle: the --fim-model;
            # a route whose model is optional: the first the key may use (key_first)
            request = await self.parse_off_loop(
                body, key_first(pool.names(), self.principal.policy), lambda r: pool.setup.ctx_sizes.get(pool.route(r.model, fim=r.suffix is not None) or "", 0)
            )
        self.ignored = request.ignored
        if request.ignored:
            log.info("request ignores parameters: %s", responses.ignored_params_value(request.ignored))
        self.record.model, self.record.stream = request.model, request.stream
        last_event_id = self.headers().get("last-event-id", "").strip()
        if last_event_id and pool is None and request.stream and getattr(link, "resumable", False):
            await self.resume(link, request, body, last_event_id)  # a stream begun on another head
            return
        self.admission = admission = await admit(
            self.headers(), self.scope.get("client"), request, self.principal, decided=self.note_class, run_in=self.scope.get("superfluid.qos")
        )
        qos, priority = admission.qos, admission.priority
        self.record.key_name = admission.key_name
        self.note_class(qos, priority)
        if pool is None:
            await self.run_job(link, request, admission)
            return
        model_id = pool.route(request.model, fim=request.suffix is not None)  # fill-in-the-middle: the --fim-model
        assert model_id is not None
        try:
            # the router's turn; an interactive or completion request may go to a full model, whose
            # worker preempts a lower lane for it
            link, dispatch, ticket = await pool.acquire(
                model_id, priority, preempts=qos in (QosClass.INTERACTIVE, QosClass.COMPLETION), jobs=request.jobs
            )
        except ModelUnavailable as exc:
            if exc.dispatch is not None:  # dispatched, then its worker was gone: the pick is still recorded
                self.record.serial = exc.dispatch.serial_fields()
            raise engine_unavailable(exc.detail, retry_after=exc.retry_after_s) from None
        self.router_serial = dispatch.serial_fields()
        self.record.serial = dict(self.router_serial)  # kept if the request later fails or is cancelled
        try:
            await self.run_job(link, request, admission)
        finally:
            pool.release(ticket)

    async def parse_off_loop(self, body: bytes, models: list[str], lane_ctx: Callable[[GenerationRequest], int]) -> GenerationRequest:
        """Parse and validate the body, then bound its prompt (before any tokenising), in a
        thread: a body of 20,000 messages takes long enough to stall every other stream were it
        done on the event loop. (``json.loads`` itself keeps the GIL for its run, which
        ``--max-body-bytes`` bounds.)"""

        self.lane_ctx = lane_ctx  # (a parse that tokenises bounds its work by it: /completion)

        def work() -> GenerationRequest:
            request = self.parse(body, models)
            check_expanded_size(request, len(body))
            limit = lane_ctx(request) or 1 << 30
            check_prompt_size(request, limit)
            for prompt in (request.prompts or [])[1:]:  # several prompts: each must fit
                check_prompt_size(dataclasses.replace(request, prompt=prompt, prompts=None), limit)
            return request

        return await asyncio.to_thread(work)

    def note_tool_format(self, link: Any) -> None:
        """How the model behind ``link`` writes tool calls (its worker's Hello), for the reply."""
        fmt = getattr(getattr(link, "hello", None), "tool_format", None)
        self.tool_format = fmt if isinstance(fmt, str) else "hermes"
        fmt = getattr(getattr(link, "hello", None), "reasoning_format", None)
        self.reasoning_format = fmt if isinstance(fmt, str) else "none"

    async def run_job(self, link: Transport, request: GenerationRequest, admission: Admission) -> None:
        self.note_tool_format(link)
        if request.n > 1 or request.prompts or request.echo:
            await self.run_jobs(link, request, admission)
            return
        qos, priority = admission.qos, admission.priority
        handle = await link.submit(
            request=request.to_wire(),
            qos=int(qos),
            priority=priority,
            batch_invariant=admission.batch_invariant,
            pin_prefix=admission.pin_prefix,
            cache_scope=admission.cache_scope,
            **self.router_wait(),
        )
        handle.key = admission.key_name
        self.record.request_id = handle.job_id
        self.note_sent(handle)
        try:
            first = await handle.next_event()
            if isinstance(first, (Rejected, Error)):
                raise link_error(first)
            self.note_sent(handle)
            if request.stream:
                # the body's digest only where another head may resume the stream (it is the
                # request's whole JSON hashed on the event loop: ~20 ms for a 2 MB body)
                body = body_digest(request) if getattr(link, "resumable", False) else ""
                await self.stream(request, handle, qos, link=link, body=body)
            else:
                await self.collect(request, handle, qos)
        except BaseException:  # the client left, or this response failed: the job stops too
            await link.cancel(handle)  # (nothing to send for a job that already ended)
            raise
        finally:
            link.finish(handle)

    # -- several choices (n > 1, several prompts) and echo ------------------------------------

    async def run_jobs(self, link: Transport, request: GenerationRequest, admission: Admission) -> None:
        """One job per choice, submitted together under this request's one admission; their
        events are merged into one response with ``index`` 0..k-1 in OpenAI's order. A
        disconnect, or any choice failing, cancels every job still running."""
        subs = request.choices()
        self.choices_per_prompt = request.n
        handles: list[JobHandle] = []
        finished: set[int] = set()
        try:
            for sub in subs:
                handle = await link.submit(
                    request=sub.to_wire(),
                    qos=int(admission.qos),
                    priority=admission.priority,
                    batch_invariant=admission.batch_invariant,
                    pin_prefix=admission.pin_prefix,
                    cache_scope=admission.cache_scope,
                    request_of=handles[0].job_id if handles else "",  # one request in llamaswap_scheduler_*
                    **self.router_wait(),
                )
                handle.key = admission.key_name
                handle.request = handles[0].job_id if handles else handle.job_id  # one request in /metrics
                handles.append(handle)
                self.note_sent(handle)
            self.record.request_id = handles[0].job_id
            scored: list[Any] = []
            for handle in handles:
                first = await handle.next_event()
                if isinstance(first, (Rejected, Error)):
                    raise link_error(first)
                self.note_sent(handle)
                scored.append(getattr(first, "prompt_logprobs", None))
            echoes = await self.echo_texts(subs, link.hello.model if link.hello else None) if request.echo else [""] * len(subs)
            head = self.reply(request)
            replies = [self.reply(sub, index=i, id=head.id, created=head.created, echo=echoes[i]) for i, sub in enumerate(subs)]
            for reply, entries in zip(replies, scored, strict=True):
                reply.prompt_logprobs = list(entries or [])
            await self.merged(request, handles, replies, admission.qos, finished)
        except BaseException:
            for handle in handles:  # generated for it but not read here (a completion stream waits for every choice's start)
                if handle.delivered_tokens > self.tokens_seen.get(handle.job_id, 0):
                    self.tokens_seen[handle.job_id] = handle.delivered_tokens
            await cancel_all(link, [handle for i, handle in enumerate(handles) if i not in finished])
            raise
        finally:
            for handle in handles:
                link.finish(handle)

    async def echo_texts(self, subs: list[GenerationRequest], model: str | None) -> list[str]:
        """Each choice's prompt as text: the string given, or its token ids detokenised with the
        vocabulary of the model that ran them (``model``: the id its worker said)."""
        from .tokenizer import detokenize
        from .views import _vocab

        out = []
        for sub in subs:
            if isinstance(sub.prompt, list):  # in a thread, as /detokenize: 128,000 ids took 0.2 s
                out.append(await asyncio.to_thread(detokenize, await _vocab(model), sub.prompt))
            else:
                out.append(sub.prompt or "")
        return out

    async def merged(
        self, request: GenerationRequest, handles: list[JobHandle], replies: list[responses.Reply], qos: QosClass, finished: set[int]
    ) -> None:
        events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        pending: list[list[Any]] = [[] for _ in handles]
        if request.stream and qos is QosClass.COMPLETION:
            # as for one choice: a missed start deadline is an HTTP error, not a frame in a 200
            for i, handle in enumerate(handles):
                first = await handle.next_event()
                if isinstance(first, (Error, Rejected)):  # (Rejected: a new worker refused it, submitted again)
                    raise link_error(first)
                pending[i].append(first)

        async def pump(i: int, handle: JobHandle) -> None:
            while True:
                ready = pending[i] or await handle.next_events()
                pending[i] = []
                for event in ready:
                    events.put_nowait((i, event))
                    if isinstance(event, (Done, Error, Rejected)):
                        return

        tasks = [asyncio.get_running_loop().create_task(pump(i, h)) for i, h in enumerate(handles)]
        dones: dict[int, Done] = {}
        out: list[bytes] = []  # a stream's frames not yet sent
        try:
            if request.stream:
                await self.send_headers(status=200, headers=SSE_HEADERS + self.response_headers(handles[0], qos))
                self.headers_sent = True
                self.record.status = 200
                opening = b"".join(responses.sse_event(f) for r in replies for f in self.opening_frames(r))
                if opening:
                    await self.send_body(opening, more_body=True)
            while len(dones) < len(handles):
                # events that arrived together (the reader fell behind) go out in one write, as
                # for one choice: every choice's, in the order they came
                ready = [await (self.beating(events.get) if request.stream else events.get())]
                while not events.empty():
                    ready.append(events.get_nowait())
                for i, event in ready:
                    reply = replies[i]
                    if isinstance(event, (Error, Rejected)):
                        if out:  # what was generated before the error reaches the client first
                            await self.send_body(b"".join(out), more_body=True)
                        raise link_error(event)
                    if isinstance(event, Delta):
                        self.saw_delta(event)
                        if not request.stream:
                            reply.add(event)
                            continue
                        out += self.delta_events(reply, event)
                    elif isinstance(event, Done):
                        dones[i] = last_done = event
                        finished.add(i)
                        if request.stream:
                            out += [responses.sse_event(f) for f in self.choice_final_frames(request, reply, event)]
                if out and len(dones) < len(handles):  # (the last write also ends the stream)
                    await self.send_body(b"".join(out), more_body=True)
                    out = []
        finally:
            for task in tasks:
                task.cancel()
        every = [dones[i] for i in range(len(handles))]
        usage = self.total_usage(every, request.n)
        # the serial fields of the choice admitted first, as the row's queue wait (the last to
        # finish had waited behind its siblings); the finish reason of the last to finish
        self.note_done(min(every, key=lambda d: _wait_or_inf(d.timing)))
        self.record.finish_reason = last_done.finish_reason
        self.note_timing([d.timing for d in every])
        self.record.usage = {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                             "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}
        if request.stream:
            await self.send_body(b"".join(out) + self.merged_stream_end(request, replies, usage))
            return
        await self.send_json(200, self.merged_body(request, replies, every, usage), self.response_headers(handles[0], qos))

    def merged_stream_end(self, request: GenerationRequest, replies: list[responses.Reply], usage: dict[str, Any]) -> bytes:
        """What ends a stream of several choices, after the last one's final frames."""
        tail = b""
        if request.include_usage:
            make = responses.chat_usage_chunk if self.endpoint == "chat" else responses.completion_usage_chunk
            tail += responses.sse_event(make(replies[0].id, replies[0].model, replies[0].created, usage))
        return tail + responses.SSE_DONE

    def merged_body(self, request: GenerationRequest, replies: list[responses.Reply], dones: list[Done], usage: dict[str, Any]) -> Any:
        """The response to a request of several choices, not streamed: one object, its choices in order."""
        bodies = [reply.body(dones[i], None) for i, reply in enumerate(replies)]
        obj = bodies[0]
        obj["choices"] = [b["choices"][0] for b in bodies]
        obj["usage"] = usage
        return obj

    @staticmethod
    def total_usage(dones: list[Done], n: int) -> dict[str, Any]:
        """The request's usage: each prompt counted once (its first choice's count), every
        choice's completion tokens."""
        prompts = dones[::n]
        return responses.usage_dict(
            sum(d.usage["prompt_tokens"] for d in prompts),
            sum(d.usage["completion_tokens"] for d in dones),
            sum(d.usage.get("cached_tokens", 0) for d in prompts),
        )

    def response_headers(self, handle: JobHandle, qos: QosClass) -> list[tuple[bytes, bytes]]:
        return reply_headers(handle.job_id, qos.label, self.ignored)

    def reply_reasoning(self, request: GenerationRequest) -> str:
        """How the reply's reasoning is split out (api/reasoning.py): the model's format, unless
        the request's reasoning_format or --reasoning-format says none. A reply that begins with
        no reasoning though its template opens the block itself is read as one that may open
        it: where the request turns thinking off (enable_thinking false: DeepSeek R1's template
        closes the block at once; the string "false" is no such thing, a template reads it as a
        non-empty string, truthy, and keeps thinking on), and where a grammar writes the reply
        from its first token (a response_format, a forced call). A reply that continues a
        prefill is not split (llama-server's reasoning format none there): it is text after
        the client's, which the template's reasoning block does not hold (:attr:`prefill`
        refuses a template that thinks first). gpt-oss's reply so left is read as llama-server's
        gpt-oss parser reads it with reasoning_format none (``harmony-unsplit``): its calls of
        offered functions are calls, its analysis stays content as written, and the final and
        preamble messages' headers are no content, with tools offered or not."""
        if (request.reasoning_format or serving().reasoning_format) == "none" or request.prefill_text:
            return HARMONY_UNSPLIT if self.reasoning_format == "harmony" else "none"
        if self.reasoning_format == "think-open" and (
            (request.chat_template_kwargs or {}).get("enable_thinking") in (False,)  # (== False: 0 too)
            or request.response_format is not None
            or (request.tools and request.tool_choice not in ("auto", "none"))
        ):
            return "think"
        return self.reasoning_format

    def reply(self, request: GenerationRequest, **extra: Any) -> responses.Reply:
        return responses.Reply(
            self.endpoint, request.model, tools=request.tools, tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls, legacy_functions=request.legacy_functions,
            tool_format=self.tool_format,
            reasoning_format=self.reply_reasoning(request),
            logprobs=request.logprobs is not None, include_usage=request.stream and request.include_usage,
            continues=bool(request.prefill_text), **extra,
        )  # fmt: skip

    async def resume(self, link: Any, request: GenerationRequest, body: bytes, last_event_id: str) -> None:
        """Redis mode: a client whose stream began on another head (which died) reconnects here
        with ``Last-Event-ID: <job id>:<n>`` and the same body and key: it gets the rest of the
        stream, from the job's Redis Stream, after the n-th text delta (the reply's state is
        rebuilt from the deltas it already has, so the frames are those the first head would have
        sent). Not admitted again: it is the same request."""
        self.note_tool_format(link)
        job_id, _, seen = last_event_id.rpartition(":")
        if not job_id or not (seen.isascii() and seen.isdigit()) or len(seen) > 9 or len(job_id) > 64:
            raise invalid_request("Last-Event-ID is not an id this server sent.", param="Last-Event-ID", code="invalid_value")
        gone = ApiError(404, "No stream to resume for this Last-Event-ID (it finished, expired or belongs to another key).", code="not_found")
        meta = await link.stream_meta(job_id)
        if meta is None or meta.get("key") != self.principal.key_name or meta.get("body") != body_digest(request):
            raise gone
        attached = await link.attach(job_id)
        if attached is None:
            raise gone
        handle, meta = attached
        # its job, as this head's own (the row of a client that leaves again has the prompt's
        # tokens as the worker accepted them: its stream is read from the start, Accepted included)
        self.note_sent(handle)
        # this head's wait for a worker came after the job was submitted (its Submit told its
        # worker the first head's wait): none of the job's, so none of its times (router_wait)
        self.engine_wait_ms = 0.0
        self.record.request_id = job_id
        self.resumed_after_tokens = int(seen) > 0
        started = meta.get("started")  # the client's arrival at the first head: the row is the request's
        if isinstance(started, (int, float)) and not isinstance(started, bool) and 0 < started <= time.time():
            self.record.started_s = float(started)
        try:
            qos = QosClass(int(meta.get("qos", QosClass.INTERACTIVE)))
            await self.take_over_places(meta, qos)
            # the first head's note (a job that ended before this head attached has no Submit left)
            priority = meta.get("priority", handle.submit.priority)
            self.note_class(qos, priority if isinstance(priority, int) and not isinstance(priority, bool) else 0)  # as the first head's row had them
            reply = self.reply(request, id=meta.get("id"), created=meta.get("created"))
            await self.pump_stream(request, handle, qos, reply, [], ids=True, skip=int(seen))
        except BaseException:  # the client left, or this response failed: the job stops too
            await link.cancel(handle)
            raise
        finally:
            link.finish(handle)

    async def take_over_places(self, meta: dict[str, Any], qos: QosClass) -> None:
        """A resumed stream's request keeps the concurrency places its first head's admission
        took in Redis (the key's ``max_concurrent``, a keyless client's): held from this head
        now, renewed and given back when its response ends here, as any of this head's own. Else
        the first head's places lapsed within a minute of its death while the request ran on,
        and its key could run one more than its limit."""
        slots, member = meta.get("slots"), meta.get("member")
        if not isinstance(slots, list) or not slots or not all(isinstance(s, str) for s in slots) or not isinstance(member, str):
            return  # none held (a key without a slot), or a head from before this note
        from keys.limits import LimitsUnavailable, shared_limiter

        priority = meta.get("priority")
        admission = Admission(qos=qos, priority=priority if isinstance(priority, int) else 0, key_name=self.principal.key_name)
        admission.shared_slots, admission.shared_member = list(slots), uuid.uuid4().hex
        self.admission = admission  # released when the response ends, whatever happens from here
        try:
            await shared_limiter(serving().redis_url).take_over(admission.shared_slots, member, admission.shared_member)
        except LimitsUnavailable as exc:  # the stream goes on; the first head's places lapse as before
            log.warning("could not take over the concurrency places of resumed stream %s: %s", self.record.request_id, exc)

    async def stream(self, request: GenerationRequest, handle: JobHandle, qos: QosClass, *, link: Any = None, body: str = "") -> None:
        reply = self.reply(request)
        ids = bool(getattr(link, "resumable", False))
        if ids:  # another head can go on with this stream if this one dies
            meta = {"key": self.principal.key_name, "body": body, "id": reply.id, "created": reply.created, "qos": int(qos), "priority": self.record.priority, "started": self.record.started_s}
            if self.admission is not None and self.admission.shared_slots:  # the head that resumes it holds them on
                meta["slots"], meta["member"] = list(self.admission.shared_slots), self.admission.shared_member
            await link.remember_stream(handle.job_id, meta)
        pending: list[Any] = []
        if qos is QosClass.COMPLETION:
            # a completion may miss its start deadline while queued: wait for its first event so
            # that a miss is a real HTTP error rather than an error frame in a 200 stream
            first = await handle.next_event()
            if isinstance(first, (Error, Rejected)):  # (Rejected: after a worker loss, by the next worker)
                raise link_error(first)
            pending.append(first)
        await self.pump_stream(request, handle, qos, reply, pending, ids=ids, skip=None)

    async def pump_stream(
        self, request: GenerationRequest, handle: JobHandle, qos: QosClass, reply: responses.Reply, pending: list[Any], *, ids: bool, skip: int | None
    ) -> None:
        """Send the SSE response. With ``ids`` every frame carries ``id: <job id>:<n>``, n the
        text deltas so far; ``skip`` (a resume): the opening and the first ``skip`` deltas' frames
        were sent by another head, so they only advance the reply's state."""
        self.stream_handle = handle
        await self.send_headers(status=200, headers=SSE_HEADERS + self.response_headers(handle, qos))
        self.headers_sent = True
        self.record.status = 200
        n = 0

        def tagged(events: list[bytes]) -> bytes:
            if not ids:
                return b"".join(events)
            tag = f"id: {handle.job_id}:{n}\n".encode()
            return b"".join(tag + e for e in events)

        opening = self.opening_frames(reply) if skip is None else []
        if opening:
            await self.send_body(tagged([self.sse_frame(f) for f in opening]), more_body=True)
        while True:
            # deltas that arrived together (the reader fell a tick or more behind) go out in one
            # write: the same bytes on the wire, one trip through daphne instead of several
            events, pending = (pending, []) if pending else (await self.beating(handle.next_events), pending)
            out: list[bytes] = []
            for event in events:
                if isinstance(event, Delta):
                    n += 1
                    sse = self.delta_events(reply, event)
                    sent = bool(sse) and (skip is None or n > skip)  # (a resumed stream: from this server)
                    if sent:
                        out.append(tagged(sse))
                    self.saw_delta(event, reached_client=sent)
                elif isinstance(event, Done):
                    self.note_done(event)
                    frames = self.final_frames(request, reply, event)
                    await self.send_body(b"".join(out) + b"".join(self.sse_frame(f) for f in frames) + self.stream_end)
                    return
                elif isinstance(event, (Error, Rejected)):
                    if out:  # what was generated before the error reaches the client first
                        await self.send_body(b"".join(out), more_body=True)
                    raise link_error(event)
            if out:
                await self.send_body(b"".join(out), more_body=True)

    # -- one job's response: what a route (/infill) may shape otherwise -------------------

    def opening_frames(self, reply: responses.Reply) -> list[dict[str, Any]]:
        return reply.first_chunks()

    def sse_frame(self, frame: dict[str, Any]) -> bytes:
        """One frame of a stream (its opening's, its end's) as its SSE event: ``data: <frame>``
        (a route whose events are named, /v1/responses or /v1/messages, says ``event:`` too)."""
        return responses.sse_event(frame)

    def delta_events(self, reply: responses.Reply, event: Delta) -> list[bytes]:
        """A delta's SSE events (one per frame), each ``data: <chunk>\\n\\n``."""
        return reply.delta_events(event)

    def final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> list[dict[str, Any]]:
        return reply.final_chunks(event, self.usage(event) if request.include_usage else None)

    def choice_final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> list[dict[str, Any]]:
        """One choice's final frames in a stream of several (the usage comes once, at the end)."""
        return reply.final_chunks(event, None)

    def final_body(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> dict[str, Any]:
        return reply.body(event, self.usage(event))

    async def collect(self, request: GenerationRequest, handle: JobHandle, qos: QosClass) -> None:
        reply = self.reply(request)
        while True:
            event = await handle.next_event()
            if isinstance(event, Delta):
                self.saw_delta(event)
                reply.add(event)
            elif isinstance(event, (Error, Rejected)):
                raise link_error(event)
            elif isinstance(event, Done):
                self.note_done(event)
                break
        await self.send_json(200, self.final_body(request, reply, event), self.response_headers(handle, qos))

    def router_wait(self) -> dict[str, Any]:
        """The Submit's ``waited_ms``, which its worker counts in its times and histograms from
        then on: with several models, the request's wait at the router (a swap, a load); with
        one, its wait for the worker to connect (a restart), from a millisecond on."""
        router = self.router_serial
        if router:
            return {"waited_ms": router["serial_queue_wait_ms"]}
        waited = self.engine_wait_ms
        return {"waited_ms": waited} if waited >= 1 else {}

    def note_sent(self, handle: JobHandle) -> None:
        """Note the connection a job was first sent on (once it was sent: -1 is not yet)."""
        if self.sends.get(handle.job_id, (handle, -1))[1] == -1:
            self.sends[handle.job_id] = (handle, handle.sent_on)

    def note_class(self, qos: QosClass, priority: int) -> None:
        """The request's class and priority in its activity row (a refused one's too; a batch
        line's, those it runs in: admit's ``run_in``)."""
        self.record.qos, self.record.priority, self.record.band = qos.label, priority, band_of(priority)

    def note_done(self, event: Done) -> None:
        self.record.finish_reason = event.finish_reason
        self.record.usage = dict(event.usage)
        self.note_timing([event.timing])
        self.record.serial = dict(event.serial)
        router = self.router_serial
        if router:  # several models: the router's pick; the wait counts both queues
            worker_wait = float(event.serial.get("serial_queue_wait_ms") or 0)
            waited = worker_wait + uncounted_wait(event.timing, router["serial_queue_wait_ms"])
            self.record.serial = {**router, "serial_queue_wait_ms": round(waited)}

    def note_timing(self, timings: list[dict[str, Any]]) -> None:
        """The activity row's timing from the worker's (one per choice), counted from the
        request's arrival: with several models the wait at the router (a swap, a load) came
        before the worker's; the worker counts it (the Submit's ``waited_ms``, given back in its
        timing), and what it did not count is added here."""
        waited = int(self.router_wait().get("waited_ms") or 0)
        self.record.timing = merged_timing([with_wait_before(t, waited) for t in timings])
        if any(sent_on != -1 and handle.sent_on != sent_on for handle, sent_on in self.sends.values()):
            # submitted again after its worker was lost: the last worker counted from the job's
            # arrival there; the client's first token and its whole wait are what this side saw
            seen = self.seen_timing()
            self.record.timing["total_ms"] = seen["total_ms"]
            if seen["ttft_ms"] is not None:
                self.record.timing["ttft_ms"] = seen["ttft_ms"]

    @staticmethod
    def usage(event: Done) -> dict[str, Any]:
        u = event.usage
        return responses.usage_dict(u["prompt_tokens"], u["completion_tokens"], u.get("cached_tokens", 0))


async def cancel_all(link: Transport, handles: list[JobHandle]) -> None:
    """Cancel each of a request's jobs at the worker, one after another. A cancel of the caller
    meanwhile (daphne cancels an application still running past its close timeout, and again
    each second) ends the wait for one Cancel, whose send goes on, not the rest: it left every
    later choice running to its last token for nobody, on a lane. The cancel is raised after."""
    cut: asyncio.CancelledError | None = None
    for handle in handles:
        try:
            await link.cancel(handle)
        except asyncio.CancelledError as exc:
            cut = exc
    if cut is not None:
        raise cut


def _wait_or_inf(timing: dict[str, Any] | None) -> float:
    wait = (timing or {}).get("queue_wait_ms")
    return float(wait) if wait is not None else float("inf")


def uncounted_wait(timing: dict[str, Any] | None, waited_ms: float) -> float:
    """The part of ``waited_ms`` (the wait at the router) that a worker's timing does not count
    already: all of it from a worker that was not told it (no ``timing["waited_ms"]``)."""
    return max(0.0, waited_ms - float((timing or {}).get("waited_ms") or 0))


def with_wait_before(timing: dict[str, Any], waited_ms: float) -> dict[str, Any]:
    """One choice's worker timing counted from ``waited_ms`` earlier (the wait at the router)."""
    extra = uncounted_wait(timing, waited_ms)
    if not timing or not extra:
        return timing
    return {k: v + extra if k in ("queue_wait_ms", "ttft_ms", "total_ms") and v is not None else v for k, v in timing.items()}


def merged_timing(timings: list[dict[str, Any]]) -> dict[str, Any]:
    """One request's timing from its choices' (n > 1, several prompts): the client's first token
    and first admission came with the earliest choice, its end with the last; preemptions add up."""

    def pick(key: str, how: Callable[[list[Any]], Any]) -> Any:
        values = [t[key] for t in timings if t and t.get(key) is not None]
        return how(values) if values else None

    waited = [t for t in timings if t and t.get("queue_wait_ms") is not None]
    first = min(waited, key=lambda t: t["queue_wait_ms"]) if waited else {}  # the first admitted choice's
    return {
        "queue_wait_ms": first.get("queue_wait_ms"),
        "held_wait_ms": first.get("held_wait_ms"),  # (of that first admission's wait)
        "ttft_ms": pick("ttft_ms", min),
        "total_ms": pick("total_ms", max),
        "preemptions": sum(int(t.get("preemptions") or 0) for t in timings if t),
    }


def reply_headers(request_id: str, qos: str | None, ignored: list[str]) -> list[tuple[bytes, bytes]]:
    """A reply's own headers: its ``x-request-id``, the class it ran in (none: refused before it
    was admitted), the body's parameters not honoured."""
    headers = [(b"x-request-id", request_id.encode())]
    if qos:
        headers.append((b"x-superfluid-qos", qos.encode()))
    if ignored:
        headers.append((responses.IGNORED_PARAMS_HEADER.encode(), responses.ignored_params_value(ignored).encode()))
    return headers


def body_digest(request: GenerationRequest) -> str:
    """What a resume must repeat: the parsed request (so whitespace or key order may differ)."""
    wire = json.dumps(request.to_wire(), sort_keys=True, default=str).encode()
    return hashlib.sha256(wire).hexdigest()


class ChatCompletionsConsumer(GenerationConsumer):
    endpoint = "chat"


class CompletionsConsumer(GenerationConsumer):
    endpoint = "completions"

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        return parse_completion_request(body, models=models, strict=serving().strict_params)


def tokenize_text(model: str, text: str) -> list[int]:
    """A ``logit_bias`` text of llama-server's native routes, tokenised as llama-server tokenises
    it (``common_tokenize(vocab, text, false)``: no BOS, special tokens as text), with the
    model's vocabulary (in the parsing thread)."""
    from .views import vocab_of

    return vocab_of(model).tokenize(text, add_special=False, parse_special=False)


class NativeCompletionConsumer(CompletionsConsumer):
    """llama-server's ``POST /completion`` (and ``/completions``; Continue's and SillyTavern's
    llama.cpp backends, llama.cpp's examples): a completion through the completions path
    (admission, keys, classes, activity rows and metrics under ``completions``), answered in
    llama-server's native shape: one completion object per prompt (an array of them for several
    prompts), or streamed ``data:`` frames of it without a closing ``[DONE]``."""

    endpoint = "completions"
    stream_end = b""  # llama-server ends a native stream with its last frame

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options = NativeOptions()  # what the body asks of its response (response_fields, ...): parse
        self.prompt_texts: dict[int, str] = {}  # a token-id prompt's text, by prompt index: the result's prompt

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        of_request = self.lane_ctx
        lane_ctx = None if of_request is None else (lambda model: of_request(GenerationRequest(endpoint="completions", model=model, prompt="")))
        request, self.options = parse_native_completion_request(
            body, models=models, strict=serving().strict_params, tokenize=self.tokenize, lane_ctx=lane_ctx,
            tokenize_text=tokenize_text,
        )
        return request

    @staticmethod
    def tokenize(model: str, text: str, first: bool) -> list[int]:
        """A string of a prompt that mixes strings and token ids, tokenised as llama-server's
        ``tokenize_mixed`` does (special tokens parsed; BOS where the vocabulary adds one, for a
        string that begins the prompt), with the model's vocabulary (in the parsing thread)."""
        from .views import vocab_of

        return vocab_of(model).tokenize(text, add_special=first, parse_special=True)

    def reply(self, request: GenerationRequest, **extra: Any) -> responses.Reply:
        # the text is gathered as a completion's; the frames and the body are llama-server's
        extra.pop("echo", None)
        return responses.Reply("completions", request.model, logprobs=request.logprobs is not None, **extra)

    async def run_job(self, link: Transport, request: GenerationRequest, admission: Admission) -> None:
        await self.note_prompt_texts(link, request)
        await super().run_job(link, request, admission)

    async def resume(self, link: Any, request: GenerationRequest, body: bytes, last_event_id: str) -> None:
        await self.note_prompt_texts(link, request)  # (a stream begun on another head: its frames' prompt too)
        await super().resume(link, request, body, last_event_id)

    async def note_prompt_texts(self, link: Any, request: GenerationRequest) -> None:
        """The result's ``prompt``: a token-id prompt's text (an id outside the vocabulary has
        none: the worker refuses that prompt, 400 naming it, as on /v1/completions)."""
        self.prompt_texts = {}
        for i, prompt in enumerate(request.prompts or [request.prompt]):
            if isinstance(prompt, list):
                with contextlib.suppress(ValueError):
                    sub = dataclasses.replace(request, prompt=prompt, prompts=None)
                    self.prompt_texts[i] = (await self.echo_texts([sub], link.hello.model if link.hello else None))[0]

    def prompt_tokens(self, index: int = 0) -> int:
        """The prompt's tokens (llama-server's ``tokens_evaluated``) of the choice ``index``."""
        jobs = list(self.sends.values())  # in choice order (a resumed stream's job too)
        return (jobs[index][0].prompt_tokens or 0) if index < len(jobs) else 0

    def native_final(self, request: GenerationRequest, reply: responses.Reply, event: Done, content: str) -> dict[str, Any]:
        """llama-server's final completion object (``content``: empty closing a stream, whose
        ``completion_probabilities`` came with its text but for its last tokens')."""
        final = responses.infill_final(request.model, content, event, whole_text="".join(reply.text), index=reply.index)
        at = reply.index // max(1, request.n)  # the prompt's (n_cmpl results each)
        prompt = request.prompts[at] if request.prompts else request.prompt
        final["generation_settings"] = responses.native_generation_settings(self.choice_of(request, reply.index), self.options.n_predict)
        final["prompt"] = prompt if isinstance(prompt, str) else self.prompt_texts.get(at, "")
        if request.logprobs is not None:  # n_probs, return_tokens
            entries = reply.closing_entries(event)
            if not request.stream:
                entries = reply.logprobs + entries
            self.add_token_fields(final, entries, closing=request.stream)
        return final

    @staticmethod
    def choice_of(request: GenerationRequest, index: int) -> GenerationRequest:
        """The result ``index``'s own request: its ``seed`` the one it sampled with (seed + j for
        the j-th of n_cmpl, as llama-server seeds its child tasks and echoes it)."""
        if request.n <= 1 and not request.prompts:
            return request
        choices = request.choices()
        return choices[index] if index < len(choices) else request

    def add_token_fields(self, frame: dict[str, Any], entries: list[dict[str, Any]], *, closing: bool = False) -> None:
        """``tokens`` (return_tokens) and ``completion_probabilities`` (n_probs) of the tokens
        whose ``entries`` these are (a closing frame's: only where some are left)."""
        if self.options.return_tokens:
            frame["tokens"] = [e["token_id"] for e in entries]
        if self.options.probabilities and (entries or not closing):
            frame["completion_probabilities"] = responses.native_probabilities(entries)

    def opening_frames(self, reply: responses.Reply) -> list[dict[str, Any]]:
        return []

    def delta_events(self, reply: responses.Reply, event: Delta) -> list[bytes]:
        held = len(reply.logprobs)
        reply.add(event)  # the whole text: the last frame's has_new_line (and n_probs' entries)
        if not event.text:
            return []
        frame = responses.infill_partial(event.text, event.tokens, self.prompt_tokens(reply.index), index=reply.index)
        if reply.want_logprobs:  # n_probs, return_tokens: the entries of the tokens whose text this is
            self.add_token_fields(frame, reply.logprobs[held:])
        return [responses.sse_event(frame)]

    def final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> list[dict[str, Any]]:
        return [responses.pick_fields(self.native_final(request, reply, event, ""), self.options.response_fields)]

    def choice_final_frames(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> list[dict[str, Any]]:
        return self.final_frames(request, reply, event)

    def final_body(self, request: GenerationRequest, reply: responses.Reply, event: Done) -> dict[str, Any]:
        return responses.pick_fields(self.native_final(request, reply, event, "".join(reply.text)), self.options.response_fields)

    def merged_stream_end(self, request: GenerationRequest, replies: list[responses.Reply], usage: dict[str, Any]) -> bytes:
        return b""

    def merged_body(self, request: GenerationRequest, replies: list[responses.Reply], dones: list[Done], usage: dict[str, Any]) -> Any:
        # several prompts: llama-server's array of results, in the prompts' order
        return [self.final_body(request, reply, dones[i]) for i, reply in enumerate(replies)]


class InfillConsumer(NativeCompletionConsumer):
    """llama-server's ``POST /infill`` (llama.vim, llama.vscode, Continue's llama.cpp provider):
    a fill-in-the-middle completion through the completions path (admission, keys, the
    completion class, --fim-model routing, activity rows and metrics under ``infill``), answered
    in llama-server's native shape, as ``/completion``."""

    endpoint = "infill"

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        request, self.options = parse_infill(body, models=models, strict=serving().strict_params)
        return request

    async def send_error(self, exc: ApiError) -> None:
        if exc.code == FIM_UNSUPPORTED and not self.headers_sent:
            # llama-server answers /infill on a model without FIM tokens 501 not_supported_error
            # (a route this model cannot serve, not a bad request); editors' plugins read it so
            exc = ApiError(501, exc.message, type="not_supported_error", param=exc.param, code=exc.code)
        await super().send_error(exc)

    def native_final(self, request: GenerationRequest, reply: responses.Reply, event: Done, content: str) -> dict[str, Any]:
        final = responses.infill_final(request.model, content, event, whole_text="".join(reply.text), index=reply.index)
        # llama-server's final result carries the settings it ran with on /infill too
        final["generation_settings"] = responses.native_generation_settings(self.choice_of(request, reply.index), self.options.n_predict)
        return final


class EmbeddingsConsumer(GenerationConsumer):
    """``POST /v1/embeddings``: admitted like any request (the key's class rules and limits),
    then one job on the worker, which embeds every input in its embeddings context, without a
    lane, and answers at once."""

    endpoint = "embeddings"

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        request, self.encoding_format = parse_embeddings_request(body, models=models, strict=serving().strict_params)
        return request

    async def run_job(self, link: Transport, request: GenerationRequest, admission: Admission) -> None:
        inputs = [list(p) if isinstance(p, list) else p for p in request.prompts or []]
        handle = await link.submit(
            request={"endpoint": "embeddings", "model": request.model, "inputs": inputs},
            qos=int(admission.qos),
            priority=admission.priority,
        )
        handle.key = admission.key_name
        self.record.request_id = handle.job_id
        try:
            while True:
                event = await handle.next_event()
                if isinstance(event, (Rejected, Error)):
                    raise link_error(event)
                if isinstance(event, Done):
                    break
        except asyncio.CancelledError:
            await link.cancel(handle)
            raise
        finally:
            link.finish(handle)
        self.record.finish_reason = event.finish_reason
        self.record.usage = dict(event.usage)
        # no queue at the worker (no timing in its Done): its wait was the router's, or for the worker to connect
        self.record.timing = {**self.seen_timing(), "queue_wait_ms": self.router_wait().get("waited_ms")}
        body = self.embeddings_body(request, event.embeddings or [], int(event.usage.get("prompt_tokens", 0)))
        await self.send_json(200, body, self.response_headers(handle, admission.qos))

    def embeddings_body(self, request: GenerationRequest, vectors: list[list[float]], tokens: int) -> Any:
        """The reply's body: OpenAI's list (llama-server's native shape: api/native_embeddings.py)."""
        data = [
            {"object": "embedding", "index": i, "embedding": responses.embedding_value(vector, self.encoding_format)}
            for i, vector in enumerate(vectors)
        ]
        return {"object": "list", "data": data, "model": request.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
