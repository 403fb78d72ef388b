"""Run one engine worker: load the model, listen on the link socket, tick until told to stop."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from scheduler.engines.base import EngineError, busy_tick_target_s
from scheduler.engines.models import model_name_for
from scheduler.management.options import add_engine_arguments, choose_engine, resolve_model, scheduler_config
from scheduler.worker.loop import EngineWorker

log = logging.getLogger("superfluid.worker")

EXIT_MODEL_UNLOADABLE = 78  # EX_CONFIG: the engine cannot load the model it was given
# Test hook: "repack" kills the worker with SIGSEGV in its start-up decode when llama.cpp's extra
# buffer types are on, "always" whatever they are, as a native build does on some CPUs (issue 17).
CRASH_PROBE_ENV = "SUPERFLUID_TEST_CRASH_PROBE"


def load_engine(kind: str, model: Path, *, n_lanes: int, lane_ctx: int, threads: int, cache_slots: int, repack: str = "auto") -> Any:
    """The engine ``--engine kind`` picks for ``model``; CommandError if it cannot load it."""
    kind = choose_engine(kind, model)
    try:
        if kind == "llamacpp":
            from scheduler.engines.llama_cpp import LlamaCppEngine

            return LlamaCppEngine(model, n_lanes=n_lanes, lane_ctx=lane_ctx, n_threads=threads or None, cache_slots=cache_slots, repack=repack)
        try:
            from scheduler.engines.mlx import MlxEngine
        except ImportError as exc:
            raise CommandError(f"--engine mlx needs mlx-lm: pip install mlx-lm (on Linux: 'mlx[cpu]' mlx-lm); {exc}") from None
        return MlxEngine(model, n_lanes=n_lanes, lane_ctx=lane_ctx, cache_slots=cache_slots)
    except EngineError as exc:
        raise CommandError(f"--engine {kind} cannot load {model}: {exc}") from None


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


class Command(BaseCommand):
    help = "Run an engine worker process (manage.py serve starts and supervises one for you)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--socket", required=True, help="Unix socket path of the link")
        add_engine_arguments(parser)
        # serve passes a pipe: "loaded repack=on|off|none" once the model is loaded, "ready" once
        # the start-up decode worked, so it can tell a worker that dies starting from a later crash
        parser.add_argument("--status-fd", type=int, default=-1, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM/SIGINT are blocked in every thread of this process and taken by one thread
        # with sigwait: threads inherit the mask, so llama.cpp's compute threads (started later,
        # spinning in OpenMP barriers) are never interrupted by a signal, and the reaction (a
        # drain) always runs on one known Python thread, wherever the main thread is.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        config = scheduler_config(options)
        model = resolve_model(options)
        started = time.monotonic()
        try:
            engine = load_engine(
                options["engine"],
                model,
                n_lanes=config.max_batch,
                lane_ctx=config.lane_ctx,
                threads=options["threads"],
                cache_slots=config.cache_slots if config.prefix_cache else 0,
                repack=options["repack"],
            )
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
        # the seed's busy-tick target for this engine bounds a tick's prefill while lanes decode
        busy_s = busy_tick_target_s(engine.name)
        if busy_s is not None:
            config.decoding_prefill_cap_s = busy_s
        name = options["model_name"] or model_name_for(model)
        worker = EngineWorker(
            engine,
            config,
            model_name=name,
            completion_deadline_ms=options["completion_deadline_ms"],
            os_pressure=options["os_pressure"] == "on",
        )

        def wait_for_stop() -> None:
            while True:
                signal.sigwait(stop_signals)
                worker.drain()

        threading.Thread(target=wait_for_stop, name="stop-signals", daemon=True).start()
        sys.stderr.write(
            f"engine worker: {name} on {engine.name}, {config.max_batch} lanes x {config.lane_ctx} tokens, "
            f"loaded in {loaded_s:.1f}s, start-up decode in {time.monotonic() - started - loaded_s:.1f}s\n"
        )
        try:
            worker.serve(options["socket"])
        finally:
            engine.close()
