"""A worker that dies while starting (issue 17: a native llama.cpp build on an AVX-512/AMX CPU
segfaults at its first decode with extra buffer types on) is started once more with
--no-repack, and serve stops with the hint if that dies too, instead of restarting it forever.

The crash is made for real: SUPERFLUID_TEST_CRASH_PROBE makes the worker SIGSEGV itself in its
start-up decode (here when it happens with --no-repack too; a serve that comes up after the
retry is tests/e2e/test_worker_faults.py's server). The supervisor's rules are also driven with
small fake workers, which are fast enough to cover each case, and with the real worker on a model
that cannot load."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scheduler.management.commands.serve import WorkerSupervisor
from testkit.harness import ROOT, free_port

RETRY_LINE = "starting it once more with --no-repack"

# A stand-in for runengine: reports on --status-fd as runengine does, and dies as `mode` says.
FAKE_WORKER = """
import os, signal, sys, time
mode, args = sys.argv[1], sys.argv[2:]
fd = int(args[args.index("--status-fd") + 1])
off = "--no-repack" in args or mode == "auto-off"
os.write(fd, ("loaded repack=" + ("off" if off else "on") + "\\n").encode())
if mode == "unloadable":
    sys.exit(78)
if mode in ("always", "auto-off") or (mode == "repack" and not off):
    os.kill(os.getpid(), signal.SIGSEGV)
os.write(fd, b"ready\\n")
if mode == "later":
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(60)
"""


def supervise(mode: str, *, repack: str | None = "auto") -> WorkerSupervisor:
    sup = WorkerSupervisor([sys.executable, "-c", FAKE_WORKER, mode], repack=repack)
    sup.start()
    return sup


def wait(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_worker_that_crashes_with_extra_buffer_types_is_started_once_more_with_no_repack(capfd) -> None:  # type: ignore[no-untyped-def]
    sup = supervise("repack")
    try:
        wait(lambda: sup.restarts == 1 and sup.proc is not None and sup.proc.poll() is None)
        assert sup.argv[-1] == "--no-repack" and sup.fatal is None
        assert not sup.exited.is_set()
    finally:
        sup.kill()
    assert RETRY_LINE in capfd.readouterr().err


def test_a_worker_that_crashes_with_no_repack_too_stops_serving_with_the_hint() -> None:
    sup = supervise("always")
    assert sup.exited.wait(30)
    assert sup.restarts == 1  # one retry, then no more
    assert sup.fatal is not None
    assert "SIGSEGV" in sup.fatal and "also with --no-repack" in sup.fatal and "GGML_NATIVE=OFF" in sup.fatal


def test_a_crash_with_extra_buffer_types_already_off_is_not_retried() -> None:
    # --repack auto turned them off itself (an AMX machine): --no-repack would change nothing
    sup = supervise("auto-off")
    assert sup.exited.wait(30)
    assert sup.restarts == 0 and sup.fatal is not None and "GGML_NATIVE=OFF" in sup.fatal


def test_an_explicit_repack_on_is_not_overridden_but_named_in_the_message() -> None:
    sup = supervise("repack", repack="on")  # serve --repack on
    assert sup.exited.wait(30)
    assert sup.restarts == 0 and "--no-repack" not in sup.argv
    assert sup.fatal is not None and "--no-repack (or SUPERFLUID_NO_REPACK=1)" in sup.fatal


def test_another_engine_dying_while_starting_stops_serving_without_llama_cpp_hints() -> None:
    sup = supervise("always", repack=None)  # the MLX engine
    assert sup.exited.wait(30)
    assert sup.restarts == 0 and sup.fatal is not None and "SIGSEGV" in sup.fatal
    assert "repack" not in sup.fatal and "CMAKE_ARGS" not in sup.fatal


def test_a_model_that_does_not_load_still_stops_serving_at_once() -> None:
    sup = supervise("unloadable")
    assert sup.exited.wait(30)
    assert sup.restarts == 0 and sup.fatal is not None and "cannot load the model" in sup.fatal


@pytest.mark.model
def test_a_real_worker_whose_model_cannot_be_loaded_stops_serving_with_its_reason_and_no_restart(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    """A model that does not load is a configuration error: the real engine worker says why
    and exits as unloadable, and the supervisor gives serve the reason (serve raises it and exits
    non-zero: the start-up crash test below runs that path with a real serve) instead of
    restarting the worker forever behind a server that can never answer."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # the magic, then nothing a loader can use
    argv = [sys.executable, str(ROOT / "manage.py"), "runengine", "--model", str(broken), "--max-batch", "1", "--ctx-size", "256"]
    sup = WorkerSupervisor(argv, repack="auto")  # as serve starts a llama.cpp worker
    sup.start()
    try:
        assert sup.exited.wait(300)
    finally:
        sup.kill()
    assert sup.restarts == 0 and sup.fatal == "the engine worker cannot load the model (its message is above)"
    err = capfd.readouterr().err  # the worker's own output: serve's, as it inherits it
    assert "cannot load" in err and str(broken) in err, err[-2000:]
    assert "restarting" not in err and RETRY_LINE not in err


def test_a_worker_that_crashes_after_it_was_ready_is_still_restarted() -> None:
    sup = supervise("later")
    try:
        wait(lambda: sup.restarts >= 2)
        assert sup.fatal is None and "--no-repack" not in sup.argv
    finally:
        sup.kill()


def test_a_restart_that_cannot_start_a_process_is_tried_again(monkeypatch: pytest.MonkeyPatch, capfd) -> None:  # type: ignore[no-untyped-def]
    """Starting the worker again can fail for a while (no file descriptors or memory left).
    The supervisor's thread used to die with that error: the model stayed dead for good and
    serve did not exit. Now the start is tried again."""
    import subprocess as sp

    from scheduler.management.commands import serve

    real, calls = sp.Popen, {"n": 0}

    def popen(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] in (2, 3):  # the first two restarts
            raise OSError(24, "Too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(serve.subprocess, "Popen", popen)
    sup = supervise("later")
    try:
        wait(lambda: calls["n"] >= 4 and sup.proc is not None and sup.proc.poll() is None)
        assert sup.fatal is None and not sup.exited.is_set()
    finally:
        sup.kill()
    assert "Too many open files" in capfd.readouterr().err


@pytest.mark.e2e
@pytest.mark.model
def test_serve_exits_with_the_hint_when_the_worker_crashes_at_start_up_whatever_the_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path), "SUPERFLUID_TEST_CRASH_PROBE": "always"}
    argv = [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(free_port()), "--max-batch", "2", "--ctx-size", "512"]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert done.stderr.count(RETRY_LINE) == 1, done.stderr[-3000:]
    assert "died with signal SIGSEGV (-11) while decoding its start-up batch, also with --no-repack" in done.stderr
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in done.stderr
    assert "restarting" not in done.stderr
