"""Plain data passed between the scheduler core, the engine and the worker.

A tick is: the scheduler's ``step()`` returns a :class:`TickPlan`; the engine executes it and
returns a :class:`TickResult`; the scheduler's ``commit()`` turns that into :class:`Event`s.

Prefill and decode are one operation here: a lane's sequence is ``prompt + output`` and the
engine is asked to *feed* the part of it that is not yet in the KV cache (``job.computed`` onward).
During prefill that is a chunk of the prompt; while decoding it is the one token sampled last
tick. The engine samples after a feed only when the feed reaches the end of the sequence.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .kv_pool import PoolOps
from .qos import DEFAULT_CLASS, QosClass

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's seed that means "draw a random one"


def seed32(seed: int | None) -> int | None:
    """A request's seed as both engines use it: its low 32 bits (llama.cpp's ``uint32_t``), or
    None for a fresh random stream: no seed, or one whose low 32 bits are LLAMA_DEFAULT_SEED
    (llama-server's ``-1``)."""
    if seed is None or seed & 0xFFFFFFFF == LLAMA_DEFAULT_SEED:
        return None
    return seed & 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """Per-lane sampling. ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    typical_p: float = 1.0
    ignore_eos: bool = False  # end-of-generation tokens are banned: run to max_tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); -100 bans
    grammar: str | None = None  # GBNF the output must match (root rule ``root``)
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Job:
    """One generation. The fields above the line are the request; below, the scheduler's state."""

    job_id: str
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    qos: QosClass = DEFAULT_CLASS
    priority: int = 0
    batch_invariant: bool = False
    # -- scheduler state --------------------------------------------------------------
    state: JobState = JobState.QUEUED
    lane: int | None = None
    computed: int = 0  # tokens of prompt + output already in the lane's KV cache
    output: list[int] = field(default_factory=list)
    arrival_s: float = 0.0  # the request's arrival (before its preparation; with a router, before its wait there)
    enqueued_tick: int = 0
    enqueued_s: float = 0.0  # when it last joined a queue (arrival, or preemption)
    waited_s: float = 0.0  # time queued before it last joined a queue: class aging counts it too
    # time it waited with a lane free that its class could not take (its class-lane cap reached,
    # or background held under critical memory pressure): the part of its queue wait not spent
    # waiting for a lane
    held_s: float = 0.0
    admitted_s: float | None = None  # its first admission
    last_admitted_s: float | None = None  # its latest admission (a resume too): preemption's tie-break
    last_admitted_n: int = 0  # the order of that admission among all (one clock time admits several)
    first_token_s: float | None = None
    finished_s: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    parked: Any = None  # engine artifact holding the KV while preempted
    seq: int = 0  # arrival order, for FIFO inside a class and priority
    deadline_s: float | None = None  # finish with "deadline" if not admitted by then (clock time)
    pin_prefix: bool = False  # keep this prompt in the prefix cache, pinned
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache instead of prefilled
    share_from: str | None = None  # job id of a running lane whose prompt prefix this one waits for
    share_tokens: int = 0
    serial_score: float | None = None  # the dispatch score it won its lane with
    cache_scope: str = ""  # prefix-cache partition: only jobs of the same scope share prefixes
    request_of: str = ""  # a later job of one client request (n > 1): its first job's id; "" for a first or only one
    # a job resumed after its worker was lost: the text its client already got (at the end of the
    # prompt here), as tokens the sampler (grammar, penalties) replays as generated before output
    resumed: list[int] = field(default_factory=list)

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.output

    @property
    def length(self) -> int:
        """``len(sequence)``, without building it (an agent's prompt is thousands of tokens, and
        the scheduler asks a lane's length several times a decode round)."""
        return len(self.prompt) + len(self.output)

    def tokens(self, start: int, end: int | None = None) -> list[int]:
        """``sequence[start:end]`` (``start``, ``end`` from 0 to ``length``), without building
        the whole sequence: a decode round feeds one token of it."""
        n = len(self.prompt)
        if end is None:
            end = n + len(self.output)
        if start >= n:
            return self.output[start - n : end - n]
        if end <= n:
            return self.prompt[start:end]
        return self.prompt[start:] + self.output[: end - n]

    @property
    def remaining_prompt(self) -> int:
        """Tokens still to feed before the job decodes: its prompt's, and while it recomputes
        after a preemption without parking, the output it feeds again."""
        return max(0, len(self.prompt) - self.computed, self.length - 1 - self.computed)

    @property
    def prefilling(self) -> bool:
        """Its prompt is not all in the KV cache, or (recomputed after a preemption without
        parking) more than the last sampled token of its output is not: that is prefill work,
        under the prefill budget, not a decode token. A decoding lane lacks only that token."""
        return self.remaining_prompt > 0


@dataclass
class LaneFeed:
    """Tokens to append to one lane's sequence at ``start_pos``; sample after them if ``sample``."""

    lane: int
    job_id: str
    start_pos: int
    tokens: list[int]
    sample: bool
    decode: bool = False  # the one token of a decode round, not a prompt (or recompute) chunk

    @property
    def is_decode(self) -> bool:
        return self.decode


@dataclass
class LaneBind:
    """Give a lane fresh sampler state for a job; ``history`` are tokens already generated.
    ``parked`` is the job's park artifact when this tick restores it into the lane: the engine
    reads there how far the job's random stream had gone (a sampler may draw more than once for
    a token), so a seeded reply goes on as if it had never been parked."""

    lane: int
    job_id: str
    sampling: SamplingParams
    history: list[int] = field(default_factory=list)
    parked: Any = None


class LaneSwap(NamedTuple):
    """Lanes ``a`` and ``b`` trade their KV and their samplers (lane compaction: the running job
    in ``a`` moves into the free lane ``b``; engines/base.py's run_tick). ``b_kept``: ``b`` holds
    a kept lane's KV, which goes to ``a``; otherwise ``b`` is empty and ``a`` is left empty."""

    a: int
    b: int
    b_kept: bool


@dataclass
class LaneRestore:
    lane: int
    job_id: str
    artifact: Any


@dataclass
class TickPlan:
    """What the engine does this tick, in this order: pool evict/drop/store, release, keep,
    park, trim, swap, restore, pool imports/copy, bind, feed."""

    tick: int
    pool: PoolOps = field(default_factory=PoolOps)
    release: list[int] = field(default_factory=list)  # free lanes: KV cleared, sampler dropped
    keep: list[int] = field(default_factory=list)  # free lanes whose KV stays (sampler dropped)
    park: list[tuple[int, str]] = field(default_factory=list)
    # (lane, n): cut a kept lane's KV to its first n tokens (0: empty it) before a job is bound
    trim: list[tuple[int, int]] = field(default_factory=list)
    swap: list[LaneSwap] = field(default_factory=list)
    restore: list[LaneRestore] = field(default_factory=list)
    bind: list[LaneBind] = field(default_factory=list)
    feeds: list[LaneFeed] = field(default_factory=list)
    step_tokens: int = 512  # most tokens per engine call; the engine checks should_stop between calls
    alone: bool = False  # a batch-invariant lane ticks alone
    # Decode rounds the engine may run on its own (a burst: each lane's sampled token fed back
    # at once, no plan and commit between; engines/base.py's run_tick). Above 1 only for a plan
    # of decode feeds alone (Scheduler._burst_rounds); 1: the feeds once.
    rounds: int = 1

    @property
    def prefill_tokens(self) -> int:
        return sum(len(f.tokens) for f in self.feeds if not f.is_decode)

    @property
    def decode_tokens(self) -> int:
        return sum(1 for f in self.feeds if f.is_decode)

    @property
    def has_work(self) -> bool:
        return bool(self.feeds or self.release or self.keep or self.park or self.trim or self.swap or self.restore or self.pool)

    @property
    def has_work_besides_feeds(self) -> bool:
        """Lane or cache work: a release, keep, park, trim, swap, restore, bind or pool operation."""
        return bool(self.release or self.keep or self.park or self.trim or self.swap or self.restore or self.bind or self.pool)


@dataclass
class TickResult:
    """What the engine did. ``fed`` may fall short of the plan when it stopped early."""

    fed: dict[int, int] = field(default_factory=dict)  # lane -> tokens consumed
    sampled: dict[int, int] = field(default_factory=dict)  # lane -> token id (of a burst, the last round's)
    # lane -> the tokens a burst's earlier rounds sampled, in order, before ``sampled``'s
    earlier: dict[int, list[int]] = field(default_factory=dict)
    rounds: int = 1  # engine calls of a burst run (TickPlan.rounds): 1 for any other tick
    eog: set[int] = field(default_factory=set)  # lanes whose sampled token ends generation
    # lane -> (logprob of the sampled token, [(token, logprob), ...] top alternatives), for
    # lanes whose sampling asks for logprobs
    logprobs: dict[int, tuple[float, list[tuple[int, float]]]] = field(default_factory=dict)
    parked: dict[str, Any] = field(default_factory=dict)  # job_id -> artifact
    evicted: dict[int, Any] = field(default_factory=dict)  # prefix entry key -> host artifact
    elapsed_s: float = 0.0
    prefill_s: float = 0.0  # time spent in engine calls that carried prefill tokens
    stopped_early: bool = False
    # lane -> why its job must end now (its grammar took too long to mask): the worker ends it
    # with an error once the tick is committed (its tokens delivered), unless the tick ended it
    failed: dict[int, str] = field(default_factory=dict)
    # sequences the tick left empty instead of filling them (a parked job's restore, a lane move,
    # a prefix's store into a cache slot or import from host memory, or a prefix copy into a
    # lane, failed): a lane's job is computed again from the start (nothing of it was fed), a
    # cache slot's entry is dropped
    lost: set[int] = field(default_factory=set)


@dataclass
class Event:
    """Something a client or an operator should hear about. ``kind`` is one of:
    ``admitted``, ``token``, ``preempted``, ``resumed``, ``moved`` (into the free lane ``lane``: lane compaction),
    ``finished``."""

    kind: str
    job_id: str
    token: int | None = None
    position: int = 0  # a token's: the job's output length with it (a burst commits several at once)
    lane: int | None = None
    reason: str | None = None
    job: Job | None = None
