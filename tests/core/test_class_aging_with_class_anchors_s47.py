"""Class aging with the priorities requests really carry. A request that sends no
X-LlamaSwap-Priority gets the anchor of its class's band (docs/scheduling.md, "Three departures
from the seed": interactive 100, completion and agent 0, background -100), which the doc says
leaves the order inside a class unchanged. Class aging lifts a waiting job one class per period
(the scheduling seed's starvation rule) and the jobs of one (aged) class are then ordered by
score: the lifted job's priority was still its own class's anchor, 100 or 200 points below the
jobs that were born in the class it rose into, so a background job that had risen into a class
lost every tie there. Over HTTP without headers it went before a later agent job only after two
periods, not one, before a later completion only after three, and never (for ~200 minutes of
score aging) before a later interactive chat: the seed's starvation bound was gone. A lifted
job's priority now counts from the anchor of the class it rose into as it counted from its own.
Pure core, fake clock; the defaults (8 ticks of 2 s: a 16 s aging period)."""

from __future__ import annotations

import pytest

from api.admission import class_anchor  # the priority a request that sends no X-LlamaSwap-Priority gets
from scheduler.core.qos import QosClass

from .builders import make_job, make_scheduler, run_until_idle, tick


def first_when_the_lane_frees(background_waited_s: float, rival: QosClass, *, rival_offset: int = 0, bg_offset: int = 0) -> str:
    """A background request (its anchor, -100, plus ``bg_offset``) waits behind an interactive
    job on the only lane (nothing preempts it); after ``background_waited_s`` a request of class
    ``rival`` (its anchor plus ``rival_offset``) arrives, and the lane frees: who takes it."""
    sched, engine, clock = make_scheduler(max_batch=1)
    sched.add(make_job(max_tokens=100_000, qos=QosClass.INTERACTIVE, priority=class_anchor(QosClass.INTERACTIVE), job_id="running"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=class_anchor(QosClass.BACKGROUND) + bg_offset, job_id="bg"))
    tick(sched, engine)
    start = clock()
    while clock() - start < background_waited_s:
        tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=rival, priority=class_anchor(rival) + rival_offset, job_id="rival"))
    tick(sched, engine)
    sched.cancel("running")
    events = run_until_idle(sched, engine)
    return next(e.job_id for e in events if e.kind == "admitted")


@pytest.mark.parametrize(
    ("rival", "periods"),
    [(QosClass.AGENT, 1), (QosClass.COMPLETION, 2), (QosClass.INTERACTIVE, 3)],
)
def test_a_background_request_goes_before_a_later_one_of_each_class_once_aging_lifted_it_into_that_class(rival: QosClass, periods: int) -> None:
    """One period per class, as the seed says, with every request at its class's anchor."""
    assert first_when_the_lane_frees(16.0 * periods - 6, rival) == "rival"
    assert first_when_the_lane_frees(16.0 * periods + 4, rival) == "bg"


def test_a_lifted_job_keeps_its_offset_from_its_class_anchor_in_the_class_it_rose_into() -> None:
    """Priorities sent with the header still order: lifted into interactive, a background job
    sent at -100 + 3 goes before a chat at 100 + 1 and after one at 100 + 5."""
    assert first_when_the_lane_frees(52.0, QosClass.INTERACTIVE, rival_offset=1, bg_offset=3) == "bg"
    assert first_when_the_lane_frees(52.0, QosClass.INTERACTIVE, rival_offset=5, bg_offset=3) == "rival"


def test_the_cores_class_anchors_are_the_admissions() -> None:
    from scheduler.core.qos import CLASS_ANCHOR

    assert CLASS_ANCHOR == {q: class_anchor(q) for q in QosClass}
    assert [class_anchor(q) for q in QosClass] == [100, 0, 0, -100]
