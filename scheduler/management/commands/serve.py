"""Serve everything on one machine: daphne (ASGI) in this process, the engine worker beside it.

The worker is a separate process so that a llama.cpp crash cannot take the web server down;
this command restarts it when it dies. Each worker gets a fresh ``socketpair``: it inherits one
end, this process keeps the other, so the link has no path another user could take.

With ``--redis URL`` it is a fleet head: jobs go through the Redis queue, and the worker it starts
pulls from that queue like any other (``--no-engine``: no local worker).

SIGTERM (or Ctrl-C) drains: no new requests are admitted, accepted ones get ``--drain-timeout``
seconds to finish (the worker gets the same timeout), then every stream still open ends with an
error frame and ``[DONE]`` (and its access-log line and activity row), and the process exits 0
within a few seconds more, whatever the worker is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from keys.binding import is_loopback
from keys.limits import parse_rate
from scheduler.core.qos import UnknownQosClass, parse_qos
from scheduler.engines.models import model_name_for
from scheduler.link.messages import SHUTDOWN
from scheduler.link.pool import PoolSetup, all_pools
from scheduler.management.commands.runengine import EXIT_MODEL_UNLOADABLE
from scheduler.management.options import (
    FlagsCommand,
    _env,
    add_api_arguments,
    add_engine_arguments,
    add_fim_arguments,
    add_web_arguments,
    check_bind_options,
    check_lanes_and_context,
    check_web_options,
    choose_engine,
    engine_argv,
    resolve_model,
    scheduler_config,
)
from scheduler.models_config import (
    FIM_MAX_CONTEXT,
    ConfigError,
    ModelsConfig,
    from_model_paths,
    load_config,
    with_fim_model,
)
from superfluid_site.deploy import with_bound_host
from superfluid_site.eventloop import loop_name
from superfluid_site.serving import ServingConfig, override_django_settings, serving
from superfluid_site.serving import install as install_serving

if TYPE_CHECKING:
    from scheduler.link.transport import Transport

log = logging.getLogger("superfluid.serve")

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # this process's own C library, glibc or musl
    except (OSError, AttributeError):  # no prctl: not Linux
        return None


# Looked up here, in serve, not in the forked child: a dlopen there could wait for ever on a lock
# another of serve's threads held as it forked.
_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1
_serve_pid = os.getpid()  # the process that starts the workers (set again before each start)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the serve process dies, so no worker is left orphaned.

    A serve that died between the fork and this call never sends it (the child then ran on, a
    worker nobody stops): the child sees it has another parent now and stops at once."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != _serve_pid:
        os.kill(os.getpid(), signal.SIGTERM)


NO_REPACK_HINT = (
    "llama.cpp's extra buffer types (AMX, weight repacking) crash some native builds on some CPUs: "
    "--no-repack (or SUPERFLUID_NO_REPACK=1) turns them off"
)


def _portable_build_hint() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        pin = f"llama-cpp-python=={version('llama-cpp-python')}"
    except PackageNotFoundError:  # not installed as a distribution: the unpinned name
        pin = "llama-cpp-python"
    return (
        "if llama-cpp-python was built for another CPU, or its native build crashes here, rebuild it with "
        f'portable AVX2 kernels: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall --no-cache-dir --no-deps {pin} '
        "(docs/engines.md)"
    )


# A starting worker dead of one of these waits this long for serve's own drain before its death
# counts as a start-up failure (a stop, not a crash, when serve was signalled with it)
_STOP_SIGNALS = (int(signal.SIGTERM), int(signal.SIGINT))
STOP_SIGNAL_GRACE_S = 2.0


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name} ({rc})"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


class WorkerSupervisor:
    """Starts the engine worker and starts it again whenever it dies, until told to stop.

    Until a worker has reported ready (model loaded, start-up decode done) a death is a start-up
    failure, which no restart mends: a worker killed by a signal while starting with llama.cpp's
    extra buffer types chosen by --repack auto is started once more with --no-repack; any other
    start-up death stops serve with the reason.
    """

    def __init__(self, argv: list[str], *, pair: bool = True, repack: str | None = None, sockets: Any = None, name: str = "") -> None:
        self.argv = argv
        self.pair = pair  # a socketpair per worker (else the worker listens on --socket)
        self.repack = repack  # a llama.cpp worker's --repack; None for other engines
        self.sockets = sockets  # where the web end goes (default: the single worker's)
        self.name = name  # the model, in messages (several models)
        self.proc: subprocess.Popen[bytes] | None = None
        self._status_fd = -1
        self.ever_ready = False
        self.stopping = False
        self.restarts = 0
        self.fatal: str | None = None  # why serving cannot start at all
        self.on_fatal: Callable[[], None] | None = None
        self._killing = False  # kill() was called: a worker started after it gets SIGKILL, not SIGTERM
        self._wake = threading.Event()  # set by drain() and kill(): a backoff wait ends at once
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
        self.exited = threading.Event()  # set once no worker runs and none will be started again

    def start(self) -> None:
        if not self.argv:  # serve --redis --no-engine: a web head only, nothing to supervise
            return
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        read_fd, write_fd = os.pipe()
        argv, pass_fds = [*self.argv, "--status-fd", str(write_fd)], [write_fd]
        ours = theirs = None
        global _serve_pid
        _serve_pid = os.getpid()
        try:
            # in here: with no descriptor left for the pair, the pipe is closed too (each retry
            # of _respawn kept two more, and the server never got its descriptors back)
            if self.pair:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                argv += ["--link-fd", str(theirs.fileno())]
                pass_fds.append(theirs.fileno())
            proc = self.proc = subprocess.Popen(argv, preexec_fn=_die_with_parent, pass_fds=tuple(pass_fds))
        except BaseException:
            os.close(read_fd)
            if ours is not None:
                ours.close()
            raise
        finally:
            os.close(write_fd)
            if theirs is not None:
                theirs.close()
        self._status_fd = read_fd
        if ours is not None:
            from scheduler.link.client import WORKER_SOCKETS

            (self.sockets or WORKER_SOCKETS).put(ours)
        if self.stopping:
            # drain() or kill() ran while this worker was being started: they saw the dead one
            # before it, so this one is told here (else it ran on beside the next load of its model)
            self._stop(proc)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            if self._killing:
                proc.kill()
            else:
                proc.send_signal(signal.SIGTERM)

    def _read_status(self) -> list[str]:
        """The start-up lines the worker (now dead) wrote to its status pipe."""
        fd, self._status_fd = self._status_fd, -1
        if fd < 0:
            return []
        data = b""
        os.set_blocking(fd, False)
        try:
            while chunk := os.read(fd, 4096):
                data += chunk
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace").split()

    def _which(self) -> str:
        return f"engine worker for {self.name}" if self.name else "engine worker"

    def _model_text(self) -> str:
        return f"the model {self.name}" if self.name else "the model"

    def _startup_failure(self, rc: int, status: list[str]) -> str | None:
        """Why serving cannot start, or None to start once more with --no-repack. With several
        models it is a load's failure, which the model's clients and the admin read: the
        worker's own words are in serve's log, not "above"."""
        where = "in serve's log" if self.name else "above"
        if rc == EXIT_MODEL_UNLOADABLE:
            # A configuration error, which no restart mends. serve stops, as llama-server does.
            return f"the engine worker cannot load {self._model_text()} (its message is {where})"
        doing = "decoding its start-up batch" if any(s.startswith("loaded") for s in status) else "loading the model"
        died = f"the {self._which()} died with {_exit_text(rc)} while {doing}"
        if self.repack is None:
            return f"{died} (its output is {where})"
        if "--no-repack" in self.argv:
            return f"{died}, also with --no-repack; {_portable_build_hint()}"
        if rc < 0 and self.repack == "auto" and "repack=off" not in status:
            return None
        if "repack=on" in status:
            return f"{died}; {NO_REPACK_HINT}"
        return f"{died}; {_portable_build_hint()}"

    def _watch(self) -> None:
        try:
            self._supervise()
        finally:
            self.exited.set()

    def _respawn(self, backoff: float) -> bool:
        """Start the worker again; a start that fails (no file descriptors or memory left for
        now) is tried again, the waits growing to 10 s, until it works or serve stops. False:
        serve is stopping."""
        while not self.stopping:
            try:
                self._spawn()
                return True
            except (OSError, subprocess.SubprocessError) as exc:  # the latter: the child's set-up before exec failed
                backoff = min(10.0, backoff * 2)
                sys.stderr.write(f"{self._which()} could not be started ({exc}); trying again in {backoff:.1f}s\n")
                self._wake.wait(backoff)
        return False

    def _supervise(self) -> None:
        backoff = 0.2
        while True:
            assert self.proc is not None
            started = time.monotonic()
            rc = self.proc.wait()
            status = self._read_status()
            if self.stopping:
                break
            if "ready" in status:
                self.ever_ready = True
            elif not self.ever_ready:
                if -rc in _STOP_SIGNALS:
                    # Ctrl-C signals the terminal's process group, a service manager's stop every
                    # process of the service: the worker, still starting (its stop signals not
                    # yet blocked), died of serve's own stop a moment before serve's handler ran
                    self._wake.wait(STOP_SIGNAL_GRACE_S)
                    if self.stopping:
                        break
                # No worker ever started. A model that stops loading later (a file replaced
                # under a running server) is retried below like a crash.
                fatal = self._startup_failure(rc, status)
                if fatal is None:
                    sys.stderr.write(
                        f"{self._which()} died with {_exit_text(rc)} while starting with llama.cpp's extra buffer types "
                        "(AMX, weight repacking) on; starting it once more with --no-repack. "
                        "Pass --no-repack (or set SUPERFLUID_NO_REPACK=1) to start that way.\n"
                    )
                    self.argv = [*self.argv, "--no-repack"]
                    self.restarts += 1
                    if not self._respawn(backoff):
                        break
                    continue
                self.fatal = fatal
                self.stopping = True
                if self.on_fatal is not None:
                    self.on_fatal()
                break
            self.restarts += 1
            quick = time.monotonic() - started < 10
            backoff = min(10.0, backoff * 2) if quick else 0.2
            sys.stderr.write(f"{self._which()} exited with {rc}; restarting in {backoff:.1f}s\n")
            self._wake.wait(backoff)
            if not self._respawn(backoff):
                break

    def drain(self) -> None:
        """SIGTERM to the worker; :attr:`exited` is set once it has exited. Set here only when no
        supervising thread runs: one that runs sets it itself once it stops (a worker it is just
        starting included, which :meth:`_spawn` then tells), not as the worker before it is seen
        dead (the pool then loaded the model again beside a worker nobody told to stop)."""
        self.stopping = True
        self._wake.set()
        proc = self.proc
        if proc is not None:
            self._stop(proc)
        if self._thread.ident is None:  # never started: serve --redis --no-engine
            self.exited.set()

    def kill(self) -> None:
        self._killing = True
        self.stopping = True
        self._wake.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        # as in drain(): a supervising thread that runs sets it itself once it stops. It may be
        # starting a worker this call could not see, which _spawn then kills: set here, exited
        # said no worker ran while that one still did
        if self._thread.ident is None or not self._thread.is_alive():
            self.exited.set()


class PoolWorkers:
    """serve's drain and stop over every model's worker (several models; see scheduler/link/pool.py)."""

    fatal: str | None = None
    on_fatal: Callable[[], None] | None = None

    class _Exited:
        def is_set(self) -> bool:
            return all(p.exited() for p in all_pools())

    exited = _Exited()

    def drain(self) -> None:
        for p in all_pools():
            p.drain()

    def kill(self) -> None:
        for p in all_pools():
            p.kill()


class Drain:
    """serve's SIGTERM, as steps the reactor takes every 0.1 s (and a test can take by hand).

    :meth:`begin`: no link admits anything new (with several models, the web side's own link
    refuses new requests and each model's link is left to its pool, which marks it as it tells
    that model's worker: the router still dispatches what waited for a lane). The worker is told
    to drain (it finishes what it holds, for the same ``--drain-timeout``, and takes nothing
    more) once no job a link accepted
    still waits for it: at once where the accepted jobs wait at the worker itself (the local
    link), and with ``--redis`` once every job this head accepted has ended, since those wait in
    the Redis queue, which a draining worker no longer pulls from (another head's queued jobs are
    left to the rest of the fleet). The same rule as the model router's: a worker is never told
    while a request is on its way to it. :meth:`step` says ``"done"`` once the worker has exited
    and no response is still being written, ``"deadline"`` once ``--drain-timeout`` and one more
    second have passed since the signal, else ``"wait"``. At the deadline :meth:`cut` ends every
    request left (an error frame and ``[DONE]`` each) and tells the worker if it was not yet."""

    def __init__(
        self,
        supervisor: WorkerSupervisor | PoolWorkers,
        links: Callable[[], list[Transport]],
        drain_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.supervisor = supervisor
        self.links = links
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self.started = False
        self.worker_told = False
        self.deadline = 0.0

    def begin(self) -> None:
        self.started = True
        pools = all_pools()
        for link in self.links():
            # a model's link in a pool is the pool's to mark (ModelPool.drain): the router still
            # dispatches the requests waiting for a lane of a loaded model, which it accepted
            if not any(pool.holds(link) for pool in pools):
                link.draining = True
        # a worker told at once cuts what is left at drain_timeout; past this, the web side does
        self.deadline = self.clock() + self.drain_timeout_s + 1.0
        self._tell_worker()

    def _tell_worker(self, *, now: bool = False) -> None:
        if self.worker_told:
            return
        if not now and any(link.inflight and not link.queue_at_worker for link in self.links()):
            return  # a job this head accepted still waits in a shared queue, or runs
        self.worker_told = True
        self.supervisor.drain()

    def open_responses(self) -> int:
        return sum(len(link.open) for link in self.links())

    def step(self) -> str:
        self._tell_worker()
        if self.worker_told:
            exited = self.supervisor.exited.is_set()
            self._fail_orphans(exited=exited)
            # responses still being written, not jobs still at the worker: a job can be done
            # there while its last frames are still on their way to the client
            if exited and self.open_responses() == 0:
                return "done"
        if self.clock() > self.deadline:
            return "deadline"
        return "wait"

    def _fail_orphans(self, *, exited: bool) -> None:
        """The jobs a local link holds while no worker is connected can never run: no worker
        runs and none will be started (``exited``: one that crashed just before the signal was in
        its restart backoff), or the one still loading the model (the first, or a crashed one's
        replacement) was told to drain before it reads them (its link is ``draining``), and
        refuses them. They are ended now, where they waited for the load or the drain deadline.
        Only once the link has read its worker's end of the connection, so no reply still on its
        way is cut; jobs in a Redis queue are left to the rest of the fleet."""
        for link in self.links():
            if link.queue_at_worker and link.inflight and not link.connected and (exited or link.draining):
                link.fail_all(SHUTDOWN, "The server shut down before this request finished.")

    def cut(self) -> None:
        """The worker did not answer in time: end every stream with an error frame and [DONE]
        (each gets its access-log line and activity row); with several models, first every
        request still waiting at the router for a lane."""
        for pool in all_pools():
            pool.fail_waiting("The server shut down before this request finished.")
        for link in self.links():
            link.fail_all(SHUTDOWN, "The server shut down before this request finished.")
        self._tell_worker(now=True)


def _check_redis(url: str) -> None:
    """A wrong URL is a configuration error: say so at once. An unreachable server is not (it
    may come back): serve starts and answers 503 until it does."""
    try:
        import redis
    except ImportError:
        raise CommandError("--redis needs redis-py: pip install redis") from None
    try:
        redis.Redis.from_url(url)
    except ValueError as exc:
        raise CommandError(f"--redis: {exc}") from None


class Command(FlagsCommand):
    help = "Serve the OpenAI-compatible API, admin and dashboard with an engine worker (embedded defaults)."

    def add_arguments(self, parser: Any) -> None:
        # read as every other flag's variable (superfluid_site/env.py): empty is the default, a
        # port that is not a number is refused by the variable's name
        parser.add_argument("--host", default=_env("--host", "127.0.0.1"), help="address to bind (default: 127.0.0.1)")
        parser.add_argument("--port", type=int, default=_env("--port", 8000), help="HTTP port, 1-65535 (default: 8000)")
        add_engine_arguments(parser, repeat_model=True)
        add_web_arguments(parser)
        parser.add_argument("--config", default="", help="several models from a YAML file (see docs/configuration.md); not with --model")
        parser.set_defaults(config_env=_env("--config", ""))  # SUPERFLUID_CONFIG: when neither --config nor --model is given
        add_fim_arguments(parser)
        add_api_arguments(parser)
        parser.add_argument("--http-default-qos", default=settings.SUPERFLUID_HTTP_DEFAULT_QOS, help="class for requests that name none (default: agent)")
        parser.add_argument("--no-http-qos-header", action="store_true", default=not settings.SUPERFLUID_HTTP_QOS_HEADER, help="ignore x-superfluid-qos")
        parser.add_argument("--http-allow-batch-invariant", action="store_true", default=settings.SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT, help="allow x-superfluid-batch-invariant over HTTP")
        parser.add_argument("--max-body-bytes", type=int, default=settings.SUPERFLUID_MAX_BODY_BYTES, help="largest request body in bytes; a larger one is refused with 413 before it is parsed")
        parser.add_argument("--body-timeout", type=float, default=settings.SUPERFLUID_BODY_TIMEOUT, help="seconds a request's line, headers and body may take to arrive; a slower one is refused with 408 and nothing is queued (0: no bound)")
        parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""), help="a fleet head: jobs go through the Redis queue at this URL (REDIS_URL too); a local engine worker pulls from it unless --no-engine")
        parser.add_argument("--no-engine", action="store_true", help="with --redis: a web head only, no local engine worker")
        parser.add_argument("--socket", default="", help="link over a Unix socket at this path, in a directory only this user may write (default: an inherited socketpair, no path)")
        parser.add_argument("--key-policy", default=os.environ.get("SUPERFLUID_KEY_POLICY", ""), metavar="FILE", help="key policies and keys (by SHA-256 digest) in a JSON file, beside the admin's; read at start")
        parser.add_argument("--require-key", action="store_true", default=settings.SUPERFLUID_REQUIRE_KEY, help="every API request needs a key (always so when binding beyond loopback)")
        parser.add_argument("--rate-limit", type=int, default=settings.SUPERFLUID_RATE_LIMIT, help="requests per minute per client IP, for requests without a key limit (0 = off)")
        parser.add_argument("--completion-rate", default=settings.SUPERFLUID_COMPLETION_RATE, help="fill-in-the-middle token bucket per client, e.g. 10/s or 600/m (0 = off)")
        parser.add_argument("--completion-burst", type=int, default=settings.SUPERFLUID_COMPLETION_BURST, help="fill-in-the-middle bucket capacity (default: 20)")

    def _models(self, options: dict[str, Any]) -> ModelsConfig | None:
        """The models of --config or of several --model; None for the single-worker server."""
        # A flag on the command line wins over the other's variable: --model over SUPERFLUID_CONFIG,
        # --config over SUPERFLUID_MODEL (either variable once refused the other's flag, naming a
        # --model or --config nobody had given)
        paths = options["model"] or []
        if not paths and not options["config"]:
            env_config, env_model = options.get("config_env", ""), options.get("model_env", "")
            if env_config and env_model:
                raise CommandError("SUPERFLUID_CONFIG and SUPERFLUID_MODEL are both set: the file names the models; unset one (or give --config or --model)")
            options["config"] = env_config
            paths = [env_model] if env_model else []
        try:
            if options["config"]:
                if paths:
                    raise CommandError("--config names the models; leave out --model")
                if options["model_name"]:  # it was silently ignored: the model kept the file's id
                    raise CommandError("--config names the models (their keys are the ids); leave out --model-name (SUPERFLUID_MODEL_NAME)")
                cfg = load_config(Path(options["config"]).expanduser(), check_path=self._check_model_path(options))
            elif len(paths) > 1:
                resolved = [resolve_model({"model": p}) for p in paths]
                for p in resolved:
                    choose_engine(options["engine"], p)
                cfg = from_model_paths(
                    resolved, model_name_for, model_name=options["model_name"], aging_divisor_s=float(options["aging_divisor"]), swap_affinity_bonus=options["swap_affinity_bonus"]
                )
            elif options["fim_model"]:  # one main model and the FIM model: the router runs both
                main = resolve_model({"model": paths[0] if paths else ""})
                choose_engine(options["engine"], main)
                cfg = from_model_paths([main], model_name_for, model_name=options["model_name"], aging_divisor_s=float(options["aging_divisor"]), swap_affinity_bonus=options["swap_affinity_bonus"])
            else:
                options["model"] = paths[0] if paths else ""
                return None
            if options["fim_model"]:
                try:
                    fim_path = resolve_model({"model": options["fim_model"]})
                    choose_engine(options["engine"], fim_path)
                except CommandError as exc:  # their messages name --model, which nobody gave
                    raise CommandError(str(exc).replace("--model ", "--fim-model ")) from None
                cfg = with_fim_model(
                    cfg, fim_path, model_name_for, max_batch=options["fim_max_batch"], max_context=options["fim_max_context"] or min(options["ctx_size"], FIM_MAX_CONTEXT)
                )
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        if options["socket"]:
            raise CommandError("--socket links one worker; several models each get their own private socketpair")
        try:
            cfg.router_config()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return cfg

    def _check_model_path(self, options: dict[str, Any]) -> Callable[[Path], str | None]:
        def check(path: Path) -> str | None:
            if not path.exists():
                return f"no such file or directory: {path}"
            try:
                choose_engine(options["engine"], path)
            except CommandError as exc:  # its message named a --model nobody gave: the file's key is named
                return str(exc).replace("--model ", "")
            return None

        return check

    def _pool_setup(self, cfg: ModelsConfig, options: dict[str, Any]) -> PoolSetup:
        argvs: dict[str, list[str]] = {}
        lanes: dict[str, int] = {}
        ctx: dict[str, int] = {}
        repack: dict[str, str | None] = {}
        # the flags as given, though every model of the file may set its own: --max-batch 0 is a
        # mistake whether or not a model takes it
        check_lanes_and_context(options, {"ctx_size": "--ctx-size", "max_batch": "--max-batch"})
        for m in cfg.models:
            opts = dict(options)
            opts["model_name"] = m.id
            if m.max_batch is not None:
                opts["max_batch"] = m.max_batch
            if m.ctx_size is not None:
                opts["ctx_size"] = m.ctx_size
            if m.fim:
                opts["class_lanes"] = ""  # its lanes are its own; --class-lanes caps the main model's
            opts["aging_divisor"] = cfg.aging_divisor_s  # the workers age as the router does
            opts["swap_affinity_bonus"] = cfg.swap_affinity_bonus
            # lanes and context the file (or --fim-max-*) set are named so in errors: "lower
            # --ctx-size" sent the operator to a flag that does not change this model's
            names: dict[str, str] = {}
            if m.fim or cfg.source:
                for key, value, fim_flag in (("ctx_size", m.ctx_size, "--fim-max-context"), ("max_batch", m.max_batch, "--fim-max-batch")):
                    if value is not None:
                        names[key] = fim_flag if m.fim else f"models.{m.id}.{key}"
            try:
                scheduler_config(opts, names)  # --class-lanes against this model's lanes, and so on
            except CommandError as exc:
                raise CommandError(f"model {m.id}: {exc}") from None
            argvs[m.id] = [sys.executable, str(MANAGE_PY), "runengine", *engine_argv(opts, m.path)]
            lanes[m.id], ctx[m.id] = opts["max_batch"], opts["ctx_size"]
            # --repack (and the start-up retry with --no-repack) applies to llama.cpp's workers
            repack[m.id] = options["repack"] if choose_engine(options["engine"], m.path) == "llamacpp" else None

        def spawn(model_id: str, sockets: Any) -> WorkerSupervisor:
            return WorkerSupervisor(argvs[model_id], repack=repack[model_id], sockets=sockets, name=model_id)

        return PoolSetup(cfg, spawn, ctx_sizes=ctx, lanes=lanes)

    def handle(self, *args: Any, **options: Any) -> None:
        check_bind_options(options)  # before the database is migrated and a worker started
        models = self._models(options)
        pool_setup = None
        engine = ""
        if models is None:
            config = scheduler_config(options)  # validates the flags before anything starts
            model = resolve_model(options)
            engine = choose_engine(options["engine"], model)  # a model no engine can load fails here, not in the worker
        else:
            # the flags are validated against each model's own lanes and context there (a file's
            # max_batch 16 takes --class-lanes agent=12, which --max-batch's 8 refused)
            pool_setup = self._pool_setup(models, options)
        try:
            default_qos = parse_qos(options["http_default_qos"])
        except UnknownQosClass as exc:
            raise CommandError(f"--http-default-qos: {exc}") from None
        if pool_setup is None:
            model_name = options["model_name"] or model_name_for(model)
            options["model_name"] = model_name
        else:
            model_name = ", ".join(m.id for m in pool_setup.config.models)
        try:
            completion_rate = parse_rate(options["completion_rate"])
        except ValueError as exc:
            raise CommandError(f"--completion-rate: {exc}") from None
        # the burst is the bucket's capacity: with --completion-rate 0 there is no bucket
        if (completion_rate > 0 and options["completion_burst"] < 1) or options["completion_burst"] < 0 or options["rate_limit"] < 0:
            raise CommandError("--completion-burst must be at least 1 and --rate-limit 0 or more")
        if options["max_body_bytes"] < 1 or not 0 <= options["body_timeout"] < float("inf"):
            # 0 bytes refused every request with 413; a negative or NaN timeout bounded nothing
            raise CommandError("--max-body-bytes must be at least 1 and --body-timeout a number of seconds, 0 or more (0: no bound)")
        keepalive = options["sse_keepalive"]
        if not (keepalive == 0 or 1 <= keepalive < float("inf")):  # (a NaN is neither)
            raise CommandError(f"--sse-keepalive must be 0 (none) or a number of seconds, at least 1; got {keepalive:g}")

        check_web_options(options)
        if options["key_policy"]:
            from keys.policyfile import PolicyFileError, load_policy_file

            try:
                load_policy_file(options["key_policy"])
            except PolicyFileError as exc:
                raise CommandError(f"--key-policy {options['key_policy']}: {exc}") from None

        redis_url = options["redis"]
        if options["no_engine"] and not redis_url:
            raise CommandError("--no-engine needs --redis URL (or REDIS_URL): without a queue, no worker could take the requests")
        if options["no_engine"] and options["class_lanes"]:
            # the seed's fleet head: no local scheduler, so lane caps belong to each worker
            raise CommandError("--class-lanes (SUPERFLUID_CLASS_LANES) on a fleet head (--no-engine): it has no scheduler; set it on each worker's runengine")
        if redis_url and options["socket"]:
            raise CommandError("--socket and --redis are exclusive: with --redis the link is the Redis queue")
        if redis_url and pool_setup is not None:
            raise CommandError("--redis serves one model per worker for now: several models (--config, repeated --model) need the local link")
        if redis_url:
            _check_redis(redis_url)

        from django.db import connection

        from scheduler.checks import part_squashed_errors

        for error in part_squashed_errors(connection):  # superfluid.E005: call_command skips migrate's checks
            raise CommandError(f"({error.id}) {error.msg}; {error.hint}")
        call_command("migrate", interactive=False, verbosity=0)
        # superfluid.W001 for the flags as given (the registered check reads the environment)
        from scheduler.checks import binding_warnings, usable_key_exists

        for warning in binding_warnings(options["host"], options["require_key"], lambda: usable_key_exists(options["key_policy"])):
            self.stderr.write(f"WARNING: ({warning.id}) {warning.msg}\n\tHINT: {warning.hint}")

        socket_path = options["socket"]
        if socket_path:
            from scheduler.worker.server import check_not_listening, check_private_dir

            try:
                check_private_dir(socket_path)
                check_not_listening(socket_path)  # a file there is not the worker's to delete
            except (OSError, ValueError) as exc:
                raise CommandError(f"--socket: {exc}") from None
        serving_config = ServingConfig.from_settings(
            models=(model_name,) if pool_setup is None else tuple(m.id for m in pool_setup.config.models),
            # /tokenize reads the vocabulary from it (with several models: the first configured one's)
            model_path=str(model if pool_setup is None else pool_setup.config.models[0].path),
            model_paths=() if pool_setup is None else tuple((name, str(m.path)) for m in pool_setup.config.models for name in (m.id, *m.aliases)),
            # the flag as given: --redis "" is one machine even where REDIS_URL is set (the web
            # side once took the Redis queue that no worker of this serve reads)
            redis_url=redis_url,
            socket=socket_path or settings.SUPERFLUID_SOCKET,
            http_default_qos=default_qos.label,
            http_qos_header=not options["no_http_qos_header"],
            http_allow_batch_invariant=options["http_allow_batch_invariant"],
            max_body_bytes=options["max_body_bytes"],
            body_timeout=options["body_timeout"],
            max_queue=options["max_queue"],
            client_concurrency=options["client_concurrency"],
            strict_params=options["strict_params"],
            reasoning_format=options["reasoning_format"],
            prefill_assistant=not options["no_prefill_assistant"],
            sse_keepalive=options["sse_keepalive"],
            max_batch=config.max_batch if pool_setup is None else max(pool_setup.lanes.values()),
            require_key=options["require_key"],
            keys_required=options["require_key"] or not is_loopback(options["host"]),
            key_policy_file=os.path.abspath(options["key_policy"]) if options["key_policy"] else "",
            rate_limit=options["rate_limit"],
            completion_rate=options["completion_rate"],
            completion_burst=options["completion_burst"],
        )
        install_serving(serving_config)
        # Django and Channels read these two themselves (docs/architecture.md, "Configuration")
        django_overrides: dict[str, Any] = {"ALLOWED_HOSTS": with_bound_host(list(settings.ALLOWED_HOSTS), options["host"])}  # http://HOST:PORT answers
        if redis_url or settings.SUPERFLUID_REDIS_URL:  # the settings' layer is REDIS_URL's
            from superfluid_site.settings import channel_layers

            django_overrides["CHANNEL_LAYERS"] = channel_layers(redis_url)
        override_django_settings(**django_overrides)

        supervisor: WorkerSupervisor | PoolWorkers
        if pool_setup is None:
            worker_cmd = [sys.executable, str(MANAGE_PY), "runengine", *engine_argv(options, model)]
            if socket_path:
                worker_cmd += ["--socket", socket_path]
            if redis_url:
                worker_cmd = [] if options["no_engine"] else [*worker_cmd, "--redis", redis_url]
            supervisor = WorkerSupervisor(worker_cmd, pair=not socket_path and not redis_url, repack=options["repack"] if engine == "llamacpp" else None)
            supervisor.start()
            lanes_line = f"{config.max_batch} lanes"
        else:
            from scheduler.link import pool

            pool.configure(pool_setup)
            supervisor = PoolWorkers()
            n = pool_setup.config.max_loaded_models
            lanes_line = f"on demand, at most {n} loaded at once"
            fim_id = pool_setup.config.fim_model
            if fim_id:
                lanes_line += f"; fill-in-the-middle on {fim_id}, {pool_setup.lanes[fim_id]} lanes, resident"
        try:
            self._run_web(options, supervisor, model_name, lanes_line)
        finally:
            supervisor.kill()
            if socket_path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(socket_path)
        if supervisor.fatal:
            raise CommandError(supervisor.fatal)
        sys.stdout.write("superfluid stopped\n")
        sys.stdout.flush()

    def _run_web(self, options: dict[str, Any], supervisor: WorkerSupervisor | PoolWorkers, model_name: str, lanes: str) -> None:
        from channels.routing import get_default_application
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import reactor

        from superfluid_site.runtime import all_links

        host, port = options["host"], options["port"]
        base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

        if options["require_key"]:
            keys_line = "required (--require-key)"
        elif serving().keys_required:
            keys_line = f"required (binds {host}, beyond loopback)"
        else:
            keys_line = "optional on loopback (--require-key to require them)"

        def ready() -> None:  # daphne calls it with the reactor's loop set as the current one
            sys.stdout.write(
                f"superfluid serving {model_name} ({lanes})\n"
                f"  API:       {base}/v1  (OpenAI-compatible)\n"
                f"  admin:     {base}/admin/\n"
                f"  dashboard: {base}/dashboard/\n"
                f"  health:    {base}/health\n"
                f"  API keys:  {keys_line}\n"
                f"  web loop:  {loop_name(asyncio.get_event_loop())}\n"
            )
            sys.stdout.flush()
            from superfluid_site.runtime import key_runtime

            reactor.callLater(0, key_runtime)  # load keys, push the admin's class-lane caps to the worker
            if isinstance(supervisor, PoolWorkers):
                from scheduler.link.pool import get_pool

                reactor.callLater(0, get_pool)  # the router starts (TTLs, preloads)

        from api.edge import install_protocol_errors
        from superfluid_site.socket_writes import install_immediate_writes

        install_protocol_errors()  # daphne's own 400s (a bad header byte, a non-ASCII path): JSON too
        install_immediate_writes()  # a streamed token goes out when it is written, not a loop turn later
        server = Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=False,
            verbosity=0,
            http_timeout=None,
            # after a client leaves, its consumer cancels the job and queues its activity row:
            # no database wait any more (activity/writer.py), so this only bounds a stuck one
            application_close_timeout=10,
            ready_callable=ready,
        )
        # daphne only logs that it cannot listen (the port taken, an address not this machine's)
        # and returns: serve then said "superfluid stopped" and exited 0, so a service manager
        # took the failure for a clean stop and did not restart it
        listen_failures: list[str] = []
        daphne_listen_error = server.listen_error

        def listen_error(failure: Any) -> None:
            listen_failures.append(failure.getErrorMessage())
            daphne_listen_error(failure)

        server.listen_error = listen_error
        drain_timeout = float(options["drain_timeout"])

        drain = Drain(supervisor, all_links, drain_timeout)

        def begin_drain() -> None:
            if drain.started:
                return
            sys.stdout.write("draining: no new requests; waiting for in-flight ones\n")
            sys.stdout.flush()
            drain.begin()

            def check() -> None:
                state = drain.step()
                if state == "done":
                    reactor.callLater(0.2, reactor.stop)
                elif state == "deadline":
                    drain.cut()
                    cut_off()
                else:
                    reactor.callLater(0.1, check)

            def cut_off(waited: float = 0.0) -> None:
                if drain.open_responses() == 0 or waited >= 2.0:
                    reactor.callLater(0.2, reactor.stop)
                else:
                    reactor.callLater(0.1, cut_off, waited + 0.1)

            check()

        def on_signal(signum: int, frame: Any) -> None:
            reactor.callFromThread(begin_drain)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        supervisor.on_fatal = lambda: reactor.callFromThread(reactor.stop)
        if supervisor.fatal:  # the worker gave up before the callback was set
            return
        server.run()
        if listen_failures:
            raise CommandError(f"cannot serve HTTP: {'; '.join(listen_failures)}")
