"""The tick scheduler: lanes, admission, preemption, prefill/decode budgets.

Driven one tick at a time and free of Django and engine libraries::

    sched = Scheduler(SchedulerConfig(max_batch=8), clock=time.monotonic)
    sched.add(job)
    plan = sched.step()           # admissions, parks, feeds for this tick
    result = engine.execute(plan, should_stop)
    events = sched.commit(result) # tokens, finishes

Invariants:
- a lane holds at most one job; ``self.lanes[i] is job`` iff ``job.lane == i`` and the job runs;
- a job is in exactly one of: the queues, a lane, finished;
- ``job.computed <= len(job.sequence)``; the engine is asked to feed ``sequence[computed:]``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .qos import QosClass
from .queues import ClassQueues
from .types import Event, Job, JobState, LaneBind, LaneFeed, LaneRestore, TickPlan, TickResult

PREFILL_STEPS = (512, 256, 128, 64, 32)


@dataclass
class SchedulerConfig:
    max_batch: int = 8
    lane_ctx: int = 4096  # context tokens per lane
    class_lanes: dict[QosClass, int] = field(default_factory=dict)  # cap per class
    prefill_budget: int = 4096  # prompt tokens per tick; 0 = adaptive (256-4096)
    tick_decode_budget: int = 0  # decode tokens per tick; 0 = every decoding lane
    tick_target_ms: int = 2000
    starvation_ticks: int = 8
    newcomer_prefill_cap_s: float = 0.5  # while a newcomer could be admitted
    prefill_cap_s: float = 8.0  # otherwise
    initial_prefill_tokens_per_s: float = 256.0  # until measured
    preemption: bool = True
    park: bool = True

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        for qos, cap in self.class_lanes.items():
            if not 1 <= cap <= self.max_batch:
                raise ValueError(f"lane cap for {qos.label} must be between 1 and {self.max_batch}")
        if self.prefill_budget != 0 and not 64 <= self.prefill_budget <= 4096:
            raise ValueError("prefill_budget must be 0 (adaptive) or between 64 and 4096")


class Scheduler:
    def __init__(self, config: SchedulerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.tick = 0
        self.lanes: list[Job | None] = [None] * config.max_batch
        self.queues = ClassQueues(config.starvation_ticks)
        self.jobs: dict[str, Job] = {}
        self._seq = itertools.count()
        self._release: list[int] = []
        self._events: list[Event] = []
        self._last_prefill_tick: dict[int, int] = {}  # lane -> last tick it got prefill
        self.prefill_tokens_per_s = config.initial_prefill_tokens_per_s
        self.last_plan: TickPlan | None = None
        self.counters = {"admitted": 0, "finished": 0, "cancelled": 0, "preemptions": 0, "ticks": 0}

    # -- requests ---------------------------------------------------------------------

    def add(self, job: Job) -> None:
        """Queue a job. Its prompt must already fit ``lane_ctx`` (checked at admission by the worker)."""
        if job.job_id in self.jobs:
            raise ValueError(f"duplicate job id {job.job_id}")
        if len(job.prompt) == 0:
            raise ValueError("a job needs at least one prompt token")
        job.arrival_s = self.clock()
        job.seq = next(self._seq)
        job.enqueued_tick = self.tick
        job.state = JobState.QUEUED
        self.jobs[job.job_id] = job
        self.queues.push(job)

    def cancel(self, job_id: str, reason: str = "cancelled") -> bool:
        """Stop a job wherever it is; its lane is released in the next plan."""
        job = self.jobs.get(job_id)
        if job is None or job.state is JobState.FINISHED:
            return False
        if job.state is JobState.QUEUED:
            self.queues.remove(job)
        self._finish(job, reason)
        if reason == "cancelled":
            self.counters["cancelled"] += 1
        return True

    def finish(self, job_id: str, reason: str) -> bool:
        """Finish a running job from outside the core (a stop string matched)."""
        return self.cancel(job_id, reason)

    # -- one tick ---------------------------------------------------------------------

    def step(self) -> TickPlan:
        self.tick += 1
        plan = TickPlan(tick=self.tick)
        plan.release, self._release = self._release, []
        self._preempt(plan)
        self._admit(plan)
        self._plan_feeds(plan)
        self.last_plan = plan
        return plan

    def commit(self, result: TickResult) -> list[Event]:
        now = self.clock()
        self.counters["ticks"] += 1
        plan = self.last_plan
        for job_id, artifact in result.parked.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state is JobState.QUEUED:
                job.parked = artifact
        for lane, n in result.fed.items():
            job = self.lanes[lane]
            if job is not None:
                job.computed += n
                if n:
                    self._last_prefill_tick[lane] = self.tick
        for lane, token in result.sampled.items():
            job = self.lanes[lane]
            if job is None or job.state is not JobState.RUNNING:
                continue
            if job.first_token_s is None:
                job.first_token_s = now
            if lane in result.eog:
                self._finish(job, "stop")
                continue
            job.output.append(token)
            self._events.append(Event("token", job.job_id, token=token, lane=lane))
            if len(job.output) >= job.max_tokens or len(job.sequence) >= self.config.lane_ctx:
                self._finish(job, "length")
        if plan is not None and result.prefill_s > 0 and plan.prefill_tokens:
            fed_prefill = sum(
                result.fed.get(f.lane, 0) for f in plan.feeds if not f.is_decode
            )
            if fed_prefill:
                rate = fed_prefill / result.prefill_s
                self.prefill_tokens_per_s = 0.7 * self.prefill_tokens_per_s + 0.3 * rate
        return self.drain_events()

    def drain_events(self) -> list[Event]:
        """Events raised outside ``commit()`` (cancels, stop-string finishes) and not yet taken."""
        events, self._events = self._events, []
        return events

    @property
    def idle(self) -> bool:
        """No job queued or running and no lane waiting to be released."""
        return not self.jobs and not self._release

    # -- internals --------------------------------------------------------------------

    def _finish(self, job: Job, reason: str) -> None:
        job.state = JobState.FINISHED
        job.finish_reason = reason
        job.finished_s = self.clock()
        if job.lane is not None:
            self.lanes[job.lane] = None
            self._release.append(job.lane)
            job.lane = None
        job.parked = None
        self.jobs.pop(job.job_id, None)
        self.counters["finished"] += 1
        self._events.append(Event("finished", job.job_id, reason=reason, job=job))

    def free_lanes(self) -> list[int]:
        return [i for i, job in enumerate(self.lanes) if job is None and i not in self._release]

    def _class_usage(self) -> dict[QosClass, int]:
        usage = {c: 0 for c in QosClass}
        for job in self.lanes:
            if job is not None:
                usage[job.qos] += 1
        return usage

    def _admissible_classes(self) -> set[QosClass]:
        usage = self._class_usage()
        caps = self.config.class_lanes
        return {c for c in QosClass if usage[c] < caps.get(c, self.config.max_batch)}

    def _bind(self, plan: TickPlan, job: Job, lane: int) -> None:
        now = self.clock()
        self.queues.pop(job)
        job.state = JobState.RUNNING
        job.lane = lane
        self.lanes[lane] = job
        self._last_prefill_tick[lane] = self.tick
        if job.parked is not None:
            plan.restore.append(LaneRestore(lane, job.job_id, job.parked))
            job.parked = None
            self._events.append(Event("resumed", job.job_id, lane=lane))
        else:
            job.computed = 0  # nothing of it is in this lane's cache
        plan.bind.append(LaneBind(lane, job.job_id, job.sampling, list(job.output)))
        if job.admitted_s is None:
            job.admitted_s = now
            self.counters["admitted"] += 1
            self._events.append(Event("admitted", job.job_id, lane=lane, job=job))

    def _admit(self, plan: TickPlan) -> None:
        for lane in self.free_lanes():
            allowed = self._admissible_classes()
            job = self.queues.best(self.tick, allowed)
            if job is None:
                return
            self._bind(plan, job, lane)

    def _preempt(self, plan: TickPlan) -> None:
        """An interactive or completion job queued with every lane busy takes the lane of the
        lowest-class running job below it: decoding lanes before prefilling ones."""
        if not self.config.preemption or self.free_lanes():
            return
        for urgent in [j for j in self.queues if j.qos <= QosClass.COMPLETION]:
            victims = [
                j
                for j in self.lanes
                if j is not None and j.qos > urgent.qos and not j.batch_invariant
            ]
            if not victims:
                continue
            victim = max(victims, key=lambda j: (j.qos, not j.prefilling, j.admitted_s or 0.0))
            lane = victim.lane
            assert lane is not None
            self.lanes[lane] = None
            victim.lane = None
            victim.state = JobState.QUEUED
            victim.preemptions += 1
            victim.enqueued_tick = self.tick
            self.queues.push_head(victim)
            self.counters["preemptions"] += 1
            if self.config.park and victim.computed > 0:
                plan.park.append((lane, victim.job_id))
            else:
                plan.release.append(lane)
                victim.computed = 0
            self._events.append(Event("preempted", victim.job_id, lane=lane))
            self._bind(plan, urgent, lane)
            if not self.free_lanes() and not any(
                j.qos <= QosClass.COMPLETION for j in self.queues
            ):
                return

    def _prefill_cap_tokens(self, newcomer_possible: bool) -> tuple[int, int]:
        """(most prompt tokens this tick, tokens per engine call), from the measured rate."""
        rate = max(1.0, self.prefill_tokens_per_s)
        cap_s = self.config.newcomer_prefill_cap_s if newcomer_possible else self.config.prefill_cap_s
        step = next((s for s in PREFILL_STEPS if s <= rate * self.config.newcomer_prefill_cap_s), 32)
        budget = self.config.prefill_budget
        if budget == 0:
            budget = int(min(4096, max(256, rate * self.config.tick_target_ms / 1000)))
        cap = max(step, int(rate * cap_s) // step * step)
        return min(budget, cap), step

    def _plan_feeds(self, plan: TickPlan) -> None:
        running = [j for j in self.lanes if j is not None]
        decoding = [j for j in running if not j.prefilling]
        prefilling = [j for j in running if j.prefilling]
        newcomer_possible = bool(self.free_lanes()) or len(self.queues) > 0
        budget, plan.step_tokens = self._prefill_cap_tokens(newcomer_possible)

        decode_budget = self.config.tick_decode_budget or len(decoding)
        for job in sorted(decoding, key=lambda j: (j.qos, j.lane))[:decode_budget]:
            assert job.lane is not None
            seq = job.sequence
            plan.feeds.append(LaneFeed(job.lane, job.job_id, job.computed, seq[job.computed:], True, decode=True))

        def prefill_order(job: Job) -> tuple[int, int, int]:
            assert job.lane is not None
            idle = self.tick - self._last_prefill_tick.get(job.lane, self.tick)
            starving = idle >= self.config.starvation_ticks > 0
            return (0 if starving else 1, int(job.qos), job.remaining_prompt)

        hold_below: int | None = None
        for job in sorted(prefilling, key=prefill_order):
            if budget <= 0:
                break
            if hold_below is not None and job.qos > hold_below:
                continue
            assert job.lane is not None
            # sequence, not prompt: a job recomputed after preemption without parking re-feeds
            # its output too, and samples only after the last of it.
            remaining = len(job.sequence) - job.computed
            take = min(budget, remaining)
            budget -= take
            finishes = take == remaining
            tokens = job.sequence[job.computed : job.computed + take]
            plan.feeds.append(LaneFeed(job.lane, job.job_id, job.computed, tokens, finishes))
            if finishes and job.qos <= QosClass.COMPLETION and hold_below is None:
                hold_below = int(job.qos)
        if hold_below is not None:
            plan.feeds = [
                f
                for f in plan.feeds
                if f.is_decode or self.jobs[f.job_id].qos <= hold_below
            ]

    # -- state for operators ---------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        lanes = []
        for i, job in enumerate(self.lanes):
            if job is None:
                lanes.append({"lane": i, "state": "idle"})
                continue
            lanes.append(
                {
                    "lane": i,
                    "state": "prefill" if job.prefilling else "decode",
                    "job_id": job.job_id,
                    "class": job.qos.label,
                    "priority": job.priority,
                    "prompt_tokens": len(job.prompt),
                    "prompt_done": min(job.computed, len(job.prompt)),
                    "generated": len(job.output),
                    "batch_invariant": job.batch_invariant,
                }
            )
        return {
            "tick": self.tick,
            "lanes": lanes,
            "lanes_active": sum(1 for j in self.lanes if j is not None),
            "queue_depth": {c.label: self.queues.depth(c) for c in QosClass},
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            "counters": dict(self.counters),
        }
