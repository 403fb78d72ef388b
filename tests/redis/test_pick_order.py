"""The Lua scripts on fake data: the order pick.lua takes jobs in is one worker's order (class,
lane caps, starvation aging, priority, arrival; a job given back first), and the fencing."""

from __future__ import annotations

import json

import pytest
import redis

from scheduler.link.redis_transport import LEASE_MS, NO_FLOOR, PICKED_FIELDS, Scripts

BIG = 8


def enqueue(
    s: Scripts, p: str, job_id: str, qos: int, prio: int = 0, *, divisor: float = 60.0, requeue: int = 0, expect: int = -1, head: str = "head", request: dict | None = None, resend: int = 0
) -> int:
    data = json.dumps({"type": "submit", "id": job_id, "request": request or {}, "qos": qos, "priority": prio})
    return int(s.enqueue([p, job_id, qos, prio, divisor, data, head, requeue, expect, resend]))


def pick(s: Scripts, p: str, n: int = 1, *, worker: str = "w1", caps: tuple[int, ...] = (BIG,) * 4, use: tuple[int, ...] = (0,) * 4, floor: int = NO_FLOOR, starvation_s: float = 0) -> list[str]:
    reply = s.pick([p, worker, n, starvation_s, LEASE_MS, floor, *caps, *use])
    return [reply[i].decode() for i in range(0, len(reply), PICKED_FIELDS)]


@pytest.fixture
def s(client: redis.Redis) -> Scripts:
    return Scripts(client)


def test_classes_in_order_whatever_the_arrival_order(s: Scripts, prefix: str) -> None:
    for job_id, qos in [("bg", 3), ("agent", 2), ("chat", 0), ("fim", 1)]:
        enqueue(s, prefix, job_id, qos)
    assert pick(s, prefix, 4) == ["chat", "fim", "agent", "bg"]
    assert pick(s, prefix, 1) == []


def test_inside_a_class_priority_first_then_arrival(s: Scripts, prefix: str) -> None:
    for job_id, prio in [("a", 0), ("b", 0), ("urgent", 100), ("batch", -100), ("c", 0)]:
        enqueue(s, prefix, job_id, 2, prio)
    assert pick(s, prefix, 5) == ["urgent", "a", "b", "c", "batch"]


def test_aging_lifts_an_old_low_priority_job_over_a_new_higher_one(s: Scripts, client: redis.Redis, prefix: str) -> None:
    # divisor 1 s: a job that waited 120 s earns 120 points, more than priority 100
    enqueue(s, prefix, "old", 2, 0, divisor=1.0)
    ((member, score),) = client.zrange(prefix + "q:2", 0, 0, withscores=True)
    client.zadd(prefix + "q:2", {member: score - 120.0})  # the score it has had it come 120 s ago
    enqueue(s, prefix, "new", 2, 100, divisor=1.0)
    enqueue(s, prefix, "recent", 2, 0, divisor=1.0)
    assert pick(s, prefix, 1) == ["old"]
    assert pick(s, prefix, 2) == ["new", "recent"]  # without the wait, priority decides


def test_without_aging_priority_alone_decides(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "old", 2, 0, divisor=0)
    enqueue(s, prefix, "new", 2, 1, divisor=0)
    assert pick(s, prefix, 2) == ["new", "old"]


def test_a_class_at_its_lane_cap_on_this_worker_is_skipped(s: Scripts, prefix: str) -> None:
    enqueue(s, prefix, "chat", 0)
    enqueue(s, prefix, "agent", 2)
    # this worker already runs one interactive job and caps interactive at one lane
    assert pick(s, prefix, 2, caps=(1, BIG, BIG, BIG), use=(1, 0, 0, 0)) == ["agent"]
    assert pick(s, prefix, 1, worker="w2") == ["chat"]  # another worker is under its cap


def test_starvation_aging_lifts_a_long_waiting_class(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "bg", 3)
    client.hincrby(prefix + "job:bg", "arrival", -10_000)  # waited 10 s: three periods of 3 s
    enqueue(s, prefix, "agent", 2)
    assert pick(s, prefix, 1, starvation_s=3) == ["bg"]
    enqueue(s, prefix, "bg2", 3)
    assert pick(s, prefix, 2, starvation_s=3) == ["agent", "bg2"]


