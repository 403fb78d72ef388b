"""serve's WorkerSupervisor when a stop signal reaches its starting worker before serve's own
handler has drained: Ctrl-C signals the terminal's whole process group, and a service manager's
stop (systemd's default KillMode=control-group, the unit in docs/deployment.md) every process of
the service, so the worker, still starting, can die of it a moment before serve tells it to stop.
A stand-in worker (a few lines of Python), not runengine."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from scheduler.management.commands.serve import WorkerSupervisor

# Dies of the signal at start-up, as a worker does before runengine blocks its stop signals (the
# Python and Django start-up before its handle()); notes that it has first. The signal's default
# action is set first: a process started in the background by a shell without job control
# inherits SIGINT ignored, and the stand-in then lived on and exited 0 (a start-up failure).
DIES_OF_SIGNAL = """
import os, signal, sys
open(sys.argv[1], "w").close()
sig = getattr(signal, sys.argv[2])
signal.signal(sig, signal.SIG_DFL)
os.kill(os.getpid(), sig)
"""


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.01)


@pytest.mark.parametrize("repack", [None, "auto"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_worker_stopped_with_serve_as_it_starts_is_a_stop_not_a_crash(tmp_path: Path, repack: str | None, sig: str) -> None:
    """serve stopped with exit status 1 and "the engine worker died with signal SIGTERM (-15)
    while loading the model" (a service manager's failed stop), or, with --repack auto, blamed
    llama.cpp's extra buffer types and started the worker once more with --no-repack."""
    marker = tmp_path / "started"
    sup = WorkerSupervisor([sys.executable, "-c", DIES_OF_SIGNAL, str(marker), sig], repack=repack)
    sup.start()
    try:
        wait_for(marker)
        time.sleep(0.2)  # serve's own handler runs a moment later, and drains
        sup.drain()
        assert sup.exited.wait(30), "the supervisor never stopped"
        assert sup.fatal is None
        assert sup.restarts == 0 and "--no-repack" not in sup.argv
    finally:
        sup.kill()


def test_a_starting_worker_killed_alone_still_stops_serve_with_the_reason(tmp_path: Path) -> None:
    """No drain follows (someone signalled the worker alone): a start-up failure, as before."""
    marker = tmp_path / "started"
    sup = WorkerSupervisor([sys.executable, "-c", DIES_OF_SIGNAL, str(marker), "SIGTERM"])
    sup.start()
    try:
        assert sup.exited.wait(30), "the supervisor never stopped"
        assert sup.fatal is not None and "signal SIGTERM" in sup.fatal
    finally:
        sup.kill()
