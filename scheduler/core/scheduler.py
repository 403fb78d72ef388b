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
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from .kv_pool import CachedPrefix, KvPool, PoolConfig, PoolOps, common_prefix
from .qos import QOS_CLASSES, QosClass, band_of
from .queues import ClassQueues, ScoreConfig
from .types import Event, Job, JobState, LaneBind, LaneFeed, LaneRestore, LaneSwap, TickPlan, TickResult

OS_PRESSURE_HOST_COOLDOWN_S = 60.0  # after OS pressure, no prefix moves to host memory for this long
OS_PRESSURE_BACKGROUND_HOLD_S = 5.0  # after critical pressure, no background job gets a lane for this long
_PRESSURE_RANK = {None: 0, "warning": 1, "critical": 2}
# The most decode rounds one burst runs (Scheduler._burst_rounds): a bound on the time between two
# plans where a round takes a millisecond or two (a GPU) and the stream interval would allow more.
MAX_BURST_ROUNDS = 16

PREFILL_STEPS = (512, 256, 128, 64, 32)
# Finishes after which a lane's KV is known to hold exactly the job's computed tokens.
KEEP_REASONS = frozenset({"stop", "length", "cancelled"})


@dataclass
class KeptLane:
    """What a finished job left in its lane's KV, offered to the next job that shares it."""

    scope: str  # the prefix-cache partition of the job that left it
    tokens: list[int]
    kept_s: float


@dataclass
class SchedulerConfig:
    max_batch: int = 8
    lane_ctx: int = 4096  # context tokens per lane
    class_lanes: dict[QosClass, int] = field(default_factory=dict)  # cap per class
    prefill_budget: int = 4096  # prompt tokens per tick; 0 = adaptive (256-4096)
    tick_decode_budget: int = 0  # decode tokens per tick; 0 = every decoding lane every round
    tick_target_ms: int = 2000  # busy tick; also the length of one class-aging tick
    # The engine's tick targets in seconds: (a lane is free or one is finishing, every lane
    # busy). None: every tick is one decode round. llama.cpp and MLX declare (0.05, 0.25).
    tick_targets_s: tuple[float, float] | None = None
    initial_round_s: float = 0.05  # decode round duration until measured
    starvation_ticks: int = 8
    newcomer_prefill_cap_s: float = 0.5  # while a newcomer could be admitted
    decoding_prefill_cap_s: float = 0.25  # while a lane decodes (llama.cpp/MLX busy-tick target)
    prefill_cap_s: float = 8.0  # otherwise
    # While an interactive or completion lane decodes beside lanes that prefill, the ticks after
    # each prefill step decode only, for up to this share of that step's time: the answer streams
    # at reading speed behind 512-token chunks, and prefill keeps 1 / (1 + share) of its rate
    # while such an answer streams. 0: a decode round beside every prefill step, no more.
    urgent_decode_share: float = 0.2
    # Whether the engine may run several decode rounds on its own (a burst: Scheduler._burst_rounds);
    # the worker turns it on with --stream-interval-ms and ends each burst when held text is due.
    decode_bursts: bool = False
    # Whether the engine stops a running step when an urgent job arrives or a lane is cancelled
    # (llama.cpp's abort callback). Then, with a pinned --prefill-budget, steps are full chunks
    # even while lanes decode: an urgent arrival no longer waits for the step in flight.
    abortable_steps: bool = False
    # An urgent arrival lets a prompt step in flight finish when it is expected to end within
    # this many seconds (its work kept, the arrival's wait bounded by it); a longer one is
    # aborted at once. 0: always abort. A cancel aborts at once either way.
    abort_grace_s: float = 0.3
    # Keep the lanes decoding together in one run (docs/scheduling.md#lane-compaction): for an
    # engine that runs a decode round in one pass over the weights per run of consecutive busy
    # lanes (llama.cpp with a KV stream per sequence; the worker turns it off for others).
    compact_lanes: bool = False
    compact_min_tokens: int = 16  # a job moves only with this many tokens left to generate per 512 tokens of KV copied
    initial_prefill_tokens_per_s: float = 256.0  # until measured
    preemption: bool = True
    park: bool = True
    aging_divisor_s: float = 60.0  # request priority: seconds of waiting per score point; 0 = off
    swap_affinity_bonus: int = 10  # request priority: 0..99
    prefix_cache: bool = True
    # A finished job's lane keeps its KV (prompt and output) until the lane is needed; a new job
    # whose prompt starts with those tokens takes that lane and skips them, as llama-server's
    # slots do. Off with prefix_cache.
    keep_lanes: bool = True
    cache_slots: int = 4  # engine sequences that hold cached prefixes
    min_prefix_tokens: int = 32
    pressure_high: float = 0.85
    # Whether occupancy watermarks evict cached prefixes. Off for engines whose KV memory is
    # fixed per sequence at start-up (llama.cpp with kv_unified=False): there an eviction frees
    # no cell a lane can use, and the cache's memory is sized by cache_slots instead.
    watermarks: bool = True
    pressure_low: float = 0.70
    host_cache_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if not 0 <= self.swap_affinity_bonus <= 99:
            raise ValueError("swap_affinity_bonus must be between 0 and 99")
        if not (math.isfinite(self.aging_divisor_s) and self.aging_divisor_s >= 0):
            raise ValueError("aging_divisor_s must be 0 (off) or a positive number")
        if not 0 < self.pressure_low < self.pressure_high <= 1:
            raise ValueError("pressure watermarks need 0 < low < high <= 1")
        for qos, cap in self.class_lanes.items():
            if not 1 <= cap <= self.max_batch:
                raise ValueError(f"lane cap for {qos.label} must be between 1 and {self.max_batch}")
        if self.prefill_budget != 0 and not 64 <= self.prefill_budget <= 4096:
            raise ValueError("prefill_budget must be 0 (adaptive) or between 64 and 4096")
        if self.tick_decode_budget < 0:
            raise ValueError("tick_decode_budget must be 0 (every decoding lane) or positive")
        if self.tick_target_ms < 1:
            raise ValueError("tick_target_ms must be at least 1")
        if not (math.isfinite(self.abort_grace_s) and 0 <= self.abort_grace_s <= 10):
            raise ValueError("abort_grace_s must be between 0 and 10 seconds")


