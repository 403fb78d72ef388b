"""`--tick-decode-budget N`: the decode grant's rotation never starves a decoding lane.

docs/scheduling.md (Prefill budget and step size, "Decode"): N > 0 gives at most N decode
tokens per tick, in rotation: a lane that got none for `--starvation-ticks` ticks first, then
by class, then the lane that decoded least recently. The seed names `--starvation-ticks` "the
starvation bound": a decoding lane of any class gets a token within about that many ticks plus
one turn of the rotation, however many better-class lanes decode beside it.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.qos import QosClass
from tests.core.builders import make_job, make_scheduler, tick


def _max_gaps(
    classes: list[QosClass], budget: int, starvation_ticks: int, ticks: int, targets: tuple[float, float] | None = None
) -> dict[str, int]:
    """Every lane decoding (long prompts done, max_tokens far off): the longest run of ticks
    each went without a token, counted once every lane has its first token."""
    sched, engine, _ = make_scheduler(
        max_batch=len(classes),
        tick_decode_budget=budget,
        starvation_ticks=starvation_ticks,
        lane_ctx=8192,
        tick_targets_s=targets,
        decode_round_s=0.02,
    )
    for i, qos in enumerate(classes):
        sched.add(make_job(job_id=f"j{i}", qos=qos, max_tokens=5000))
    for _ in range(10_000):  # until every lane decodes
        tick(sched, engine)
        if all(j is not None and not j.prefilling and j.output for j in sched.lanes):
            break
    last = {f"j{i}": sched.tick for i in range(len(classes))}
    gaps = dict.fromkeys(last, 0)
    for _ in range(ticks):
        events = tick(sched, engine)
        for e in events:
            if e.kind == "token":
                last[e.job_id] = sched.tick
        for job_id, t in last.items():
            gaps[job_id] = max(gaps[job_id], sched.tick - t)
    return gaps


def test_an_agent_lane_beside_interactive_lanes_that_starve_in_turn_still_gets_tokens() -> None:
    """Budget 1, two chats and an agent, --starvation-ticks 2: each chat gets a token every
    other tick, so each is 'starving' in turn; the agent, starving too, must still get its
    turn (it once went without a token for good: starving lanes were ordered by class)."""
    gaps = _max_gaps([QosClass.INTERACTIVE, QosClass.INTERACTIVE, QosClass.AGENT], 1, 2, 60)
    assert gaps["j2"] <= 2 + 3, gaps


@settings(max_examples=60, deadline=None)
@given(
    classes=st.lists(st.sampled_from(list(QosClass)), min_size=1, max_size=8),
    budget=st.integers(1, 4),
    starvation_ticks=st.integers(1, 8),
    targets=st.sampled_from([None, (0.05, 0.25)]),
)
def test_no_decoding_lane_goes_more_than_the_starvation_bound_plus_a_turn_without_a_token(
    classes: list[QosClass], budget: int, starvation_ticks: int, targets: tuple[float, float] | None
) -> None:
    """Ticks of one round, or of several (llama.cpp's and MLX's targets: the budget is the
    tick's, spent over its rounds)."""
    gaps = _max_gaps(classes, budget, starvation_ticks, 40, targets)
    bound = starvation_ticks + math.ceil(len(classes) / budget)
    assert max(gaps.values()) <= bound, (gaps, bound)



def _decode_only_runs(budget: int) -> list[int]:
    """A background lane decodes, a long background prompt prefills in 512-token steps (~1.7 s
    each), a chat streams: the decode-only rounds that follow each prefill step."""
    sched, engine, _ = make_scheduler(
        max_batch=3,
        abortable_steps=True,
        tick_decode_budget=budget,
        initial_prefill_tokens_per_s=300.0,
        prefill_s_per_token=1.0 / 300.0,
        decode_round_s=0.02,
    )
    sched.add(make_job(8, max_tokens=400, qos=QosClass.BACKGROUND, job_id="talker"))
    tick(sched, engine)  # the talker decodes from here on
    sched.add(make_job(6000, max_tokens=4, qos=QosClass.BACKGROUND, job_id="long"))
    tick(sched, engine)
    sched.add(make_job(8, max_tokens=60, qos=QosClass.INTERACTIVE, job_id="chat"))
    runs: list[int] = []
    current = 0
    while "chat" in sched.jobs:
        tick(sched, engine)
        plan = sched.last_plan
        assert plan is not None
        if any(not f.is_decode for f in plan.feeds):
            runs.append(current)
            current = 0
        else:
            assert {f.job_id for f in plan.feeds} <= {"chat"}  # the answer's rounds feed it alone
            current += 1
    return runs[2:]  # after the chat's own prompt and its first full step


def test_a_decode_budget_does_not_cut_the_answers_decode_only_rounds_short() -> None:
    """docs/scheduling.md (An urgent answer streams beside big steps): after each prefill step
    the ticks decode the urgent lanes alone until --urgent-decode-share of the step's time has
    passed. With --tick-decode-budget 1 the background lane they leave out went --starvation-ticks
    ticks without a token, came first in the grant, and so ended the answer's rounds after 7 of
    the 18 the share holds (the chat's 60 tokens took twice as long); it gets its token in the
    next prefill step, as the rule says."""
    unbudgeted = _decode_only_runs(0)
    assert unbudgeted and min(unbudgeted) >= 15
    assert _decode_only_runs(1) == unbudgeted
