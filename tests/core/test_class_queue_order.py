"""ClassQueues on its own: FIFO among equal scores, a cancel leaving no trace, a requeued job at
its class's head, every queued job aging (properties over random pushes, requeues and removals)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.qos import QosClass
from scheduler.core.queues import ClassQueues
from scheduler.core.types import Job

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(list(QosClass)), st.integers(-3, 3), st.floats(0, 30)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
        st.tuples(st.just("requeue"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, equal=st.booleans())
def test_equal_scores_keep_arrival_order_and_a_cancel_leaves_no_trace(ops: list[tuple], equal: bool) -> None:
    queues = ClassQueues(starvation_ticks=0)  # class aging off: each class is its own queue
    now, seq, queued, gone, requeued = 0.0, 0, [], [], []
    for op in ops:
        if op[0] == "push":
            _, qos, priority, dt = op
            now += dt
            seq += 1
            job = Job(f"j{seq}", [1], 1, qos=qos, priority=0 if equal else priority, arrival_s=now, enqueued_s=now, seq=seq)
            queues.push(job)
            queued.append(job)
        elif queued:
            job = queued[op[1] % len(queued)]
            if op[0] == "remove":
                assert queues.remove(job) and not queues.remove(job)
                queued.remove(job)
                gone.append(job)
            else:
                queues.pop(job)
                queues.push_head(job)
                requeued.append(job)
        assert len(queues) == len(queued) and all(j not in list(queues) for j in gone)
        for qos in QosClass:
            mine = [j for j in queued if j.qos is qos]
            assert queues.depth(qos) == len(mine)
            head = queues.head(qos, now)
            assert (head is None) == (not mine)
            if head is None:
                continue
            heads = [j for j in reversed(requeued) if j in mine]
            if heads:  # the latest requeued first, ahead of every score
                assert head is heads[0]
            elif equal:  # equal priority: plain FIFO
                assert head is min(mine, key=lambda j: j.arrival_s) and head.seq == min(j.seq for j in mine)
            else:
                assert queues.score(head, now) == max(queues.score(j, now) for j in mine)
        best = queues.best(set(QosClass), now)
        assert best is None or best.qos == min(j.qos for j in queued)
