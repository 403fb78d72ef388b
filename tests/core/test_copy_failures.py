"""A tick's state copies that fail: a restore, an eviction save, a prefix's store, import or
copy, a lane move. docs/scheduling.md: a park that fails recomputes the preempted job and fails no
other (tests/core/test_park_failure.py); the same holds for the other state copies of a tick.
A parked job whose KV cannot be loaded back is computed again from its prompt and the tokens it already has; a cached prefix whose move to host memory fails is
dropped. Before, each raised out of the tick and the worker failed every running job with
``engine_error``, the urgent request that preempted included."""

from __future__ import annotations

from typing import Any

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Event, Job
from scheduler.engines.base import EngineError
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Done, Error, Submit
from scheduler.worker.loop import EngineWorker
from tests.core.builders import (
    RecordingConn,
    finished,
    make_job,
    make_scheduler,
    outputs,
    run_until_idle,
    run_worker,
    tick,
)


class LoadFails(SimEngine):
    """Restoring a parked lane fails (llama.cpp: ``llama_state_seq_set_data`` reading nothing)."""

    def load(self, seq: int, artifact: Any) -> None:
        if seq < self.n_lanes:
            raise EngineError(f"could not restore lane {seq}'s KV cache", permanent=False)
        super().load(seq, artifact)


class EvictSaveFails(SimEngine):
    """Copying a cache slot's KV out to host memory fails."""

    def save(self, seq: int) -> Any:
        if seq >= self.n_lanes:
            raise EngineError(f"could not copy cache slot {seq}'s KV", permanent=False)
        return super().save(seq)


