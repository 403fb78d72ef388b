"""Builders for core tests: a scheduler on a fake clock, a simulated engine, jobs, a KV pool
under a Hypothesis state machine, a model router and the loop that carries out its actions."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from scheduler.core.kv_pool import KvPool, PoolConfig, PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.router import Dispatch, ModelSpec, Router, RouterConfig
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Event, Job, SamplingParams
from scheduler.engines.sim import FakeClock, SimEngine

_ids = itertools.count(1)


def make_scheduler(**overrides: Any) -> tuple[Scheduler, SimEngine, FakeClock]:
    clock = FakeClock()
    engine_kw = {k: overrides.pop(k) for k in ("prefill_s_per_token", "decode_round_s", "eog_after") if k in overrides}
    config = SchedulerConfig(**overrides)
    sched = Scheduler(config, clock=clock)
    engine = SimEngine(
        n_lanes=config.max_batch, lane_ctx=config.lane_ctx, clock=clock, cache_slots=config.cache_slots, **engine_kw
    )
    return sched, engine, clock


def make_job(
    prompt_tokens: int = 16,
    *,
    max_tokens: int = 8,
    qos: QosClass = QosClass.AGENT,
    priority: int = 0,
    job_id: str | None = None,
    batch_invariant: bool = False,
) -> Job:
    job_id = job_id or f"job{next(_ids)}"
    # a stable hash: the same job id gives the same prompt in every run (str hash() is salted per process)
    prompt = [zlib.crc32(f"{job_id}:{i}".encode()) % 200 + 3 for i in range(prompt_tokens)]
    return Job(
        job_id=job_id,
        prompt=prompt,
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
        qos=qos,
        priority=priority,
        batch_invariant=batch_invariant,
    )


def make_jobs(n: int, **kwargs: Any) -> list[Job]:
    return [make_job(**kwargs) for _ in range(n)]


def tick(sched: Scheduler, engine: SimEngine, should_stop: Callable[[], bool] = lambda: False) -> list[Event]:
    plan = sched.step()
    result = engine.execute(plan, should_stop)
    return sched.commit(result)


def run_until_idle(sched: Scheduler, engine: SimEngine, max_ticks: int = 10_000) -> list[Event]:
    events: list[Event] = []
    for _ in range(max_ticks):
        if not sched.jobs:
            return events
        events += tick(sched, engine)
    raise AssertionError("scheduler did not go idle")


def outputs(events: list[Event]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        if e.kind == "token":
            assert e.token is not None
            out.setdefault(e.job_id, []).append(e.token)
    return out


def finished(events: list[Event]) -> dict[str, str]:
    return {e.job_id: e.reason or "" for e in events if e.kind == "finished"}


class RecordingConn:
    """A web side's connection to a worker (``EngineWorker.handle``) that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def queue(self, message: Any) -> None:
        self.sent.append(message)

    def texts(self) -> dict[str, str]:
        """Each job's streamed text, by job id."""
        from scheduler.link.messages import Delta

        out: dict[str, str] = {}
        for m in self.sent:
            if isinstance(m, Delta):
                out[m.id] = out.get(m.id, "") + m.text
        return out


def run_worker(worker: Any, ticks: int = 2000) -> None:
    """Tick ``worker`` until it is idle; fails if it does not get there in ``ticks``."""
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return
    raise AssertionError("the worker did not go idle")


def greedy_reply(prompt: list[int], n: int) -> list[int]:
    """What the simulated engine's greedy decode gives after ``prompt``, ``n`` tokens."""
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(SimEngine.next_token(seq))
        seq.append(out[-1])
    return out


# Prompts of 32 shared tokens and up to four 8-token blocks of 1, 2 or 3: they share prefixes in
# every way (the same again, one extending another, one diverging after a block).
KV_PROMPTS = st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=4).map(lambda xs: [7] * 32 + xs * 8)


class KvPoolMachine(RuleBasedStateMachine):
    """A Hypothesis state machine over a KvPool of two 128-token lanes, ``cache_slots`` prefix
    slots and ``host_cache_bytes`` of host memory (prefixes of 32 tokens or more), at time 0 with
    this tick's operations (``ops``) empty. A subclass adds the rules and invariants."""

    def __init__(self, *, cache_slots: int, host_cache_bytes: int) -> None:
        super().__init__()
        self.pool = KvPool(PoolConfig(n_lanes=2, lane_ctx=128, cache_slots=cache_slots, min_prefix_tokens=32, host_cache_bytes=host_cache_bytes))
        self.ops = PoolOps()
        self.now = 0.0


class RouterLoop:
    """A model router on a fake clock and the loop serve runs it in: ``settle()`` carries out
    its actions (``unload``, ``load``: a subclass's to do; ``dispatch``) until it has none, 50
    rounds at the most, and calls ``round_done()`` after each round and once it has none left.
    ``started``: the request ids dispatched, in order; ``dispatches``: each one's dispatch."""

    def __init__(self, specs: list[ModelSpec], **config: object) -> None:
        self.clock = FakeClock()
        self.router = Router(specs, RouterConfig(**config), clock=self.clock)  # type: ignore[arg-type]
        self.started: list[str] = []
        self.dispatches: dict[str, object] = {}

    def settle(self) -> None:
        for _ in range(50):
            actions = self.router.schedule()
            if not actions:
                self.round_done()
                return
            for model in actions.unload:
                self.unload(model)
            for model in actions.load:
                self.load(model)
            for d in actions.dispatch:
                self.dispatch(d)
            self.round_done()
        raise AssertionError("the router did not settle")

    def unload(self, model: str) -> None:
        raise NotImplementedError

    def load(self, model: str) -> None:
        raise NotImplementedError

    def dispatch(self, d: Dispatch) -> None:
        self.started.append(d.request_id)
        self.dispatches[d.request_id] = d

    def round_done(self) -> None:
        pass
