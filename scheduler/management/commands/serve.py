"""Serve everything on one machine: daphne (ASGI) in this process, the engine worker beside it.

The worker is a separate process so that a llama.cpp crash cannot take the web server down;
this command restarts it when it dies. SIGTERM (or Ctrl-C) drains: no new requests are
admitted, in-flight ones get ``--drain-timeout`` seconds to finish, then everything stops and
the process exits 0.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from keys.binding import is_loopback
from keys.limits import parse_rate
from scheduler.core.qos import UnknownQosClass, parse_qos
from scheduler.engines.models import model_name_for
from scheduler.management.commands.runengine import EXIT_MODEL_UNLOADABLE
from scheduler.management.options import add_api_arguments, add_engine_arguments, choose_engine, engine_argv, resolve_model, scheduler_config

log = logging.getLogger("superfluid.serve")

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the serve process dies, so no worker is left orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class WorkerSupervisor:
    """Starts the engine worker and starts it again whenever it dies, until told to stop."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts = 0
        self.fatal: str | None = None  # why serving cannot start at all
        self.on_fatal: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
        self.exited = threading.Event()

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(self.argv, preexec_fn=_die_with_parent)

    def _watch(self) -> None:
        backoff = 0.2
        while True:
            assert self.proc is not None
            started = time.monotonic()
            rc = self.proc.wait()
            if self.stopping:
                break
            if rc == EXIT_MODEL_UNLOADABLE and self.restarts == 0:
                # The first worker could not load the model: a configuration error, which no
                # restart mends. serve stops, as llama-server does. A model that stops loading
                # later (a file replaced under a running server) is retried below like a crash.
                self.fatal = "the engine worker cannot load the model (its message is above)"
                self.stopping = True
                if self.on_fatal is not None:
                    self.on_fatal()
                break
            self.restarts += 1
            quick = time.monotonic() - started < 10
            backoff = min(10.0, backoff * 2) if quick else 0.2
            sys.stderr.write(f"engine worker exited with {rc}; restarting in {backoff:.1f}s\n")
            time.sleep(backoff)
            if self.stopping:
                break
            self._spawn()
        self.exited.set()

    def drain(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        else:
            self.exited.set()

    def kill(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.exited.set()


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible API, admin and dashboard with an engine worker (embedded defaults)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("SUPERFLUID_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("SUPERFLUID_PORT", "8000")))
        add_engine_arguments(parser)
        add_api_arguments(parser)
        parser.add_argument("--http-default-qos", default=settings.SUPERFLUID_HTTP_DEFAULT_QOS, help="class for requests that name none (default: agent)")
        parser.add_argument("--no-http-qos-header", action="store_true", default=not settings.SUPERFLUID_HTTP_QOS_HEADER, help="ignore x-superfluid-qos")
        parser.add_argument("--http-allow-batch-invariant", action="store_true", default=settings.SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT, help="allow x-superfluid-batch-invariant over HTTP")
        parser.add_argument("--max-body-bytes", type=int, default=settings.SUPERFLUID_MAX_BODY_BYTES, help="largest request body (413 above)")
        parser.add_argument("--socket", default="", help="link socket path (default: a fresh one in the temp folder)")
        parser.add_argument("--require-key", action="store_true", default=settings.SUPERFLUID_REQUIRE_KEY, help="every API request needs a key (always so when binding beyond loopback)")
        parser.add_argument("--rate-limit", type=int, default=settings.SUPERFLUID_RATE_LIMIT, help="requests per minute per client IP, for requests without a key limit (0 = off)")
        parser.add_argument("--completion-rate", default=settings.SUPERFLUID_COMPLETION_RATE, help="fill-in-the-middle token bucket per client, e.g. 10/s or 600/m (0 = off)")
        parser.add_argument("--completion-burst", type=int, default=settings.SUPERFLUID_COMPLETION_BURST, help="fill-in-the-middle bucket capacity (default: 20)")

    def handle(self, *args: Any, **options: Any) -> None:
        config = scheduler_config(options)  # validates the flags before anything starts
        model = resolve_model(options)
        choose_engine(options["engine"], model)  # a model no engine can load fails here, not in the worker
        try:
            default_qos = parse_qos(options["http_default_qos"])
        except UnknownQosClass as exc:
            raise CommandError(f"--http-default-qos: {exc}") from None
        model_name = options["model_name"] or model_name_for(model)
        options["model_name"] = model_name
        try:
            parse_rate(options["completion_rate"])
        except ValueError as exc:
            raise CommandError(f"--completion-rate: {exc}") from None
        if options["completion_burst"] < 1 or options["rate_limit"] < 0:
            raise CommandError("--completion-burst must be at least 1 and --rate-limit 0 or more")

        call_command("migrate", interactive=False, verbosity=0)

        socket_path = options["socket"] or os.path.join(tempfile.gettempdir(), f"superfluid-{os.getpid()}.sock")
        settings.SUPERFLUID_SOCKET = socket_path
        settings.SUPERFLUID_MODELS = [model_name]
        settings.SUPERFLUID_HTTP_DEFAULT_QOS = default_qos.label
        settings.SUPERFLUID_HTTP_QOS_HEADER = not options["no_http_qos_header"]
        settings.SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT = options["http_allow_batch_invariant"]
        settings.SUPERFLUID_MAX_BODY_BYTES = options["max_body_bytes"]
        settings.SUPERFLUID_MAX_BATCH = config.max_batch
        settings.SUPERFLUID_REQUIRE_KEY = options["require_key"]
        settings.SUPERFLUID_KEYS_REQUIRED = options["require_key"] or not is_loopback(options["host"])
        settings.SUPERFLUID_RATE_LIMIT = options["rate_limit"]
        settings.SUPERFLUID_COMPLETION_RATE = options["completion_rate"]
        settings.SUPERFLUID_COMPLETION_BURST = options["completion_burst"]
        settings.SUPERFLUID_STRICT_PARAMS = options["strict_params"]
        settings.SUPERFLUID_MODEL_PATH = str(model)  # /tokenize reads the vocabulary from it

        worker_cmd = [sys.executable, str(MANAGE_PY), "runengine", "--socket", socket_path, *engine_argv(options, model)]
        supervisor = WorkerSupervisor(worker_cmd)
        supervisor.start()
        try:
            self._run_web(options, supervisor, model_name, config.max_batch)
        finally:
            supervisor.kill()
        if supervisor.fatal:
            raise CommandError(supervisor.fatal)
        sys.stdout.write("superfluid stopped\n")
        sys.stdout.flush()

    def _run_web(self, options: dict[str, Any], supervisor: WorkerSupervisor, model_name: str, lanes: int) -> None:
        from channels.routing import get_default_application
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import reactor

        from scheduler.link import client as link_client

        host, port = options["host"], options["port"]
        base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

        if options["require_key"]:
            keys_line = "required (--require-key)"
        elif settings.SUPERFLUID_KEYS_REQUIRED:
            keys_line = f"required (binds {host}, beyond loopback)"
        else:
            keys_line = "optional on loopback (--require-key to require them)"

        def ready() -> None:
            sys.stdout.write(
                f"superfluid serving {model_name} ({lanes} lanes)\n"
                f"  API:       {base}/v1  (OpenAI-compatible)\n"
                f"  admin:     {base}/admin/\n"
                f"  dashboard: {base}/dashboard/\n"
                f"  health:    {base}/health\n"
                f"  API keys:  {keys_line}\n"
            )
            sys.stdout.flush()
            from keys.runtime import get_runtime

            reactor.callLater(0, get_runtime)  # load keys, push the admin's class-lane caps to the worker

        server = Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=False,
            verbosity=0,
            http_timeout=None,
            application_close_timeout=5,
            ready_callable=ready,
        )
        drain_timeout = float(options["drain_timeout"])

        def begin_drain() -> None:
            if getattr(begin_drain, "started", False):
                return
            begin_drain.started = True  # type: ignore[attr-defined]
            sys.stdout.write("draining: no new requests; waiting for in-flight ones\n")
            sys.stdout.flush()
            for client in link_client._clients.values():
                client.draining = True
            supervisor.drain()
            deadline = time.monotonic() + drain_timeout + 2.0

            def check() -> None:
                # responses still being written, not jobs still at the worker: a job can be done
                # there while its last frames are still on their way to the client
                open_responses = sum(len(c.open) for c in link_client._clients.values())
                if (supervisor.exited.is_set() and open_responses == 0) or time.monotonic() > deadline:
                    reactor.callLater(0.2, reactor.stop)
                else:
                    reactor.callLater(0.1, check)

            check()

        def on_signal(signum: int, frame: Any) -> None:
            reactor.callFromThread(begin_drain)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        supervisor.on_fatal = lambda: reactor.callFromThread(reactor.stop)
        if supervisor.fatal:  # the worker gave up before the callback was set
            return
        server.run()
