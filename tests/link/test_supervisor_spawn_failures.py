"""serve's WorkerSupervisor when a worker cannot be started at all (no file descriptors left for
now): each try is retried until it works, so a try that fails must give back what it took."""

from __future__ import annotations

import errno
import os
import socket
import sys

import pytest

from scheduler.management.commands.serve import WorkerSupervisor


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_start_that_finds_no_descriptor_for_its_link_leaks_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status pipe was made before the link's socket pair: with the descriptors used up, the
    pipe's two were taken, the pair failed, and the pipe was never closed. Every retry (every 10 s,
    until a start works) then kept two more, so the server that ran out of descriptors never got
    them back and the worker could never be started again."""

    def no_descriptors(*args: object, **kwargs: object) -> tuple[socket.socket, socket.socket]:
        raise OSError(errno.EMFILE, "Too many open files")

    sup = WorkerSupervisor([sys.executable, "-c", "pass"])
    monkeypatch.setattr(socket, "socketpair", no_descriptors)
    before = open_fds()
    for _ in range(5):  # five retries of the restart loop
        with pytest.raises(OSError):
            sup._spawn()
    assert open_fds() == before
    assert sup.proc is None