class Scheduler:
    def __init__(self, config: SchedulerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.tick = 0
        self.prefill_cap: tuple[int, int] = (config.prefill_budget, 0)  # (tokens, step) of the last plan
        self.lanes: list[Job | None] = [None] * config.max_batch
        self.queues = ClassQueues(
            config.starvation_ticks,
            ScoreConfig(config.aging_divisor_s, config.swap_affinity_bonus),
            tick_s=config.tick_target_ms / 1000.0,
        )
        self.pool = KvPool(
            PoolConfig(
                n_lanes=config.max_batch,
                lane_ctx=config.lane_ctx,
                cache_slots=config.cache_slots if config.prefix_cache else 0,
                pressure_high=config.pressure_high,
                pressure_low=config.pressure_low,
                min_prefix_tokens=config.min_prefix_tokens,
                host_cache_bytes=config.host_cache_bytes,
            )
        )
        self._pending_pool = PoolOps()  # cache work decided between ticks (plan rejected)
        self._os_pressure: str | None = None  # a rise in OS pressure not yet acted on
        self.os_level: str | None = None  # the OS pressure level last read: None, warning, critical
        self._background_hold_until = 0.0
        self._bi_turn = 0
        self._stored: set[str] = set()
        # leader preempted in the plan being made -> the cache entry its waiters' prefix was stored into
        self._handed_over: dict[str, CachedPrefix] = {}
        self.jobs: dict[str, Job] = {}
        self._seq = itertools.count()
        self._release: list[int] = []  # lanes to empty in the next plan
        self._release_keep: list[int] = []  # lanes freed in the next plan with their KV kept
        self._kept: dict[int, KeptLane] = {}  # free lane whose KV is not empty -> the tokens it holds (trimmed when bound)
        # running job aging admitted ahead of better classes -> (its admission order, the urgent
        # jobs it was admitted ahead of): they do not preempt it while that order still holds
        self._aged_ahead: dict[str, tuple[tuple[int, int, float, int], set[str]]] = {}
        # the jobs the last admission left queued beside a free lane their class could not take,
        # and when: each is held until the next admission, which adds that time to its held_s
        self._held: tuple[float, list[Job]] = (0.0, [])
        self._events: list[Event] = []
        # Prefill starvation counts ticks that prefilled: decode-only ticks (an urgent answer
        # streaming) deprive every prompt alike, so they must not reorder prompts.
        self._prefill_ticks = 0  # ticks whose plan carried prompt tokens
        self._last_prefill_tick: dict[int, int] = {}  # lane -> _prefill_ticks when it last got prefill
        self.prefill_tokens_per_s = config.initial_prefill_tokens_per_s
        self.round_s = config.initial_round_s  # measured decode round duration
        self.rounds = 0  # engine calls planned (a tick is one or more rounds)
        self._tick_started_s = 0.0
        self._decode_only_until = 0.0  # urgent answers decode alone until then (urgent_decode_share)
        self._tick_decoded = 0  # decode tokens granted in the tick in flight
        self._grants = itertools.count()
        self._admissions = itertools.count(1)  # admission order: a tick admits several at one clock time
        self._decoded_at: dict[str, int] = {}  # job id -> number of its last decode grant
        self._decoded_tick: dict[str, int] = {}  # job id -> tick it last got a decode token
        self.last_plan: TickPlan | None = None
        self.counters = {
            "admitted": 0,
            "finished": 0,
            "cancelled": 0,
            "preemptions": 0,
            "parks": 0,
            "resumes": 0,
            "ticks": 0,
            "deadline_expired": 0,
            "os_pressure_warning": 0,
            "os_pressure_critical": 0,
            "plans_rejected": 0,
            "lane_moves": 0,
            "dispatched_interactive": 0,
            "dispatched_normal": 0,
            "dispatched_batch": 0,
        }

    # -- requests ---------------------------------------------------------------------

    def add(self, job: Job, *, arrival_s: float | None = None, enqueued_s: float | None = None) -> None:
        """Queue a job. Its prompt must already fit ``lane_ctx`` (checked at admission by the worker).

        ``arrival_s`` (this scheduler's clock): when the request arrived, if before now. The
        worker prepares a prompt (renders and tokenises it, maybe behind others) before it
        queues the job, and with several models the request waited at the router first: its
        queue wait, time to first token and score aging count from there. ``enqueued_s``: when
        it joined this worker's queue, where class aging and the oldest-wait figures start
        (default: ``arrival_s``). Neither is later than now; both default to now."""
        if job.job_id in self.jobs:
            raise ValueError(f"duplicate job id {job.job_id}")
        if len(job.prompt) == 0:
            raise ValueError("a job needs at least one prompt token")
        now = self.clock()
        job.arrival_s = arrival_s if arrival_s is not None and math.isfinite(arrival_s) and arrival_s < now else now
        enqueued = job.arrival_s if enqueued_s is None else enqueued_s
        job.enqueued_s = min(max(enqueued, job.arrival_s), now) if math.isfinite(enqueued) else now
        job.seq = next(self._seq)
        job.enqueued_tick = self.tick
        job.state = JobState.QUEUED
        self.jobs[job.job_id] = job
        self.queues.push(job)

    def cancel(self, job_id: str, reason: str = "cancelled", *, counted: bool = True) -> bool:
        """Stop a job wherever it is; its lane is released in the next plan. ``counted``: False
        for a job that is not ending for its client (its link dropped and its web side submits
        it again): it counts neither as cancelled nor as finished."""
        job = self.jobs.get(job_id)
        if job is None or job.state is JobState.FINISHED:
            return False
        if job.state is JobState.QUEUED:
            self.queues.remove(job)
        self._finish(job, reason, counted=counted)
        if reason == "cancelled" and counted:
            self.counters["cancelled"] += 1
        return True

    def finish(self, job_id: str, reason: str) -> bool:
        """Finish a running job from outside the core (a stop string matched)."""
        return self.cancel(job_id, reason)

    # -- one tick ---------------------------------------------------------------------

    def step(self) -> TickPlan:
        now = self.clock()
        self.rounds += 1
        if self._tick_continues(now):
            # another decode round of the tick in flight: nothing is admitted or preempted
            plan = TickPlan(tick=self.tick)
            self._plan_feeds(plan)
            plan.rounds = self._burst_rounds(plan)
            self.last_plan = plan
            return plan
        self.tick += 1
        self._tick_started_s = now
        self._tick_decoded = 0
        plan = TickPlan(tick=self.tick, pool=self._pending_pool)
        self._pending_pool = PoolOps()
        if (self._os_pressure is not None and self.config.watermarks) or self._kept_over_watermark():
            self._forget_kept()  # kept lanes are the first thing memory pressure takes
        plan.release, self._release = self._release, []
        plan.keep, self._release_keep = self._release_keep, []
        self._expire_deadlines(now)
        self._apply_os_pressure(plan, now)
        if self.config.watermarks:
            self.pool.enforce_watermarks(plan.pool, self._lane_tokens(), now)
        # free lanes first, then preemption: an urgent job still queued once admission has
        # filled the last free lane preempts now, not a tick later
        self._admit(plan, now)
        self._preempt(plan)
        self._share_prefixes(plan, now)
        self._store_pinned(plan, now)
        self._compact_lanes(plan)
        self._plan_feeds(plan)
        plan.rounds = self._burst_rounds(plan)
        self.last_plan = plan
        return plan

    def _burst_rounds(self, plan: TickPlan) -> int:
        """The decode rounds the engine may run on its own for ``plan`` (TickPlan.rounds), each
        lane's sampled token fed back at once (the worker ends a burst sooner: an arrival, held
        text due). Only when nothing could happen between the rounds that the scheduler must
        decide: the plan is every running lane's one decode token and nothing else, no job
        waits, no lane waits to be released nor cache work to be done, no decode budget rations
        the rounds, and no lane needs the worker each token (its first token, a grammar,
        logprobs, a batch-invariant lane). No lane passes its max_tokens or its context."""
        if not self.config.decode_bursts or not plan.feeds or self.config.tick_decode_budget or self.queues or self._os_pressure is not None:
            return 1
        if self._release or self._release_keep or self._pending_pool or plan.has_work_besides_feeds or plan.alone:
            return 1
        if len(plan.feeds) != sum(1 for j in self.lanes if j is not None):
            return 1  # a lane waits (for a leader's prefix): the scheduler looks at it each round
        rounds = MAX_BURST_ROUNDS
        for feed in plan.feeds:
            job = self.jobs.get(feed.job_id)
            if not feed.is_decode or job is None or not job.output or job.batch_invariant:
                return 1
            if job.sampling.grammar is not None or job.sampling.logprobs is not None:
                return 1
            rounds = min(rounds, job.max_tokens - len(job.output), self.config.lane_ctx - job.length)
        return max(1, rounds)

    def on_os_pressure(self, level: str | None) -> None:
        """A memory-pressure reading from the OS: "warning", "critical", or anything else for
        normal. Only a rise (normal to warning, to critical) is acted on, at the next step: a
        level that stays high does not evict again; the watermarks act on occupancy."""
        new = level if level in ("warning", "critical") else None
        if _PRESSURE_RANK[new] > _PRESSURE_RANK[self.os_level]:
            self._os_pressure = new
        if self.os_level == "critical" and new != "critical":  # background waits 5 s after it ends
            self._background_hold_until = max(self._background_hold_until, self.clock() + OS_PRESSURE_BACKGROUND_HOLD_S)
        self.os_level = new

    def on_plan_rejected(self) -> None:
        """The engine could not hold the last plan: release pins, drop the device cache, empty
        the kept lanes where they hold memory of their own (``watermarks``), replan."""
        self.counters["plans_rejected"] += 1
        if self.config.watermarks:
            self._forget_kept()
        self.pool.release_pins()
        self.pool.clear_device(self._pending_pool)

    def on_engine_failed(self) -> None:
        """The engine failed the last plan before it ran or part way through its lane and cache
        work (the worker has failed the running jobs): what lanes and cache slots hold is
        unknown. Every lane without a job is emptied at the next tick (kept lanes too), the
        device cache is dropped (a store of the plan may never have run), an eviction that never
        reached host memory is forgotten, and a job parked by the plan, whose KV never came
        back, is computed again from the start."""
        plan = self.last_plan
        for _lane, job_id in plan.park if plan is not None else []:
            job = self.jobs.get(job_id)
            if job is not None and job.parked is None:
                job.computed = job.cached_tokens = 0
        self._forget_kept()
        for lane, job in enumerate(self.lanes):
            if job is None and lane not in self._release:
                self._release.append(lane)
        self.pool.clear_device(self._pending_pool)
        self.pool.settle({})

    def commit(self, result: TickResult) -> list[Event]:
        now = self.clock()
        self.counters["ticks"] += 1
        plan = self.last_plan
        # counted as the engine made them (a counter never goes down between two reads of it)
        self.counters["parks"] += len(result.parked)
        for job_id, artifact in result.parked.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state is JobState.QUEUED:
                job.parked = artifact
        if plan is not None:
            for _lane, job_id in plan.park:
                if job_id in result.parked:
                    continue
                job = self.jobs.get(job_id)
                if job is not None:
                    job.computed = job.cached_tokens = 0  # the engine kept nothing: recompute from the start
        for seq in result.lost:  # a restore, move, store, import or copy the engine could not make: empty
            if seq >= len(self.lanes):  # a cache slot a prefix was not stored or imported into
                self.pool.lose(seq, plan.pool if plan is not None else PoolOps())
                continue
            job = self.lanes[seq]
            if job is not None:
                job.computed = job.cached_tokens = 0  # recomputed from the start
                if plan is not None and any(r.lane == seq for r in plan.restore):
                    self.counters["resumes"] -= 1  # not restored
            for _src, dst, n in plan.pool.copy if plan is not None else ():
                if dst == seq:  # a prefix copied into it (or imported for it) that did not arrive: no hit
                    self.pool.counters["prefix_hits"] -= 1
                    self.pool.counters["prefix_tokens_reused"] -= n
            self._kept.pop(seq, None)  # a kept KV that did not reach it
        self.pool.settle(result.evicted)
        if plan is not None and plan.prefill_tokens and result.fed:
            self._prefill_ticks += 1
        for lane, n in result.fed.items():
            job = self.lanes[lane]
            if job is not None:
                job.computed += n
                if n:
                    self._last_prefill_tick[lane] = self._prefill_ticks
        for lane, token in result.sampled.items():
            job = self.lanes[lane]
            if job is None or job.state is not JobState.RUNNING:
                continue
            if job.first_token_s is None:
                job.first_token_s = now
            for earlier in result.earlier.get(lane, ()):  # a burst's rounds before its last
                if not self._take_token(job, lane, earlier):
                    break
            if job.state is not JobState.RUNNING:
                continue
            if lane in result.eog:
                self._finish(job, "stop")
                continue
            self._take_token(job, lane, token)
        if plan is not None and plan.feeds and not plan.prefill_tokens and result.elapsed_s > 0 and not result.stopped_early:
            self.round_s = 0.7 * self.round_s + 0.3 * result.elapsed_s / max(1, result.rounds)
        if plan is not None and result.prefill_s > 0 and plan.prefill_tokens:
            fed_prefill = sum(
                result.fed.get(f.lane, 0) for f in plan.feeds if not f.is_decode
            )
            if fed_prefill:
                rate = fed_prefill / result.prefill_s
                self.prefill_tokens_per_s = 0.7 * self.prefill_tokens_per_s + 0.3 * rate
                self._decode_only_until = now + self.config.urgent_decode_share * result.elapsed_s
        return self.drain_events()

    def _take_token(self, job: Job, lane: int, token: int) -> bool:
        """A token sampled for a running job: into its output, an event, and the job finished
        at its length limit. Whether the job runs on."""
        job.output.append(token)
        self._events.append(Event("token", job.job_id, token=token, lane=lane, position=len(job.output)))
        if len(job.output) >= job.max_tokens or job.length >= self.config.lane_ctx:
            self._finish(job, "length")
            return False
        return True

    def drain_events(self) -> list[Event]:
        """Events raised outside ``commit()`` (cancels, stop-string finishes) and not yet taken."""
        events, self._events = self._events, []
        return events

    @property
    def idle(self) -> bool:
        """No job queued or running and no lane waiting to be released."""
        return not self.jobs and not self._release and not self._release_keep

    # -- internals --------------------------------------------------------------------

    def _finish(self, job: Job, reason: str, *, counted: bool = True) -> None:
        if job.lane is not None and reason in KEEP_REASONS:
            self._store_pin_at_end(job)
        self._stored.discard(job.job_id)
        self._aged_ahead.pop(job.job_id, None)
        self._decoded_at.pop(job.job_id, None)
        self._decoded_tick.pop(job.job_id, None)
        job.share_from = None
        job.state = JobState.FINISHED
        job.finish_reason = reason
        job.finished_s = self.clock()
        if job.lane is not None:
            self.lanes[job.lane] = None
            if self._keeps(job, reason):
                self._kept[job.lane] = KeptLane(job.cache_scope, job.tokens(0, job.computed), job.finished_s)
                self._release_keep.append(job.lane)
            else:
                self._release.append(job.lane)
            job.lane = None
        job.parked = None
        self.jobs.pop(job.job_id, None)
        if counted:
            self.counters["finished"] += 1
        self._events.append(Event("finished", job.job_id, reason=reason, job=job))

    def free_lanes(self) -> list[int]:
        return [i for i, job in enumerate(self.lanes) if job is None and i not in self._release and i not in self._release_keep]

    # -- kept lanes: a finished job's KV stays in its lane for a job that shares it ------

    def _keeps(self, job: Job, reason: str) -> bool:
        return (
            self.config.prefix_cache
            and self.config.keep_lanes
            and reason in KEEP_REASONS
            and not job.batch_invariant
            and job.computed > 0
        )

    def _seeds_from_prefix(self, job: Job) -> bool:
        """Whether a new lane for ``job`` may start from a shared prefix: a fresh job (not
        parked, nothing generated yet) that is not batch-invariant, with the cache on."""
        return self.config.prefix_cache and not job.batch_invariant and job.parked is None and not job.output

    def _kept_match(self, job: Job, lane: int, *, taken: bool = False) -> int:
        """Tokens of ``job``'s prompt that ``lane``'s kept KV already holds (0 if another
        scope's, none, or too few to count); at least one prompt token is left to feed.

        A match counts from ``min_prefix_tokens`` up, or when the lane holds the whole prompt
        but the token fed to sample from (a short prompt sent again: a retry, a regenerate, a
        fixed prompt), as llama-server's slots reuse theirs. Fewer shared tokens (a chat
        template's opening, say) do not count when choosing a lane: taking the lane for them
        would empty KV that its own conversation's next turn may still come back for. Once the
        job has the lane anyway (``taken``: no empty lane was left), they count: the lane's KV
        is cut to what the job shares instead of emptied, as llama-server's slots keep the
        longest common prefix whatever its length."""
        kept = self._kept.get(lane)
        if kept is None or kept.scope != job.cache_scope or not self._seeds_from_prefix(job):
            return 0
        whole = len(job.prompt) - 1
        n = min(common_prefix(kept.tokens, job.prompt), whole)
        return n if taken or n >= self.config.min_prefix_tokens or (n and n == whole) else 0

    def _lane_for(self, job: Job, free: list[int]) -> int:
        """The free lane ``job`` takes: the one whose kept KV shares the most of its prompt;
        else an empty one; else the one kept longest ago (its prefix is the least likely to
        come back)."""
        if self._kept:
            matches = {lane: self._kept_match(job, lane) for lane in free}
            best = max(free, key=matches.__getitem__)
            if matches[best]:
                return best
            empty = [lane for lane in free if lane not in self._kept]
            if empty:
                return self._beside_the_others(job, empty)
            return min(free, key=lambda lane: self._kept[lane].kept_s)
        return self._beside_the_others(job, free)

    def _beside_the_others(self, job: Job, lanes: list[int]) -> int:
        """The lowest of ``lanes``, or with ``compact_lanes`` the lowest of those that leave the
        lanes decoding together in the fewest runs (a job bound into a gap is not moved later)."""
        if not self.config.compact_lanes or job.batch_invariant or len(lanes) == 1:
            return lanes[0]
        group = set(self._decoding_together())
        return min(lanes, key=lambda lane: (lane_runs(group | {lane}), lane))

    def _kept_over_watermark(self) -> bool:
        """Kept lanes would bring the pool to its high watermark (engines whose KV grows with
        use; with memory fixed per lane a kept lane costs nothing)."""
        if not self._kept or not self.config.watermarks:
            return False
        return self.pool.used_blocks(self._lane_tokens() + self._kept_tokens()) >= self.pool.share_of_blocks(self.config.pressure_high)

    def _kept_tokens(self) -> list[int]:
        """What each kept lane holds where that is memory of its own (``watermarks``); with
        memory fixed per lane (llama.cpp) a kept lane uses nothing more than an empty one."""
        return [len(k.tokens) for k in self._kept.values()] if self.config.watermarks else []

    def _forget_kept(self) -> None:
        """Empty every kept lane (the engine refused a plan, memory is short, or the engine
        failed): its KV goes. On memory grounds only where a kept lane holds memory of its own
        (``watermarks``: KV that grows with use, MLX); with memory fixed per lane (llama.cpp)
        it frees nothing, so an OS pressure rise or a refused plan keeps the prefixes there."""
        self._release_keep = []
        for lane in sorted(self._kept):
            if lane not in self._release:
                self._release.append(lane)
        self._kept.clear()

    def _class_usage(self) -> dict[QosClass, int]:
        usage = dict.fromkeys(QOS_CLASSES, 0)
        for job in self.lanes:
            if job is not None:
                usage[job.qos] += 1
        return usage

    def _admissible_classes(self) -> set[QosClass]:
        usage = self._class_usage()
        caps = self.config.class_lanes
        allowed = {c for c in QOS_CLASSES if usage[c] < caps.get(c, self.config.max_batch)}
        if self.os_level == "critical" or self.clock() < self._background_hold_until:
            allowed.discard(QosClass.BACKGROUND)  # critical memory pressure: let it ease first
        return allowed

    def _lane_tokens(self) -> list[int]:
        return [j.computed for j in self.lanes if j is not None]

    def _bind(self, plan: TickPlan, job: Job, lane: int, now: float) -> None:
        job.waited_s = self.queues.waited(job, now)
        self.queues.pop(job)
        kept_n = self._kept_match(job, lane, taken=True)
        kept = self._kept.pop(lane, None)
        job.state = JobState.RUNNING
        job.lane = lane
        self.lanes[lane] = job
        self._last_prefill_tick[lane] = self._prefill_ticks + 1  # as if fed in the tick being planned
        keep_tokens = 0  # of the lane's kept KV, what stays
        parked = job.parked
        if parked is not None:
            plan.restore.append(LaneRestore(lane, job.job_id, parked))
            job.parked = None
            self.counters["resumes"] += 1
            self._events.append(Event("resumed", job.job_id, lane=lane))
        else:
            job.computed = 0  # nothing of it is in this lane's cache
            if job.output:
                self._events.append(Event("resumed", job.job_id, lane=lane))
            else:
                keep_tokens = self._seed_from_prefix(plan, job, now, lane, kept_n)
        if kept is not None:  # the lane's KV is not empty: keep what the job shares, no more
            plan.trim.append((lane, keep_tokens))
        plan.bind.append(LaneBind(lane, job.job_id, job.sampling, job.resumed + job.output, parked))
        job.last_admitted_s = now
        job.last_admitted_n = next(self._admissions)
        if job.admitted_s is None:
            job.admitted_s = now
            job.deadline_s = None  # a start deadline: a started job never misses it
            job.serial_score = round(self.queues.score(job, now), 3)
            self.counters["admitted"] += 1
            if not job.request_of:  # a request is dispatched once (the seed's requests), not per choice
                self.counters[f"dispatched_{band_of(job.priority)}"] += 1
            self._events.append(Event("admitted", job.job_id, lane=lane, job=job))

    def _seed_from_prefix(
        self,
        plan: TickPlan,
        job: Job,
        now: float,
        kept_lane: int | None,
        kept_n: int,
        *,
        handed_over: CachedPrefix | None = None,
    ) -> int:
        """Start ``job``'s lane from the longest shared prompt prefix: what a kept lane holds
        (``kept_n`` tokens of ``kept_lane``: the job's own lane, which keeps them where they are,
        or another one of its scope, copied from), a cached one (imported from host memory if it
        was evicted there; ``handed_over``, a preempted leader's prefix stored in this plan, is
        one too), or one a running lane has prefilled or is prefilling (then this lane waits for
        it rather than prefilling the same tokens; one whose prefix a copy brings in this plan is
        copied from in it too, after that copy: ``_filled_in``). Returns how many of the lane's
        own kept tokens stay."""
        if not self.config.prefix_cache or job.batch_invariant:
            return 0
        assert job.lane is not None
        entry, n = self.pool.best_match(job.prompt, job.cache_scope)
        if handed_over is not None and handed_over.slot is not None and handed_over.scope == job.cache_scope:
            # stored from its preempted leader's lane in this plan: pending, so no best match yet
            handed = min(common_prefix(handed_over.tokens, job.prompt), len(job.prompt) - 1)
            if handed >= self.config.min_prefix_tokens and handed > n:
                entry, n = handed_over, handed
        leader, shared = self._best_leader(job)
        if kept_n and kept_n >= n and kept_n >= shared:
            assert kept_lane is not None
            if kept_lane != job.lane:
                self._copy_from_lane(plan, kept_lane, job, kept_n, now, store=False)  # the kept lane holds it
                return 0
            job.computed = job.cached_tokens = kept_n
            self.pool.counters["prefix_hits"] += 1
            self.pool.counters["prefix_tokens_reused"] += kept_n
            return kept_n
        if entry is not None and n >= shared and self.pool.use(plan.pool, entry, job.lane, n, now):
            job.computed = job.cached_tokens = n
            return 0
        if leader is None:
            return 0
        assert leader.lane is not None
        if leader.computed >= shared:
            self._copy_from_lane(plan, leader.lane, job, shared, now)
        else:
            job.share_from, job.share_tokens = leader.job_id, shared
        return 0

    def _best_leader(self, job: Job) -> tuple[Job | None, int]:
        best: Job | None = None
        best_len = 0
        for other in self.lanes:
            if other is None or other is job or other.share_from is not None or other.batch_invariant:
                continue
            if other.cache_scope != job.cache_scope:
                continue
            n = min(common_prefix(other.prompt, job.prompt), len(job.prompt) - 1)
            if n > best_len:
                best, best_len = other, n
        if best_len < self.config.min_prefix_tokens:
            return None, 0
        return best, best_len

    def _copy_from_lane(self, plan: TickPlan, src: int, job: Job, n: int, now: float, *, store: bool = True) -> None:
        """Seed ``job``'s lane with the first ``n`` tokens of lane ``src`` (a leader's, or a kept
        lane of ``job``'s scope), which are ``job``'s prompt's; they go to a cache slot too
        (unless not ``store``)."""
        assert job.lane is not None
        if store and not _filled_in(plan, src):  # else its KV is not in the lane yet when stores run
            self.pool.store(plan.pool, src, job.prompt[:n], now, scope=job.cache_scope)
        plan.pool.copy.append((src, job.lane, n))
        self.pool.counters["prefix_hits"] += 1
        self.pool.counters["prefix_tokens_reused"] += n
        job.computed = job.cached_tokens = n
        job.share_from, job.share_tokens = None, 0

    def _share_prefixes(self, plan: TickPlan, now: float) -> None:
        """Lanes waiting for a leader's prefix: copy it once ready; stop waiting if it left (a
        leader that ended in the tick its prefill completed, at its first token, left the
        prefix in its kept lane: copied from there). The waiters of a leader that left before
        its prefix was done (cancelled, preempted) are seeded again (``_rejoin``), the one
        sharing the most with it first: it becomes their leader, the others wait for it."""
        orphans: list[Job] = []
        for job in self.lanes:
            if job is None or job.share_from is None:
                continue
            leader = self.jobs.get(job.share_from)
            if leader is None or leader.state is not JobState.RUNNING or leader.lane is None:
                self._copy_from_kept(plan, job, now)
                if job.share_from is not None:  # no kept lane holds all it waited for
                    orphans.append(job)
                continue
            if leader.computed >= job.share_tokens and job.computed == 0:
                self._copy_from_lane(plan, leader.lane, job, job.share_tokens, now)
        for job in sorted(orphans, key=lambda j: -j.share_tokens):  # stable: lane order among equals
            assert job.share_from is not None
            self._rejoin(plan, job, now, self._handed_over.get(job.share_from))
        self._handed_over.clear()

    def _hand_over(self, plan: TickPlan, leader: Job, now: float) -> None:
        """``leader`` is preempted while lanes wait for its prompt's prefix: what it has of that
        prefix is stored in a cache slot first (a tick's stores run before its parks and
        releases), and the waiting lanes are seeded from there in this plan (``_rejoin``)
        instead of prefilling it again."""
        if not self.config.prefix_cache or leader.lane is None:
            return
        wanted = max((j.share_tokens for j in self.lanes if j is not None and j.share_from == leader.job_id), default=0)
        n = min(leader.computed, wanted)
        if n < self.config.min_prefix_tokens:
            return
        entry = self.pool.store(plan.pool, leader.lane, leader.prompt[:n], now, scope=leader.cache_scope)
        if entry is not None:
            self._handed_over[leader.job_id] = entry

    def _rejoin(self, plan: TickPlan, job: Job, now: float, handed_over: CachedPrefix | None = None) -> None:
        """Seed ``job``, whose leader left before its prefix was done, as a new lane is seeded
        (``_seed_from_prefix``): from the longest of what a kept lane of its scope holds (the
        leader's own lane keeps what it prefilled), a cached prefix, or a running lane's prompt,
        waiting for that lane if it has not prefilled it yet. Another waiter of the same leader
        already seeded again is such a lane: one of them prefills the rest, the others copy it."""
        job.share_from, job.share_tokens = None, 0
        if job.computed != 0 or job.lane is None or not self.config.prefix_cache:
            return
        whole = len(job.prompt) - 1
        kept_lane, kept_n = None, 0
        for lane, kept in self._kept.items():
            n = min(common_prefix(kept.tokens, job.prompt), whole)
            if kept.scope == job.cache_scope and n > kept_n and not _bound_in(plan, lane):
                kept_lane, kept_n = lane, n
        if kept_n < self.config.min_prefix_tokens:
            kept_lane, kept_n = None, 0
        self._seed_from_prefix(plan, job, now, kept_lane, kept_n, handed_over=handed_over)

    def _copy_from_kept(self, plan: TickPlan, job: Job, now: float) -> None:
        """Seed ``job``, whose leader left, from a kept lane of its scope holding the prefix it
        waited for, one this plan does not bind (a bound one is trimmed before copies run)."""
        n = job.share_tokens
        if n <= 0 or job.computed != 0 or job.lane is None:
            return
        for lane, kept in self._kept.items():
            if kept.scope == job.cache_scope and len(kept.tokens) >= n and kept.tokens[:n] == job.prompt[:n] and not _bound_in(plan, lane):
                self._copy_from_lane(plan, lane, job, n, now)
                return

    def _store_pinned(self, plan: TickPlan, now: float) -> None:
        """A request that asked for its prompt to be pinned is cached once its prefill is done."""
        if not self.config.prefix_cache:
            return
        for job in self.lanes:
            if job is None or not job.pin_prefix or job.batch_invariant or job.job_id in self._stored or job.prefilling:
                continue  # a batch-invariant lane neither takes nor gives prefix-cache copies
            assert job.lane is not None
            if _bound_in(plan, job.lane):  # restored this tick: stores run before restores
                continue  # stored at the next tick
            stored = self.pool.store(plan.pool, job.lane, job.prompt, now, pinned=True, scope=job.cache_scope)
            if stored is not None or len(job.prompt) < self.pool.config.min_prefix_tokens:
                self._stored.add(job.job_id)  # else every slot is filled or copied from: next tick

    def _store_pin_at_end(self, job: Job) -> None:
        """A pinned prompt whose job ends before a tick stored it (at its first token: max_tokens
        1, an end of generation) is stored at the next tick from the lane the job leaves: that
        tick's stores run before its lanes are released, trimmed or refilled."""
        if not self.config.prefix_cache or not job.pin_prefix or job.batch_invariant or job.job_id in self._stored or job.prefilling:
            return
        assert job.lane is not None
        self.pool.store(self._pending_pool, job.lane, job.prompt, self.clock(), pinned=True, scope=job.cache_scope)

    def _decoding_together(self) -> list[int]:
        """Lanes whose jobs run in one decode round: all but batch-invariant ones (each ticks
        alone) and ones waiting for a leader's prefix (nothing to feed), in lane order."""
        return [lane for lane, job in enumerate(self.lanes) if job is not None and not job.batch_invariant and job.share_from is None]

    def _compact_lanes(self, plan: TickPlan) -> None:
        """Move running jobs into free lanes so that the lanes decoding together are one run.

        On an engine that passes over the weights once per run of consecutive busy lanes in a
        decode round (``compact_lanes``), lanes 0-2 and 4-7 busy cost two passes a round where
        0-6 cost one (docs/benchmarks.md). A move copies the job's KV and hands its sampler over
        as it is, so its tokens are the same as if it had stayed; a kept lane's KV in the target
        lane trades places with it. Of the windows of as many lanes as there are jobs decoding
        together, the one needing the fewest moves (the lowest among equals) is filled, and only
        when every move it needs is worth its copy: the job has at least ``compact_min_tokens``
        left to generate per 512 tokens of KV the move copies (its own, and the kept lane's it
        trades places with; a move of 517 tokens took 8 ms here, about one pass), and it is not
        one this plan binds, parks, copies or stores from. A batch-invariant job or one waiting
        for a leader's prefix is never moved, and a window holding one is not taken."""
        if not self.config.compact_lanes:
            return
        group = self._decoding_together()
        k = len(group)
        if k == 0 or group[-1] - group[0] + 1 == k:
            return  # one run (or none)
        touched = {lane for lane, _ in plan.park} | {lane for lane, _ in plan.trim} | {b.lane for b in plan.bind}
        touched |= {r.lane for r in plan.restore}
        touched |= {lane for lane, _, _ in plan.pool.store} | {lane for pair in plan.pool.copy for lane in pair[:2]}
        free = set(self.free_lanes()) - touched
        in_group = set(group)
        best: list[tuple[int, int]] | None = None
        for start in range(len(self.lanes) - k + 1):
            window = range(start, start + k)
            holes = [lane for lane in window if lane not in in_group]
            if best is not None and len(holes) >= len(best):
                continue
            if not all(lane in free for lane in holes):
                continue  # a lane another job holds, or one this plan works on
            outside = [lane for lane in group if lane not in window]
            moves = list(zip(outside, holes, strict=True))
            if all(self._worth_moving(src, dst, touched) for src, dst in moves):
                best = moves
        for src, dst in best or []:
            job = self.lanes[src]
            assert job is not None
            self._move(plan, job, src, dst)

    def _worth_moving(self, src: int, dst: int, touched: set[int]) -> bool:
        job = self.lanes[src]
        assert job is not None
        if src in touched or job.computed == 0:
            return False
        kept = self._kept.get(dst)
        copied = job.computed + (len(kept.tokens) if kept is not None else 0)
        left = min(job.max_tokens - len(job.output), self.config.lane_ctx - job.length)
        return left >= self.config.compact_min_tokens * max(1.0, copied / 512)

    def _move(self, plan: TickPlan, job: Job, src: int, dst: int) -> None:
        """``job`` goes from lane ``src`` to the free lane ``dst``; a kept KV there goes to ``src``."""
        kept = self._kept.pop(dst, None)
        plan.swap.append(LaneSwap(src, dst, kept is not None))
        if kept is not None:
            self._kept[src] = kept
        self.lanes[dst], self.lanes[src] = job, None
        job.lane = dst
        prefill_src = self._last_prefill_tick.pop(src, None)
        prefill_dst = self._last_prefill_tick.pop(dst, None)
        if prefill_src is not None:
            self._last_prefill_tick[dst] = prefill_src
        if prefill_dst is not None:
            self._last_prefill_tick[src] = prefill_dst
        self.counters["lane_moves"] += 1
        self._events.append(Event("moved", job.job_id, lane=dst))

    def _expire_deadlines(self, now: float) -> None:
        for job in [j for j in self.queues if j.deadline_s is not None and now > j.deadline_s]:
            self.queues.remove(job)
            self.counters["deadline_expired"] += 1
            self._finish(job, "deadline")

    def _apply_os_pressure(self, plan: TickPlan, now: float) -> None:
        """Warning: drop host-held prefixes, suspend moves to host, one eviction round.
        Critical: also preempt every decoding background lane (no parking: memory is short)."""
        level, self._os_pressure = self._os_pressure, None
        if level is None:
            return
        self.counters[f"os_pressure_{level}"] += 1
        self.pool.drop_host()
        self.pool.host_suspended_until = now + OS_PRESSURE_HOST_COOLDOWN_S
        self.pool.evict_round(plan.pool, self._lane_tokens(), now, at_least_one=True)
        if level == "critical":
            self._background_hold_until = now + OS_PRESSURE_BACKGROUND_HOLD_S
            for job in [j for j in self.lanes if j is not None]:
                if job.qos is QosClass.BACKGROUND and not job.prefilling and not job.batch_invariant:
                    self._preempt_job(plan, job, park=False)

    def _invariant_wait_rule(self) -> Callable[[Job], bool] | None:
        """While a batch-invariant job waits, nothing at or below its class is admitted, by a
        free lane or by preemption: the filter of jobs that may still take a lane."""
        waiting_bi = [j for j in self.queues if j.batch_invariant]
        if not waiting_bi:
            return None
        floor = min(j.qos for j in waiting_bi)
        # the waiting ones themselves (the best class among them) still may; one below it may not
        return lambda j: j.qos < floor or (j.batch_invariant and j.qos == floor)

    def _admit(self, plan: TickPlan, now: float) -> None:
        since, held = self._held
        for waiting in held:
            if waiting.state is JobState.QUEUED:
                waiting.held_s += max(0.0, now - since)
        self._held = (now, [])
        while free := self.free_lanes():
            allowed = self._admissible_classes()
            keep = self._invariant_wait_rule()
            job = self.queues.best(allowed, now, keep)
            if job is None:
                # a lane is free and these wait all the same: their class may not take it
                self._held = (now, [j for j in self.queues if j.qos not in allowed])
                return
            self.queues.note_pick(job, allowed, now, keep)
            beaten = {
                j.job_id
                for j in self.queues
                if j.qos < job.qos and j.qos <= QosClass.COMPLETION and j.qos in allowed and (keep is None or keep(j))
            }
            if beaten:
                self._aged_ahead[job.job_id] = (self.queues.order(job, now), beaten)
            self._bind(plan, job, self._lane_for(job, free), now)

    def _protected_from(self, victim: Job, urgent: Job, now: float) -> bool:
        """Whether ``victim`` keeps its lane against ``urgent``: aging admitted it ahead of
        ``urgent`` into a free lane, and the order it was admitted in still puts it first.
        Preempting it at once would undo aging (the wait its class aging counts survives a
        preemption, so it would win the next free lane back, then lose it again); ``urgent``'s
        own wait ends the protection once it would have been admitted first."""
        aged = self._aged_ahead.get(victim.job_id)
        return aged is not None and urgent.job_id in aged[1] and aged[0] < self.queues.order(urgent, now)

    def _preempt_job(self, plan: TickPlan, victim: Job, *, park: bool) -> int:
        lane = victim.lane
        assert lane is not None
        self.lanes[lane] = None
        victim.lane = None
        victim.state = JobState.QUEUED
        victim.preemptions += 1
        victim.enqueued_tick = self.tick
        victim.enqueued_s = self.clock()
        victim.share_from, victim.share_tokens = None, 0
        self._aged_ahead.pop(victim.job_id, None)
        self.queues.push_head(victim)
        self.counters["preemptions"] += 1
        if park and victim.computed > 0:
            plan.park.append((lane, victim.job_id))
        else:
            plan.release.append(lane)
            victim.computed = victim.cached_tokens = 0  # recomputed: none of its prompt is reused
        self._events.append(Event("preempted", victim.job_id, lane=lane))
        return lane

    def _preempt(self, plan: TickPlan) -> None:
        """An interactive or completion job queued with every lane busy takes the lane of the
        lowest-class running job below it: decoding lanes before prefilling ones, among equals
        the most recently admitted (a resume counts: the lane that has done the least since).

        Urgent jobs go in the order admission would take them (class, then score), each only
        while its class is under its lane cap and none is held back by a waiting batch-invariant
        job. A job's own class decides, never its aged class: aging orders free lanes only, and
        a job it admitted ahead of an urgent one keeps its lane against it (``_protected_from``)."""
        if not self.config.preemption:
            return
        now = self.clock()
        while not self.free_lanes():
            urgent_classes = self._admissible_classes() & {QosClass.INTERACTIVE, QosClass.COMPLETION}
            keep = self._invariant_wait_rule()
            urgent = self.queues.best_by_own_class(urgent_classes, now, keep)
            if urgent is None:
                return
            # a lane this plan copies a prefix from keeps its KV until the copy has run (the
            # tick parks and releases lanes before it copies: run_tick's order)
            sources = {src for src, _, _ in plan.pool.copy}
            victims = [
                j
                for j in self.lanes
                if j is not None
                and j.qos > urgent.qos
                and not j.batch_invariant
                and j.lane not in sources
                and not any(b.job_id == j.job_id for b in plan.bind)  # admitted this tick
                and not self._protected_from(j, urgent, now)
            ]
            if not victims:
                return  # the best urgent job finds none: a worse one does not go before it
            victim = max(victims, key=lambda j: (j.qos, not j.prefilling, j.last_admitted_s or 0.0, j.last_admitted_n))
            self.queues.note_pick(urgent, urgent_classes, now, keep, by_own_class=True)
            self._hand_over(plan, victim, now)
            lane = self._preempt_job(plan, victim, park=self.config.park)
            self._bind(plan, urgent, lane, now)

    def _prefill_cap_tokens(self, newcomer_possible: bool, decoding: bool, n_decode: int) -> tuple[int, int]:
        """(most prompt tokens this tick, tokens per engine call), from the measured rate.

        The step: with a pinned --prefill-budget on an engine whose steps abort (an urgent
        arrival or a cancel stops the step in flight), a full chunk (512 tokens, smaller only if
        512 take more than the 8 s cap); otherwise the largest that fits in 0.5 s, so an urgent
        arrival never waits long for the step in flight. A tick carries one decode round, so
        while a lane decodes the tick is kept near the engine's busy-tick target, or
        --tick-target-ms where that is lower, as decode rounds are (whole steps, at least one):
        its stream gets a token per step instead of one per 8 s of other lanes' prefill. The
        decode tokens ride in the first step, so a decoding tick's prompt is the steps less the
        decode tokens: whole engine calls, never a small call at the end."""
        rate = max(1.0, self.prefill_tokens_per_s)
        budget = self.config.prefill_budget
        big = budget != 0 and self.config.abortable_steps
        step_s = self.config.prefill_cap_s if big else self.config.newcomer_prefill_cap_s
        step = next((s for s in PREFILL_STEPS if s <= rate * step_s), 32)
        cap_s = self.config.newcomer_prefill_cap_s if newcomer_possible else self.config.prefill_cap_s
        if decoding:  # the busy-tick target, never above --tick-target-ms (as _tick_target_s)
            cap_s = min(cap_s, self.config.decoding_prefill_cap_s, self.config.tick_target_ms / 1000.0)
        if budget == 0:
            budget = int(min(4096, max(256, rate * self.config.tick_target_ms / 1000)))
        cap = max(step, int(rate * cap_s) // step * step)
        if n_decode:
            cap = max(step // 2, cap - n_decode)
        return min(budget, cap), step

    def _tick_group(self, plan: TickPlan) -> list[Job]:
        """The lanes that run this tick. A batch-invariant lane ticks alone: with any running,
        ticks go round-robin over each batch-invariant lane and the group of all the others.
        Lanes waiting for a leader's prefix have nothing to feed."""
        running = [j for j in self.lanes if j is not None and j.share_from is None]
        invariant = [j for j in running if j.batch_invariant]
        if not invariant:
            return running
        others = [j for j in running if not j.batch_invariant]
        groups = [[j] for j in sorted(invariant, key=lambda j: j.lane or 0)] + ([others] if others else [])
        group = groups[self._bi_turn % len(groups)]
        self._bi_turn += 1
        plan.alone = group[0].batch_invariant
        return group

    # -- tick sizing: the one place that decides how long a tick is and who decodes in it --

    def _tick_target_s(self) -> float | None:
        """The seed's target for this tick: the short one while a lane is free or one is
        finishing (its last tokens fit in a busy tick), else the busy one, never above
        --tick-target-ms. None: the engine declared no targets, a tick is one round."""
        targets = self.config.tick_targets_s
        if targets is None:
            return None
        free_s, busy_s = targets
        busy_s = min(busy_s, self.config.tick_target_ms / 1000.0)
        free_s = min(free_s, busy_s)  # the short target is never the longer one (--tick-target-ms 20)
        if self.free_lanes():
            return free_s
        rounds = busy_s / max(self.round_s, 1e-6)
        if any(j is not None and j.max_tokens - len(j.output) <= rounds for j in self.lanes):
            return free_s
        return busy_s

    def _tick_continues(self, now: float) -> bool:
        """Whether the next engine call is another decode round of the tick in flight.

        A tick runs rounds until the next one would pass its target. It ends sooner, so the
        next step admits, preempts and acts on pressure, when: a lane was released (a job
        finished or was cancelled), a lane prefills (its chunk is already sized to the target,
        below), an interactive or completion job is queued, the tick's decode budget is spent,
        cache work or OS pressure is pending, or a batch-invariant lane runs (it ticks alone)."""
        target = self._tick_target_s()
        if target is None or self.tick == 0:
            return False
        if self._release or self._release_keep or self._pending_pool or self._os_pressure is not None:
            return False
        running = [j for j in self.lanes if j is not None]
        if not running or any(j.prefilling or j.share_from is not None or j.batch_invariant for j in running):
            return False
        if any(j.qos <= QosClass.COMPLETION for j in self.queues):
            return False
        budget = self.config.tick_decode_budget
        if budget and self._tick_decoded >= budget:
            return False
        return (now - self._tick_started_s) + self.round_s <= target

    def _decode_grant(self, decoding: list[Job]) -> list[Job]:
        """The decoding lanes that get a token this round. ``--tick-decode-budget 0``: all of
        them (the grant scales with the rounds of the tick). N > 0: at most N tokens in the
        tick, given in rotation: a lane that got none for --starvation-ticks ticks first, then
        by class, then the lane that decoded least recently, so equal lanes share equally.
        Starving lanes go among themselves by the least recent grant, not by class: better
        lanes that starve in turn (more of them than the budget covers in --starvation-ticks
        ticks) would otherwise keep a starving lane of a worse class from its token for good."""
        budget = self.config.tick_decode_budget
        if not budget:
            return decoding
        left = budget - self._tick_decoded
        if left <= 0:
            return []
        for job in decoding:  # a lane waiting for its first grant is counted from now, not never
            self._decoded_tick.setdefault(job.job_id, self.tick)

        def order(job: Job) -> tuple[int, int, int, int]:
            assert job.lane is not None
            idle = self.tick - self._decoded_tick[job.job_id]
            starving = idle >= self.config.starvation_ticks > 0
            if starving:
                return (0, 0, self._decoded_at.get(job.job_id, -1), job.lane)
            return (1, int(job.qos), self._decoded_at.get(job.job_id, -1), job.lane)

        return sorted(decoding, key=order)[:left]

    def _plan_feeds(self, plan: TickPlan) -> None:
        running = self._tick_group(plan)
        decoding = [j for j in running if not j.prefilling]
        prefilling = [j for j in running if j.prefilling]
        newcomer_possible = bool(self.free_lanes()) or len(self.queues) > 0
        granted = self._decode_grant(decoding)
        budget, plan.step_tokens = self._prefill_cap_tokens(
            newcomer_possible, bool(decoding), sum(j.length - j.computed for j in granted)
        )
        urgent = [j for j in decoding if j.qos <= QosClass.COMPLETION]
        if prefilling and urgent and self.clock() < self._decode_only_until:
            # an urgent answer streams: decode rounds alone for a share of the last step, of the
            # urgent lanes alone (the others get their token in each prefill step, as without it:
            # theirs here cost a round more and bring the last agent's end no nearer). The grant
            # is made among them: a lane left out here that starves for it comes first in the
            # next prefill step, not here, where it ended the answer's rounds early
            budget = 0
            granted = self._decode_grant(urgent)
        self.prefill_cap = (budget, plan.step_tokens)

        for job in granted:
            assert job.lane is not None
            rest = job.tokens(job.computed)
            plan.feeds.append(LaneFeed(job.lane, job.job_id, job.computed, rest, True, decode=len(rest) == 1))
            self._decoded_at[job.job_id] = next(self._grants)  # grant order: a strict rotation
            self._decoded_tick[job.job_id] = self.tick
        self._tick_decoded += sum(1 for f in plan.feeds if f.sample)

        inherited = self._inherited_classes()

        def prefill_class(job: Job) -> int:
            """The job's class, or the class it prefills the prefix a more urgent lane waits for at."""
            cls, upto = inherited.get(job.job_id, (int(job.qos), 0))
            return cls if job.computed < upto else int(job.qos)

        def prefill_order(job: Job) -> tuple[int, int, int]:
            assert job.lane is not None
            planned = self._prefill_ticks + 1  # the tick being planned, if it prefills
            idle = planned - self._last_prefill_tick.get(job.lane, planned)
            starving = idle >= self.config.starvation_ticks > 0
            return (0 if starving else 1, prefill_class(job), job.remaining_prompt)

        hold_below: int | None = None
        for job in sorted(prefilling, key=prefill_order):
            if budget <= 0:
                break
            if hold_below is not None and prefill_class(job) > hold_below:
                continue
            assert job.lane is not None
            # sequence, not prompt: a job recomputed after preemption without parking re-feeds
            # its output too, and samples only after the last of it.
            remaining = job.length - job.computed
            take = min(budget, remaining)
            cls = prefill_class(job)
            done = finishes = take == remaining
            if cls < job.qos:  # only the prefix a more urgent lane waits for, which this feed may end
                take = min(take, inherited[job.job_id][1] - job.computed)
                finishes = take == remaining
                done = job.computed + take == inherited[job.job_id][1]
            budget -= take
            tokens = job.tokens(job.computed, job.computed + take)
            plan.feeds.append(LaneFeed(job.lane, job.job_id, job.computed, tokens, finishes))
            if done and cls <= QosClass.COMPLETION and hold_below is None:
                hold_below = cls  # the urgent prompt (or the prefix it waits for) ends: this step is its
        if hold_below is not None:
            plan.feeds = [
                f
                for f in plan.feeds
                if f.is_decode or prefill_class(self.jobs[f.job_id]) <= hold_below
            ]

    def _inherited_classes(self) -> dict[str, tuple[int, int]]:
        """Leader job id -> (the most urgent class among the lanes waiting for its prefix, the
        longest prefix they wait for). A chat waiting for a background lane's system prompt
        would otherwise wait for background's turn to prefill it: the leader prefills that much
        at the waiter's class (priority inheritance), and the rest of its prompt at its own."""
        inherited: dict[str, tuple[int, int]] = {}
        for waiter in self.lanes:
            if waiter is None or waiter.share_from is None:
                continue
            cls, upto = inherited.get(waiter.share_from, (int(waiter.qos), 0))
            inherited[waiter.share_from] = (min(cls, int(waiter.qos)), max(upto, waiter.share_tokens))
        return inherited

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
                    "max_tokens": job.max_tokens,  # its limit (the context's room where none was asked)
                    "cached_tokens": job.cached_tokens,
                    "batch_invariant": job.batch_invariant,
                    "waiting_for_prefix": job.share_from is not None,
                    "preemptions": job.preemptions,
                }
            )
        return {
            "tick": self.tick,
            "lanes": lanes,
            "lanes_active": sum(1 for j in self.lanes if j is not None),
            "queue_depth": {c.label: self.queues.depth(c) for c in QOS_CLASSES},
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            "parked": [
                {"job_id": j.job_id, "class": j.qos.label, "tokens": j.computed}
                for j in self.queues
                if j.parked is not None
            ],
            "pool": {
                "blocks_used": self.pool.used_blocks(self._lane_tokens() + self._kept_tokens()),
                "blocks_total": self.pool.total_blocks,
                "cached_blocks": self.pool.cached_blocks(),
                "pinned_blocks": self.pool.pinned_blocks(),
                "device_prefixes": len(self.pool.device_entries()),
                "host_prefixes": len(self.pool.host_entries()),
                "host_bytes": self.pool.host_bytes(),
            },
            "class_lanes": {q.label: n for q, n in self.config.class_lanes.items()},
            "counters": {
                **self.counters,
                **self.pool.counters,
                "reorders_aging": self.queues.reorders["aging"],
                "reorders_swap_affinity": self.queues.reorders["swap_affinity"],
            },
        }


def lane_runs(lanes: Collection[int]) -> int:
    """Runs of consecutive lane numbers: the passes over the weights a decode round over these
    lanes costs on an engine with a KV stream per sequence."""
    busy = set(lanes)
    return sum(1 for lane in busy if lane - 1 not in busy)


def _bound_in(plan: TickPlan, lane: int) -> bool:
    """Whether ``lane`` gets its job in this plan. Its KV is then restored, trimmed or copied in
    during the tick, after the pool's stores have run (engines/base.py: run_tick's order), so a
    store from it would copy what the lane held before."""
    return any(b.lane == lane for b in plan.bind)


def _filled_in(plan: TickPlan, lane: int) -> bool:
    """Whether ``lane``'s KV arrives during this tick, after the pool's stores have run: the lane
    is bound in this plan (``_bound_in``), or a prefix is copied into it (a lane seeded again
    after its leader left); a store from it would copy what the lane held before. A copy from
    it runs after the copy into it (copies run in plan order)."""
    return _bound_in(plan, lane) or any(dst == lane for _, dst, _ in plan.pool.copy)
