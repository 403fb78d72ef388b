"""Run one engine worker: load the model, talk over the link, tick until told to stop.

``manage.py serve`` starts it with ``--link-fd``: one end of a socketpair it inherits (no path
anyone could take). Started by hand, ``--socket PATH`` listens on a 0600 socket in a directory
only its owner may write, and refuses peers of another uid. ``--redis URL`` (or ``REDIS_URL``)
makes it a fleet worker: it pulls jobs from the Redis queue (``scheduler.link.redis_transport``).
SIGTERM drains: nothing new is
admitted, what is in flight gets ``--drain-timeout`` seconds, then each job left ends with a
``shutdown`` error its client sees, and the worker exits.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.base import TICK_TARGETS_MS, EngineError, busy_tick_target_s
from scheduler.engines.models import model_name_for
from scheduler.management.options import (
    FlagsCommand,
    add_engine_arguments,
    choose_engine,
    resolve_model,
    scheduler_config,
)
from scheduler.worker.loop import EngineWorker
from scheduler.worker.server import LinkServer, check_not_listening, check_private_dir

log = logging.getLogger("superfluid.worker")

EXIT_MODEL_UNLOADABLE = 78  # EX_CONFIG: the engine cannot load the model it was given
# Test hook: "repack" kills the worker with SIGSEGV in its start-up decode when llama.cpp's extra
# buffer types are on, "always" whatever they are, as a native build does on some CPUs (issue 17).
CRASH_PROBE_ENV = "SUPERFLUID_TEST_CRASH_PROBE"


def load_engine(
    kind: str, model: Path, *, n_lanes: int, lane_ctx: int, threads: int, cache_slots: int, repack: str = "auto", adapt_threads: bool = True
) -> Any:
    """The engine ``--engine kind`` picks for ``model``; CommandError if it cannot load it."""
    kind = choose_engine(kind, model)
    try:
        if kind == "llamacpp":
            from scheduler.engines.llama_cpp import LlamaCppEngine

            return LlamaCppEngine(
                model, n_lanes=n_lanes, lane_ctx=lane_ctx, n_threads=threads or None, cache_slots=cache_slots, repack=repack, adapt_threads=adapt_threads
            )
        try:
            from scheduler.engines.mlx import MlxEngine
        except ImportError as exc:
            raise CommandError(f"--engine mlx needs mlx-lm: pip install mlx-lm (on Linux: 'mlx[cpu]' mlx-lm); {exc}") from None
        return MlxEngine(model, n_lanes=n_lanes, lane_ctx=lane_ctx, cache_slots=cache_slots)
    except EngineError as exc:
        raise CommandError(f"--engine {kind} cannot load {model}: {exc}") from None


def load_configured_engine(options: dict[str, Any], config: SchedulerConfig, model: Path) -> Any:
    """The engine runengine's flags (``options``) ask for, with ``config``'s lanes and cache slots."""
    return load_engine(
        options["engine"],
        model,
        n_lanes=config.max_batch,
        lane_ctx=config.lane_ctx,
        threads=options["threads"],
        cache_slots=config.cache_slots if config.prefix_cache else 0,
        repack=options["repack"],
        adapt_threads=options["adapt_threads"] == "on",
    )


def engine_worker(engine: Any, config: SchedulerConfig, options: dict[str, Any], model: Path) -> EngineWorker:
    """The worker around a loaded ``engine``, ``config`` tuned to it, as runengine serves it (the
    in-process MLX tests build theirs here too: tests/edge/test_mlx_in_process.py)."""
    # the seed's busy-tick target for this engine bounds a tick's prefill while lanes decode
    busy_s = busy_tick_target_s(engine.name)
    if busy_s is not None:
        config.decoding_prefill_cap_s = busy_s
    # llama.cpp's per-sequence KV streams are allocated at start-up: evicting a cached prefix
    # frees nothing a lane can use, so the watermarks do not run there (docs/scheduling.md)
    config.watermarks = engine.name != "llamacpp"
    targets_ms = TICK_TARGETS_MS.get(engine.name)
    if targets_ms is not None:  # ticks of several decode rounds, sized to these targets
        config.tick_targets_s = (targets_ms[0] / 1000.0, targets_ms[1] / 1000.0)
    return EngineWorker(
        engine,
        config,
        model_name=options["model_name"] or model_name_for(model),
        completion_deadline_ms=options["completion_deadline_ms"],
        stream_interval_ms=options["stream_interval_ms"],
        os_pressure=options["os_pressure"] == "on",
        prepare_in_thread=True,
    )


def _status(fd: int, line: str) -> None:
    if fd >= 0:
        os.write(fd, (line + "\n").encode())


def _probe(engine: Any) -> None:
    """Decode a tiny batch before the worker reports ready (llama.cpp engine), so that kernels
    which crash on this CPU kill the worker at start-up, where serve can react, not at the first
    request."""
    crash = os.environ.get(CRASH_PROBE_ENV, "")
    if crash == "always" or (crash == "repack" and getattr(engine, "repack", False)):
        os.kill(os.getpid(), signal.SIGSEGV)
    probe = getattr(engine, "probe", None)
    if probe is not None:
        probe()


class Command(FlagsCommand):
    help = "Run an engine worker process (manage.py serve starts and supervises one for you)."

    def add_arguments(self, parser: Any) -> None:
        link = parser.add_mutually_exclusive_group(required=not os.environ.get("REDIS_URL"))
        link.add_argument("--socket", default="", help="listen for the web side on this Unix socket path (its directory must be writable by this user alone)")
        link.add_argument("--link-fd", type=int, default=-1, help="the link is this inherited socket (what serve passes)")
        link.add_argument("--redis", default="", help="pull jobs from the Redis queue at this URL (a fleet worker; REDIS_URL too)")
        add_engine_arguments(parser)
        # serve passes a pipe: "loaded repack=on|off|none" once the model is loaded, "ready" once
        # the start-up decode worked, so it can tell a worker that dies starting from a later crash
        parser.add_argument("--status-fd", type=int, default=-1, help="write start-up progress (loaded, ready) to this inherited pipe (what serve passes)")

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM/SIGINT are blocked in every thread of this process and taken by one thread
        # with sigwait: threads inherit the mask, so llama.cpp's compute threads (started later,
        # spinning in OpenMP barriers) are never interrupted by a signal, and the reaction (a
        # drain) always runs on one known Python thread, wherever the main thread is.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        config = scheduler_config(options)
        model = resolve_model(options)
        if options["socket"]:
            try:
                check_private_dir(options["socket"])
                check_not_listening(options["socket"])  # before minutes of loading the model
            except (OSError, ValueError) as exc:
                raise CommandError(f"--socket: {exc}") from None
        started = time.monotonic()
        try:
            engine = load_configured_engine(options, config, model)
        except CommandError as exc:
            # a distinct status, so the supervisor can tell "this model does not load" from a crash
            sys.stderr.write(f"engine worker: {exc}\n")
            sys.exit(EXIT_MODEL_UNLOADABLE)
        repack = getattr(engine, "repack", None)
        if getattr(engine, "repack_note", None):
            sys.stderr.write(f"engine worker: {engine.repack_note}\n")
        status_fd = options["status_fd"]
        _status(status_fd, f"loaded repack={'none' if repack is None else 'on' if repack else 'off'}")
        loaded_s = time.monotonic() - started
        try:
            _probe(engine)
        except EngineError as exc:
            sys.stderr.write(f"engine worker: the start-up decode failed: {exc}\n")
            sys.exit(EXIT_MODEL_UNLOADABLE)
        _status(status_fd, "ready")
        if status_fd >= 0:
            os.close(status_fd)
        worker = engine_worker(engine, config, options, model)
        name = worker.model_name

        def wait_for_stop() -> None:
            while True:
                signal.sigwait(stop_signals)
                worker.drain()

        threading.Thread(target=wait_for_stop, name="stop-signals", daemon=True).start()
        sys.stderr.write(
            f"engine worker: {name} on {engine.name}, {config.max_batch} lanes x {config.lane_ctx} tokens, "
            f"loaded in {loaded_s:.1f}s, start-up decode in {time.monotonic() - started - loaded_s:.1f}s\n"
        )
        redis_url = options["redis"] or ("" if options["socket"] or options["link_fd"] >= 0 else os.environ.get("REDIS_URL", ""))
        if redis_url:
            from scheduler.link.redis_transport import RedisWorkerLink

            # a fleet worker: it takes jobs from the global queue while it has free lanes
            # the global queue's classes age with the worker's own period (--starvation-ticks busy
            # ticks of --tick-target-ms: 16 s by default), not with the engines' shorter real ticks
            link = RedisWorkerLink(worker, redis_url, starvation_s=worker.scheduler.queues.aging_period_s(), preemption=config.preemption)
            sys.stderr.write(f"engine worker: pulling from Redis as {link.worker_id} (waiting classes age every {link.starvation_s:g} s)\n")
        elif options["link_fd"] >= 0:
            inherited = socket.socket(fileno=options["link_fd"])
            os.set_inheritable(inherited.fileno(), False)
            # the only connection there will be: when serve's end closes, nobody is left to serve
            link = LinkServer(worker.inbox, worker._on_message, worker.hello, inherited=inherited, on_closed=worker.drain)
        else:
            link = LinkServer(worker.inbox, worker._on_message, worker.hello, path=options["socket"])
        try:
            worker.serve(link, drain_timeout_s=float(options["drain_timeout"]))
        finally:
            engine.close()