def _preempt_and_resume(engine_class: type[SimEngine]) -> tuple[RecordingConn, EngineWorker]:
    clock = FakeClock()
    engine = engine_class(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    conn = RecordingConn()
    for job_id in ("a", "b"):
        agent = {"endpoint": "completions", "prompt": f"agent {job_id}'s prompt", "max_tokens": 30}
        worker.handle(conn, Submit(job_id, agent, qos=2))  # type: ignore[arg-type]
    for _ in range(6):
        worker.run_tick()
    chat = {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}
    worker.handle(conn, Submit("chat", chat, qos=0))  # type: ignore[arg-type]
    run_worker(worker)
    return conn, worker


def test_a_restore_that_fails_recomputes_the_parked_job_and_fails_no_other() -> None:
    reference, _ = _preempt_and_resume(SimEngine)
    conn, worker = _preempt_and_resume(LoadFails)
    assert worker.scheduler.counters["parks"] == 1  # a job was parked, and its restore failed
    assert worker.scheduler.counters["resumes"] == 0  # superfluid_resumes_total: none was restored
    assert [m for m in conn.sent if isinstance(m, Error)] == []
    assert {m.id for m in conn.sent if isinstance(m, Done)} == {"a", "b", "chat"}
    # recomputed from its prompt and its tokens so far: the same text as with the restore
    assert conn.texts() == reference.texts()
    done = {m.id: m for m in conn.sent if isinstance(m, Done)}
    assert all(d.usage["completion_tokens"] == 30 for k, d in done.items() if k != "chat")


def _shared_prefixes(engine_class: type[SimEngine]) -> tuple[RecordingConn, EngineWorker]:
    """Two pairs of requests, each pair sharing a long prefix; one cache slot, so the first
    pair's prefix is moved to host memory to make room for the second's."""
    clock = FakeClock()
    engine = engine_class(n_lanes=2, lane_ctx=512, clock=clock, cache_slots=1)
    config = SchedulerConfig(max_batch=2, lane_ctx=512, cache_slots=1)
    worker = EngineWorker(engine, config, model_name="sim", clock=clock)
    conn = RecordingConn()
    for k, prefix in enumerate(("The first long shared system prompt, " * 3, "Another long shared system prompt here, " * 3)):
        for i in range(2):
            body = {"endpoint": "completions", "prompt": f"{prefix}question {i}", "max_tokens": 4}
            worker.handle(conn, Submit(f"p{k}-{i}", body, qos=2))  # type: ignore[arg-type]
        run_worker(worker)
    return conn, worker


def test_an_eviction_whose_save_fails_drops_the_cache_entry_and_fails_no_job() -> None:
    reference, ref_worker = _shared_prefixes(SimEngine)
    assert ref_worker.scheduler.pool.counters["evictions"] >= 1  # the scenario evicts to host
    assert len(ref_worker.scheduler.pool.host_entries()) == 1
    conn, worker = _shared_prefixes(EvictSaveFails)
    assert [m for m in conn.sent if isinstance(m, Error)] == []
    assert {m.id for m in conn.sent if isinstance(m, Done)} == {"p0-0", "p0-1", "p1-0", "p1-1"}
    assert conn.texts() == reference.texts()
    assert worker.scheduler.pool.host_entries() == []  # the entry whose save failed is dropped


def _restore_beside_a_follower(engine_class: type[SimEngine]) -> tuple[dict[str, list[int]], dict[str, str], SimEngine]:
    """A parked agent is restored in the tick that admits a newer agent sharing its prompt's
    prefix, which copies that prefix from the restored lane."""
    clock = FakeClock()
    sched = Scheduler(SchedulerConfig(max_batch=2, lane_ctx=512), clock=clock)
    engine = engine_class(n_lanes=2, lane_ctx=512, clock=clock)
    x = make_job(64, job_id="x", max_tokens=20)
    z = make_job(16, job_id="z", max_tokens=20, qos=QosClass.BACKGROUND)
    sched.add(x)
    sched.add(z)
    events: list[Event] = []
    for _ in range(4):
        events += tick(sched, engine)
    for chat in ("c1", "c2"):
        sched.add(make_job(8, job_id=chat, max_tokens=2, qos=QosClass.INTERACTIVE))
    y = make_job(8, job_id="y", max_tokens=5)
    y.prompt = x.prompt[:48] + y.prompt
    sched.add(y)
    events += run_until_idle(sched, engine)
    assert sched.counters["parks"] == 2
    return outputs(events), finished(events), engine


def test_a_job_copying_from_a_lane_whose_restore_failed_computes_its_prompt_itself() -> None:
    ref_out, ref_done, _ = _restore_beside_a_follower(SimEngine)
    out, done, _ = _restore_beside_a_follower(LoadFails)
    assert done == ref_done == {"x": "length", "y": "length", "z": "length", "c1": "length", "c2": "length"}
    assert out == ref_out


class ImportFails(SimEngine):
    """Loading a prefix back from host memory into a cache slot fails."""

    def load(self, seq: int, artifact: Any) -> None:
        if seq >= self.n_lanes:
            raise EngineError(f"could not load cache slot {seq}'s KV", permanent=False)
        super().load(seq, artifact)


def _import_back(engine_class: type[SimEngine]) -> tuple[RecordingConn, EngineWorker]:
    """The first pair's prefix, moved to host memory for the second's, is imported back by a
    later request that shares it."""
    conn, worker = _shared_prefixes(engine_class)
    assert len(worker.scheduler.pool.host_entries()) == 1
    body = {"endpoint": "completions", "prompt": "The first long shared system prompt, " * 3 + "question 9", "max_tokens": 4}
    worker.handle(conn, Submit("again", body, qos=2))  # type: ignore[arg-type]
    run_worker(worker)
    return conn, worker


def test_an_import_from_host_that_fails_drops_the_entry_and_the_job_prefills_its_prompt() -> None:
    reference, ref_worker = _import_back(SimEngine)
    assert ref_worker.scheduler.pool.counters["host_imports"] == 1
    conn, worker = _import_back(ImportFails)
    assert worker.scheduler.pool.counters["host_imports"] == 0  # tried, and failed: none imported
    assert [m for m in conn.sent if isinstance(m, Error)] == []
    assert conn.texts() == reference.texts()
    done = {m.id: m for m in conn.sent if isinstance(m, Done)}
    assert done["again"].usage["cached_tokens"] == 0  # prefilled, not taken from the cache
    first = list(("The first long shared system prompt, " * 3).encode())
    assert [e for e in ref_worker.scheduler.pool.entries.values() if e.tokens[: len(first)] == first]
    assert not [e for e in worker.scheduler.pool.entries.values() if e.tokens[: len(first)] == first]  # its entry is dropped


class StoreFails(SimEngine):
    """Copying a lane's prefix into a cache slot fails (llama.cpp copies through the sequence
    state, as a park does)."""

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        if dst >= self.n_lanes:
            raise EngineError(f"could not copy sequence {src}'s KV", permanent=False)
        super().copy_prefix(src, dst, n_tokens)


class CopyFails(SimEngine):
    """Copying a shared prefix into a new lane fails."""

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        if dst < self.n_lanes:
            raise EngineError(f"could not copy sequence {src}'s KV", permanent=False)
        super().copy_prefix(src, dst, n_tokens)


def test_a_prefix_store_that_fails_drops_the_cache_entry_and_fails_no_job() -> None:
    reference, ref_worker = _shared_prefixes(SimEngine)
    assert ref_worker.scheduler.pool.counters["stored"] >= 2
    conn, worker = _shared_prefixes(StoreFails)
    assert [m for m in conn.sent if isinstance(m, Error)] == []
    assert {m.id for m in conn.sent if isinstance(m, Done)} == {"p0-0", "p0-1", "p1-0", "p1-1"}
    assert conn.texts() == reference.texts()
    assert worker.scheduler.pool.entries == {}  # nothing was stored: no entry claims a slot
    assert worker.scheduler.pool.counters["stored"] == 0


def test_a_prefix_copy_into_a_lane_that_fails_prefills_that_prompt_and_fails_no_job() -> None:
    reference, _ = _shared_prefixes(SimEngine)
    conn, _ = _shared_prefixes(CopyFails)
    assert [m for m in conn.sent if isinstance(m, Error)] == []
    assert conn.texts() == reference.texts()
    done = {m.id: m for m in conn.sent if isinstance(m, Done)}
    ref_done = {m.id: m for m in reference.sent if isinstance(m, Done)}
    assert any(d.usage["cached_tokens"] for d in ref_done.values())  # the reference copied prefixes
    assert all(d.usage["cached_tokens"] == 0 for d in done.values())  # these prefilled them


# A lane move (lane compaction) copies a running job's KV into a free lane (llama_state_seq_get_data
# then _set_data on llama.cpp, as a park and a restore do): the moved job is computed again in its
# new lane and the kept KV it traded places with is forgotten.


class LaneSaveFails(SimEngine):
    def save(self, seq: int) -> Any:
        if seq < self.n_lanes:
            raise EngineError(f"could not copy lane {seq}'s KV cache", permanent=False)
        return super().save(seq)


def _run_moves(compact: bool, engine_class: type[SimEngine]) -> tuple[list[Event], Scheduler]:
    sched, plain_engine, _ = make_scheduler(max_batch=4, compact_lanes=compact, min_prefix_tokens=8)
    engine = engine_class(n_lanes=4, lane_ctx=plain_engine.lane_ctx, clock=plain_engine.clock, cache_slots=4)
    jobs = [make_job(16, max_tokens=n, job_id=f"j{i}") for i, n in enumerate([40, 4, 40, 40])]
    for job in jobs:
        sched.add(job)
    events: list[Event] = []

    def step() -> None:
        plan = sched.step()
        events.extend(sched.commit(engine.execute(plan, lambda: False)))

    while "j1" in sched.jobs:
        step()
    step()  # the tick after j1's finish: j3 moves down into its lane (with compaction)
    # the finished conversation's next turn, which the KV j1 kept would serve
    turn2 = Job(job_id="turn2", prompt=jobs[1].sequence[: jobs[1].computed] + [7, 8, 9], max_tokens=5, sampling=jobs[1].sampling)
    sched.add(turn2)
    for _ in range(1000):
        if not sched.jobs:
            return events, sched
        step()
    raise AssertionError("scheduler did not go idle")


def test_a_move_whose_copy_fails_recomputes_the_moved_job_and_fails_no_other() -> None:
    reference, _ = _run_moves(False, SimEngine)
    events, sched = _run_moves(True, LaneSaveFails)
    assert sched.counters["lane_moves"] >= 1
    assert {e.job_id: e.reason for e in events if e.kind == "finished"} == {
        "j0": "length", "j1": "length", "j2": "length", "j3": "length", "turn2": "length"
    }
    assert outputs(events) == outputs(reference)


def test_a_prefix_copy_or_import_that_fails_is_not_counted_as_a_prefix_hit() -> None:
    """The pool's prefix_hits and prefix_tokens_reused count prefixes a lane took from the
    cache or from another lane: a copy (or the import it needed) that failed took nothing."""
    _, ref_worker = _shared_prefixes(SimEngine)
    assert ref_worker.scheduler.pool.counters["prefix_hits"] >= 1  # the reference copied prefixes
    _, worker = _shared_prefixes(CopyFails)
    assert worker.scheduler.pool.counters["prefix_hits"] == 0
    assert worker.scheduler.pool.counters["prefix_tokens_reused"] == 0
    _, ref_worker = _import_back(SimEngine)
    _, worker = _import_back(ImportFails)
    ref_counters, counters = ref_worker.scheduler.pool.counters, worker.scheduler.pool.counters
    assert counters["prefix_hits"] == ref_counters["prefix_hits"] - 1  # the import's copy did not happen
    assert counters["prefix_tokens_reused"] < ref_counters["prefix_tokens_reused"]
