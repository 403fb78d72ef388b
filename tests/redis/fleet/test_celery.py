"""Redis mode: the Batch API on Celery, through the unmodified ``openai`` client, with real
``celery -A superfluid_site worker`` processes of this module's own on the package's fleet
(conftest.py: its redis-server is the broker, its database theirs, its two ``runengine``
workers run the lines, and its head 2 takes the API calls). Its tests run before
test_processes.py's, which stop Redis and kill processes of the fleet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from testkit.harness import ROOT, RunningServer, stop_processes
from tests.e2e.server import openai_client
from tests.e2e.test_batches import wait_for

from .conftest import MODEL, Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.model]


STALL_S = 3  # SUPERFLUID_BATCH_STALL_S for the Celery workers here: a lost chain is seen in seconds
LEASE_S = 3  # SUPERFLUID_BATCH_LEASE_S: a killed worker's line is free again in seconds


def celery_worker(env: dict[str, str], data_dir: str) -> subprocess.Popen[bytes]:
    with open(Path(data_dir) / "celery.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "superfluid_site", "worker", "--pool", "threads", "--concurrency", "4", "--loglevel", "info"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )


@dataclass
class Deployment:
    """A ``serve --redis`` head of the fleet, its Redis, and what a Celery worker of it is started with."""

    head: RunningServer
    worker: subprocess.Popen[bytes]
    redis_url: str
    env: dict[str, str]
    data_dir: str


@pytest.fixture(scope="module")
def head_and_celery(fleet: Fleet) -> Iterator[Deployment]:
    """Head 2 of the fleet (head 1 dies in test_processes.py's last test) and a Celery worker.
    The heads read neither setting below: in Redis mode a head only sends a batch's start task,
    and the lines, their leases and the sweep are the Celery workers'."""
    head = fleet.heads[1]
    assert head.proc is not None and head.proc.poll() is None, head.log()
    env = {**os.environ, "SUPERFLUID_DATA_DIR": fleet.data_dir, "REDIS_URL": fleet.redis.url, "SUPERFLUID_BATCH_STALL_S": str(STALL_S), "SUPERFLUID_BATCH_LEASE_S": str(LEASE_S)}
    worker = celery_worker(env, fleet.data_dir)
    try:
        yield Deployment(head, worker, fleet.redis.url, env, fleet.data_dir)
    finally:
        stop_processes(worker)  # none of this module's workers is left to the fleet's next tests


def batch_file(c: openai.OpenAI, n: int, max_tokens: int) -> str:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"{i} plus {i} is", "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]
    return c.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch").id


def completed_once(c: openai.OpenAI, batch_id: str, n: int) -> None:
    """The batch of ``batch_file(c, n, ...)`` completes, each of its lines once in the output."""
    done = wait_for(c, batch_id, ("completed", "failed", "cancelled", "expired"), timeout_s=120)
    assert done.status == "completed", done
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (n, 0)
    assert done.output_file_id is not None
    out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(n))


def test_a_20_line_batch_completes_on_a_celery_worker_and_cancel_works(head_and_celery: Deployment) -> None:
    worker = head_and_celery.worker
    c = openai_client(head_and_celery.head.base)
    b = c.batches.create(input_file_id=batch_file(c, 20, 8), endpoint="/v1/completions", completion_window="24h")
    b = wait_for(c, b.id, ("completed", "failed", "cancelled"))
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (20, 20, 0)
    out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(20))
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"][0]["text"] for o in out)
    assert b.error_file_id is None

    long = c.batches.create(input_file_id=batch_file(c, 40, 40), endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while c.batches.retrieve(long.id).request_counts.completed < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.batches.cancel(long.id).status in ("cancelling", "cancelled")
    long = wait_for(c, long.id, ("cancelled", "completed", "failed"), timeout_s=120)
    assert long.status == "cancelled"
    assert long.request_counts.completed < 40
    assert worker.poll() is None


def test_a_batch_whose_tasks_the_broker_lost_gets_new_chains_and_completes(head_and_celery: Deployment) -> None:
    """Each line's task sends the next task of its chain through Redis. When the broker loses
    them (a publish that failed while Redis was away, a Redis restarted without persistence),
    the batch stayed ``in_progress`` for good: nothing else sent a task for it, or noticed its
    expiry. A worker's sweep now gives a running batch none of whose tasks ran for
    ``SUPERFLUID_BATCH_STALL_S`` new chains. Here the worker stops at once (a warm shutdown:
    its running tasks end and send their next ones) and the broker loses those, and the start
    task of a batch created meanwhile."""
    import redis as redis_py

    deployment = head_and_celery
    worker = deployment.worker
    c = openai_client(deployment.head.base)
    b = c.batches.create(input_file_id=batch_file(c, 60, 24), endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 120  # bounds a hang only
    while c.batches.retrieve(b.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    # a batch created meanwhile: its start task waits in the queue, and is lost with the rest
    unstarted = c.batches.create(input_file_id=batch_file(c, 4, 4), endpoint="/v1/completions", completion_window="24h")
    broker = redis_py.Redis.from_url(deployment.redis_url)
    broker.delete("celery", "unacked", "unacked_index")  # Celery's queue and its unacknowledged tasks
    broker.close()
    stalled = c.batches.retrieve(b.id)
    assert stalled.status == "in_progress" and stalled.request_counts.completed < 60, stalled
    assert c.batches.retrieve(unstarted.id).status == "validating"
    replacement = celery_worker(deployment.env, deployment.data_dir)
    try:
        completed_once(c, b.id, 60)
        late = wait_for(c, unstarted.id, ("completed", "failed", "cancelled", "expired"), timeout_s=60)
        assert late.status == "completed" and late.request_counts.completed == 4, late
    finally:
        stop_processes(replacement)


def test_a_batch_whose_celery_worker_was_killed_mid_line_completes_on_another_with_each_line_once(head_and_celery: Deployment) -> None:
    """A worker killed (SIGKILL) with lines in flight leaves them leased to a runner that is
    gone, and its chains' tasks unacknowledged. Once the leases lapse, the sweep of the worker
    started in its place gives the batch new chains, and every line runs, once in the output."""
    deployment = head_and_celery
    c = openai_client(deployment.head.base)
    worker = deployment.worker if deployment.worker.poll() is None else celery_worker(deployment.env, deployment.data_dir)
    b = c.batches.create(input_file_id=batch_file(c, 30, 24), endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 120  # bounds a hang only
    while c.batches.retrieve(b.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker.kill()
    worker.wait(30)
    replacement = celery_worker(deployment.env, deployment.data_dir)
    try:
        completed_once(c, b.id, 30)
    finally:
        stop_processes(replacement)
