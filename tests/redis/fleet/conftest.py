"""A fleet of real processes on loopback, shared by this package's modules: a redis-server of
its own, two engine workers (``runengine --redis URL``) with the bundled model and two web heads
(``serve --redis URL --no-engine``) on one database. test_celery.py runs the Batch API's Celery
workers on it; test_processes.py then stops and starts its Redis, SIGKILLs a worker (and starts
another) and, last, kills head 1. pytest runs a package's modules in file-name order, so the
Celery tests come first; they use head 2, which stays up, and so pass after those tests too.
One fleet for both saves a real server's start (a ``serve`` head with its engine, and a Redis,
for the Celery tests alone)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from testkit.harness import ROOT, RunningServer, stop_processes
from tests.redis.conftest import RedisServer

MODEL = "SmolLM2-135M-Instruct.Q4_1"
LANES = 3  # two workers: six lanes, so six streams are in flight at once


def start_worker(url: str, data_dir: str, log_dir: str, n: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(ROOT / "manage.py"), "runengine", "--redis", url, "--max-batch", str(LANES), "--ctx-size", "1024", "--threads", "1"]
    with open(Path(log_dir) / f"worker{n}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "SUPERFLUID_DATA_DIR": data_dir}, stdout=log, stderr=subprocess.STDOUT)


def start_heads(heads: list[RunningServer]) -> None:
    """Start the web heads side by side (each waits for its own port) and check each is up."""
    threads = [threading.Thread(target=h.start, args=(300,)) for h in heads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in heads:
        assert h.proc is not None and h.proc.poll() is None, h.log()


@dataclass
class Fleet:
    redis: RedisServer
    heads: list[RunningServer]
    workers: list[subprocess.Popen[bytes]]
    data_dir: str
    keys: dict[str, str] = field(default_factory=dict)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.redis.port)

    def live_workers(self) -> int:
        return int(self.client().scard("sf:workers"))

    def createkey(self, name: str, *flags: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "createkey", name, *flags],
            cwd=ROOT, env={**os.environ, "SUPERFLUID_DATA_DIR": self.data_dir}, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        self.keys[name] = done.stdout.strip().splitlines()[-1]
        return self.keys[name]


def wait_until(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


@pytest.fixture(scope="package")
def fleet() -> Iterator[Fleet]:
    server = RedisServer().start()
    data_dir = tempfile.mkdtemp(prefix="superfluid-fleet-")  # one database for both heads (and the Celery workers)
    # the database is migrated once, before the heads start (two migrating one file at once collide)
    env = {**os.environ, "SUPERFLUID_DATA_DIR": data_dir}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300)
    workers = [start_worker(server.url, data_dir, data_dir, n) for n in range(2)]
    heads = [RunningServer("--redis", server.url, "--no-engine", "--http-allow-batch-invariant", env={"SUPERFLUID_DATA_DIR": data_dir}) for _ in range(2)]
    fleet = Fleet(server, heads, workers, data_dir)
    try:
        start_heads(heads)
        wait_until(lambda: fleet.live_workers() == 2, 120, "both workers registered")
        yield fleet
    finally:
        for h in heads:
            if h.proc is not None and h.proc.poll() is None:  # test_processes.py's last test kills head 1
                h.stop()
        stop_processes(*workers)
        server.stop()
