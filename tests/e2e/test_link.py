"""The link against the real processes: it has no path, and a drain lets what fits finish,
refuses new work, still ends every stream properly when it runs out of time, and stops serve."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
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


def _collect(srv: RunningServer, body: dict, lines: list[str], started: threading.Event, after: int) -> None:
    """Stream ``body``, keeping every ``data:`` line; ``started`` is set after ``after`` lines."""
    with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
        lines.append(r.headers["x-request-id"])
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if len(lines) == after + 1:
                    started.set()
    started.set()


def test_sigterm_drains_what_fits_refuses_new_requests_ends_what_outlasts_the_drain_timeout_and_exits_zero() -> None:
    """One server for both halves of a drain: a short stream in flight at SIGTERM finishes
    normally; a long one (3,000 tokens, far beyond --drain-timeout) ends with an error frame;
    a new request meanwhile is a 503; serve exits 0. (A third lane keeps the probe requests
    sent before the signal is handled from queueing behind the two streams.)"""
    srv = RunningServer("--max-batch", "3", "--ctx-size", "4096", "--drain-timeout", "8").start()
    short = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}
    long = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 3000, "temperature": 0, "stream": True}
    got: dict[str, list[str]] = {"short": [], "long": []}
    started = {name: threading.Event() for name in got}
    threads = [
        threading.Thread(target=_collect, args=(srv, short, got["short"], started["short"], 1)),
        threading.Thread(target=_collect, args=(srv, long, got["long"], started["long"], 5)),
    ]
    try:
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in started.values())
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        # once the signal is handled, a new request is refused while the streams drain
        probe = {**short, "stream": False, "max_tokens": 1}
        refused = srv.wait_for(lambda: (r := httpx.post(srv.base + "/v1/completions", json=probe, timeout=30)).status_code == 503 and r, timeout_s=30)
        assert refused.json()["error"]["code"], refused.text
        for t in threads:
            t.join(120)
        # the wait's bound is a failsafe, not a measure
        assert srv.proc.wait(timeout=120) == 0

        request_id, *lines = got["short"]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"

        request_id, *lines = got["long"]
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
        for t in threads:
            t.join(30)
