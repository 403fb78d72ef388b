"""pick.lua's class aging with the priorities requests really carry: one that sends no
X-LlamaSwap-Priority has its class's anchor (background -100, agent 0, interactive 100). A
background job lifted into a better class counted -100 there and lost every tie to the jobs born
in it (a later interactive chat went first for ~200 minutes of score aging, not three periods):
its priority now counts from the anchor of the class it rose into, as in a worker's own queues
(tests/core/test_class_aging_with_class_anchors_s47.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

import scheduler.link
from scheduler.core.qos import CLASS_ANCHOR
from scheduler.link.redis_transport import Scripts

from .test_pick_order import enqueue, pick

ANCHOR = {int(q): a for q, a in CLASS_ANCHOR.items()}


def test_pick_lua_s_anchors_are_the_workers() -> None:
    """pick.lua writes the anchors out (Lua has no import): they must be the worker queues'."""
    source = (Path(scheduler.link.__file__).parent / "lua" / "pick.lua").read_text()
    written = re.search(r"local ANCHOR = \{([^}]*)\}", source)
    assert written is not None, "pick.lua's ANCHOR table"
    assert {int(k): int(v) for k, v in re.findall(r"\[(\d+)\]\s*=\s*(-?\d+)", written.group(1))} == ANCHOR


@pytest.fixture
def s(client: redis.Redis) -> Scripts:
    return Scripts(client)


def waited(client: redis.Redis, prefix: str, job_id: str, qos: int, seconds: float, divisor: float = 60.0) -> None:
    """``job_id`` came ``seconds`` earlier: its arrival (in its class's arrival order too), and
    the score its aging gives it (and its score as an arrival, kept for a class it rises into)."""
    client.hincrby(prefix + f"job:{job_id}", "arrival", -int(seconds * 1000))
    member = client.hget(prefix + f"job:{job_id}", "member")
    assert member is not None
    client.zincrby(prefix + f"q:{qos}", -seconds / divisor, member)
    client.zincrby(prefix + f"qa:{qos}", -int(seconds * 1000), member)
    client.hincrbyfloat(prefix + f"job:{job_id}", "natural", -seconds / divisor)


@pytest.mark.parametrize(("rival", "periods"), [(2, 1), (1, 2), (0, 3)])
def test_a_background_request_goes_before_a_later_one_of_each_class_once_aging_lifted_it_there(
    s: Scripts, client: redis.Redis, prefix: str, rival: int, periods: int
) -> None:
    enqueue(s, prefix, "bg", 3, ANCHOR[3])
    waited(client, prefix, "bg", 3, 3 * periods + 1)  # periods of 3 s, and a second more
    enqueue(s, prefix, "rival", rival, ANCHOR[rival])
    assert pick(s, prefix, 1, starvation_s=3) == ["bg"]
    assert pick(s, prefix, 1, starvation_s=3) == ["rival"]


def test_a_lifted_job_keeps_its_offset_from_its_class_anchor_and_its_score_goes_back_unlifted(s: Scripts, client: redis.Redis, prefix: str) -> None:
    enqueue(s, prefix, "bg", 3, ANCHOR[3] + 3)
    waited(client, prefix, "bg", 3, 10)
    enqueue(s, prefix, "chat-5", 0, ANCHOR[0] + 5)
    enqueue(s, prefix, "chat-1", 0, ANCHOR[0] + 1)
    score = client.zscore(prefix + "q:3", client.hget(prefix + "job:bg", "member"))
    assert pick(s, prefix, 3, starvation_s=3) == ["chat-5", "bg", "chat-1"]
    # the score kept for a give-back is its own class's, not the lifted one
    assert float(client.hget(prefix + "job:bg", "score") or 0) == pytest.approx(score)


def test_the_scripts_anchors_are_the_cores() -> None:
    import re
    from pathlib import Path

    from scheduler.core.qos import CLASS_ANCHOR

    lua = (Path(__file__).resolve().parents[2] / "scheduler" / "link" / "lua" / "pick.lua").read_text()
    table = re.search(r"local ANCHOR = \{(.*)\}", lua)
    assert table is not None
    assert {int(c): int(a) for c, a in re.findall(r"\[(\d)\] = (-?\d+)", table[1])} == {int(q): a for q, a in CLASS_ANCHOR.items()} == ANCHOR


def test_a_job_given_back_after_a_loss_heads_its_own_class_but_not_one_aging_lifted_it_into(s: Scripts, client: redis.Redis, prefix: str) -> None:
    # (session 52, as a preempted job in a worker's queues: tests/core) a background job whose
    # worker was lost goes back ahead of every background arrival, but in the agent class aging
    # lifted it into it ranks by its score there, behind an agent request of higher priority
    enqueue(s, prefix, "lost", 3, ANCHOR[3])
    waited(client, prefix, "lost", 3, 4)  # one period of 3 s, and a second more
    assert pick(s, prefix, 1) == ["lost"]
    client.zadd(prefix + "leases", {"lost": 0})  # its lease ran out
    assert int(s.reap([prefix, 100, 60])) == 1
    epoch = int(client.hget(prefix + "job:lost", "epoch") or 0)
    assert enqueue(s, prefix, "lost", 3, ANCHOR[3], requeue=1, expect=epoch) == epoch
    enqueue(s, prefix, "bg", 3, ANCHOR[3] + 50)
    enqueue(s, prefix, "agent", 2, ANCHOR[2] + 5)
    enqueue(s, prefix, "agent-low", 2, ANCHOR[2] - 5)
    assert pick(s, prefix, 4, starvation_s=3) == ["agent", "lost", "agent-low", "bg"]
