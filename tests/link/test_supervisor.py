"""serve's WorkerSupervisor against small stand-in workers (a few lines of Python each), not
runengine: how it stops a worker it is starting, how it waits between restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler.management.commands.serve import WorkerSupervisor

# Reports ready on --status-fd as runengine does; the first one (no marker file yet) then exits
# at once, as a worker that crashed, and every later one runs until it is told to stop.
FAKE_WORKER = """
import os, sys, time
marker, args = sys.argv[1], sys.argv[2:]
fd = int(args[args.index("--status-fd") + 1])
os.write(fd, b"loaded repack=none\\nready\\n")
os.close(fd)
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(1)
time.sleep(120)
"""


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@dataclass
class Starts:
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)  # every worker started
    on_restart: list[Callable[[], None]] = field(default_factory=list)  # run as a restart starts its worker


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Starts]:
    """The worker processes the supervisor starts, killed at the end whatever the test did."""
    real = subprocess.Popen
    seen = Starts()

    def popen(*args, **kwargs):  # type: ignore[no-untyped-def]
        if seen.procs and seen.on_restart:
            seen.on_restart.pop()()
        proc = real(*args, **kwargs)
        seen.procs.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        yield seen
    finally:
        for proc in seen.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("stop", ["drain", "kill"])
def test_a_worker_started_as_the_supervisor_is_told_to_stop_is_stopped_too(starts: Starts, tmp_path: Path, stop: str) -> None:
    """A drain or kill that lands while a restart is starting the next worker (the pool unloading
    its model, serve stopping) saw only the dead worker before it. ``exited`` was set at once and
    the new worker ran on, told nothing: the pool loaded the model again beside it (two workers,
    twice the memory), and serve's drain took it for done."""
    sup = WorkerSupervisor([sys.executable, "-c", FAKE_WORKER, str(tmp_path / "crashed")])
    starts.on_restart.append(getattr(sup, stop))
    sup.start()
    try:
        wait_for(lambda: len(starts.procs) == 2)
        assert sup.exited.wait(30), "the supervisor never stopped"
        # by the time it says no worker runs, none does
        assert all(proc.poll() is not None for proc in starts.procs)
        assert sup.restarts == 1
    finally:
        sup.kill()


def test_a_restart_whose_start_fails_otherwise_than_with_an_os_error_is_tried_again(starts: Starts, tmp_path: Path) -> None:
    """Popen raises SubprocessError when the child's set-up before exec fails: the supervising
    thread died of it, and serve ran on with no worker and nothing starting one (every request
    503, and with several models that model's load waited for ever)."""

    def fail() -> None:
        raise subprocess.SubprocessError("Exception occurred in preexec_fn.")

    sup = WorkerSupervisor([sys.executable, "-c", FAKE_WORKER, str(tmp_path / "crashed")])
    starts.on_restart.append(fail)
    sup.start()
    try:
        wait_for(lambda: len(starts.procs) == 2 or sup.exited.is_set())
        assert not sup.exited.is_set() and sup.proc is starts.procs[1] and sup.proc.poll() is None
    finally:
        sup.kill()


@pytest.mark.parametrize(("name", "where"), [("c", "in serve's log"), ("", "above")])
def test_a_model_that_cannot_be_loaded_says_where_its_reason_is(starts: Starts, name: str, where: str) -> None:
    """With several models a load's failure is the 503 detail its clients get and the admin's
    error: it said the worker's message was "above", which only serve's console has."""
    from scheduler.management.commands.runengine import EXIT_MODEL_UNLOADABLE

    sup = WorkerSupervisor([sys.executable, "-c", f"import sys; sys.exit({EXIT_MODEL_UNLOADABLE})"], name=name)
    sup.start()
    try:
        assert sup.exited.wait(30), "the supervisor never stopped"
        assert sup.fatal is not None and sup.fatal.endswith(f"(its message is {where})"), sup.fatal
    finally:
        sup.kill()


# Stands in for serve: starts a worker with serve's _die_with_parent, made to run only once this
# process is gone (serve SIGKILLed between the fork and the call). The child notes its pid first.
SERVE_DYING_AS_IT_STARTS = """
import os, subprocess, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")
import django
django.setup()
from scheduler.management.commands import serve
pid_file = sys.argv[1]
me = os.getpid()

def preexec():
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    while os.getppid() == me:
        time.sleep(0.01)
    serve._die_with_parent()

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=preexec)
time.sleep(120)
"""


def running(pid: int) -> bool:
    """Not gone and not a zombie (an orphan's new parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_whose_serve_died_as_it_was_started_does_not_run_on(tmp_path: Path) -> None:
    """serve SIGKILLed between the fork and _die_with_parent's prctl: the parent-death signal was
    asked for too late to ever come, and the worker ran on, orphaned, holding its model."""
    pid_file = tmp_path / "child.pid"
    helper = subprocess.Popen([sys.executable, "-c", SERVE_DYING_AS_IT_STARTS, str(pid_file)], cwd=Path(__file__).resolve().parents[2])
    child = 0
    try:
        wait_for(lambda: pid_file.exists() or helper.poll() is not None)
        assert helper.poll() is None, "the stand-in for serve did not start its worker"
        child = int(pid_file.read_text())
        helper.kill()
        helper.wait()
        wait_for(lambda: not running(child))
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        if child and running(child):
            os.kill(child, signal.SIGKILL)
