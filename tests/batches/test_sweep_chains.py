"""Redis mode's sweep (batches/tasks.py) against a real redis-server on loopback: the broker is a
list here (a task sent is appended; the test runs them in order, as a worker would), the alive
marks and generations live in the real Redis, and the lines end at once (a fake line runner)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from batches import runner, tasks
from batches.models import Batch, File, Line
from tests.redis.conftest import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)

CONCURRENCY = 2


@pytest.fixture(scope="module")
def redis_port() -> Iterator[int]:
    server = RedisServer().start()
    yield server.port
    server.stop()


class Broker:
    """Celery's queue, in order: (task name, args) of each task sent and not yet run."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, tuple[Any, ...]]] = []

    def sender(self, name: str) -> Any:
        def send(*args: Any, **_kw: Any) -> None:
            self.queue.append((name, args))

        def apply_async(args: tuple[Any, ...] = (), **_kw: Any) -> None:
            self.queue.append((name, tuple(args)))

        return send, apply_async

    def run_one(self) -> None:
        name, args = self.queue.pop(0)
        {"run_line": tasks.run_line, "start_batch": tasks.start_batch}[name](*args)

    def run_round(self) -> int:
        """Run every task queued now (what they send waits for the next round); how many ran."""
        n = len(self.queue)
        for _ in range(n):
            self.run_one()
        return n


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch, redis_port: int, settings: Any) -> Iterator[Broker]:
    settings.SUPERFLUID_BATCH_CONCURRENCY = CONCURRENCY
    b = Broker()
    for name in ("run_line", "start_batch"):
        send, apply_async = b.sender(name)
        monkeypatch.setattr(getattr(tasks, name), "delay", send)
        monkeypatch.setattr(getattr(tasks, name), "apply_async", apply_async)
    client = redis.Redis(port=redis_port)
    monkeypatch.setattr(tasks, "_redis", client)

    async def instant(_b: Batch, line: Line) -> tuple[bool, dict[str, Any]]:
        return True, runner._output(line, 200, "req-1", {"choices": [{"text": line.custom_id}]})

    monkeypatch.setattr(runner, "run_line", instant)
    yield b
    client.close()


def make_batch(n: int) -> Batch:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="", total=n)
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body={"prompt": "p"}) for i in range(n)])
    return b


def stall_passes(batch_id: str) -> None:
    """SUPERFLUID_BATCH_STALL_S went by with no task of the batch run: its alive mark is gone."""
    tasks._broker().delete(tasks.ALIVE + batch_id)


def test_chains_still_queued_under_a_backlog_do_not_multiply_at_each_stall(broker: Broker) -> None:
    """Under a backlog the batch's chains wait in the broker, not run, past the stall time: the
    sweep took them for lost and gave the batch new ones, at every stall, and once the backlog
    cleared every one of them went on as a chain of its own: after three stalls a batch of
    concurrency 2 had 8 chains, each a task per line. A sweep now starts a new generation of
    chains; a task of an older one ends at once, so the batch has its concurrency again."""
    b = make_batch(40)
    tasks.start_batch(b.id)
    assert len(broker.queue) == CONCURRENCY
    for stall in range(1, 4):  # nothing of the queue ran: each stall the sweep sends new chains
        stall_passes(b.id)
        assert tasks.sweep() == [b.id]
        assert len(broker.queue) == CONCURRENCY * (1 + stall)
    broker.run_round()  # the backlog clears: every queued task runs
    assert len(broker.queue) == CONCURRENCY, broker.queue  # the chains that go on
    assert Batch.objects.get(pk=b.id).completed <= CONCURRENCY
    rounds = 0
    while broker.queue:
        assert len(broker.queue) <= CONCURRENCY
        broker.run_round()
        rounds += 1
        assert rounds < 100
    done = Batch.objects.select_related("output_file").get(pk=b.id)
    assert (done.status, done.completed, done.failed) == ("completed", 40, 0)
    out = bytes(done.output_file.content).decode().splitlines()
    assert [line.split('"custom_id": "')[1].split('"')[0] for line in out] == [f"c{i}" for i in range(40)]


def test_a_start_task_that_was_only_late_does_not_add_chains_to_the_one_the_sweep_sent(broker: Broker) -> None:
    """A batch still ``validating`` a stall time after its creation is started again by the
    sweep. When its first start task was only waiting in a backlog, both ran, and both found no
    line claimed yet (the first's chains were queued behind them): twice the chains."""
    from datetime import timedelta

    from django.utils import timezone

    b = make_batch(10)
    Batch.objects.filter(pk=b.id).update(created_at=timezone.now() - timedelta(seconds=tasks.stall_s() + 1))
    broker.queue.append(("start_batch", (b.id,)))  # the head's start task (batches/runner.py start), not run yet
    assert tasks.sweep() == [b.id]
    assert [name for name, _args in broker.queue] == ["start_batch", "start_batch"]
    broker.run_round()
    assert Batch.objects.get(pk=b.id).status == "in_progress"
    assert len(broker.queue) == CONCURRENCY, broker.queue
    while broker.queue:
        assert len(broker.queue) <= CONCURRENCY
        broker.run_round()
    assert Batch.objects.get(pk=b.id).completed == 10


def test_a_generation_redis_lost_is_set_again_by_the_chains_that_run(broker: Broker) -> None:
    """Redis restarted without persistence: the generation is gone with the queue, and the
    chains a worker still held (a task running, or waiting for its countdown) go on, setting it
    again, so that a sweep's next generation is newer than theirs."""
    b = make_batch(10)
    tasks.start_batch(b.id)
    stall_passes(b.id)
    assert tasks.sweep() == [b.id]
    chains = broker.queue[CONCURRENCY:]
    assert all(args[1] == 1 for _name, args in chains)
    tasks._broker().delete(tasks.GEN + b.id, tasks.ALIVE + b.id)  # the restart
    broker.queue[:] = chains[:1]  # one task a worker held; the rest was lost
    broker.run_round()
    assert int(tasks._broker().get(tasks.GEN + b.id)) == 1 and 0 < tasks._broker().ttl(tasks.GEN + b.id) <= tasks.GEN_TTL_S
    stall_passes(b.id)
    assert tasks.sweep() == [b.id]
    assert all(args[1] == 2 for _name, args in broker.queue[1:])
    broker.run_round()
    assert len(broker.queue) == CONCURRENCY  # the generation-1 chain ended
    while broker.queue:
        broker.run_round()
    assert Batch.objects.get(pk=b.id).completed == 10