def test_an_old_job_rises_even_behind_a_newer_one_of_higher_priority(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """Class aging weighs every queued job, as a worker's own queues do: an old background job
    behind a newer background job of priority 100 overtakes a later agent once its wait lifts it
    (only each class's first job by score used to be compared)."""
    enqueue(s, prefix, "old", 3)
    client.hincrby(prefix + "job:old", "arrival", -10_000)  # waited 10 s: three periods of 3 s
    enqueue(s, prefix, "new", 3, 100)
    enqueue(s, prefix, "agent", 2)
    assert pick(s, prefix, 1, starvation_s=3) == ["old"]
    assert pick(s, prefix, 2, starvation_s=3) == ["agent", "new"]
    assert client.zcard(prefix + "qa:3") == 0 and client.zcard(prefix + "qa:2") == 0  # the index follows the queue
    enqueue(s, prefix, "gone", 2)
    s.cancel([prefix, "gone"])
    assert client.zcard(prefix + "qa:2") == 0


def test_a_job_given_back_after_a_loss_goes_first_in_its_class(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "lost", 2)
    assert pick(s, prefix, 1) == ["lost"]
    enqueue(s, prefix, "waiting", 2, 100)
    client.zadd(prefix + "leases", {"lost": 0})  # its lease ran out
    assert int(s.reap([prefix, 100, 60])) == 1
    epoch = int(client.hget(prefix + "job:lost", "epoch"))
    assert enqueue(s, prefix, "lost", 2, requeue=1, expect=epoch) == epoch
    assert pick(s, prefix, 2) == ["lost", "waiting"]


def test_the_floor_takes_only_urgent_work_and_only_when_no_worker_has_a_free_lane(s: Scripts, prefix: str) -> None:
    enqueue(s, prefix, "agent", 2)
    enqueue(s, prefix, "chat", 0)
    s.renew([prefix, "w2", LEASE_MS, 1])  # another worker has a free lane: it takes the chat
    assert pick(s, prefix, 1, floor=3) == []
    s.renew([prefix, "w2", LEASE_MS, 0])
    assert pick(s, prefix, 1, floor=3) == ["chat"]
    assert pick(s, prefix, 1, floor=3) == []  # an agent job never preempts


def test_the_floor_never_preempts_a_class_as_urgent_as_the_newcomer(s: Scripts, prefix: str) -> None:
    enqueue(s, prefix, "fim", 1)
    assert pick(s, prefix, 1, floor=1) == []
    assert pick(s, prefix, 1, floor=2) == ["fim"]


def test_only_the_lease_holder_of_the_current_epoch_emits(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "j", 2)
    reply = s.pick([prefix, "w1", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])
    epoch = int(reply[1])
    line = '{"type":"delta","id":"j","text":"a","tokens":1}'
    assert int(s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, line])) == 1
    assert int(s.emit([prefix, "j", epoch, "w2", 0, 100, 60, 0, line])) == 0  # not its job
    client.zadd(prefix + "leases", {"j": 0})
    s.reap([prefix, 100, 60])
    assert int(s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, line])) == 0  # lease lapsed: fenced
    entries = client.xrange(prefix + "s:j")
    assert [json.loads(f[b"m"])["type"] for _id, f in entries] == ["delta", "lost"]
    # the next holder emits under the new epoch; its renew keeps the lease, the old one's does not
    enqueue(s, prefix, "j", 2, requeue=1, expect=epoch + 1)
    reply = s.pick([prefix, "w2", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])
    assert int(reply[1]) == epoch + 2
    client.set(prefix + "hb:head", "1")  # its head is alive
    assert [g.decode() for g in s.renew([prefix, "w1", LEASE_MS, 0, "j"])[0]] == ["j"]
    assert s.renew([prefix, "w2", LEASE_MS, 0, "j"]) == [[], []]


