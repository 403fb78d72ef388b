"""pick.lua's candidates when a job put back after a loss heads its class. Its -1e300 score puts
it first in the class's sorted set whatever its priority, and pick.lua weighed only each class's
first job by score and its oldest: lifted by aging into a better class, where it ranks by its score
as an arrival, the requeued job hid its class's real first job by score, which aging may have
lifted as far and whose priority is higher. The first job by score behind a requeued one is a
candidate too, so the fleet's queue picks as a worker's own queues do
(scheduler/core/queues.py; tests/core/test_preempted_head_s52.py)."""

from __future__ import annotations

import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.qos import QosClass
from scheduler.core.queues import ClassQueues, ScoreConfig
from scheduler.core.types import Job
from scheduler.link.redis_transport import Scripts

from .test_pick_class_anchor_s47 import ANCHOR, waited
from .test_pick_order import enqueue, pick

PERIOD_S = 3  # starvation_s: one class per 3 s waited
Queued = tuple[str, int, int, float]  # id, class, priority, seconds waited


@pytest.fixture
def s(client: redis.Redis) -> Scripts:
    return Scripts(client)


def arrive(s: Scripts, client: redis.Redis, prefix: str, job_id: str, qos: int, prio: int, age: float = 0) -> None:
    """``job_id`` came ``age`` seconds ago."""
    enqueue(s, prefix, job_id, qos, prio)
    waited(client, prefix, job_id, qos, age)


def lose(s: Scripts, client: redis.Redis, prefix: str, jobs: list[Queued]) -> None:
    """``jobs`` (id, class, priority, seconds waited) came, were taken, and their worker was lost:
    each is put back at the head of its class, its arrival kept."""
    if not jobs:
        return
    for job_id, qos, prio, age in jobs:
        arrive(s, client, prefix, job_id, qos, prio, age)
    assert sorted(pick(s, prefix, len(jobs))) == sorted(j[0] for j in jobs)
    client.zadd(prefix + "leases", {j[0]: 0 for j in jobs})  # their leases ran out
    assert int(s.reap([prefix, 100, 60])) == len(jobs)
    for job_id, qos, prio, _ in jobs:
        epoch = int(client.hget(prefix + f"job:{job_id}", "epoch") or 0)
        assert enqueue(s, prefix, job_id, qos, prio, requeue=1, expect=epoch) == epoch


@pytest.mark.parametrize(
    ("lost_age", "arrivals", "order"),
    [
        # both background jobs waited a period and a second: both count as agent jobs. The one of
        # higher priority, the arrivals' first by score, goes first there, before the agent
        # request; the requeued one after it
        (4, [("bg", 3, ANCHOR[3] + 50, 4), ("agent", 2, ANCHOR[2] + 5, 0)], ["bg", "agent", "lost"]),
        # the requeued job is not lifted; the oldest arrival and the one of higher priority both
        # are, as far: the first by score goes first
        (1, [("old", 3, ANCHOR[3], 5), ("urgent", 3, ANCHOR[3] + 50, 4), ("agent", 2, ANCHOR[2] + 5, 0)], ["urgent", "agent", "old", "lost"]),
        # the requeued job leads the class's arrival order too: the oldest arrival behind it,
        # lifted as far and of higher priority than both it and the first by score, goes first
        (4.5, [("old", 3, ANCHOR[3] + 50, 4.5), ("new", 3, ANCHOR[3] + 95, 0)], ["old", "lost", "new"]),
    ],
    ids=["first-by-score-lifted", "first-by-score-beats-oldest", "oldest-arrival"],
)
def test_a_requeued_job_hides_neither_the_arrivals_first_by_score_nor_their_oldest(
    s: Scripts, client: redis.Redis, prefix: str, lost_age: float, arrivals: list[Queued], order: list[str]
) -> None:
    lose(s, client, prefix, [("lost", 3, ANCHOR[3], lost_age)])
    for job in arrivals:
        arrive(s, client, prefix, *job)
    assert pick(s, prefix, len(order), starvation_s=PERIOD_S) == order


def test_of_two_requeued_jobs_lifted_as_far_the_one_of_higher_priority_goes_first(s: Scripts, client: redis.Redis, prefix: str) -> None:
    lose(s, client, prefix, [("first", 3, ANCHOR[3], 4.5), ("second", 3, ANCHOR[3] + 50, 4.5)])
    arrive(s, client, prefix, "agent", 2, ANCHOR[2] + 5)
    assert pick(s, prefix, 3, starvation_s=PERIOD_S) == ["second", "agent", "first"]


# -- the worker's own queues as the reference -----------------------------------------------

AGES = st.sampled_from([0.0, 1.5, 4.5, 7.5, 10.5])  # clear of the 3 s aging periods' edges
PRIOS = st.sampled_from([-100, -50, -5, 0, 5, 50, 100])
JOBS = st.lists(st.tuples(PRIOS, AGES), max_size=2)
# per class: at most two arrivals and two jobs put back after a loss (pick.lua weighs the
# arrivals' first by score and oldest: a third may be neither, docs/scheduling.md)
Mix = list[tuple[list[tuple[int, float]], list[tuple[int, float]]]]


def queued(mix: Mix) -> tuple[list[Queued], list[Queued]]:
    """The jobs put back after a loss and the arrivals of ``mix``, each 10 ms older than the one
    before it: no two tie, as a worker's float scores tie only by chance (a lifted priority
    -100 + 100 against 0)."""
    lost = [(f"lost{c}.{i}", c, prio, age) for c, (_, back) in enumerate(mix) for i, (prio, age) in enumerate(back)]
    arrivals = [(f"j{c}.{i}", c, prio, age) for c, (jobs, _) in enumerate(mix) for i, (prio, age) in enumerate(jobs)]
    return [(j, c, prio, age + 0.01 * n) for n, (j, c, prio, age) in enumerate(lost)], [
        (j, c, prio, age + 0.01 * (len(lost) + n)) for n, (j, c, prio, age) in enumerate(arrivals)
    ]


def core_order(lost: list[Queued], arrivals: list[Queued]) -> list[str]:
    """The order a worker's queues (the same aging period and divisor) take the jobs in."""
    now = 1000.0
    queues = ClassQueues(starvation_ticks=PERIOD_S, score=ScoreConfig(aging_divisor_s=60.0), tick_s=1.0)
    for job_id, c, prio, age in reversed(lost):  # the first put back has the lowest seq, as its Redis member
        queues.push_head(Job(job_id, [1], 1, qos=QosClass(c), priority=prio, arrival_s=now - age, enqueued_s=now - age))
    for seq, (job_id, c, prio, age) in enumerate(arrivals, 1):
        queues.push(Job(job_id, [1], 1, qos=QosClass(c), priority=prio, arrival_s=now - age, enqueued_s=now - age, seq=seq))
    order = []
    while (job := queues.best(set(QosClass), now)) is not None:
        order.append(queues.pop(job).job_id)
    return order


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mix=st.lists(st.tuples(JOBS, JOBS), min_size=4, max_size=4))
def test_the_fleet_queue_takes_jobs_in_a_worker_queues_order(client: redis.Redis, mix: Mix) -> None:
    s, prefix = Scripts(client), f"t{uuid.uuid4().hex[:8]}:"  # (Hypothesis takes a first argument with attributes for a method's self)
    lost, arrivals = queued(mix)
    lose(s, client, prefix, lost)
    for job_id, c, prio, age in arrivals:
        arrive(s, client, prefix, job_id, c, prio, age)
    taken = []
    while got := pick(s, prefix, 1, starvation_s=PERIOD_S):
        taken += got
    assert taken == core_order(lost, arrivals)
