"""A job's sequence read without building it: ``Job.length`` and ``Job.tokens(start, end)`` are
what the scheduler feeds the engine (a decode round's one token, a prompt step's chunk, a kept
lane's tokens), so they must be ``len(sequence)`` and ``sequence[start:end]`` for every split of
prompt and output, and every range a feed can ask for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.qos import QOS_CLASSES, QosClass
from scheduler.core.queues import ClassQueues
from scheduler.core.types import Job

tokens = st.lists(st.integers(0, 50_000), max_size=40)


@st.composite
def job_and_range(draw: st.DrawFn) -> tuple[Job, int, int | None]:
    job = Job("j", prompt=draw(tokens), max_tokens=64)
    job.output = draw(tokens)
    n = job.length
    start = draw(st.integers(0, n))
    end = draw(st.none() | st.integers(start, n))
    return job, start, end


@given(job_and_range())
def test_tokens_and_length_are_the_sequences_slice_and_length(case: tuple[Job, int, int | None]) -> None:
    job, start, end = case
    assert job.length == len(job.sequence)
    assert job.tokens(start, end) == job.sequence[start:end]


@given(job_and_range())
def test_tokens_is_a_copy_the_job_does_not_share(case: tuple[Job, int, int | None]) -> None:
    """A feed's tokens are the plan's: a later token appended to the job does not change them."""
    job, start, end = case
    got = job.tokens(start, end)
    before = list(got)
    job.output.append(7)
    job.prompt.append(8)
    assert got == before


def test_queues_iterate_best_class_first_and_are_false_only_when_empty() -> None:
    queues = ClassQueues(starvation_ticks=8)
    assert not queues and list(queues) == []
    jobs = {c: Job(f"j-{c.label}", prompt=[1], max_tokens=1, qos=c) for c in reversed(QOS_CLASSES)}
    for job in jobs.values():  # pushed worst class first
        queues.push(job)
    assert queues and len(queues) == 4
    assert [j.qos for j in queues] == [QosClass.INTERACTIVE, QosClass.COMPLETION, QosClass.AGENT, QosClass.BACKGROUND]
    for job in jobs.values():
        queues.pop(job)
    assert not queues
