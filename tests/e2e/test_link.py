"""The link against the real processes: it has no path anyone could reach. (A drain, which ends
the link, is the last test on tests/e2e/test_worker_faults.py's server.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def _unix_socket_paths() -> dict[str, str]:
    """inode -> path of every Unix socket on the machine (empty for unnamed ones)."""
    out: dict[str, str] = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        out[fields[6]] = fields[7] if len(fields) > 7 else ""
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def test_the_link_between_serve_and_its_worker_has_no_path_anyone_could_reach(server: RunningServer) -> None:
    worker = int(server.health()["worker_pid"])
    assert server.proc is not None
    cmdline = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
    assert b"--link-fd" in cmdline and b"--socket" not in cmdline
    paths = _unix_socket_paths()
    ours = _socket_inodes(worker) | _socket_inodes(server.proc.pid)
    unix = {inode: paths[inode] for inode in ours if inode in paths}
    assert unix, "the link is a Unix socketpair"
    assert all(path == "" for path in unix.values()), unix
