"""A preempted job heads its own class (scheduling seed: "requeues at the head of its class");
in a class that class aging lifted it into it is one more lifted job, ranked by its score from
that class's anchor (docs/scheduling.md, "Queues and request priority"). It once headed every
class it rose into: a preempted background job lifted into agent went before an agent request
of higher priority."""

from __future__ import annotations

from scheduler.core.qos import QosClass

from .builders import make_job, make_scheduler, tick


def preempted_background_lifted_beside(job_qos: QosClass, priority: int, arrives_after_s: float, wait_s: float) -> str:
    """One lane: a background job (-100) runs and a chat preempts it; ``arrives_after_s`` later a
    job of ``job_qos`` and ``priority`` is queued; ``wait_s`` after the preemption the chat ends.
    Which of the two queued jobs takes the lane. The aging period is 16 s (8 ticks of 2 s)."""
    sched, engine, clock = make_scheduler(max_batch=1)
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, priority=-100, max_tokens=1000))
    tick(sched, engine)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=10_000))
    assert [e.job_id for e in tick(sched, engine) if e.kind == "preempted"] == ["bg"]
    clock.advance(arrives_after_s)
    sched.add(make_job(job_id="other", qos=job_qos, priority=priority, max_tokens=2))
    clock.advance(wait_s - arrives_after_s)
    sched.cancel("chat")
    plan = sched.step()
    assert len(plan.bind) == 1
    return plan.bind[0].job_id


def test_a_preempted_job_still_heads_its_own_class() -> None:
    # a background job of higher priority queued after the preemption: the preempted one first
    assert preempted_background_lifted_beside(QosClass.BACKGROUND, -60, 1.0, 5.0) == "bg"


def test_lifted_into_a_better_class_a_preempted_job_is_ranked_there_by_its_score() -> None:
    # 17 s after the preemption the background job counts as agent (its -100 as 0 there); an
    # agent request at 40 that came 10 s after it, not lifted, scores higher and goes first
    assert preempted_background_lifted_beside(QosClass.AGENT, 40, 10.0, 17.0) == "other"
    # at the same priority its longer wait wins: it goes first, as any lifted job would
    assert preempted_background_lifted_beside(QosClass.AGENT, 0, 10.0, 17.0) == "bg"