def test_a_running_job_whose_head_is_gone_has_its_lease_ended_and_is_marked_lost(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """A job whose head died is read by nobody; it ran to its max_tokens, holding a lane. Its
    worker's renew ends its lease instead (and says so), the reap marks it lost, and a head that
    adopted it (a client resumed there) keeps it running."""
    client.set(prefix + "hb:alive", "1")
    enqueue(s, prefix, "orphan", 2, head="dead")
    enqueue(s, prefix, "kept", 2, head="alive")
    enqueue(s, prefix, "adopted", 2, head="dead")
    assert pick(s, prefix, 3) == ["orphan", "kept", "adopted"]
    assert int(s.adopt([prefix, "adopted", "alive"])) == 1
    assert int(s.adopt([prefix, "nothing", "alive"])) == 0 and not client.exists(prefix + "job:nothing")
    gone, headless = s.renew([prefix, "w1", LEASE_MS, 0, "orphan", "kept", "adopted"])
    assert (gone, [h.decode() for h in headless]) == ([], ["orphan"])
    assert int(s.reap([prefix, 100, 60])) == 1
    assert client.hget(prefix + "job:orphan", "state") == b"lost"
    assert [json.loads(f[b"m"])["type"] for _id, f in client.xrange(prefix + "s:orphan")] == ["lost"]
    assert [client.hget(prefix + f"job:{j}", "state") for j in ("kept", "adopted")] == [b"run", b"run"]


def test_a_batch_of_events_sent_again_is_appended_once_and_a_new_epoch_counts_afresh(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """A worker sends a batch again when its reply was lost: Redis appends what it has not got
    (numbered from the batch's first message), never a message twice."""
    enqueue(s, prefix, "j", 2)
    epoch = int(s.pick([prefix, "w1", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])[1])

    def texts() -> list[str]:
        return [json.loads(f[b"m"]).get("text", "") for _id, f in client.xrange(prefix + "s:j")]

    def delta(text: str) -> str:
        return json.dumps({"type": "delta", "id": "j", "text": text, "tokens": 1})

    assert s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, delta("a"), delta("b")]) == 1
    assert s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, delta("a"), delta("b")]) == 1  # the same batch
    assert s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, delta("a"), delta("b"), delta("c")]) == 1  # it, and one more
    assert s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 3, delta("d")]) == 1
    assert texts() == ["a", "b", "c", "d"]
    # the job lost and picked again (the next epoch) starts its count at 0
    client.zadd(prefix + "leases", {"j": 0})
    s.reap([prefix, 100, 60])
    enqueue(s, prefix, "j", 2, requeue=1, expect=epoch + 1)  # the reap's epoch
    epoch = int(s.pick([prefix, "w2", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])[1])
    assert s.emit([prefix, "j", epoch, "w2", 0, 100, 60, 0, delta("e")]) == 1
    assert texts() == ["a", "b", "c", "d", "", "e"]  # "" is the lost marker


def test_a_streams_resume_note_expires_with_the_stream_not_before_it(
    s: Scripts, client: redis.Redis, prefix: str
) -> None:
    """A head notes a stream for resuming (``r:ID``) once, with the stream's time to live; every
    emit, and a reap's lost marker, gave the stream (``s:ID``) that time again but not the note:
    a stream longer than STREAM_TTL_S lost its note, and a client reconnecting with
    Last-Event-ID could not resume it. The note now expires with its stream."""
    enqueue(s, prefix, "j", 2)
    epoch = int(s.pick([prefix, "w1", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])[1])
    line = '{"type":"delta","id":"j","text":"a","tokens":1}'
    client.set(prefix + "r:j", "{}", ex=5)  # noted long ago: 5 s of its time left
    assert s.emit([prefix, "j", epoch, "w1", 0, 100, 60, 0, line]) == 1
    assert 5 < client.ttl(prefix + "r:j") <= 60
    client.expire(prefix + "r:j", 5)
    client.zadd(prefix + "leases", {"j": 0})  # its worker died
    s.reap([prefix, 100, 60])
    assert 5 < client.ttl(prefix + "r:j") <= 60
    # a stream nobody noted (not resumable) gets no note
    enqueue(s, prefix, "k", 2)
    epoch = int(s.pick([prefix, "w1", 1, 0, LEASE_MS, NO_FLOOR, *(BIG,) * 4, *(0,) * 4])[1])
    assert s.emit([prefix, "k", epoch, "w1", 1, 100, 60, 0, line.replace('"j"', '"k"')]) == 1
    assert not client.exists(prefix + "r:k")


