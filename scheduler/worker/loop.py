"""The engine worker: turns link messages into jobs and runs the tick loop.

One thread owns the scheduler and the engine. Between ticks it drains the inbox (submits,
cancels), then plans a tick, executes it on the engine, commits the result and sends text
deltas. Prompts are tokenised on submit so that a request that cannot fit is rejected before
the web side has sent any response.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.qos import QosClass, band_of
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Event, Job, SamplingParams
from scheduler.engines import chat as chat_format
from scheduler.engines.base import Engine, EngineError
from scheduler.link.protocol import error_dict

from .metrics import WorkerMetrics
from .output import TextStream
from .pressure import PressureMonitor
from .server import Connection, LinkServer

log = logging.getLogger("superfluid.worker")

SNAPSHOT_INTERVAL_S = 0.1


class Rejected(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = error_dict(status, message, "invalid_request_error" if status < 500 else "server_error", code, param)


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


class EngineWorker:
    def __init__(
        self,
        engine: Engine,
        config: SchedulerConfig,
        *,
        model_name: str,
        clock: Callable[[], float] = time.monotonic,
        completion_deadline_ms: int = 0,
        os_pressure: bool = False,
        pressure_monitor: PressureMonitor | None = None,
    ) -> None:
        self.engine = engine
        self.completion_deadline_ms = completion_deadline_ms
        self.pressure = (pressure_monitor or PressureMonitor()) if os_pressure else None
        self.model_name = model_name
        self.scheduler = Scheduler(config, clock=clock)
        self.clock = clock
        self.inbox: queue.SimpleQueue[tuple[Connection, dict[str, Any]]] = queue.SimpleQueue()
        self.interrupt = threading.Event()
        self.contexts: dict[str, JobContext] = {}
        self.draining = False
        self.stopped = threading.Event()
        self.link: LinkServer | None = None
        self.metrics = WorkerMetrics()
        self._replanned = False
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

    def hello(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "engine": self.engine.name,
            "n_lanes": self.engine.n_lanes,
            "lane_ctx": self.engine.lane_ctx,
            "pid": os.getpid(),
            # optional, for /v1/models' meta: where the engine knows them
            "n_ctx_train": getattr(self.engine, "n_ctx_train", None),
            "n_vocab": getattr(self.engine, "vocab_size", None),
        }

    def _on_message(self, message: dict[str, Any]) -> None:
        """Runs on a reader thread: stop the tick in flight when someone must not wait for it."""
        op = message.get("op")
        if op == "cancel" or op == "disconnected":
            self.interrupt.set()
        elif op == "submit" and int(message.get("qos", 2)) <= QosClass.COMPLETION:
            self.interrupt.set()

    def serve(self, socket_path: str) -> None:
        self.link = LinkServer(socket_path, self.inbox, self._on_message, self.hello)
        self.link.start()
        try:
            self.run()
        finally:
            self.link.close()

    # -- messages ----------------------------------------------------------------------

    def handle(self, conn: Connection, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "submit":
            self._submit(conn, message)
        elif op == "cancel":
            self.scheduler.cancel(str(message.get("id")))
        elif op == "disconnected":
            for ctx in [c for c in self.contexts.values() if c.conn is conn]:
                self.scheduler.cancel(ctx.job_id)
        elif op == "config":
            self.configure(message)
        else:
            log.warning("unknown link op %r", op)

    def _submit(self, conn: Connection, message: dict[str, Any]) -> None:
        job_id = str(message.get("id") or uuid.uuid4().hex)
        try:
            if self.draining:
                raise Rejected(503, "The server is shutting down.", "engine_unavailable")
            if job_id in self.contexts:
                raise Rejected(400, f"duplicate job id {job_id}", "duplicate_id")
            job, ctx = self._build_job(job_id, conn, message)
        except Rejected as exc:
            self.stats["rejected_total"] += 1
            conn.queue({"ev": "rejected", "id": job_id, "error": exc.error})
            return
        self.scheduler.add(job)
        self.contexts[job_id] = ctx
        self.stats["requests_total"] += 1
        conn.queue({"ev": "accepted", "id": job_id, "prompt_tokens": ctx.prompt_tokens})

    def _prompt_tokens(self, request: dict[str, Any], resume_text: str) -> tuple[list[int], int, str]:
        """(tokens to prefill, tokens of the client's own prompt, the param errors refer to)."""
        engine = self.engine
        if request.get("endpoint") == "chat":
            try:
                features = getattr(engine, "features", frozenset())
                messages, extra = chat_format.template_inputs(
                    request["messages"],
                    request.get("tools") if request.get("tool_choice") != "none" else None,
                    getattr(engine, "chat_template", None),
                    request.get("chat_template_kwargs"),
                    native_ok="template_vars" in features,
                )
                text = engine.render_chat(messages, **extra) if extra else engine.render_chat(messages)
            except Exception as exc:  # a template's raise_exception, or a malformed message
                raise Rejected(400, f"The chat template rejected the messages: {exc}", "invalid_messages", "messages") from None
            own = engine.tokenize(text)
            tokens = engine.tokenize(text + resume_text) if resume_text else own
            return tokens, len(own), "messages"
        prompt = request.get("prompt")
        suffix = request.get("suffix")
        if suffix is not None:
            fim = getattr(engine, "fim_tokens", lambda: None)()
            if fim is None:
                raise Rejected(400, "This model has no fill-in-the-middle tokens; 'suffix' is not supported.", "fim_unsupported", "suffix")
            pre, suf, mid = fim
            prefix_text = prompt if isinstance(prompt, str) else ""
            own = [pre, *engine.tokenize(prefix_text, add_special=False), suf, *engine.tokenize(suffix, add_special=False), mid]
            extra = engine.tokenize(resume_text, add_special=False) if resume_text else []
            return own + extra, len(own), "prompt"
        if isinstance(prompt, list):
            vocab = getattr(engine, "vocab_size", None)
            if vocab is not None and any(not 0 <= t < vocab for t in prompt):
                raise Rejected(400, f"Token ids in 'prompt' must be between 0 and {vocab - 1}.", "invalid_prompt", "prompt")
            own = [int(t) for t in prompt]
            extra = engine.tokenize(resume_text, add_special=False) if resume_text else []
            return own + extra, len(own), "prompt"
        text = str(prompt)
        own = engine.tokenize(text)
        tokens = engine.tokenize(text + resume_text) if resume_text else own
        return tokens, len(own), "prompt"

    def _build_job(self, job_id: str, conn: Connection, message: dict[str, Any]) -> tuple[Job, JobContext]:
        request = message["request"]
        resume_text = str(message.get("resume_text") or "")
        resume_tokens = int(message.get("resume_tokens") or 0)
        tokens, own_len, param = self._prompt_tokens(request, resume_text)
        ctx_limit = self.engine.lane_ctx
        if not tokens:
            raise Rejected(400, "The prompt is empty.", "empty_prompt", param)
        max_tokens = request.get("max_tokens")
        if len(tokens) >= ctx_limit or (max_tokens is not None and own_len + max_tokens > ctx_limit):
            detail = f"{own_len} tokens in the {param}"
            if max_tokens is not None:
                detail += f" and {max_tokens} in the completion ({own_len + max_tokens} in all)"
            raise Rejected(
                400,
                f"This model's maximum context length is {ctx_limit} tokens. However, you requested {detail}. "
                "Please reduce the length of the prompt or the completion.",
                "context_length_exceeded",
                param,
            )
        budget = (max_tokens if max_tokens is not None else ctx_limit - own_len) - resume_tokens
        sampling = self._sampling(request)
        qos = QosClass(int(message.get("qos", QosClass.AGENT)))
        job = Job(
            job_id=job_id,
            prompt=tokens,
            max_tokens=max(1, budget),
            sampling=sampling,
            qos=qos,
            priority=int(message.get("priority", 0)),
            batch_invariant=bool(message.get("batch_invariant", False)),
            pin_prefix=bool(message.get("pin_prefix", False)),
        )
        if qos is QosClass.COMPLETION and self.completion_deadline_ms > 0:
            job.deadline_s = self.clock() + self.completion_deadline_ms / 1000.0
        stream = TextStream(self.engine.token_bytes, list(request.get("stop") or []))
        ctx = JobContext(job_id, conn, stream, own_len, resume_tokens, logprobs=sampling.logprobs is not None)
        return job, ctx

    def _sampling(self, request: dict[str, Any]) -> SamplingParams:
        """The request's sampler settings; a feature the engine lacks, a token id outside the
        vocabulary or a constraint that does not compile is a 400 naming the parameter."""
        from scheduler.engines import grammar as grammars

        engine = self.engine
        features = getattr(engine, "features", frozenset())

        def need(feature: str, param: str) -> None:
            if feature not in features:
                raise Rejected(400, f"'{param}' is not supported by the {engine.name} engine.", "unsupported_parameter", param)

        simple = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty", "frequency_penalty")
        kwargs: dict[str, Any] = {k: request[k] for k in simple if request.get(k) is not None}
        if request.get("typical_p") not in (None, 1.0):
            need("typical_p", "typical_p")
            kwargs["typical_p"] = float(request["typical_p"])
        if request.get("ignore_eos"):
            need("ignore_eos", "ignore_eos")
            kwargs["ignore_eos"] = True
        bias = [(int(t), float(b)) for t, b in request.get("logit_bias") or []]
        if bias:
            need("logit_bias", "logit_bias")
            vocab = getattr(engine, "vocab_size", None)
            bad = [t for t, _ in bias if vocab is not None and not 0 <= t < vocab]
            if bad:
                raise Rejected(400, f"Invalid value for 'logit_bias': token id {bad[0]} is not in the vocabulary (0 to {vocab - 1}).", "invalid_value", "logit_bias")
            kwargs["logit_bias"] = tuple(bias)
        if request.get("logprobs") is not None:
            need("logprobs", "logprobs")
            kwargs["logprobs"] = int(request["logprobs"])
        tools, choice = request.get("tools"), request.get("tool_choice", "auto")
        param = "tool_choice"
        try:
            grammar = grammars.tool_grammar(tools or [], choice, bool(request.get("parallel_tool_calls", True))) if tools else None
            if grammar is None:
                param = "response_format"
                grammar = grammars.response_grammar(request.get("response_format"))
        except grammars.GrammarError as exc:
            raise Rejected(400, f"Invalid value for '{param}': {exc}", "invalid_value", param) from None
        if grammar is not None:
            need("grammar", param)
            problem = engine.check_grammar(grammar)  # type: ignore[attr-defined]
            if problem:
                raise Rejected(400, f"Invalid value for '{param}': the constraint does not compile ({problem}).", "invalid_value", param)
            kwargs["grammar"] = grammar
        return SamplingParams(**kwargs)

    # -- ticks -------------------------------------------------------------------------

    def _drain_inbox(self, block_s: float) -> None:
        try:
            conn, message = self.inbox.get(timeout=block_s) if block_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        self.handle(conn, message)
        while True:
            try:
                conn, message = self.inbox.get_nowait()
            except queue.Empty:
                return
            self.handle(conn, message)

    def run_tick(self) -> bool:
        """Plan, execute and commit one tick. Returns False when there was nothing to do.

        The interrupt flag is cleared by the caller *before* it drains the inbox, so a message
        that arrives after the drain always stops this tick early instead of waiting for it."""
        self._process(self.scheduler.drain_events())
        plan = self.scheduler.step()
        if not plan.has_work:
            self._process(self.scheduler.drain_events())
            return False
        started = time.perf_counter()
        try:
            result = self.engine.execute(plan, self.interrupt.is_set)
        except EngineError as exc:
            partial = getattr(exc, "partial", None)
            if not exc.permanent and partial is not None and not self._replanned:
                # the pool could not hold the plan: keep what ran, release pins, plan again
                log.warning("engine refused the plan (%s); replanning with pins released", exc)
                self._replanned = True
                self._process(self.scheduler.commit(partial))
                self.scheduler.on_plan_rejected()
                return True
            self._fail_running(str(exc))
            return True
        self._replanned = False
        self.stats["tick_seconds_total"] += time.perf_counter() - started
        if result.logprobs:
            self._stash_logprobs(result.logprobs)
        self._process(self.scheduler.commit(result))
        self.metrics.on_tick(plan, result)
        active = sum(1 for j in self.scheduler.lanes if j is not None)
        self.stats["peak_lanes_active"] = max(self.stats["peak_lanes_active"], active)
        return True

    def _stash_logprobs(self, logprobs: dict[int, tuple[float, list[tuple[int, float]]]]) -> None:
        """Queue each sampled token's logprobs on its job, to go out with the token's text."""
        lanes = self.scheduler.lanes
        for lane, (logprob, top) in logprobs.items():
            job = lanes[lane] if 0 <= lane < len(lanes) else None
            ctx = self.contexts.get(job.job_id) if job is not None else None
            if ctx is not None and ctx.logprobs:
                ctx.lp_queue.append({"logprob": logprob, "top": top})

    def _logprob_entry(self, token: int, lp: dict[str, Any] | None) -> dict[str, Any]:
        piece = self.engine.token_bytes
        entry = {"token_id": token, "bytes": list(piece(token)), "logprob": lp["logprob"] if lp else None}
        entry["top"] = [{"token_id": t, "bytes": list(piece(t)), "logprob": v} for t, v in (lp["top"] if lp else [])]
        return entry

    def _fail_running(self, message: str) -> None:
        log.error("engine error, failing running jobs: %s", message)
        self.stats["engine_errors_total"] += 1
        for job in [j for j in self.scheduler.lanes if j is not None]:
            ctx = self.contexts.pop(job.job_id, None)
            self.scheduler.cancel(job.job_id, reason="error")
            if ctx is not None:
                ctx.conn.queue({"ev": "error", "id": job.job_id, "error": error_dict(500, f"The engine failed: {message}", "server_error", "engine_error")})
        self.scheduler.drain_events()

    def _process(self, events: list[Event]) -> None:
        for event in events:
            ctx = self.contexts.get(event.job_id)
            if ctx is None:
                continue
            if event.kind == "token":
                assert event.token is not None
                text = ctx.stream.push(event.token)
                if text:
                    ctx.pending_text.append(text)
                if ctx.logprobs and not ctx.stream.stopped:
                    lp = ctx.lp_queue.pop(0) if ctx.lp_queue else None
                    ctx.pending_logprobs.append(self._logprob_entry(event.token, lp))
                if ctx.stream.stopped:
                    self.scheduler.finish(event.job_id, "stop")
            elif event.kind == "finished":
                self._finished(ctx, event)
        # stop strings finish jobs after commit: their events are pending now
        followups = self.scheduler.drain_events()
        if followups:
            self._process(followups)
        for ctx in self.contexts.values():
            if ctx.pending_text or ctx.pending_logprobs:
                job = self.scheduler.jobs.get(ctx.job_id)
                generated = len(job.output) if job else 0
                self._send_delta(ctx, generated + ctx.resume_tokens)

    @staticmethod
    def _send_delta(ctx: JobContext, tokens: int) -> None:
        message: dict[str, Any] = {"ev": "delta", "id": ctx.job_id, "text": "".join(ctx.pending_text), "tokens": tokens}
        if ctx.pending_logprobs:
            message["logprobs"] = list(ctx.pending_logprobs)  # optional: only when asked for
            ctx.pending_logprobs.clear()
        ctx.conn.queue(message)
        ctx.pending_text.clear()

    def _finished(self, ctx: JobContext, event: Event) -> None:
        self.contexts.pop(ctx.job_id, None)
        job = event.job
        assert job is not None
        tail = ctx.stream.flush()
        if tail:
            ctx.pending_text.append(tail)
        completion = len(job.output) + ctx.resume_tokens
        if ctx.pending_text or ctx.pending_logprobs:
            self._send_delta(ctx, completion)
        self.metrics.on_finished(job, event.reason)
        if event.reason == "error":
            return
        if event.reason == "deadline":
            ctx.conn.queue({"ev": "error", "id": ctx.job_id, "error": error_dict(
                503, "The completion was not started before its deadline (--completion-deadline-ms).",
                "server_error", "completion_deadline_exceeded")})
            return
        self.stats["prompt_tokens_total"] += ctx.prompt_tokens
        self.stats["completion_tokens_total"] += len(job.output)
        timing = {
            "queue_wait_ms": _ms(job.admitted_s, job.arrival_s),
            "ttft_ms": _ms(job.first_token_s, job.arrival_s),
            "total_ms": _ms(job.finished_s, job.arrival_s),
            "preemptions": job.preemptions,
        }
        if timing["ttft_ms"] is not None:
            self.stats["last_ttft_ms"] = timing["ttft_ms"]
        ctx.conn.queue(
            {
                "ev": "done",
                "id": ctx.job_id,
                "finish_reason": event.reason,
                "usage": {
                    "prompt_tokens": ctx.prompt_tokens,
                    "completion_tokens": completion,
                    "cached_tokens": min(job.cached_tokens, ctx.prompt_tokens),
                },
                "timing": timing,
                "class": job.qos.label,
                "priority": job.priority,
                "serial": {
                    "serial_priority": job.priority,
                    "serial_band": band_of(job.priority),
                    "serial_score": job.serial_score,
                    "serial_queue_wait_ms": timing["queue_wait_ms"],
                },
            }
        )

    def snapshot(self) -> dict[str, Any]:
        state = self.scheduler.snapshot()
        state.update(self.hello())
        state["stats"] = dict(self.stats)
        state["draining"] = self.draining
        state["metrics"] = self.metrics.collect(self)
        return state

    def _maybe_snapshot(self) -> None:
        """Send a snapshot every SNAPSHOT_INTERVAL_S, and at once when a lane is taken or freed."""
        now = time.monotonic()
        occupancy = tuple(j.job_id if j is not None else None for j in self.scheduler.lanes)
        changed = occupancy != self._last_occupancy
        if self.link is not None and (changed or now - self._last_snapshot >= SNAPSHOT_INTERVAL_S):
            self._last_snapshot = now
            self._last_occupancy = occupancy
            self.link.broadcast({"ev": "snapshot", "state": self.snapshot()})

    def drain(self) -> None:
        """Stop admitting; the loop exits once every job already accepted has finished."""
        self.draining = True

    def run(self, drain_timeout_s: float = 30.0) -> None:
        drain_deadline: float | None = None
        while True:
            idle = self.scheduler.idle
            self.interrupt.clear()
            self._drain_inbox(0.05 if idle else 0.0)
            if self.draining:
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + drain_timeout_s
                if self.scheduler.idle or time.monotonic() > drain_deadline:
                    break
            if self.pressure is not None:
                level = self.pressure.poll(time.monotonic())
                if level is not None:
                    log.warning("OS memory pressure: %s", level)
                    self.scheduler.on_os_pressure(level)
            self.run_tick()
            self._maybe_snapshot()
            if self.link is not None:
                self.link.flush()
        for job_id in list(self.contexts):
            ctx = self.contexts.pop(job_id)
            ctx.conn.queue({"ev": "error", "id": job_id, "error": error_dict(503, "The server shut down before this request finished.", "server_error", "engine_unavailable")})
        if self.link is not None:
            self.link.broadcast({"ev": "snapshot", "state": self.snapshot()})
            self.link.flush()
        self.stopped.set()

    def configure(self, message: dict[str, Any]) -> None:
        """A ``config`` op from the web side: the admin's class-lane caps ({class label: lanes}).
        They replace the caps for the classes they name; other classes keep their --class-lanes
        cap. An entry outside 1..max_batch or naming no class is ignored with a warning."""
        from scheduler.core.qos import UnknownQosClass, parse_qos

        if not hasattr(self, "_flag_class_lanes"):
            self._flag_class_lanes = dict(self.scheduler.config.class_lanes)
        caps = dict(self._flag_class_lanes)
        max_batch = self.scheduler.config.max_batch
        for name, value in dict(message.get("class_lanes") or {}).items():
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


def _ms(end: float | None, start: float) -> float | None:
    return None if end is None else round((end - start) * 1000.0, 1)
