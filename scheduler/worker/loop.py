"""The engine worker: turns link messages into jobs and runs the tick loop.

One thread owns the scheduler and the engine. Between ticks it drains the inbox (submits,
cancels), then plans a tick, executes it on the engine, commits the result and sends text
deltas. Prompts are rendered and tokenised when they arrive, before the job is accepted, so a
request that cannot fit is rejected before the web side has sent any response; in the serving
worker that happens on a preparation thread (``prepare_in_thread``), so a huge prompt never
stalls the lanes, after a cheap size bound that refuses what cannot fit without tokenising it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.core.qos import QosClass, band_of
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Event, Job, JobState, SamplingParams, TickPlan, TickResult
from scheduler.engines import chat as chat_format
from scheduler.engines.base import Engine, EngineError, Unsupported
from scheduler.link.messages import (
    CONTEXT_LENGTH_EXCEEDED,
    DEADLINE_EXCEEDED,
    DUPLICATE_ID,
    EMPTY_PROMPT,
    ENGINE_ERROR,
    FIM_UNSUPPORTED,
    GRAMMAR_TOO_SLOW,
    INVALID_JOB,
    INVALID_MESSAGES,
    INVALID_PROMPT,
    INVALID_VALUE,
    SHUTDOWN,
    SHUTTING_DOWN,
    UNSUPPORTED_PARAMETER,
    Accepted,
    Cancel,
    Config,
    Delta,
    Done,
    Error,
    Hello,
    Message,
    Snapshot,
    Submit,
)
from scheduler.link.messages import Rejected as RejectedMsg

from .metrics import WorkerMetrics
from .output import TextStream
from .pressure import PressureMonitor
from .server import Connection, Disconnected, LinkServer

if TYPE_CHECKING:
    from scheduler.engines import grammar as grammars

log = logging.getLogger("superfluid.worker")

SNAPSHOT_INTERVAL_S = 0.1
# The longest the tick thread waits, ticking nothing, for an interactive or completion job's
# preparation (usually a millisecond or two) instead of starting a step that it would abort.
URGENT_PREPARE_HOLD_S = 0.1
# A prompt step an urgent arrival let run on (abort_grace_s) is aborted still if it has not ended
# this long after its estimated end.
ABORT_OVERRUN_S = 0.05


class Refusal(Exception):
    """A job the worker will not queue, with the reason the web side maps to an HTTP error."""

    def __init__(self, reason: str, detail: str, param: str | None = None) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.param = reason, detail, param


class Ended(Refusal):
    """A job with nothing to generate: submitted again after its worker was lost, which had
    delivered its last token (``max_tokens`` of them, or up to the end of the context) but not
    its Done; or one of ``max_tokens`` 0 (completions: the prompt alone, with echo + logprobs
    its scores). It is answered at once, ``length``, never queued."""

    def __init__(self, prompt_tokens: int, completion_tokens: int, prompt_logprobs: list[dict[str, Any]] | None = None) -> None:
        super().__init__("length", "nothing left to generate")
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        self.prompt_logprobs = prompt_logprobs


# The cheap bound checked before a prompt is rendered or tokenised: no token of a vocabulary we
# serve spans more characters than this, so a prompt with more than lane_ctx * this characters
# (or more messages than lane_ctx) cannot fit and is refused without tokenising it.
MAX_CHARS_PER_TOKEN = 128
MAX_PRIORITY = 2**53  # far beyond the seed's bands; a float holds it exactly
# Submit.waited_ms above this (a week) is refused like a malformed priority: no request waits so
# long at the router, and its arrival must stay a finite time on the worker's clock.
MAX_WAITED_MS = 7 * 86_400_000
COUNTED_IDS = 4096  # recent job ids remembered so that a resubmission is not counted again


@dataclass
class JobContext:
    job_id: str
    conn: Connection
    stream: TextStream
    prompt_tokens: int  # the client's prompt, before any resume text
    resume_tokens: int = 0  # completion tokens delivered by an earlier worker
    pending_text: list[str] = field(default_factory=list)
    logprobs: bool = False  # the request asked for logprobs
    lp_queue: list[dict[str, Any]] = field(default_factory=list)  # per sampled token, not yet matched
    pending_logprobs: list[dict[str, Any]] = field(default_factory=list)  # to send with the next delta
    held_logprobs: deque[dict[str, Any]] = field(default_factory=deque)  # of tokens whose text is not out yet
    entries_sent: int = 0  # the stream's tokens_out when entries last went to pending_logprobs
    prompt_logprobs: list[dict[str, Any]] | None = None  # echo + logprobs: the scored prompt
    waited_ms: float = 0.0  # Submit.waited_ms: its wait before this worker (the router), in its times
    # /infill's t_max_predict_ms (llama-server's; 0: off): the text ends at a token whose text
    # holds a new line once this long has passed since the first generated token
    t_max_predict_ms: int = 0
    preempted: bool = False  # preempted in this tick: the next Delta says so, with or without text
    # /slots' llama-server next_token: whether the request gave a limit (n_remain -1 where it did
    # not, as llama-server's) and whether its text so far holds a new line (has_new_line)
    limit_asked: bool = True
    has_new_line: bool = False
    text_out: bool = False  # a Delta of it has been queued (its first text never waits: _send_pending)
    # the output position of the token its text stopped at (a stop string, a limit): the reply
    # ends there, whatever a decode burst sampled after it (_finished)
    output_end: int | None = None


def slot_params(job: Job, ctx: JobContext | None) -> dict[str, Any]:
    """llama-server's /slots ``params`` of a busy lane (its task_params' to_json(only_metrics),
    the settings this server has): what the job samples with. ``seed`` the unsigned 32 bits
    (4294967295: none given, llama.cpp's default), ``n_predict``/``max_tokens`` -1 where the
    request gave no limit."""
    s = job.sampling
    limit = job.max_tokens if ctx is None or ctx.limit_asked else -1
    return {
        "seed": (s.seed if s.seed is not None else -1) & 0xFFFFFFFF,
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "typical_p": s.typical_p, "repeat_penalty": s.repeat_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "max_tokens": limit, "n_predict": limit,
        "ignore_eos": s.ignore_eos, "n_probs": s.logprobs or 0,
    }  # fmt: skip


class Prepared(Message):
    """Not on the wire: the preparation thread's result for one Submit, back to the tick thread."""

    type = "prepared"

    def __init__(
        self, job_id: str, built: tuple[Job, JobContext] | None, refusal: Refusal | None, embedded: tuple[list[list[float]], int] | None = None
    ) -> None:
        # ``embedded``: /v1/embeddings' vectors and the tokens they took (no job is built)
        self.id, self.built, self.refusal, self.embedded = job_id, built, refusal, embedded


class EngineWorker:
    def __init__(
        self,
        engine: Engine,
        config: SchedulerConfig,
        *,
        model_name: str,
        clock: Callable[[], float] = time.monotonic,
        completion_deadline_ms: int = 0,
        stream_interval_ms: int = 0,
        os_pressure: bool = False,
        pressure_monitor: PressureMonitor | None = None,
        prepare_in_thread: bool = False,
    ) -> None:
        self.engine = engine
        self.completion_deadline_ms = completion_deadline_ms
        # --stream-interval-ms: a running job's text goes out at most this often (its first text
        # and its end at once), so one link message, one wake-up of the web process and one SSE
        # event carry the tokens of several short decode rounds (_send_pending)
        self.stream_interval_s = stream_interval_ms / 1000.0
        self._paced_s = -math.inf  # when held text last went out (the worker's clock)
        self.pressure = (pressure_monitor or PressureMonitor()) if os_pressure else None
        self.model_name = model_name
        # An engine that aborts a running step (llama.cpp) lets the scheduler plan full prompt
        # chunks: an urgent arrival or a cancel no longer waits for the step in flight.
        config.abortable_steps = bool(getattr(engine, "abortable", False))
        # An engine whose decode round costs a pass per run of consecutive busy lanes
        # (llama.cpp's KV streams) has running jobs moved into free lanes, unless the config
        # says not to (serve --no-compact-lanes).
        config.compact_lanes = config.compact_lanes and bool(getattr(engine, "compact_lanes", False))
        # Decode rounds run in bursts while their text is held for the stream interval anyway:
        # no plan and commit between them (_burst_stop). 0 (a chunk per token): a round a tick.
        config.decode_bursts = self.stream_interval_s > 0
        self.scheduler = Scheduler(config, clock=clock)
        self.clock = clock
        self.inbox: queue.SimpleQueue[tuple[Connection, Message]] = queue.SimpleQueue()
        self.interrupt = threading.Event()
        self._abort_armed: int | None = None  # the prompt step an urgent arrival let run on (_interrupt)
        self.contexts: dict[str, JobContext] = {}
        # When each Submit reached this worker (the scheduler's clock), stamped by the reader
        # thread before it waits in the inbox for the tick in flight; taken by _submit. A job's
        # waits, time to first token and aging count from there (plus Submit.waited_ms), not
        # from when it was queued after its preparation.
        self._received: dict[str, float] = {}
        # the Submits read before drain() (stamped by the reader with _received): a drain refuses
        # only what reaches the worker after it began. One read before it is an accepted request
        # on its way (the link's order), which the drain runs like the jobs already queued, even
        # if it waits in the inbox behind a long tick when drain() lands.
        self._read_before_drain: set[str] = set()
        # the ids of the jobs counted in requests_total lately (insertion order, the oldest
        # forgotten past COUNTED_IDS): a job its web side submits again after a link drop
        # (same id, the text delivered) is one request, counted once
        self._counted: dict[str, None] = {}
        self._counted_lock = threading.Lock()  # a Redis link's pull thread marks ids too
        self._arrived: dict[str, float] = {}  # the same stamp, by id, for the Submits in ``preparing``
        # Submits being rendered and tokenised off the tick thread (prepare_in_thread), by id.
        # A cancel removes its entry; a result whose entry is gone is dropped.
        self.preparing: dict[str, Connection] = {}
        # the urgent ones among them: id -> when the tick thread stops waiting for it (monotonic)
        self._urgent_preparing: dict[str, float] = {}
        self._urgent_ready = False  # one of them was prepared in this turn of the loop
        # (0 urgent / 1 not, arrival number, ...): the prepare thread takes an interactive or
        # completion job before the agents' prompts handed over in the same drain, which would
        # otherwise hold it behind their rendering and tokenising (a 1,000-token prompt each)
        self._prepare_queue: queue.PriorityQueue[tuple[int, int, Connection, Submit]] | None = None
        self._prepare_order = itertools.count()
        # the embeddings thread's, in the same order: a search box's query (interactive) is not
        # held behind documents a background job queued before it (_embeddings_queue)
        self._embed_jobs: queue.PriorityQueue[tuple[int, int, Connection, Submit]] | None = None
        if prepare_in_thread:
            self._prepare_queue = queue.PriorityQueue()
            threading.Thread(target=self._prepare_loop, name="prepare", daemon=True).start()
        self.draining = False
        self.stopped = threading.Event()
        self.link: LinkServer | None = None
        self.metrics = WorkerMetrics()
        self._replanned = False
        # what the handling of the inbox answered since ``_take_messages`` began it: refusals
        # (or ends), and acceptances
        self._answered = self._accepted = False
        self._last_snapshot = 0.0
        self._last_occupancy: tuple[str | None, ...] = ()
        self.stats: dict[str, float] = {
            "peak_lanes_active": 0,
            "prompt_tokens_total": 0,
            "completion_tokens_total": 0,
            "requests_total": 0,
            "rejected_total": 0,
            "engine_errors_total": 0,
            "tick_seconds_total": 0.0,
            "last_ttft_ms": 0.0,
        }

    # -- link --------------------------------------------------------------------------

    # What the model's template and vocabulary say, once per worker (its engine is its model's
    # for its whole life): asked for each request, and tool_format in each snapshot's hello.
    @functools.cached_property
    def tool_format(self) -> str:
        """How the model writes tool calls in ``auto`` mode (``chat.tool_call_format``): its
        template's own format where the template is given the tools, else the generic one."""
        engine = self.engine
        return chat_format.tool_call_format(engine.chat_template, native="template_vars" in engine.features)

    @functools.cached_property
    def reasoning_format(self) -> str:
        """How the model writes its reasoning (``chat.reasoning_format``), from its template."""
        return chat_format.reasoning_format(self.engine.chat_template)

    @functools.cached_property
    def _takes_system(self) -> bool:
        """Whether the model's template writes a system message (``chat.takes_system_turn``):
        where not (Gemma 2's raises "System role not supported"), a request's system text opens
        its next message, as llama-server writes it, rather than being a 400."""
        return chat_format.takes_system_turn(self.engine.render_chat)

    @functools.cached_property
    def _kept_tool_tokens(self) -> dict[int, bytes]:
        """The control tokens of the model's tool-call format (Mistral's ``[TOOL_CALLS]``, Llama
        3.1's ``<|python_tag|>``), each one token that holds no text decoded as plain text: their
        text, which a reply that offers tools keeps (:meth:`_reply_token_bytes`)."""
        return self._kept_tokens(chat_format.TOOL_FORMAT_TOKENS.get(self.tool_format, ()))

    @functools.cached_property
    def _kept_reasoning_tokens(self) -> dict[int, bytes]:
        """The control tokens of the model's reasoning format (Mistral's ``[THINK]``,
        ``[/THINK]``): their text, which every chat reply keeps (:meth:`_reply_token_bytes`)."""
        return self._kept_tokens(chat_format.REASONING_FORMAT_TOKENS.get(self.reasoning_format, ()))

    def _kept_tokens(self, markers: tuple[str, ...]) -> dict[int, bytes]:
        """Each of ``markers`` that is one token holding no text decoded as plain text: its text."""
        engine, kept = self.engine, {}
        for marker in markers:
            try:
                ids = engine.tokenize(marker, add_special=False, special=True)
            except Exception:  # noqa: BLE001 - a vocabulary without it: nothing to keep
                continue
            if len(ids) == 1 and not engine.token_bytes(ids[0]):
                kept[ids[0]] = marker.encode()
        return kept

    def _reply_token_bytes(self, *, chat: bool, offers_tools: bool) -> Callable[[int], bytes]:
        """``engine.token_bytes`` for a reply: a chat reply's spells its reasoning format's
        control tokens, one that offers tools its tool format's. Decoded as plain text they hold
        none, and a call's opening or a reasoning block's would be lost (llama-server keeps them
        too: its chat format's ``preserved_tokens``)."""
        kept = {**(self._kept_reasoning_tokens if chat else {}), **(self._kept_tool_tokens if offers_tools else {})}
        plain = self.engine.token_bytes
        if not kept:
            return plain
        return lambda token: kept.get(token) or plain(token)

    def hello(self) -> Hello:
        meta = getattr(self.engine, "model_meta", None) or {}
        return Hello(
            model=self.model_name,
            engine=self.engine.name,
            n_lanes=self.engine.n_lanes,
            lane_ctx=self.engine.lane_ctx,
            pid=os.getpid(),
            # optional, for /v1/models' meta and /props
            n_ctx_train=self.engine.n_ctx_train or None,
            n_vocab=self.engine.vocab_size,
            n_embd=meta.get("n_embd") or None,
            n_params=meta.get("n_params") or None,
            model_size=meta.get("size") or None,
            model_ftype=meta.get("ftype") or None,
            # the model's own, else ChatML, which compile_chat_template renders it with
            chat_template=self.engine.chat_template or chat_format.CHATML,
            tool_format=self.tool_format,
            reasoning_format=self.reasoning_format,
        )

    def _on_message(self, message: Message) -> None:
        """Runs on a reader thread: stop the tick in flight when someone must not wait for it.

        An urgent Submit interrupts at once, also when prompts are prepared on their own thread:
        the tick thread hands it to that thread only between ticks, so waiting for the tick in
        flight (a full prompt chunk, seconds on a CPU) would delay the urgent job by that much.
        The tick thread then waits for its preparation (``_urgent_hold_s``); once prepared it
        interrupts again (``_prepare_loop``), for a tick begun after the wait ran out."""
        if isinstance(message, Submit):
            self._received[str(message.id)] = self.clock()
            if not self.draining:
                self._read_before_drain.add(str(message.id))
        if isinstance(message, Disconnected) or (isinstance(message, Cancel) and self._holds_lane(message.id)):
            self._interrupt()
        elif isinstance(message, Submit) and _urgent(message) and not _embeddings(message):
            # (an embeddings request takes no lane: aborting the step for it threw other
            # requests' prompt work away; its answer stops the tick once ready, _embed_loop)
            self._interrupt(urgent=True)

    def _holds_lane(self, job_id: str) -> bool:
        """Whether the job is in a lane (read on a reader thread: a moment's view). A cancel of a
        job that holds none (queued, parked, being prepared, unknown) frees nothing the step in
        flight holds up: aborting that step for it threw its prompt work away, and clients giving
        up in the queue of a loaded worker then kept a long prompt from ever being prefilled."""
        job = self.scheduler.jobs.get(str(job_id))
        return job is not None and job.lane is not None

    def _interrupt(self, urgent: bool = False) -> None:
        """Stop the tick in flight: between its engine steps, and inside a step that carries
        prompt tokens where the engine can abort one (llama.cpp rolls it back).

        For an urgent arrival, a prompt step expected to end within the grace
        (``abort_grace_s``) runs on: aborting it would throw its work away to save the urgent
        job less than that. A timer aborts it still if it runs past its estimated end (by
        ABORT_OVERRUN_S) or the grace, so the wait is bounded whatever the estimate."""
        self.interrupt.set()
        abort = getattr(self.engine, "abort_step", None)
        if abort is None:
            return
        grace = self.scheduler.config.abort_grace_s if urgent else 0.0
        eta = getattr(self.engine, "step_eta", None)
        in_flight = eta() if grace > 0 and eta is not None else None
        if in_flight is None or in_flight[1] > grace:
            abort()
            return
        serial = in_flight[0]
        if serial != self._abort_armed:  # one timer a step, however many arrive in its tail
            self._abort_armed = serial
            # a step that runs past its estimate (busy cores) is aborted then, not at the grace
            delay = min(grace, max(0.0, in_flight[1]) + ABORT_OVERRUN_S)
            timer = threading.Timer(delay, abort, kwargs={"serial": serial})
            timer.daemon = True
            timer.start()

    def serve(self, link: LinkServer, drain_timeout_s: float = 30.0) -> None:
        self.link = link
        self.link.start()
        try:
            self.run(drain_timeout_s)
        finally:
            self.link.close()

    # -- messages ----------------------------------------------------------------------

    def handle(self, conn: Connection, message: Message) -> None:
        if isinstance(message, Submit):
            self._submit(conn, message)
        elif isinstance(message, Prepared):
            self._prepared(conn, message)
        elif isinstance(message, Cancel):
            self._arrived.pop(message.id, None)
            if self.preparing.pop(message.id, None) is None:
                self.scheduler.cancel(message.id)
        elif isinstance(message, Disconnected):
            # A link to a web side dropped (``link``: a connection of all its jobs, not a Redis run
            # of one job, which may end so because its client cancelled it): not a client's
            # cancel. The web side submits each job again on its next connection, and that one's
            # finish counts the request (its prompt once); the tokens generated here count now,
            # the resubmitted job counts only its own.
            for ctx in [c for c in self.contexts.values() if c.conn is conn]:
                if not message.link:
                    self.scheduler.cancel(ctx.job_id)
                    continue
                del self.contexts[ctx.job_id]
                # counted at its admission: remembered as the newest, so that the ids of the jobs
                # admitted since it (a long job outlives thousands of short ones) do not push it
                # out before its resubmission arrives
                self.mark_counted(ctx.job_id)
                job = self.scheduler.jobs.get(ctx.job_id)
                if job is not None:
                    self.stats["completion_tokens_total"] += len(job.output)
                    self.metrics.on_dropped(job)
                self.scheduler.cancel(ctx.job_id, counted=False)
            for job_id in [j for j, c in self.preparing.items() if c is conn]:
                del self.preparing[job_id]
                self._arrived.pop(job_id, None)
            # their ends now, not at the next tick: a web side that reconnects submits each job
            # again under its id (with the text delivered), maybe in this same inbox drain
            self._process(self.scheduler.drain_events())
        elif isinstance(message, Config):
            self.configure(message)
        else:
            log.warning("unexpected link message %r", message.type)

    def _refuse(self, conn: Connection, job_id: str, refusal: Refusal) -> None:
        self._answered = True
        if isinstance(refusal, Ended):
            conn.queue(Accepted(job_id, refusal.usage["prompt_tokens"], refusal.prompt_logprobs))
            conn.queue(Done(job_id, "length", usage=refusal.usage))
            return
        self.stats["rejected_total"] += 1
        conn.queue(RejectedMsg(job_id, refusal.reason, refusal.detail, refusal.param))

    def _submit(self, conn: Connection, message: Submit) -> None:
        job_id = str(message.id)
        # when it arrived: stamped as it was read (see _on_message), else now
        now = self.clock()
        received = self._received.pop(job_id, now)
        received = received if received <= now else now
        read_before_drain = job_id in self._read_before_drain
        self._read_before_drain.discard(job_id)
        try:
            if self.draining and not read_before_drain:
                raise Refusal(SHUTTING_DOWN, "The server is shutting down.")
            if job_id in self.contexts or job_id in self.preparing:
                raise Refusal(DUPLICATE_ID, f"duplicate job id {job_id}")
            embeddings = _embeddings(message)
            if embeddings and self._prepare_queue is None:
                self._answer_embeddings(conn, job_id, self._embed(message, lambda: True))
                return
            if embeddings:
                # on a thread of their own: seconds of forwards would hold the prepare thread,
                # and every chat waiting there to be tokenised, as they held the tick thread
                self.preparing[job_id] = conn
                self._embeddings_queue().put((0 if _urgent(message) else 1, next(self._prepare_order), conn, message))
                return
            self._check_size(message)
            if self._prepare_queue is not None:
                self.preparing[job_id] = conn
                self._arrived[job_id] = received
                urgent = _urgent(message)
                if urgent:
                    self._urgent_preparing[job_id] = time.monotonic() + URGENT_PREPARE_HOLD_S
                self._prepare_queue.put((0 if urgent else 1, next(self._prepare_order), conn, message))
                return
            job, ctx = self._build(conn, message)
        except Refusal as exc:
            self._refuse(conn, job_id, exc)
            return
        self._admit(conn, job, ctx, received)

    def _embed(self, message: Submit, wanted: Callable[[], bool]) -> tuple[list[list[float]], int] | None:
        """``/v1/embeddings``: (every input's vector, the tokens they took), on the embeddings
        thread (an embedding is a prefill-sized forward in the engine's embeddings context,
        seconds for a request of long inputs: on the tick thread it held every stream meanwhile);
        it takes no lane and never queues. None once ``wanted()`` says no one waits for it (cancelled,
        its connection gone), checked before each input. Any failure refuses this request alone:
        one raised out of the embeddings thread ended it, and every later request hung."""
        try:
            return self._embed_inputs(message, wanted)
        except Refusal:
            raise
        except Exception as exc:
            log.exception("cannot embed submit %s", message.id)
            raise Refusal(INVALID_JOB, f"The engine worker could not embed this request: {exc}") from None

    def _embed_inputs(self, message: Submit, wanted: Callable[[], bool]) -> tuple[list[list[float]], int] | None:
        engine, request = self.engine, message.request
        embed = getattr(engine, "embed", None)
        if embed is None or "embeddings" not in engine.features:
            raise Refusal(UNSUPPORTED_PARAMETER, f"Embeddings are not supported by the {engine.name} engine.", "input")
        inputs = request.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise Refusal(INVALID_VALUE, "Invalid value for 'input': expected a non-empty string or array.", "input")
        limit = engine.lane_ctx
        # a text as llama-server embeds it (its EOS too where the model asks for one)
        tokenize = getattr(engine, "embedding_tokens", engine.tokenize)
        tokenized = []  # every input checked before any is embedded: a refusal costs no forward
        for i, item in enumerate(inputs):
            tokens = [int(t) for t in item] if isinstance(item, list) else tokenize(str(item))
            if any(not 0 <= t < engine.vocab_size for t in tokens):
                raise Refusal(INVALID_VALUE, f"Token ids in 'input' must be between 0 and {engine.vocab_size - 1}.", "input")
            if not tokens:
                raise Refusal(INVALID_VALUE, f"Invalid value for 'input': input {i} holds no tokens.", "input")
            if len(tokens) > limit:
                raise Refusal(CONTEXT_LENGTH_EXCEEDED, f"This model's maximum context length is {limit} tokens. However, input {i} holds {len(tokens)} tokens.", "input")
            tokenized.append(tokens)
        vectors = []
        for i, tokens in enumerate(tokenized):
            if i and not _urgent(message):
                self._embed_urgent_waiting()
            if not wanted():
                return None
            try:
                vectors.append(embed(tokens))
            except Unsupported as exc:
                raise Refusal(UNSUPPORTED_PARAMETER, str(exc), "input") from None
            except EngineError as exc:
                raise Refusal(INVALID_JOB, f"The input could not be embedded: {exc}", "input") from None
        return vectors, sum(len(tokens) for tokens in tokenized)

    def _answer_embeddings(self, conn: Connection, job_id: str, embedded: tuple[list[list[float]], int] | None) -> None:
        """On the tick thread: an embeddings request's Accepted and Done, counted."""
        if embedded is None:
            return
        vectors, total = embedded
        self._answered = True  # a whole answer: it leaves at once (_take_messages)
        self.stats["requests_total"] += 1
        self.stats["prompt_tokens_total"] += total  # a finished request's prompt, as _finished counts one
        conn.queue(Accepted(job_id, total))
        conn.queue(Done(job_id, "stop", usage={"prompt_tokens": total, "completion_tokens": 0}, embeddings=vectors))

    def _admit(self, conn: Connection, job: Job, ctx: JobContext, received_s: float) -> None:
        """Queue a prepared job. ``received_s``: when its Submit reached this worker. Its queue
        wait, time to first token and score aging count from its arrival: that, less the wait
        the web side reports before it (``waited_ms``: the router's, with several models), so
        the histograms and its Done timing hold the whole wait. Its class aging and its start
        deadline count from ``received_s``: only the time this worker held it (the router
        already ordered the wait before it)."""
        # a start deadline, for a job that has not started: not for one submitted again with the
        # text it had streamed when its worker was lost (its client's stream is under way)
        if job.qos is QosClass.COMPLETION and self.completion_deadline_ms > 0 and not (ctx.resume_tokens or job.resumed):
            job.deadline_s = received_s + self.completion_deadline_ms / 1000.0
        self.scheduler.add(job, arrival_s=received_s - ctx.waited_ms / 1000.0, enqueued_s=received_s)
        self.contexts[job.job_id] = ctx
        self.metrics.on_queued(job.job_id)
        if job.job_id not in self._counted:
            self.stats["requests_total"] += 1
            self.mark_counted(job.job_id)
        self._accepted = True
        conn.queue(Accepted(job.job_id, ctx.prompt_tokens, ctx.prompt_logprobs))

    def mark_counted(self, job_id: str) -> None:
        """Remember the job as counted in requests_total, so that it is not counted again when
        its web side submits it again after a link drop, or, in a Redis fleet, when it resumes
        here after the worker that ran it (and counted it) was lost."""
        with self._counted_lock:
            self._counted.pop(job_id, None)  # the newest again: forgotten last
            self._counted[job_id] = None
            if len(self._counted) > COUNTED_IDS:
                del self._counted[next(iter(self._counted))]

    def _prepared(self, conn: Connection, result: Prepared) -> None:
        """``conn``: the connection of the Submit that was prepared (the inbox carries it)."""
        if self.preparing.get(result.id) is not conn:
            # cancelled, or its connection closed, while it was being prepared; or that, then the
            # job submitted again on another connection, whose own result is still to come
            return
        del self.preparing[result.id]
        if self._urgent_preparing.pop(result.id, None) is not None:
            self._urgent_ready = True
        received = self._arrived.pop(result.id, None)
        if result.refusal is not None:
            self._refuse(conn, result.id, result.refusal)
            return
        if result.embedded is not None:
            self._answer_embeddings(conn, result.id, result.embedded)
            return
        assert result.built is not None
        self._admit(conn, *result.built, self.clock() if received is None else received)

    def _prepare_loop(self) -> None:
        """The preparation thread: renders and tokenises prompts so the tick thread never does."""
        assert self._prepare_queue is not None
        while True:
            _rank, _order, conn, message = self._prepare_queue.get()
            self._prepare_and_hand_over(conn, message)

    def _hand_over(self, conn: Connection, message: Submit, result: Prepared) -> None:
        """A prepared Submit to the tick thread. An urgent one's stops the tick in flight first:
        before the result is in the inbox, so the tick that takes it from there is never the one
        this stops (the tick thread clears the flag, then drains the inbox). Only a job to start
        aborts the step in flight: a refusal or an embeddings answer takes no lane, and waits for
        the step, whose prompt work an abort would throw away for no one."""
        if _urgent(message):
            if result.built is not None:
                self._interrupt(urgent=True)
            else:
                self.interrupt.set()
        self.inbox.put((conn, result))

    def _embeddings_queue(self) -> queue.PriorityQueue[tuple[int, int, Connection, Submit]]:
        """The embeddings thread's queue (the thread started with the first request)."""
        if self._embed_jobs is None:
            self._embed_jobs = queue.PriorityQueue()
            threading.Thread(target=self._embed_loop, args=(self._embed_jobs,), name="embeddings", daemon=True).start()
        return self._embed_jobs

    def _embed_loop(self, jobs: queue.PriorityQueue[tuple[int, int, Connection, Submit]]) -> None:
        """The embeddings thread: each request's inputs embedded, the result back to the tick
        thread (as the prepare thread's)."""
        while True:
            _rank, _order, conn, message = jobs.get()
            self._prepare_and_hand_over(conn, message)

    def _embed_urgent_waiting(self) -> None:
        """On the embeddings thread, between two inputs of a request of the other classes: the
        interactive and completion requests queued meanwhile are embedded and answered first. A
        search box's query waited for every input of a background batch of documents in flight
        (seconds each for long inputs); it waits for one input now. Only this thread takes from
        the queue, so what the peek saw is what ``get_nowait`` returns."""
        jobs = self._embed_jobs
        while jobs is not None:
            with jobs.mutex:
                if not jobs.queue or jobs.queue[0][0] != 0:
                    return
            _rank, _order, conn, message = jobs.get_nowait()
            self._prepare_and_hand_over(conn, message)

    def _prepare_and_hand_over(self, conn: Connection, message: Submit) -> None:
        """A queued Submit prepared on this thread (prepare or embeddings) and handed to the tick
        thread, unless it is no longer wanted."""
        result = self._prepare_one(conn, message)
        if result is not None:
            self._hand_over(conn, message, result)

    def _prepare_one(self, conn: Connection, message: Submit) -> Prepared | None:
        """One queued Submit prepared (its job, or its refusal); None when it is no longer
        wanted: cancelled before its turn, or its connection closed (a job submitted again on
        another connection is queued again, with that connection)."""
        if self.preparing.get(message.id) is not conn:
            return None
        try:
            if _embeddings(message):
                embedded = self._embed(message, lambda: self.preparing.get(message.id) is conn)
                return None if embedded is None else Prepared(message.id, None, None, embedded)
            return Prepared(message.id, self._build(conn, message), None)
        except Refusal as exc:
            return Prepared(message.id, None, exc)

    def _urgent_hold_s(self) -> float:
        """How much longer the tick thread waits for an urgent job being prepared (0: none).

        An interactive or completion Submit stops the step in flight at once, then waits for
        its preparation on the prepare thread. A prompt step begun meanwhile (a full 512-token
        chunk, a second or more here) would be aborted the moment the job is ready, its work
        lost, and the abort itself takes up to a graph node's time. So the tick thread ticks
        nothing until the job is prepared, for at most URGENT_PREPARE_HOLD_S."""
        if not self._urgent_preparing:
            return 0.0
        self._urgent_preparing = {j: until for j, until in self._urgent_preparing.items() if j in self.preparing}
        return max(0.0, max(self._urgent_preparing.values(), default=0.0) - time.monotonic())

    def _build(self, conn: Connection, message: Submit) -> tuple[Job, JobContext]:
        """The job for a Submit; Refusal if it cannot be one (any failure refuses this job alone)."""
        try:
            return self._build_job(message.id, conn, message)
        except Refusal:
            raise
        except Exception as exc:  # a malformed Submit must not take the worker down
            log.exception("cannot make a job of submit %s", message.id)
            raise Refusal(INVALID_JOB, f"The engine worker could not prepare this request: {exc}") from None

    def _check_size(self, message: Submit) -> None:
        """Refuse, without rendering or tokenising, a prompt that cannot fit the context."""
        request = message.request if isinstance(message.request, dict) else {}
        limit = self.engine.lane_ctx
        messages = request.get("messages")
        if isinstance(messages, list):
            if len(messages) > limit:
                raise Refusal(CONTEXT_LENGTH_EXCEEDED, f"This model's maximum context length is {limit} tokens; {len(messages)} messages cannot fit in it.", "messages")
            chars = chat_format.chat_text_chars(messages, request.get("tools"), request.get("chat_template_kwargs"))
            param = "messages"
        else:
            prompt, suffix = request.get("prompt"), request.get("suffix")
            chars = (len(prompt) if isinstance(prompt, (str, list)) else 0) + (len(suffix) if isinstance(suffix, str) else 0)
            chars += fim_extra_chars(request)  # /infill: the typed text and the context chunks
            param = "prompt"
        if chars > limit * MAX_CHARS_PER_TOKEN:
            raise Refusal(
                CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {limit} tokens; {chars} characters in the {param} cannot fit in it.",
                param,
            )
        priority = message.priority
        if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise Refusal(INVALID_JOB, "The priority is not an integer in range.")
        _waited_ms(message)
        stop = request.get("stop")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise Refusal(INVALID_JOB, "'stop' must be a list of strings.", "stop")

    def _chat_tokens(
        self, messages: list[dict[str, Any]], resume_text: str = "", extra: dict[str, Any] | None = None, *, offers_tools: bool = False, prefill: str = ""
    ) -> tuple[list[int], int]:
        """(the rendered conversation's tokens followed by ``resume_text``'s, how many are the
        conversation's, a ``prefill``'s with them): the client's text tokenised as text
        (``chat.chat_prompt_tokens``)."""
        engine = self.engine
        template_vars = dict(extra or {})
        offered = template_vars.pop("tools", None)  # the tools the template renders, passed with the messages

        def render(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            # extra template variables (tools, chat_template_kwargs, today's date) only where there are any
            variables = template_vars if tools is None else {**template_vars, "tools": tools}
            return engine.render_chat(msgs, **variables) if variables else engine.render_chat(msgs)

        # the control tokens whose text the reply so far holds: a resumed reply's are tokens again
        kept = chat_format.REASONING_FORMAT_TOKENS.get(self.reasoning_format, ())
        if offers_tools:  # (a reply that offers tools keeps its format's: _reply_token_bytes)
            kept += chat_format.TOOL_FORMAT_TOKENS.get(self.tool_format, ())
        return chat_format.chat_prompt_tokens(render, engine.tokenize, messages, offered, resume_text, kept, prefill)

    def _prompt_tokens(self, request: dict[str, Any], resume_text: str) -> tuple[list[int], int, str, int]:
        """(tokens to prefill, tokens of the client's own prompt, the param errors refer to, how
        many leading tokens are the prompt's own text: what ``echo`` + ``logprobs`` scores; with
        ``suffix`` only the FIM prompt's head up to the prefix, not the suffix or the markers)."""
        engine = self.engine

        def resumed(own: list[int]) -> list[int]:
            # the reply so far is text the model wrote after the prompt (a control token it
            # sampled has no text: "<|im_end|>" in it was written as text), tokenised after it
            return engine.tokenize(resume_text, add_special=False, special=False, after=own[-1] if own else None) if resume_text else []

        if request.get("endpoint") == "chat":
            # a last assistant turn the reply continues: the prompt ends with its text
            turns, prefill = chat_format.split_prefill(request["messages"], bool(request.get("prefill")))
            try:
                features = engine.features
                messages, extra = chat_format.template_inputs(
                    turns,
                    # tool_choice "none" too: the model sees the tools, as llama-server's
                    # template is given them (and OpenAI's model), and may not call them
                    request.get("tools"),
                    engine.chat_template,
                    request.get("chat_template_kwargs"),
                    native_ok="template_vars" in features,
                )
                if messages and messages[0].get("role") == "system" and not self._takes_system:
                    messages = chat_format.merge_system_turn(messages)
                offers_tools = bool(request.get("tools")) and request.get("tool_choice", "auto") != "none"
                # (a conversation the template refuses, agents' as a matter of course: as it may take it)
                (tokens, own_len), messages = chat_format.rendered_or_fixed(
                    lambda msgs: self._chat_tokens(msgs, resume_text, extra, offers_tools=offers_tools, prefill=prefill), messages
                )
                thinks = prefill and "template_vars" in features and chat_format.prefill_thinks(engine.render_chat, messages, extra)
            except Exception as exc:  # a template's raise_exception, or a malformed message
                raise Refusal(INVALID_MESSAGES, f"The chat template rejected the messages: {exc}", "messages") from None
            if thinks:
                raise Refusal(INVALID_MESSAGES, chat_format.PREFILL_THINKING, "messages")
            return tokens, own_len, "messages", own_len
        prompt = request.get("prompt")
        suffix = request.get("suffix")
        if suffix is not None:
            fim = engine.fim_tokens()
            if fim is None:
                if request.get("fim_extra") is not None:  # POST /infill
                    # llama-server's words, which its clients match on
                    raise Refusal(FIM_UNSUPPORTED, "Infill is not supported by this model: it has no fill-in-the-middle tokens.", "input_suffix")
                raise Refusal(FIM_UNSUPPORTED, "This model has no fill-in-the-middle tokens; 'suffix' is not supported.", "suffix")
            pre, suf, mid = fim
            # the prefix is the prompt, as text or as token ids (never dropped). Prefix and suffix
            # are the client's code, tokenised as text: a source file that mentions
            # "<|fim_middle|>" must not end the prefix there. BOS first when the vocabulary asks
            # for one, as llama.cpp's server assembles an infill prompt.
            prefix = self._prompt_ids(prompt) if isinstance(prompt, list) else engine.tokenize(str(prompt or ""), add_special=False, special=False)
            bos = engine.tokenize("", special=False)  # [BOS] or []
            typed = engine.tokenize(str(request.get("fim_prompt") or ""), add_special=False, special=False)
            suffix_ids = engine.tokenize(suffix, add_special=False, special=False)
            max_tokens = request.get("max_tokens")
            # the completion's room: n_predict, or (none given) a quarter of the context, as
            # llama-server's n_batch caps the FIM prompt below n_ctx
            reserve = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else engine.lane_ctx // 4
            fit = engine.lane_ctx - reserve - len(bos) - 3 - len(typed)
            if request.get("fim_extra") is not None and len(prefix) + len(suffix_ids) > fit > 0:
                # /infill cuts what does not fit, as llama-server's format_infill: the suffix's
                # head (a quarter of the room, or what the prefix leaves) and the prefix's tail
                n_suffix = min(len(suffix_ids), max(fit // 4, fit - len(prefix)))
                prefix, suffix_ids = prefix[len(prefix) - (fit - n_suffix) :], suffix_ids[:n_suffix]
            core = [*bos, pre, *prefix, *typed, suf, *suffix_ids, mid]
            extra = self._fim_extra_tokens(request.get("fim_extra"))
            # /infill's context chunks fill what the FIM prompt and the completion leave of the
            # context, their tail kept (llama-server's n_extra_take)
            room = max(0, engine.lane_ctx - len(core) - reserve)
            extra = extra[len(extra) - room :] if len(extra) > room else extra
            own = [*extra, *core]
            return own + resumed(own), len(own), "prompt", len(extra) + len(bos) + 1 + len(prefix)
        if isinstance(prompt, list):
            own = self._prompt_ids(prompt)
            return own + resumed(own), len(own), "prompt", len(own)
        own = engine.tokenize(str(prompt))
        return own + resumed(own), len(own), "prompt", len(own)

    def _fim_extra_tokens(self, chunks: Any) -> list[int]:
        """``POST /infill``'s context before the FIM prompt, as llama-server's format_infill lays
        it out (repo-level FIM): ``FIM_REP "myproject\\n"`` where the model has FIM_REP; per chunk
        ``FIM_SEP filename "\\n"`` (or, without FIM_SEP, a ``--- snippet ---`` line) and its
        text; then ``FIM_SEP "filename\\n"``. None (``/v1/completions``' ``suffix``): nothing."""
        if chunks is None:
            return []
        engine = self.engine

        def text(t: str) -> list[int]:
            return engine.tokenize(t, add_special=False, special=False)

        sep, rep = engine.fim_repo_tokens()
        out: list[int] = [rep, *text("myproject\n")] if rep is not None else []
        for filename, body in chunks:
            out += [sep, *text(str(filename) + "\n")] if sep is not None else text("\n\n--- snippet ---\n\n")
            out += text(str(body))
        if sep is not None:
            out += [sep, *text("filename\n")]
        return out

    def _prompt_ids(self, prompt: list[Any]) -> list[int]:
        """A token-array prompt, checked against the model's vocabulary."""
        vocab = self.engine.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise Refusal(INVALID_PROMPT, f"Token ids in 'prompt' must be between 0 and {vocab - 1}.", "prompt")
        return [int(t) for t in prompt]

    def _build_job(self, job_id: str, conn: Connection, message: Submit) -> tuple[Job, JobContext]:
        request = message.request
        resume_text = str(message.resume_text or "")
        resume_tokens = int(message.resume_tokens or 0)
        tokens, own_len, param, echoed = self._prompt_tokens(request, resume_text)
        ctx_limit = self.engine.lane_ctx
        if not tokens:
            raise Refusal(EMPTY_PROMPT, "The prompt is empty.", param)
        max_tokens = request.get("max_tokens")
        if max_tokens is not None and request.get("max_tokens_is_cap") is True and own_len + max_tokens > ctx_limit:
            max_tokens = None  # a cap (GenerationRequest.max_tokens_is_cap): the context's end bounds the reply
        budget = (max_tokens if max_tokens is not None else ctx_limit - own_len) - resume_tokens
        if (resume_text or resume_tokens) and own_len < ctx_limit and (budget <= 0 or len(tokens) >= ctx_limit):
            raise Ended(own_len, resume_tokens)  # its text had reached max_tokens or the context
        if len(tokens) >= ctx_limit or (max_tokens is not None and own_len + max_tokens > ctx_limit):
            detail = f"{own_len} tokens in the {param}"
            if max_tokens is not None:
                detail += f" and {max_tokens} in the completion ({own_len + max_tokens} in all)"
            raise Refusal(
                CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {ctx_limit} tokens. However, you requested {detail}. "
                "Please reduce the length of the prompt or the completion.",
                param,
            )
        sampling = self._sampling(request, thinking=self._thinking(request, tokens[:own_len]))
        if max_tokens == 0 and not (resume_text or resume_tokens):
            # nothing to generate (completions max_tokens 0): the prompt's own answer, its scores
            # with echo + logprobs, and no lane
            scored = self._prompt_logprobs(tokens[:echoed], sampling.logprobs) if request.get("echo") and sampling.logprobs is not None else None
            raise Ended(own_len, 0, scored)
        qos = QosClass(int(message.qos))
        job = Job(
            job_id=job_id,
            prompt=tokens,
            max_tokens=max(1, budget),
            sampling=sampling,
            qos=qos,
            priority=int(message.priority),
            batch_invariant=bool(message.batch_invariant),
            pin_prefix=bool(message.pin_prefix),
            cache_scope=message.cache_scope,
            request_of=str(message.request_of or ""),
            # the text a lost worker had sent already, as the prompt ends with it: a grammar
            # goes on from where it was
            resumed=tokens[own_len:],
        )
        # a forced tool call (tool_choice required or a named function) is tool-call markup from
        # its first token to its last (the grammar allows nothing else): the client's stop strings
        # apply to content, and one matched inside the markup cut the call it had required
        forced_call = bool(request.get("tools")) and request.get("tool_choice", "auto") not in ("auto", "none")
        # a stop string begun in the text a lost worker had sent already ends in this one's
        stop = [] if forced_call else list(request.get("stop") or [])
        offers_tools = bool(request.get("tools")) and request.get("tool_choice", "auto") != "none"
        token_bytes = self._reply_token_bytes(chat=request.get("endpoint") == "chat", offers_tools=offers_tools)
        stream = TextStream(token_bytes, stop, resume_text or "", n_indent=int(request.get("n_indent") or 0))
        ctx = JobContext(job_id, conn, stream, own_len, resume_tokens, logprobs=sampling.logprobs is not None)
        ctx.t_max_predict_ms = int(request.get("t_max_predict_ms") or 0)
        ctx.limit_asked, ctx.has_new_line = max_tokens is not None, "\n" in resume_text
        ctx.waited_ms = float(message.waited_ms)  # checked in _check_size, as the priority
        if request.get("echo") and sampling.logprobs is not None:
            ctx.prompt_logprobs = self._prompt_logprobs(tokens[:echoed], sampling.logprobs)
        return job, ctx

    def _sampling(self, request: dict[str, Any], thinking: grammars.Thinking | None = None) -> SamplingParams:
        """The request's sampler settings; a feature the engine lacks, a token id outside the
        vocabulary or a constraint that does not compile refuses the job naming the parameter
        (a 400 on the web side); a malformed number refuses it too (TypeError/ValueError)."""
        from scheduler.engines import grammar as grammars

        engine = self.engine
        features = engine.features

        def need(feature: str, param: str) -> None:
            if feature not in features:
                raise Refusal(UNSUPPORTED_PARAMETER, f"'{param}' is not supported by the {engine.name} engine.", param)

        kwargs = _numbers(request, _SIMPLE_SAMPLING)
        typical = _numbers(request, ("typical_p",)).get("typical_p")
        if typical not in (None, 1.0):
            need("typical_p", "typical_p")
            kwargs["typical_p"] = typical
        if request.get("ignore_eos"):
            need("ignore_eos", "ignore_eos")
            kwargs["ignore_eos"] = True
        bias = [(int(t), float(b)) for t, b in request.get("logit_bias") or []]
        if bias:
            need("logit_bias", "logit_bias")
            vocab = engine.vocab_size
            bad = [t for t, _ in bias if not 0 <= t < vocab]
            if bad:
                raise Refusal(INVALID_VALUE, f"Invalid value for 'logit_bias': token id {bad[0]} is not in the vocabulary (0 to {vocab - 1}).", "logit_bias")
            if not all(math.isfinite(b) for _, b in bias):
                raise ValueError("logit_bias values must be finite")
            kwargs["logit_bias"] = tuple(bias)
        if request.get("logprobs") is not None:
            need("logprobs", "logprobs")
            kwargs["logprobs"] = int(request["logprobs"])
        tools, choice = request.get("tools"), request.get("tool_choice", "auto")
        param = "tools"  # a forced call's grammar is made of the tools' parameters
        lazy: str | None = None
        # a template that refuses a turn of several calls (Llama 3.x's) gets one at a time, as
        # llama.cpp turns parallel_tool_calls off for it: several would be refused next turn
        parallel = bool(request.get("parallel_tool_calls", True)) and self.tool_format not in chat_format.SINGLE_CALL_FORMATS
        try:
            grammar = grammars.tool_grammar(tools or [], choice, parallel, fmt=self.tool_format) if tools else None
            if grammar is None and tools and choice == "auto" and request.get("response_format"):
                param = "response_format"  # a tool call, or an answer in the format
                grammar = grammars.tools_or_format_grammar(tools, parallel, request["response_format"])
            elif grammar is None and tools and choice == "auto":
                grammar = lazy = self._lazy_tool_grammar(tools, parallel, thinking)  # (checked there)
            elif grammar is None:
                param = "response_format"
                grammar = grammars.response_grammar(request.get("response_format"))
            if grammar is not None:
                grammars.check_bounds(grammar)  # before the engine's parser, which can crash on it
        except grammars.GrammarError as exc:
            raise Refusal(INVALID_VALUE, f"Invalid value for '{param}': {exc}", param) from None
        if grammar is not None and grammar is not lazy:
            need("grammar", param)
            problem = engine.check_grammar(grammar)
            if problem:
                raise Refusal(INVALID_VALUE, f"Invalid value for '{param}': the constraint does not compile ({problem}).", param)
        if grammar is not None:
            kwargs["grammar"] = grammar
        return SamplingParams(**kwargs)

    def _thinking(self, request: dict[str, Any], prompt: list[int]) -> grammars.Thinking | None:
        """Where a chat reply's reasoning block is, for ``tool_choice`` auto's grammar (which
        leaves the block free): opened where the prompt ends by opening it (the template's
        generation prompt, unless the request turned thinking off), else one the reply may open,
        with the model's reasoning format's markers (``<think>``, Magistral's ``[THINK]``); None
        where the model has no such block. After a prefill (the client's text the prompt ends
        with) the block is open where the template's text before it opened one and the prefill
        did not close it, or where the prefill opens one it leaves open."""
        from scheduler.engines import grammar as grammars

        block = chat_format.REASONING_BLOCKS.get(self.reasoning_format)
        if request.get("endpoint") != "chat" or block is None or not request.get("tools"):
            return None
        spell = self._reply_token_bytes(chat=True, offers_tools=True)
        _turns, prefill = chat_format.split_prefill(request["messages"], bool(request.get("prefill")))
        # (a prefill's tokens are its text's, at least a byte each: the template's last 16 before them)
        tail = b"".join(spell(t) for t in prompt[-(16 + len(prefill.encode("utf-8", "replace"))) :]).decode("utf-8", "replace")
        if prefill and tail.endswith(prefill):
            tail = tail[: -len(prefill)]
        opening, closing = block
        opened = tail.rstrip().endswith(opening)
        if prefill and (opening in prefill or closing in prefill):
            opened = prefill.rfind(opening) > prefill.rfind(closing)
        return grammars.Thinking(opened, opening, closing)

    def _lazy_tool_grammar(self, tools: list[dict[str, Any]], parallel: bool, thinking: grammars.Thinking | None = None) -> str | None:
        """``tool_choice`` auto's grammar (llama-server's lazy grammar): free text, and a call the
        model opens held to the tools' parameters (``grammar.lazy_tool_grammar``); a model that
        answers in harmony channels (gpt-oss) gets that format's, whose calls are a message to
        ``functions.NAME``, whatever its tool format says. None, as before, where it cannot be:
        an engine without a grammar sampler, tools whose parameters no grammar holds (a forced
        call of them is a 400; an auto reply stays free, as it always was). ``thinking``: where
        the reply's reasoning block is (:meth:`_thinking`), which stays free whole."""
        from scheduler.engines import grammar as grammars

        if "grammar" not in self.engine.features:
            return None
        fmt = "harmony" if self.reasoning_format == "harmony" else self.tool_format
        try:
            grammar = grammars.lazy_tool_grammar(tools, parallel, fmt=fmt, thinking=thinking)
            if grammar is not None:
                grammars.check_bounds(grammar)
        except grammars.GrammarError as exc:
            log.info("tool_choice auto left free: the tools' parameters cannot be held to (%s)", exc)
            return None
        if grammar is not None and self.engine.check_grammar(grammar):
            log.info("tool_choice auto left free: the engine does not compile the tools' grammar")
            return None
        return grammar

    # -- ticks -------------------------------------------------------------------------

    def _drain_inbox(self, block_s: float) -> bool:
        """Handle what the link brought; whether there was anything."""
        try:
            conn, message = self.inbox.get(timeout=block_s) if block_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return False
        self.handle(conn, message)
        while True:
            try:
                conn, message = self.inbox.get_nowait()
            except queue.Empty:
                return True
            self.handle(conn, message)

    def _take_messages(self, block_s: float) -> None:
        """Drain the inbox, and send the answers it gave (a refusal, the end of a cancelled job)
        at once, not after the tick that follows (a prompt step may take seconds). Not when it
        accepted a job as well: an acceptance begins its client's response, and it leaves after
        the job's first tick, so that a worker lost in that tick is a 503 for a stream, not an
        error inside a 200 (the acceptance and the refusals would leave in one flush)."""
        self._answered = self._accepted = False
        if not self._drain_inbox(block_s):
            return
        ends = self.scheduler.drain_events()
        self._process(ends)
        if (ends or self._answered) and not self._accepted and self.link is not None:
            self.link.flush()

    def run_tick(self) -> bool:
        """Plan, execute and commit one tick. Returns False when there was nothing to do.

        The interrupt flag is cleared by the caller *before* it drains the inbox, so a message
        that arrives after the drain always stops this tick early instead of waiting for it."""
        self._process(self.scheduler.drain_events())
        plan = self.scheduler.step()
        if not plan.has_work:
            self._process(self.scheduler.drain_events())
            return False
        if self.stream_interval_s > 0 and not self._short_round(plan):
            # text held for pacing does not wait for a prompt step or a cache copy
            self._send_pending(None)
            if self.link is not None:
                self.link.flush()
        started = time.perf_counter()
        try:
            result = self.engine.execute(plan, self._burst_stop if plan.rounds > 1 else self.interrupt.is_set)
        except EngineError as exc:
            partial = exc.partial
            if not exc.permanent and partial is not None and not self._replanned:
                # the pool could not hold the plan: keep what ran, release pins, plan again
                log.warning("engine refused the plan (%s); replanning with pins released", exc)
                self._replanned = True
                self._note_busy_lanes()
                self._commit(partial)  # tokens sampled before the refused step, with their logprobs
                self.metrics.on_fed(plan, partial)
                self.scheduler.on_plan_rejected()
                return True
            self._replanned = False  # the next plan is a new one, not this one's replan
            self._fail_running(str(exc))
            return True
        self._replanned = False
        self.stats["tick_seconds_total"] += time.perf_counter() - started
        self._note_busy_lanes()
        self._commit(result)
        self.metrics.on_tick(plan, result)
        return True

    def _burst_stop(self) -> bool:
        """Whether a decode burst (plan.rounds) ends before its next round: on any message, not
        only those that interrupt a prompt step (an arrival is admitted a round later at most),
        and once held text falls due (the interval since it last went out: _send_pending), so
        no text waits longer than without bursts, the interval and a round."""
        return self.interrupt.is_set() or not self.inbox.empty() or self._text_due(self.clock())

    def _text_due(self, now: float) -> bool:
        """Held text may go out: the stream interval has passed since it last did."""
        return now - self._paced_s >= self.stream_interval_s

    @staticmethod
    def _short_round(plan: TickPlan) -> bool:
        """A round of decoding only: no prompt tokens, no lane parked, restored or swapped, no
        cache copy (each of which can take far longer than a decode round)."""
        return not (plan.prefill_tokens or plan.park or plan.restore or plan.swap or plan.pool)

    def _note_busy_lanes(self) -> None:
        """The lanes the tick ran, counted before its commit frees the lanes of the jobs it
        finished (a job admitted and finished in one tick held a lane too)."""
        active = sum(1 for j in self.scheduler.lanes if j is not None)
        self.stats["peak_lanes_active"] = max(self.stats["peak_lanes_active"], active)

    def _commit(self, result: TickResult) -> None:
        """Commit what a tick ran: its tokens' logprobs queued on their jobs, its events sent, then
        the jobs the engine said must end (read before the commit, which frees finished lanes)
        ended with their error."""
        if result.logprobs:
            self._stash_logprobs(result.logprobs)
        failing = self._jobs_of(result.failed)
        self._process(self.scheduler.commit(result))
        self._fail_jobs(failing)

    def _stash_logprobs(self, logprobs: dict[int, tuple[float, list[tuple[int, float]]]]) -> None:
        """Queue each sampled token's logprobs on its job, to go out with the token's text."""
        lanes = self.scheduler.lanes
        for lane, (logprob, top) in logprobs.items():
            job = lanes[lane] if 0 <= lane < len(lanes) else None
            ctx = self.contexts.get(job.job_id) if job is not None else None
            if ctx is not None and ctx.logprobs:
                ctx.lp_queue.append({"logprob": logprob, "top": top})

    def _prompt_logprobs(self, tokens: list[int], top: int) -> list[dict[str, Any]]:
        """Completions ``echo`` + ``logprobs``: each prompt token scored by the model given the
        tokens before it; the first has no logprob (null), as in OpenAI's and vLLM's replies."""
        score = getattr(self.engine, "score_prompt", None)
        if score is None or "prompt_logprobs" not in self.engine.features:
            raise Refusal(UNSUPPORTED_PARAMETER, f"'echo' with 'logprobs' is not supported by the {self.engine.name} engine.", "echo")
        try:
            scored = score(tokens, top) if tokens else []
        except EngineError as exc:
            raise Refusal(INVALID_JOB, f"The prompt could not be scored: {exc}", "echo") from None
        entries = [self._logprob_entry(tokens[0], None)] if tokens else []
        entries += [self._logprob_entry(t, {"logprob": lp, "top": alts}) for t, (lp, alts) in zip(tokens[1:], scored, strict=True)]
        return entries

    def _logprob_entry(self, token: int, lp: dict[str, Any] | None) -> dict[str, Any]:
        piece = self.engine.token_bytes
        entry = {"token_id": token, "bytes": list(piece(token)), "logprob": lp["logprob"] if lp else None}
        entry["top"] = [{"token_id": t, "bytes": list(piece(t)), "logprob": v} for t, v in (lp["top"] if lp else [])]
        return entry

    def _jobs_of(self, failed: dict[int, str]) -> dict[str, str]:
        """The jobs of the lanes the engine says must end (job id -> why), read before the tick
        is committed (a commit frees the lanes of jobs it finishes)."""
        lanes = self.scheduler.lanes
        return {job.job_id: detail for lane, detail in failed.items() if 0 <= lane < len(lanes) and (job := lanes[lane]) is not None}

    def _fail_jobs(self, failing: dict[str, str]) -> None:
        """End, each with an error its client sees, the jobs the engine said must end (a grammar
        too slow to mask) and that the committed tick left running; the tick's tokens, the last
        one included, went out with it, and a job the tick finished keeps its Done."""
        for job_id, detail in failing.items():
            job = self.scheduler.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                continue
            log.warning("ending %s: %s", job_id, detail)
            self._end_with_error(job, GRAMMAR_TOO_SLOW, detail)
        if failing:
            self._process(self.scheduler.drain_events())

    def _end_with_error(self, job: Job, reason: str, detail: str) -> None:
        """End a running job with an error its client sees; its finished event then finds no
        context, so nothing else is sent for it."""
        ctx = self.contexts.pop(job.job_id, None)
        self.scheduler.cancel(job.job_id, reason="error")
        self.metrics.on_finished(job, "error")
        if ctx is not None:
            ctx.conn.queue(Error(job.job_id, reason, detail))

    def _fail_running(self, message: str) -> None:
        log.error("engine error, failing running jobs: %s", message)
        self.stats["engine_errors_total"] += 1
        for job in [j for j in self.scheduler.lanes if j is not None]:
            self._end_with_error(job, ENGINE_ERROR, f"The engine failed: {message}")
        # the failed jobs' own events find no context; any other (a queued job whose deadline the
        # failed tick's plan expired) is sent as usual, never dropped
        self._process(self.scheduler.drain_events())
        self.scheduler.on_engine_failed()  # lanes and cache slots hold what, nobody knows

    def _process(self, events: list[Event]) -> None:
        for event in events:
            ctx = self.contexts.get(event.job_id)
            if ctx is None:
                continue
            if event.kind == "token":
                assert event.token is not None
                stopped = ctx.stream.stopped
                text = ctx.stream.push(event.token)
                if ctx.t_max_predict_ms > 0 and "\n" in text and not ctx.stream.stopped and self._predicting_ms(event.job_id) > ctx.t_max_predict_ms:
                    text += ctx.stream.limit()  # llama-server's t_max_predict_ms: at a new line past it
                if text:
                    ctx.pending_text.append(text)
                    ctx.has_new_line = ctx.has_new_line or "\n" in text
                if ctx.logprobs and not stopped:
                    lp = ctx.lp_queue.pop(0) if ctx.lp_queue else None
                    ctx.held_logprobs.append(self._logprob_entry(event.token, lp))
                    self._entries_out(ctx)
                if ctx.stream.stopped and not stopped:  # a limit (n_indent, t_max_predict_ms) is llama-server's stop_type "limit"
                    ctx.output_end = event.position
                    self.scheduler.finish(event.job_id, "length" if ctx.stream.limited else "stop")
            elif event.kind == "finished":
                self._finished(ctx, event)
            elif event.kind == "preempted":
                ctx.preempted = True
        # stop strings finish jobs after commit: their events are pending now
        followups = self.scheduler.drain_events()
        if followups:
            self._process(followups)
        self._send_pending(self.clock())

    def _send_pending(self, now: float | None) -> None:
        """Queue each job's text and logprobs not sent yet; ``now`` None: all of it, else what
        --stream-interval-ms lets go: every job's once the interval has passed since held text
        last went out (all jobs' at once, so eight streams' tokens still wake the web process
        once), else only a job's first text (the time to first token) and a preemption. A job's
        end never waits (_finished), and what waits goes before a round that may be long
        (run_tick): no text waits much more than the interval."""
        every = now is None or self._text_due(now)
        if every and now is not None:
            self._paced_s = now
        for ctx in self.contexts.values():
            # a preemption is said at once, in an empty Delta where no text goes: a client that
            # leaves while its job is parked has it on its row (no Delta came until it ran again)
            if (ctx.pending_text or ctx.pending_logprobs or ctx.preempted) and (every or ctx.preempted or not ctx.text_out):
                ctx.preempted = False
                job = self.scheduler.jobs.get(ctx.job_id)
                # the tokens whose text went out: a job submitted again goes on after them
                self._send_delta(ctx, ctx.stream.tokens_out + ctx.resume_tokens, job.preemptions if job else 0)

    def _predicting_ms(self, job_id: str) -> float:
        """Milliseconds on the worker's clock since the job's first generated token (on this
        worker: llama-server's t_gen_ms)."""
        job = self.scheduler.jobs.get(job_id)
        first = job.first_token_s if job is not None else None
        return 0.0 if first is None else (self.clock() - first) * 1000.0

    @staticmethod
    def _entries_out(ctx: JobContext) -> None:
        """Move the logprobs entries of the tokens whose text went out (``tokens_out``) to the
        next delta: an entry goes with its token's text, never before it."""
        out = ctx.stream.tokens_out - ctx.entries_sent
        for _ in range(min(out, len(ctx.held_logprobs))):
            ctx.pending_logprobs.append(ctx.held_logprobs.popleft())
        ctx.entries_sent += out

    @staticmethod
    def _send_delta(ctx: JobContext, tokens: int, preemptions: int) -> None:
        ctx.text_out = True
        logprobs = None
        if ctx.pending_logprobs:
            logprobs = list(ctx.pending_logprobs)  # optional: only when asked for
            ctx.pending_logprobs.clear()
        ctx.conn.queue(Delta(ctx.job_id, "".join(ctx.pending_text), tokens, logprobs, preemptions))
        ctx.pending_text.clear()

    def _finished(self, ctx: JobContext, event: Event) -> None:
        self.contexts.pop(ctx.job_id, None)
        job = event.job
        assert job is not None
        if ctx.output_end is not None:
            # a decode burst ran past where the text stopped: those tokens are not the reply's
            # (nor its usage); the lane's KV holds them, and its kept tokens say so
            del job.output[ctx.output_end :]
        tail = ctx.stream.flush()
        if tail:
            ctx.pending_text.append(tail)
        if ctx.logprobs:
            self._entries_out(ctx)  # (those of tokens cut off by a stop string stay out)
        completion = len(job.output) + ctx.resume_tokens
        if ctx.pending_text or ctx.pending_logprobs:
            self._send_delta(ctx, completion, job.preemptions)
        reason = event.reason
        if reason == "length" and ctx.stream.stopped and not ctx.stream.limited:
            reason = "stop"  # a stop string completed by the last token max_tokens allowed
        self.metrics.on_finished(job, reason)
        if reason == "error":
            return
        if reason == "deadline":
            ctx.conn.queue(Error(ctx.job_id, DEADLINE_EXCEEDED, "The completion was not started before its deadline (--completion-deadline-ms)."))
            return
        self.stats["prompt_tokens_total"] += ctx.prompt_tokens
        self.stats["completion_tokens_total"] += len(job.output)
        timing = {
            "queue_wait_ms": _ms(job.admitted_s, job.arrival_s),
            "ttft_ms": _ms(job.first_token_s, job.arrival_s),
            "total_ms": _ms(job.finished_s, job.arrival_s),
            "preemptions": job.preemptions,
        }
        if ctx.waited_ms:  # the times above count it: the web side does not add it again
            timing["waited_ms"] = ctx.waited_ms
        timing["held_wait_ms"] = _ms(job.held_s, 0.0)  # (of queue_wait_ms: waited with a lane free its class could not take)
        if timing["ttft_ms"] is not None:
            self.stats["last_ttft_ms"] = timing["ttft_ms"]
        ctx.conn.queue(
            Done(
                ctx.job_id,
                reason or "stop",
                usage={
                    "prompt_tokens": ctx.prompt_tokens,
                    "completion_tokens": completion,
                    "cached_tokens": min(job.cached_tokens, ctx.prompt_tokens),
                },
                timing=timing,
                stop_word=ctx.stream.stop_word,
                serial={
                    "serial_priority": job.priority,
                    "serial_band": band_of(job.priority),
                    "serial_score": job.serial_score,
                    "serial_queue_wait_ms": timing["queue_wait_ms"],
                },
            )
        )

    def snapshot(self) -> dict[str, Any]:
        state = self.scheduler.snapshot()
        for lane in state["lanes"]:  # type: ignore[union-attr]
            ctx = self.contexts.get(lane.get("job_id") or "")
            if ctx is not None:  # /slots' next_token (llama-server's n_remain, has_new_line)
                lane["limit_asked"], lane["has_new_line"] = ctx.limit_asked, ctx.has_new_line
            job = self.scheduler.lanes[lane["lane"]] if 0 <= lane.get("lane", -1) < len(self.scheduler.lanes) else None
            if job is not None and job.job_id == lane.get("job_id"):
                lane["params"] = slot_params(job, ctx)
        # not the chat template: kilobytes in every snapshot (one a lane taken or freed), said once in the hello
        state.update({k: v for k, v in dataclasses.asdict(self.hello()).items() if k != "chat_template"})
        state["stats"] = dict(self.stats)
        state["draining"] = self.draining
        state["metrics"] = self.metrics.collect(self.scheduler, self.stats)
        return state

    def _maybe_snapshot(self) -> None:
        """Send a snapshot every SNAPSHOT_INTERVAL_S, and at once when a lane is taken or freed."""
        now = time.monotonic()
        occupancy = tuple(j.job_id if j is not None else None for j in self.scheduler.lanes)
        changed = occupancy != self._last_occupancy
        if self.link is not None and (changed or now - self._last_snapshot >= SNAPSHOT_INTERVAL_S):
            self._last_snapshot = now
            self._last_occupancy = occupancy
            self.link.broadcast(Snapshot(self.snapshot()))

    def drain(self) -> None:
        """Stop admitting; the loop exits once every job already accepted has finished."""
        self.draining = True

    def run(self, drain_timeout_s: float = 30.0) -> None:
        drain_deadline: float | None = None
        worked = True
        while True:
            # nothing to do: no job, or none the last tick could run (background jobs held under
            # critical memory pressure and for 5 s after it): wait for a message, up to 50 ms,
            # rather than plan empty ticks back to back (a core spun at 100% all that time)
            idle = self.scheduler.idle or not worked
            self.interrupt.clear()
            clear_abort = getattr(self.engine, "clear_abort", None)
            if clear_abort is not None:
                clear_abort()
            self._take_messages(0.05 if idle else 0.0)
            if self.draining:
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + drain_timeout_s
                # nothing left, and nothing on its way: a Submit its reader read before the drain
                # began (one it serves) may reach the inbox just after the drain of it above
                if (self.scheduler.idle and not self.preparing and self.inbox.empty()) or time.monotonic() > drain_deadline:
                    break
            hold = self._urgent_hold_s()
            if hold > 0:
                self._take_messages(hold)  # returns with the first message: its Prepared, likely
                continue  # from the top: the flag cleared, the inbox drained, then the tick
            if self._urgent_ready:
                # its interrupt was raised before its Prepared was queued, so possibly after this
                # turn cleared the flag: clear it again (from the top) before the tick serving it
                self._urgent_ready = False
                continue
            if self.pressure is not None:
                level = self.pressure.poll(time.monotonic())
                if level is not None:  # a change: warning, critical, or back to normal
                    log.warning("OS memory pressure: %s", level)
                    self.scheduler.on_os_pressure(level)
            worked = self.run_tick()
            self._maybe_snapshot()
            if self.link is not None:
                self.link.flush()
        # the ends no tick processed: a cancel that emptied a draining worker stopped it at once
        self._process(self.scheduler.drain_events())
        self._send_pending(None)  # text held for pacing goes before the errors of the jobs cut
        # the drain ran out of time: every job left ends with an error its client sees
        cut = [(ctx.conn, job_id) for job_id, ctx in self.contexts.items()] + [(conn, job_id) for job_id, conn in self.preparing.items()]
        for job_id in list(self.contexts):
            # an error its client sees (shutdown), as an engine error: not a cancel, which
            # superfluid_cancelled_total counts for clients that left
            job = self.scheduler.jobs.get(job_id)
            if job is not None and self.scheduler.cancel(job_id, reason="error"):
                self.metrics.on_finished(job, "error")
        self.contexts.clear()
        self.preparing.clear()
        self._arrived.clear()
        for conn, job_id in cut:
            conn.queue(Error(job_id, SHUTDOWN, "The server shut down before this request finished."))
        if self.link is not None:
            self.link.broadcast(Snapshot(self.snapshot()))
            self.link.flush()
        self.stopped.set()

    def configure(self, message: Config) -> None:
        """A ``config`` op from the web side: the admin's class-lane caps ({class label: lanes}).
        They replace the caps for the classes they name; other classes keep their --class-lanes
        cap. An entry outside 1..max_batch or naming no class is ignored with a warning."""
        from scheduler.core.qos import UnknownQosClass, parse_qos

        if not hasattr(self, "_flag_class_lanes"):
            self._flag_class_lanes = dict(self.scheduler.config.class_lanes)
        caps = dict(self._flag_class_lanes)
        max_batch = self.scheduler.config.max_batch
        lanes = message.class_lanes if isinstance(message.class_lanes, dict) else {}
        for name, value in lanes.items():
            try:
                qos, cap = parse_qos(str(name)), int(value)
            except (UnknownQosClass, TypeError, ValueError):
                log.warning("config: ignoring class-lane cap %r=%r", name, value)
                continue
            if not 1 <= cap <= max_batch:
                log.warning("config: ignoring class-lane cap %s=%d (must be 1..%d)", qos.label, cap, max_batch)
                continue
            caps[qos] = cap
        self.scheduler.config.class_lanes = caps
        log.info("class-lane caps now %s", {q.label: n for q, n in sorted(caps.items())} or "none")


# the sampler settings every engine honours (plain numbers); the rest are engine features
_SIMPLE_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty", "frequency_penalty")


def _numbers(request: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The request's numeric sampling fields among ``names`` as the engine needs them: ints and
    finite floats (TypeError or ValueError otherwise, which refuses this job rather than failing
    a tick)."""
    values: dict[str, Any] = {}
    fields_ = SamplingParams.__dataclass_fields__
    for name in names:
        value = request.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number")
        if isinstance(fields_[name].default, float):
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite")
        else:
            value = int(value)
        values[name] = value
    return values


def _embeddings(message: Submit) -> bool:
    return isinstance(message.request, dict) and message.request.get("endpoint") == "embeddings"


def _urgent(message: Submit) -> bool:
    try:
        return int(message.qos) <= QosClass.COMPLETION
    except (TypeError, ValueError, OverflowError):  # a broken web side's (1e999: OverflowError)
        return False


def fim_extra_chars(request: dict[str, Any]) -> int:
    """The characters ``POST /infill`` adds to a FIM prompt: the typed text (``fim_prompt``) and
    the context chunks' file names and texts (``fim_extra``); 0 for anything else."""
    typed = request.get("fim_prompt")
    chars = len(typed) if isinstance(typed, str) else 0
    chunks = request.get("fim_extra")
    if isinstance(chunks, list):
        chars += sum(len(part) for chunk in chunks if isinstance(chunk, (list, tuple)) for part in chunk if isinstance(part, str))
    return chars


def _waited_ms(message: Submit) -> float:
    """Submit.waited_ms, checked: the milliseconds the request waited before it was submitted
    (at the model router). Not a number from 0 to MAX_WAITED_MS (negative, NaN, infinite, a
    string, a boolean): the job is refused, as for a malformed priority."""
    value = message.waited_ms
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_WAITED_MS:
        raise Refusal(INVALID_JOB, "The waited time is not a number of milliseconds in range.")
    return float(value)


def _ms(end: float | None, start: float) -> float | None:
    return None if end is None else round((end - start) * 1000.0, 1)