def test_a_cancel_that_comes_before_its_submit_refuses_the_submit(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """A head cancelled while sending a submit cancels the job from another connection, which
    can reach Redis first: the submit is then refused, and nothing is queued."""
    assert s.cancel([prefix, "late"]) == b""
    assert enqueue(s, prefix, "late", 2) == -3
    assert client.zcard(prefix + "q:2") == 0 and not client.exists(prefix + "job:late")
    assert enqueue(s, prefix, "other", 2) == 0  # other ids are not affected


def test_a_lost_job_is_given_back_once(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "j", 2)
    pick(s, prefix, 1)
    client.zadd(prefix + "leases", {"j": 0})
    s.reap([prefix, 100, 60])
    epoch = int(client.hget(prefix + "job:j", "epoch"))
    assert enqueue(s, prefix, "j", 2, requeue=1, expect=epoch) == epoch
    assert enqueue(s, prefix, "j", 2, requeue=1, expect=epoch) == -1  # no longer lost
    assert enqueue(s, prefix, "other", 2) == 0
    assert enqueue(s, prefix, "other", 2, head="another-head") == -2  # duplicate id
    assert enqueue(s, prefix, "other", 2, request={"prompt": "else"}) == -2  # duplicate id


def test_a_heads_own_submit_sent_again_is_a_no_op(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """A head whose enqueue reply was lost (a connection that died with it) sends the same
    submit again: it keeps its place and epoch and is queued once."""
    assert enqueue(s, prefix, "a", 2) == 0 and enqueue(s, prefix, "b", 2) == 0
    assert enqueue(s, prefix, "a", 2) == 0
    assert client.zcard(prefix + "q:2") == 2
    assert pick(s, prefix, 2) == ["a", "b"]
    epoch = int(client.hget(prefix + "job:a", "epoch"))
    assert enqueue(s, prefix, "a", 2) == epoch  # picked meanwhile: still a no-op, at its epoch now
    assert pick(s, prefix, 2) == []


def test_a_heads_own_submit_sent_again_after_its_job_ended_runs_nothing(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """The lost reply's job was picked and ran to its end (its last emit deleted it; its stream
    stays) before the head sent the submit again: the resend reads that stream (epoch 0),
    nothing is queued. Only a resend: a fresh submit never finds a stream under a new id."""
    assert enqueue(s, prefix, "a", 2) == 0 and pick(s, prefix, 1) == ["a"]
    epoch = int(client.hget(prefix + "job:a", "epoch"))
    assert s.emit([prefix, "a", epoch, "w1", 1, 1000, 60, 0, json.dumps({"type": "done", "id": "a"})]) == 1
    assert not client.exists(prefix + "job:a") and client.exists(prefix + "s:a")
    assert enqueue(s, prefix, "a", 2, resend=1) == 0
    assert client.zcard(prefix + "q:2") == 0 and not client.exists(prefix + "job:a")
    assert pick(s, prefix, 1) == []
    assert enqueue(s, prefix, "b", 2, resend=1) == 0 and pick(s, prefix, 1) == ["b"]  # never ran: queued


def test_cancel_takes_a_queued_job_out_and_tells_a_running_jobs_worker(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "queued", 2)
    enqueue(s, prefix, "running", 0)
    assert pick(s, prefix, 1) == ["running"]
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(prefix + "w:w1")
    assert s.cancel([prefix, "queued"]) == b""
    assert s.cancel([prefix, "running"]) == b"w1"
    message = None
    for _ in range(50):
        message = pubsub.get_message(timeout=0.1)
        if message:
            break
    assert message is not None and message["data"] == b"cancel running"
    assert pick(s, prefix, 2) == []
    pubsub.close()


def test_the_floor_takes_urgent_work_by_its_own_class_never_its_aged_class(s: Scripts, client: redis.Redis, prefix: str) -> None:
    """A worker with every lane busy asks for work to preempt with: the urgent jobs go by their
    own class, interactive before completion, as a worker's own preemption does
    (docs/scheduling.md: "A job's own class decides, never its aged class"). A completion job
    that had waited a period aged to interactive's rank and, older, went before the chat, which
    waited behind it for the next lane. Into a free lane (no floor) aging still orders them."""
    enqueue(s, prefix, "fim", 1)
    client.hincrby(prefix + "job:fim", "arrival", -10_000)  # waited 10 s: past a 3 s period
    enqueue(s, prefix, "chat", 0)
    assert pick(s, prefix, 1, floor=3, starvation_s=3) == ["chat"]
    enqueue(s, prefix, "chat2", 0)
    assert pick(s, prefix, 1, starvation_s=3) == ["fim"]
