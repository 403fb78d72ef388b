"""The link against the real processes: it has no path, and a drain that runs out of time still
ends every stream properly and stops serve in time."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import httpx
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


def test_sigterm_with_a_long_stream_and_a_short_drain_timeout_ends_it_with_an_error_frame_and_exits(tmp_path: Path) -> None:
    srv = RunningServer("--max-batch", "2", "--ctx-size", "4096", "--drain-timeout", "3").start()
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 3000, "temperature": 0, "stream": True}
    lines: list[str] = []
    try:
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
            request_id = r.headers["x-request-id"]
            data = (line for line in r.iter_lines() if line.startswith("data: "))
            for _ in range(5):
                lines.append(next(data))
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            lines.extend(data)
        # the drain ran out (3,000 tokens take longer than --drain-timeout 3): an error frame
        # ended the stream and serve exited 0 (the wait's bound is a failsafe, not a measure)
        assert srv.proc.wait(timeout=120) == 0
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "engine_unavailable" and "shut down" in error["message"]
        assert all("choices" in json.loads(line[6:]) for line in lines[:-2])  # text, then the error
        log = srv.log()
        assert f"completions {request_id} status=200" in log and "error=engine_unavailable" in log
        with sqlite3.connect(Path(srv.data_dir) / "superfluid.sqlite3") as db:
            rows = db.execute("SELECT error_code FROM activity_activityentry WHERE request_id = ?", (request_id,)).fetchall()
        assert rows == [("engine_unavailable",)]
    finally:
        srv.stop()
