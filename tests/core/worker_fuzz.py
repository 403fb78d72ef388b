"""Randomized fuzz harness for the engine worker's loop (EngineWorker.handle / run_tick) driven by
the simulated engine.

Run:  python -m tests.core.worker_fuzz [first_seed] [n_seeds] [--flag=value ...]
      python -m tests.core.worker_fuzz 123 1 -v     (one seed, verbose trace)
tests/core/test_worker_fuzz.py runs it under Hypothesis. Written by a review helper, it found the
bugs its regression tests in tests/core/test_worker_rules.py name (a lane copied from and
preempted in one plan; a resubmission after a link drop refused or lost; a failed tick's lane
and cache work forgotten; a malformed Submit raising out of handle()).

Each seed builds a worker with a random SchedulerConfig, then drives a random sequence of
actions: submits (completions and chat, all QoS classes, priorities, shared prefixes, stop
strings, max_tokens near the lane context, pin_prefix, resume_text/resume_tokens, logprobs),
cancels (live, finished, unknown, preparing, twice), Config messages, OS pressure, clock
advances past completion deadlines, interrupts (should_stop), link disconnects, and an engine
that sometimes raises EngineError (permanent or not, from a step: partial set) or StepAborted.
Optionally a deterministic emulation of prepare_in_thread (the prepare queue is drained by the
harness at random moments).

Flags (--name=value): steps, max_jobs, prepare (share of runs emulating prepare_in_thread),
utf8 (share of runs whose tokens split characters), step/abort/permanent_share/abort_decode
(forward faults), pre (execute fails before any op) and prim (load/trim/copy fail); resubmit=1:
the web side's same-id resubmission after a link drop; cache_heavy, urgent, bi.

Invariants (checked after every action; KV/pool ones after every run_tick):
  I1  per job: Accepted (once) before any Delta; exactly one terminal (Done/Error/Rejected) unless
      the client cancelled or disconnected (then at most one); nothing after a terminal;
      messages only on the job's own connection.
  I2  Done(stop|length): text == the reference (sim next_token from the prompt alone) cut at the
      first stop string / at min(max_tokens, lane_ctx - prompt); finish_reason matches;
      usage.completion_tokens == generated + resume_tokens; usage.prompt_tokens == own prompt.
      Done(cancelled)/Error: the text delivered is a prefix of the reference.
  I3  Delta.tokens is non-decreasing and >= delivered chars + resume_tokens (one char per token).
  I4  logprobs entries: one per generated token (before a stop-completing one), matching the
      token and carrying that token's own logprob.
  I5  after run_tick: worker.contexts keys == scheduler.jobs keys; each running lane's engine KV
      is exactly job.sequence[:computed] with its sampler bound; kept lanes hold their kept
      tokens; free lanes are empty; device cache slots hold their entry's tokens; parked artifacts
      hold the job's computed tokens.
  I6  at the end (all work drained): contexts, preparing, scheduler.jobs empty; every lane free;
      no sampler bound; every expected terminal arrived.
  I7  nothing but an injected fault escapes handle()/run_tick().
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import queue
import random
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import JobState, TickPlan, TickResult
from scheduler.engines.base import EngineError, Step, StepAborted, swap_keys
from scheduler.engines.sim import FakeClock, SimEngine

# isort: off
from scheduler.link.messages import Accepted, Cancel, Config, Delta, Done, Error, Message, Rejected, Snapshot, Submit, decode, encode  # fmt: skip
# isort: on
from scheduler.worker.loop import EngineWorker
from scheduler.worker.server import DISCONNECTED


class InvariantError(AssertionError):
    pass


# -- the engine --------------------------------------------------------------------------


def lp_of(token: int) -> float:
    """The fake logprob the engine reports for a sampled token: identifies the token."""
    return -token / 1000.0


class FuzzEngine(SimEngine):
    """The sim engine with injected faults and an optional logprobs feature."""

    utf8 = False

    def token_bytes(self, token: int) -> bytes:
        return utf8_token_bytes(token) if self.utf8 else bytes([token % 256])

    def next_token(self, sequence: list[int]) -> int:  # type: ignore[override]
        return utf8_next_token(sequence) if self.utf8 else SimEngine.next_token(sequence)

    def __init__(self, rnd: random.Random, faults: dict[str, float], logprobs: bool, **kw: Any) -> None:
        super().__init__(**kw)
        self.rnd = rnd
        self.faults = faults
        self.armed = False  # faults only while the harness says so
        if logprobs:
            self.features = frozenset({"logprobs"})
        self._lp_lanes: dict[int, int] = {}
        self._lp: dict[int, tuple[float, list[tuple[int, float]]]] = {}
        self.injected: list[str] = []
        self.failed_jobs: set[str] = set()  # jobs whose lane take_failed named

    def bind_sampler(self, bind: Any) -> None:
        super().bind_sampler(bind)
        if bind.sampling.logprobs is not None:
            self._lp_lanes[bind.lane] = bind.sampling.logprobs
        else:
            self._lp_lanes.pop(bind.lane, None)

    def drop_sampler(self, lane: int) -> None:
        super().drop_sampler(lane)
        self._lp_lanes.pop(lane, None)

    def swap_samplers(self, a: int, b: int) -> None:
        super().swap_samplers(a, b)
        swap_keys(self._lp_lanes, a, b)

    def take_failed(self) -> dict[int, str]:
        """Now and then a lane's job must end (as llama.cpp's for a grammar too slow to mask)."""
        bound = [lane for lane, job in enumerate(self.lane_job) if job is not None]
        if not (self.armed and bound and self.rnd.random() < self.faults.get("fail_lane", 0.0)):
            return {}
        lane = self.rnd.choice(bound)
        self.failed_jobs.add(str(self.lane_job[lane]))
        self.injected.append(f"fail_lane:{lane}")
        return {lane: "injected: the grammar took too long"}

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if self.armed and self.rnd.random() < self.faults.get("pre", 0.0):
            # fails before doing anything (a closed engine): partial None
            permanent = self.rnd.random() < 0.5
            self.injected.append(f"pre(permanent={permanent})")
            raise EngineError("injected: before any op", permanent=permanent)
        return super().execute(plan, should_stop)

    def _prim_fault(self, what: str) -> None:
        if self.armed and self.rnd.random() < self.faults.get("prim", 0.0):
            self.injected.append(f"prim:{what}")
            raise EngineError(f"injected: {what} failed", permanent=True)  # as llama.cpp/MLX primitives do

    def load(self, seq: int, artifact: Any) -> None:
        self._prim_fault("load")
        super().load(seq, artifact)

    def trim(self, seq: int, n_tokens: int) -> None:
        self._prim_fault("trim")
        super().trim(seq, n_tokens)

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        self._prim_fault("copy_prefix")
        super().copy_prefix(src, dst, n_tokens)

    def forward(self, step: Step) -> dict[int, int]:
        if self.armed:
            r = self.rnd.random()
            if r < self.faults.get("abort", 0.0) and (step.prefill or self.faults.get("abort_decode", 0)):
                self.injected.append("abort")
                raise StepAborted("injected abort")  # rolled back: nothing of the step happened
            r = self.rnd.random()
            if r < self.faults.get("step", 0.0):
                permanent = self.rnd.random() < self.faults.get("permanent_share", 0.3)
                self.injected.append(f"step(permanent={permanent})")
                raise EngineError("injected: llama_decode failed", permanent=permanent)  # rolled back
        sampled = super().forward(step)
        for lane, token in sampled.items():
            if lane in self._lp_lanes:
                self._lp[lane] = (lp_of(token), [(token, lp_of(token))])
        return sampled

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        out, self._lp = self._lp, {}
        return out


# -- the link ----------------------------------------------------------------------------


class FakeConn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[Message] = []
        self.read = 0

    def queue(self, message: Message) -> None:
        self.sent.append(message)


# -- the reference ------------------------------------------------------------------------

# UTF-8 mode: tokens that are pieces of characters (é = C3 A9, € = E2 82 AC split over tokens),
# tokens of several characters, and a lone continuation byte (decoded as U+FFFD).
MULTI = {240: b"xy", 241: b"\xc3\xa9z", 242: b" \xc3"}


def utf8_token_bytes(token: int) -> bytes:
    return MULTI.get(token) or bytes([token % 256])


def utf8_next_token(sequence: list[int]) -> int:
    tail = b"".join(utf8_token_bytes(t) for t in sequence[-3:])
    if tail.endswith(b"\xc3"):
        return 0xA9
    if tail.endswith(b"\xe2\x82"):
        return 0xAC
    if tail.endswith(b"\xe2"):
        return 0x82
    digest = hashlib.blake2b(bytes(t % 256 for t in sequence[-16:]), digest_size=2).digest()
    r = digest[0] % 40
    if r < 26:
        return 97 + r
    return [0xC3, 0xC3, 0xC3, 0xC3, 0xE2, 0xE2, 0x80, 240, 240, 240, 241, 241, 242, 242][r - 26]


MODEL = {"next": SimEngine.next_token, "bytes": lambda t: bytes([t % 256])}


def reference(prompt: list[int], n_max: int, stops: list[str], eog_at: int | None, resumed: str = "") -> tuple[str, int, str, list[int]]:
    """(text, tokens generated, finish reason, tokens) a lone greedy run gives. ``resumed``: the
    text a lost worker had sent (Submit.resume_text): a stop string that began there and ends in
    the new text stops the run at once, as it would have had the worker not been lost (one wholly
    in it cannot be: the lost worker stopped there)."""
    nxt, tb = MODEL["next"], MODEL["bytes"]
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    seq = list(prompt)
    text = ""
    toks: list[int] = []
    stops = [s for s in stops if s]
    longest = max(map(len, stops), default=0)
    tail = resumed[1 - longest :] if longest > 1 else ""

    def cut(t: str) -> str | None:
        whole = tail + t
        hits = [i for s in stops for i in _finds(whole, s) if i + len(s) > len(tail)]
        return t[: max(0, min(hits) - len(tail))] if hits else None

    for i in range(n_max):
        if eog_at is not None and i == eog_at:
            final = text + dec.decode(b"", final=True)
            c = cut(final)
            return (final if c is None else c), i, "eog", toks
        t = nxt(seq)
        seq.append(t)
        toks.append(t)
        text += dec.decode(tb(t))
        c = cut(text)
        if c is not None:
            return c, i + 1, "stop", toks
    final = text + dec.decode(b"", final=True)
    c = cut(final)
    return (final if c is None else c), n_max, ("length" if c is None else "flushstop"), toks


def _finds(text: str, sub: str) -> list[int]:
    """Where ``sub`` begins in ``text``, each place (overlapping ones too)."""
    return [i for i in range(len(text) - len(sub) + 1) if text.startswith(sub, i)]


@dataclass
class JobRec:
    job_id: str
    conn: FakeConn
    submit: Submit
    expect_reject: str | None  # the reason, if the harness predicts a refusal
    prompt: list[int] = field(default_factory=list)  # tokens prefilled (own + resume)
    own_len: int = 0
    n_max: int = 0
    stops: list[str] = field(default_factory=list)
    eog_at: int | None = None
    logprobs: bool = False
    # observed
    accepted: bool = False
    terminal: Message | None = None
    text: str = ""
    last_tokens: int = 0
    lp_entries: list[dict[str, Any]] = field(default_factory=list)
    cancelled: bool = False  # the client cancelled or disconnected: a terminal is optional
    dup_pending: int = 0  # duplicate submits whose Rejected(duplicate_id) is expected
    ended: bool = False  # resumed with nothing left to generate: Accepted, Done(length), never queued
    messages: list[str] = field(default_factory=list)


# -- the run -------------------------------------------------------------------------------


WORDS = ["alpha ", "beta ", "gamma ", "delta ", "zz", "q", "hello world ", "ab", "xyz"]


class Fuzz:
    def __init__(self, seed: int, flags: dict[str, Any], verbose: bool = False) -> None:
        self.seed = seed
        self.rnd = rnd = random.Random(seed)
        self.flags = flags
        self.verbose = verbose
        self.clock = FakeClock()
        wide = bool(flags.get("wide"))  # 4-8 lanes and longer jobs: several lane moves in a plan
        max_batch = rnd.choice([4, 5, 6, 8] if wide else [1, 2, 3, 4])
        lane_ctx = rnd.choice([96, 160, 256] if wide else [48, 64, 96, 160, 256])
        cache_slots = rnd.choice([0, 1, 2, 4])
        prefix_cache = rnd.random() < 0.8
        class_lanes = {}
        for q in QosClass:
            if rnd.random() < 0.25:
                class_lanes[q] = rnd.randint(1, max_batch)
        cfg = dict(
            max_batch=max_batch,
            lane_ctx=lane_ctx,
            cache_slots=cache_slots,
            prefix_cache=prefix_cache,
            keep_lanes=rnd.random() < 0.8,
            park=rnd.random() < 0.7,
            preemption=rnd.random() < 0.9,
            class_lanes=class_lanes,
            prefill_budget=rnd.choice([0, 64, 128, 4096]),
            tick_decode_budget=rnd.choice([0, 0, 1, 2]),
            tick_targets_s=rnd.choice([None, (0.05, 0.25)]),
            min_prefix_tokens=rnd.choice([4, 8, 16, 32]),
            starvation_ticks=rnd.choice([2, 8]),
            watermarks=rnd.random() < 0.8,
            host_cache_bytes=rnd.choice([0, 1 << 30, 2000]),
            compact_lanes=True,  # where the engine asks for it (FuzzEngine's compact_lanes, below)
            compact_min_tokens=rnd.choice([1, 4, 16]),
        )
        if flags.get("cache_heavy"):
            cfg.update(prefix_cache=True, cache_slots=rnd.choice([1, 2]), min_prefix_tokens=4, host_cache_bytes=rnd.choice([300, 1 << 30]),
                       lane_ctx=rnd.choice([96, 160]), max_batch=rnd.choice([2, 3, 4]), watermarks=True)  # fmt: skip
            cfg["class_lanes"] = {}
            if wide:
                cfg["max_batch"] = rnd.choice([4, 6, 8])
        self.cfg_desc = cfg
        faults = {
            "abort": flags.get("abort", 0.05),
            "step": flags.get("step", 0.03),
            "permanent_share": flags.get("permanent_share", 0.3),
            "pre": flags.get("pre", 0.0),
            "abort_decode": flags.get("abort_decode", 0),
            "prim": flags.get("prim", 0.0),
            "fail_lane": flags.get("fail_lane", 0.02),
        }
        self.utf8 = flags.get("utf8", 0.3) > rnd.random()
        if self.utf8:
            MODEL.update(next=utf8_next_token, bytes=utf8_token_bytes)
        else:
            MODEL.update(next=SimEngine.next_token, bytes=lambda t: bytes([t % 256]))
        self.engine = FuzzEngine(
            rnd, faults, logprobs=rnd.random() < 0.5, n_lanes=cfg["max_batch"], lane_ctx=cfg["lane_ctx"], clock=self.clock,
            cache_slots=cfg["cache_slots"] if cfg["prefix_cache"] else 0,
            prefill_s_per_token=rnd.choice([0.0005, 0.005]), decode_round_s=rnd.choice([0.01, 0.06]),
            compact_lanes=rnd.random() < flags.get("compact", 0.5),
        )  # fmt: skip
        self.engine.utf8 = self.utf8
        self.deadline_ms = rnd.choice([0, 0, 50, 300])
        self.worker = EngineWorker(
            self.engine, SchedulerConfig(**cfg), model_name="sim", clock=self.clock, completion_deadline_ms=self.deadline_ms
        )
        self.prepare_mode = flags.get("prepare", 0.3) > rnd.random()
        if self.prepare_mode:
            self.worker._prepare_queue = queue.PriorityQueue()  # drained by the harness, not a thread
        self.conns = [FakeConn("c0"), FakeConn("c1")]
        self.dead: list[FakeConn] = []
        self.jobs: dict[str, JobRec] = {}
        self.n = 0
        self.prefixes = ["".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 8))) for _ in range(4)]
        self.trace: list[str] = []
        self.expected_fault = False
        # what the worker's own counters must add up to (I8)
        self.seen = {"rejected": 0, "prompt_tokens": 0, "finishes": 0}
        self.admitted_ids: set[str] = set()

    # -- logging --
    def log(self, s: str) -> None:
        self.trace.append(s)
        if self.verbose:
            print(s)

    def fail(self, msg: str) -> None:
        raise InvariantError(f"seed {self.seed}: {msg}")

    # -- requests --
    def random_prompt_text(self) -> str:
        rnd = self.rnd
        kind = rnd.random()
        if kind < 0.6:
            return rnd.choice(self.prefixes) + "".join(rnd.choice(WORDS) for _ in range(rnd.randint(0, 3)))
        if kind < 0.8:
            return "".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 5)))
        if kind < 0.9:
            return "é" * rnd.randint(1, 5) + rnd.choice(self.prefixes)
        return "" if rnd.random() < 0.3 else rnd.choice(self.prefixes) * rnd.randint(2, 6)

    def new_submit(self) -> None:
        rnd = self.rnd
        eng = self.engine
        ctx = eng.lane_ctx
        self.n += 1
        job_id = f"j{self.n}"
        chat = rnd.random() < 0.25
        request: dict[str, Any] = {}
        token_prompt = False
        if chat:
            msgs = [{"role": "user", "content": self.random_prompt_text()}]
            if rnd.random() < 0.3:
                msgs = [{"role": "system", "content": self.prefixes[0]}] + msgs
            request = {"endpoint": "chat", "messages": msgs}
            own_text = eng.render_chat(msgs)
            own = list(own_text.encode())
        else:
            if rnd.random() < 0.1:
                token_prompt = True
                prompt_ids = [rnd.randint(3, 255) for _ in range(rnd.randint(0, 20))]
                if rnd.random() < 0.1:
                    prompt_ids.append(300)  # outside the vocabulary
                request = {"endpoint": "completions", "prompt": prompt_ids}
                own_text = None
                own = list(prompt_ids)
            else:
                own_text = self.random_prompt_text()
                request = {"endpoint": "completions", "prompt": own_text}
                own = list(own_text.encode())
        own_len = len(own)
        # resume
        resume_text = ""
        resume_tokens = 0
        if rnd.random() < 0.12 and own_len and not token_prompt:
            toks = reference(own, 20, [], None)[3]
            k = rnd.randint(1, 8)
            try:
                resume_text = b"".join(MODEL["bytes"](t) for t in toks[:k]).decode("utf-8")
                resume_tokens = k  # the tokens that gave the text delivered before the loss
            except UnicodeDecodeError:
                pass  # ends inside a character: the web side never got that text
        if token_prompt:
            tokens = own + list(resume_text.encode())
        elif chat:
            tokens = list((own_text + resume_text).encode())  # type: ignore[operator]
        else:
            tokens = list((own_text + resume_text).encode())  # type: ignore[operator]
        # max_tokens
        r = rnd.random()
        room = ctx - own_len
        if r < 0.15:
            mt: int | None = None
        elif r < 0.3:
            mt = room  # exactly fits
        elif r < 0.35:
            mt = room + 1  # one over: refused
        elif r < 0.45:
            mt = max(1, room - rnd.randint(0, 3))
        else:
            mt = rnd.randint(1, 60 if self.flags.get("wide") else 25)
        if mt is not None:
            if resume_tokens and mt <= resume_tokens:
                mt = resume_tokens + rnd.randint(1, 5)
            request["max_tokens"] = mt
        # stops
        stops: list[str] = []
        if rnd.random() < 0.5 and tokens:
            full = reference(tokens, max(1, min(40, ctx - len(tokens))) if len(tokens) < ctx else 1, [], None)[0]
            for _ in range(rnd.randint(1, 3)):
                k = rnd.random()
                if k < 0.3 and full:  # spans tokens
                    a = rnd.randrange(len(full))
                    stops.append(full[a : a + rnd.randint(2, 4)])
                elif k < 0.5 and full:  # at the very end of what max_tokens allows
                    n_allowed = (mt if mt is not None else ctx - own_len) - resume_tokens
                    end = full[: max(1, min(n_allowed, len(full)))]
                    stops.append(end[-rnd.randint(1, 3) :])
                elif k < 0.6:
                    stops.append("")
                elif k < 0.8:
                    stops.append("".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(1, 3))))
                else:
                    stops.append(rnd.choice(["zzzzzz", "é", "\n", "q"]))
            request["stop"] = stops
        request["temperature"] = 0.0 if rnd.random() < 0.8 else rnd.choice([0.7, 1.0])
        if rnd.random() < 0.3:
            request["seed"] = rnd.randint(0, 100)
        want_lp = rnd.random() < 0.3
        if want_lp:
            request["logprobs"] = rnd.randint(0, 3)
        qos = rnd.choice([0, 1, 1, 2, 2, 3, 3] if not self.flags.get("urgent") else [0, 0, 1, 1, 1, 2, 3])
        priority = rnd.choice([0, 0, 100, -100, rnd.randint(-1000, 1000)])
        if rnd.random() < 0.02:
            priority = 2**60
        extra = dict(
            qos=qos,
            priority=priority,
            pin_prefix=rnd.random() < 0.15,
            batch_invariant=rnd.random() < self.flags.get("bi", 0.08),
            cache_scope=rnd.choice(["", "", "", "s1"]),
            resume_text=resume_text,
            resume_tokens=resume_tokens,
        )
        submit = Submit(id=job_id, request=request, **extra)  # type: ignore[arg-type]
        # predict
        expect: str | None = None
        budget = (mt if mt is not None else ctx - own_len) - resume_tokens
        # a resumed job whose text had reached max_tokens or the context: Done(length) at once
        ended = bool(resume_tokens) and own_len < ctx and (budget <= 0 or len(tokens) >= ctx)
        if not -(2**53) <= priority <= 2**53:
            expect = "invalid_job"
        elif token_prompt and any(not 0 <= t < 256 for t in own):
            expect = "invalid_prompt"
        elif not tokens:
            expect = "empty_prompt"
        elif ended:
            pass
        elif len(tokens) >= ctx or (mt is not None and own_len + mt > ctx):
            expect = "context_length_exceeded"
        elif want_lp and "logprobs" not in eng.features:
            expect = "unsupported_parameter"
        n_max = 0 if ended else min(max(1, budget), ctx - len(tokens))
        eog_at = None
        if rnd.random() < 0.1 and expect is None:
            n_eog = rnd.randint(1, 10)
            self.engine.eog_after[job_id] = n_eog
            i = n_eog - 1 - len(resume_text.encode())  # the sim counts the resumed tokens as its tokenizer makes them
            eog_at = i if i >= 0 else None
        conn = rnd.choice(self.conns)
        rec = JobRec(job_id, conn, submit, expect, tokens, own_len, n_max, stops, eog_at, want_lp)
        rec.ended = ended and expect is None
        self.jobs[job_id] = rec
        self.log(
            f"submit {job_id} conn={conn.name} qos={qos} prio={priority} own={own_len} toks={len(tokens)} mt={mt} "
            f"n_max={n_max} stops={stops!r} resume={resume_tokens} eog_at={eog_at} lp={want_lp} pin={extra['pin_prefix']} "
            f"scope={extra['cache_scope']!r} bi={extra['batch_invariant']} expect={expect}"
        )
        self.worker.handle(conn, submit)

    # -- actions --
    def live_ids(self) -> list[str]:
        return [j for j in self.jobs if j in self.worker.contexts or j in self.worker.preparing]

    def do_cancel(self) -> None:
        rnd = self.rnd
        r = rnd.random()
        live = self.live_ids()
        if r < 0.6 and live:
            job_id = rnd.choice(live)
        elif r < 0.8 and self.jobs:
            job_id = rnd.choice(list(self.jobs))
        else:
            job_id = f"unknown{rnd.randint(0, 99)}"
        times = 2 if rnd.random() < 0.2 else 1
        rec = self.jobs.get(job_id)
        if rec is not None:
            rec.cancelled = True
        self.log(f"cancel {job_id} x{times}")
        for _ in range(times):
            conn = rec.conn if rec is not None else rnd.choice(self.conns)
            self.worker.handle(conn, Cancel(id=job_id))

    def do_config(self) -> None:
        rnd = self.rnd
        caps: dict[str, Any] = {}
        for label in ["interactive", "completion", "agent", "background", "bogus", "2"]:
            if rnd.random() < 0.3:
                caps[label] = rnd.choice([0, 1, 2, 3, 4, 99, "x", None])
        self.log(f"config {caps}")
        self.worker.handle(self.rnd.choice(self.conns), Config(class_lanes=caps))

    def do_pressure(self) -> None:
        level = self.rnd.choice(["warning", "critical", None, "normal"])
        self.log(f"pressure {level}")
        self.worker.scheduler.on_os_pressure(level)

    def do_advance(self) -> None:
        dt = self.rnd.choice([0.001, 0.02, 0.1, (self.deadline_ms or 100) / 1000.0 + 0.01, 2.0])
        self.log(f"advance {dt}")
        self.clock.advance(dt)

    def do_dup(self) -> None:
        live = self.live_ids()
        if not live:
            return
        job_id = self.rnd.choice(live)
        rec = self.jobs[job_id]
        rec.dup_pending += 1
        self.log(f"dup submit {job_id}")
        self.worker.handle(rec.conn, rec.submit)

    def do_prepare(self) -> None:
        pq = self.worker._prepare_queue
        if pq is None or pq.empty():
            return
        _rank, _order, conn, message = pq.get()
        result = self.worker._prepare_one(conn, message)  # what the preparation thread does
        if result is None:
            self.log(f"prepare {message.id}: skipped (cancelled)")
            return
        self.log(f"prepared {message.id}")
        self.worker.handle(conn, result)

    def do_disconnect(self) -> None:
        conn = self.rnd.choice(self.conns)
        self.log(f"disconnect {conn.name}")
        for rec in self.jobs.values():
            if rec.conn is conn:
                rec.cancelled = True
        self.worker.handle(conn, DISCONNECTED.__class__())
        self.conns.remove(conn)
        self.dead.append(conn)
        new = FakeConn(f"c{len(self.conns) + len(self.dead)}")
        self.conns.append(new)
        if self.flags.get("resubmit", 0) and self.rnd.random() < 0.7:
            # the web side reconnects and submits every job in flight again, same id, with resume
            for rec in list(self.jobs.values()):
                if rec.conn is conn and rec.terminal is None and rec.expect_reject is None and rec.accepted and not rec.submit.resume_text:
                    self.resubmit(rec, new)

    def resubmit(self, rec: JobRec, conn: FakeConn) -> None:
        text = rec.text
        sub = Submit(
            id=rec.job_id, request=rec.submit.request, qos=rec.submit.qos, priority=rec.submit.priority,
            pin_prefix=rec.submit.pin_prefix, cache_scope=rec.submit.cache_scope, resume_text=text, resume_tokens=len(text),
        )  # fmt: skip
        new = JobRec(rec.job_id, conn, sub, None, rec.prompt + list(text.encode()), rec.own_len,
                     0, rec.stops, None, rec.logprobs)  # fmt: skip
        mt = rec.submit.request.get("max_tokens")
        budget = (mt if mt is not None else self.engine.lane_ctx - rec.own_len) - len(text)
        # every token it may have delivered, or its text at the end of the context: Done(length)
        # at once, with not one token more
        ended = bool(text) and (budget <= 0 or len(new.prompt) >= self.engine.lane_ctx)
        new.n_max = 0 if ended else min(budget, self.engine.lane_ctx - len(new.prompt))
        new.ended = ended
        self.engine.eog_after.pop(rec.job_id, None)
        old_key = f"{rec.job_id}@old{len(self.jobs)}"
        self.jobs[old_key] = rec
        self.jobs[rec.job_id] = new
        self.log(f"resubmit {rec.job_id} on {conn.name} resume={text!r}")
        self.worker.handle(conn, sub)

    def do_tick(self) -> None:
        interrupt = self.rnd.random() < 0.15
        if interrupt:
            self.worker.interrupt.set()
        self.engine.armed = True
        n_inj = len(self.engine.injected)
        sch = self.worker.scheduler
        os_level, hold = sch.os_level, sch._background_hold_until
        plan_before = sch.last_plan
        try:
            did = self.worker.run_tick()
        finally:
            self.engine.armed = False
            self.worker.interrupt.clear()
        inj = self.engine.injected[n_inj:]
        self.log(f"tick -> {did} interrupt={interrupt} injected={inj} lanes={[j.job_id if j else None for j in self.worker.scheduler.lanes]}")
        if sch.last_plan is not plan_before and not inj:
            self.check_plan(sch.last_plan, os_level, hold, self.clock() )
        self.check_state()
        if self.rnd.random() < 0.2:
            state = self.worker.snapshot()
            try:
                encode(Snapshot(state))
            except Exception as exc:  # noqa: BLE001
                self.fail(f"snapshot cannot be encoded: {exc}")

    # -- checks --
    def collect(self) -> None:
        for conn in self.conns + self.dead:
            while conn.read < len(conn.sent):
                msg = conn.sent[conn.read]
                conn.read += 1
                self.on_message(conn, msg)

    def on_message(self, conn: FakeConn, msg: Message) -> None:
        try:
            decoded = decode(encode(msg))
        except Exception as exc:  # noqa: BLE001
            self.fail(f"message cannot cross the link: {msg!r}: {exc}")
        if decoded != msg:
            self.fail(f"message changes on the link: {msg!r} -> {decoded!r}")
        job_id = getattr(msg, "id", None)
        rec = self.jobs.get(job_id)  # type: ignore[arg-type]
        if rec is not None and rec.conn is not conn:  # an earlier submission of the same id (resubmitted)
            rec = next((r for r in self.jobs.values() if r.job_id == job_id and r.conn is conn), rec)
        if rec is None:
            self.fail(f"message for an unknown job: {msg!r}")
        rec.messages.append(type(msg).__name__)
        self.count(rec, msg)
        if isinstance(msg, Rejected) and msg.reason == "duplicate_id" and rec.dup_pending:
            rec.dup_pending -= 1
            return
        if conn is not rec.conn:
            self.fail(f"{job_id}: message on another connection ({conn.name}, not {rec.conn.name}): {msg!r}")
        if rec.terminal is not None:
            self.fail(f"{job_id}: message after its terminal {rec.terminal!r}: {msg!r}")
        if isinstance(msg, Accepted):
            if rec.accepted:
                self.fail(f"{job_id}: second Accepted")
            if rec.expect_reject is not None:
                self.fail(f"{job_id}: accepted but the harness expected Rejected({rec.expect_reject})")
            if msg.prompt_tokens != rec.own_len:
                self.fail(f"{job_id}: Accepted.prompt_tokens {msg.prompt_tokens} != {rec.own_len}")
            rec.accepted = True
        elif isinstance(msg, Delta):
            if not rec.accepted:
                self.fail(f"{job_id}: Delta before Accepted")
            rec.text += msg.text
            if msg.tokens < rec.last_tokens:
                self.fail(f"{job_id}: Delta.tokens went down {rec.last_tokens} -> {msg.tokens}")
            rec.last_tokens = msg.tokens
            if not self.utf8 and len(rec.text) + rec.submit.resume_tokens > msg.tokens:
                self.fail(f"{job_id}: {len(rec.text)} chars delivered (+{rec.submit.resume_tokens} resumed) but Delta.tokens={msg.tokens}")
            if msg.logprobs:
                if not rec.logprobs:
                    self.fail(f"{job_id}: logprobs sent but not asked for")
                rec.lp_entries.extend(msg.logprobs)
            ref_text = reference(rec.prompt, rec.n_max, [], None)[0]
            if not _prefix(ref_text, rec.text):
                self.fail(f"{job_id}: delivered text {rec.text!r} is not a prefix of the lone run {ref_text!r}")
        elif isinstance(msg, Rejected):
            if rec.accepted:
                self.fail(f"{job_id}: Rejected after Accepted: {msg!r}")
            if rec.expect_reject != msg.reason:
                self.fail(f"{job_id}: Rejected({msg.reason}: {msg.detail}) but expected {rec.expect_reject}")
            rec.terminal = msg
        elif isinstance(msg, (Done, Error)):
            if not rec.accepted:
                self.fail(f"{job_id}: {type(msg).__name__} before Accepted: {msg!r}")
            rec.terminal = msg
            self.check_terminal(rec, msg)
        else:
            self.fail(f"{job_id}: unexpected message {msg!r}")

    def count(self, rec: JobRec, msg: Message) -> None:
        """What a message adds to the worker's counters: a Rejected to rejected_total, an
        admission (Accepted, but an ended resumption's) to requests_total once per id, a finish
        (Done, but an ended resumption's, or Error) to the finishes, a Done's prompt to
        prompt_tokens_total."""
        if isinstance(msg, Rejected):
            self.seen["rejected"] += 1
        elif isinstance(msg, Accepted) and not rec.ended:
            self.admitted_ids.add(rec.job_id)
        elif isinstance(msg, Done) and not rec.ended:
            self.seen["prompt_tokens"] += int(msg.usage.get("prompt_tokens", 0))
            self.seen["finishes"] += 1
        elif isinstance(msg, Error):
            self.seen["finishes"] += 1

    def check_counts(self) -> None:
        """I8: the worker's counters (its snapshot's stats and metrics) against its messages."""
        stats = self.worker.stats
        want = {
            "requests_total": len(self.admitted_ids),
            "rejected_total": self.seen["rejected"],
            "prompt_tokens_total": self.seen["prompt_tokens"],
        }
        got = {k: int(stats[k]) for k in want}
        if got != want:
            self.fail(f"worker stats {got} != what its messages add up to {want}")
        finishes = sum(n for by_reason in self.worker.metrics.finishes.values() for n in by_reason.values())
        if finishes != self.seen["finishes"]:
            self.fail(f"metrics count {finishes} finishes {self.worker.metrics.finishes}, the messages {self.seen['finishes']}")

    def check_terminal(self, rec: JobRec, msg: Message) -> None:
        ref_text, gen, reason, toks = reference(rec.prompt, rec.n_max, rec.stops, rec.eog_at, rec.submit.resume_text)
        eog = reason == "eog"
        flushstop = reason == "flushstop"  # a stop string holding U+FFFD matched by the final flush
        reason = "stop" if eog or flushstop else reason
        full_text = reference(rec.prompt, rec.n_max, [], None)[0]
        resume = rec.submit.resume_tokens
        if isinstance(msg, Error):
            if msg.reason == "completion_deadline_exceeded":
                if rec.submit.qos != 1 or not self.deadline_ms:
                    self.fail(f"{rec.job_id}: deadline error for qos {rec.submit.qos} deadline {self.deadline_ms}")
                if rec.text:
                    self.fail(f"{rec.job_id}: deadline error after text was delivered")
            elif msg.reason == "grammar_too_slow":
                if rec.job_id not in self.engine.failed_jobs:
                    self.fail(f"{rec.job_id}: grammar_too_slow but its lane was never failed")
            elif msg.reason != "engine_error":
                self.fail(f"{rec.job_id}: unexpected Error {msg!r}")
            if not _prefix(full_text, rec.text) or any(st and st in rec.text for st in rec.stops):
                self.fail(f"{rec.job_id}: text {rec.text!r} not a prefix of {full_text!r} free of stops {rec.stops!r}")
            return
        assert isinstance(msg, Done)
        if msg.usage.get("prompt_tokens") != rec.own_len:
            self.fail(f"{rec.job_id}: usage.prompt_tokens {msg.usage} != own {rec.own_len}")
        if msg.finish_reason == "cancelled":
            if not rec.cancelled:
                self.fail(f"{rec.job_id}: Done(cancelled) but never cancelled")
            # the stream flushes a held stop-string prefix on a cancel: the lone run's text, cut
            # anywhere, holding no complete stop string
            if not _prefix(full_text, rec.text) or any(st and st in rec.text for st in rec.stops):
                self.fail(f"{rec.job_id}: cancelled text {rec.text!r} not a prefix of {full_text!r} free of stops {rec.stops!r}")
            if not self.utf8 and msg.usage.get("completion_tokens", 0) < len(rec.text) + resume:
                self.fail(f"{rec.job_id}: cancelled usage {msg.usage} below delivered {len(rec.text)}+{resume}")
            self.check_lp(rec, None)
            return
        if msg.finish_reason not in ("stop", "length"):
            self.fail(f"{rec.job_id}: finish_reason {msg.finish_reason}")
        if rec.text != ref_text or msg.finish_reason != reason:
            self.fail(
                f"{rec.job_id}: Done({msg.finish_reason}) text {rec.text!r} but the lone run gives {ref_text!r} ({reason}); "
                f"n_max={rec.n_max} stops={rec.stops!r} eog_at={rec.eog_at}"
            )
        if msg.usage.get("completion_tokens") != gen + resume:
            self.fail(f"{rec.job_id}: usage.completion_tokens {msg.usage.get('completion_tokens')} != generated {gen} + resumed {resume}")
        if rec.last_tokens > gen + resume:
            self.fail(f"{rec.job_id}: Delta.tokens {rec.last_tokens} above the final count {gen + resume}")
        self.check_lp(rec, (toks, gen, "eog" if eog or flushstop else reason), len(ref_text))

    def check_lp(self, rec: JobRec, final: tuple[list[int], int, str] | None, text_chars: int = 0) -> None:
        if not rec.logprobs:
            return
        for i, e in enumerate(rec.lp_entries):
            if e["logprob"] is None:
                self.fail(f"{rec.job_id}: logprob entry {i} has no logprob: {e}")
            if abs(e["logprob"] - lp_of(e["token_id"])) > 1e-9:
                self.fail(f"{rec.job_id}: logprob entry {i} for token {e['token_id']} carries token {-e['logprob'] * 1000:.0f}'s logprob")
        if final is None:
            return
        toks, gen, reason = final
        want = toks[:gen]
        if reason == "stop":  # a stop string ended it: the tokens with a character before it have entries
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            firsts = list(itertools.accumulate((len(dec.decode(MODEL["bytes"](t))) for t in toks[:gen]), initial=0))
            want = [t for t, first in zip(toks[:gen], firsts[:-1], strict=True) if first < text_chars]
        got = [e["token_id"] for e in rec.lp_entries]
        if got != want:
            self.fail(f"{rec.job_id}: logprob tokens {got} != {want}")

    def check_plan(self, plan: TickPlan | None, os_level: str | None, hold_until: float, now: float) -> None:
        """The plan the tick ran: admissions within class caps, no background admission under
        critical pressure, a batch-invariant lane fed alone."""
        s = self.worker.scheduler
        if plan is None or not plan.bind:
            return
        caps = s.config.class_lanes
        usage: dict[QosClass, int] = {}
        for j in s.lanes:
            if j is not None:
                usage[j.qos] = usage.get(j.qos, 0) + 1
        for b in plan.bind:
            job = s.jobs.get(b.job_id)
            if job is None:
                continue
            if usage.get(job.qos, 0) > caps.get(job.qos, s.config.max_batch):
                self.fail(f"{b.job_id} ({job.qos.label}) bound with {usage[job.qos]} lanes of its class, cap {caps.get(job.qos)}")
            if job.qos is QosClass.BACKGROUND and (os_level == "critical" or now < hold_until):
                self.fail(f"{b.job_id}: background job bound under critical pressure")
        fed = {f.job_id for f in plan.feeds}
        bi = [j for j in fed if (jj := s.jobs.get(j)) is not None and jj.batch_invariant]
        if bi and len(fed) > 1:
            self.fail(f"batch-invariant {bi} fed beside {fed}")

    def check_state(self) -> None:
        w, s, e = self.worker, self.worker.scheduler, self.engine
        if set(w.contexts) != set(s.jobs):
            self.fail(f"contexts {sorted(w.contexts)} != scheduler.jobs {sorted(s.jobs)}")
        for lane, job in enumerate(s.lanes):
            if job is not None:
                if job.lane != lane or job.state is not JobState.RUNNING:
                    self.fail(f"lane {lane}: job {job.job_id} lane={job.lane} state={job.state}")
                want = job.sequence[: job.computed]
                if e.kv[lane] != want:
                    self.fail(f"lane {lane} ({job.job_id}): KV holds {len(e.kv[lane])} tokens, != sequence[:computed={job.computed}] (equal prefix {_cp(e.kv[lane], want)})")
                if e.lane_job[lane] != job.job_id:
                    self.fail(f"lane {lane}: sampler bound to {e.lane_job[lane]}, not {job.job_id}")
            elif lane in s._kept:
                if e.kv[lane] != s._kept[lane].tokens:
                    self.fail(f"kept lane {lane}: KV {len(e.kv[lane])} tokens != kept {len(s._kept[lane].tokens)} (equal prefix {_cp(e.kv[lane], s._kept[lane].tokens)})")
            elif lane not in s._release:
                if e.kv[lane]:
                    self.fail(f"free lane {lane} holds {len(e.kv[lane])} tokens")
        for entry in s.pool.entries.values():
            if entry.slot is not None and not entry.pending:
                have = e.kv[entry.slot]
                if have != entry.tokens:
                    self.fail(f"cache slot {entry.slot}: KV {len(have)} tokens != entry {entry.key} tokens {len(entry.tokens)} (equal prefix {_cp(have, entry.tokens)})")
            if entry.slot is None and entry.host is not None and entry.host.tokens != entry.tokens:
                self.fail(f"host entry {entry.key}: artifact != tokens")
        for job in s.jobs.values():
            if job.state is JobState.QUEUED and job.parked is not None:
                if job.parked.tokens != job.sequence[: job.computed]:
                    self.fail(f"parked {job.job_id}: artifact {len(job.parked.tokens)} != computed {job.computed}")

    # -- driver --
    def step(self) -> None:
        rnd = self.rnd
        fl = self.flags
        weights = [
            ("submit", fl.get("w_submit", 0.22) if len(self.jobs) < fl.get("max_jobs", 40) else 0.0),
            ("cancel", fl.get("w_cancel", 0.03)),
            ("config", 0.02),
            ("pressure", 0.02),
            ("advance", 0.05),
            ("dup", 0.01 * fl.get("dup", 1)),
            ("disconnect", fl.get("w_disconnect", 0.002)),
            ("prepare", 0.06 if self.prepare_mode else 0.0),
            ("tick", 0.55),
        ]
        total = sum(w for _, w in weights)
        r = rnd.random() * total
        name = weights[-1][0]
        for candidate, w in weights:
            r -= w
            if r < 0:
                name = candidate
                break
        getattr(self, {"submit": "new_submit", "tick": "do_tick"}.get(name, f"do_{name}"))()
        self.collect()

    def run(self, steps: int) -> None:
        self.log(f"config {self.cfg_desc} deadline_ms={self.deadline_ms} prepare={self.prepare_mode} lp={bool(self.engine.features)} utf8={self.utf8}")
        for _ in range(steps):
            self.step()
        # wind down: no faults, no pressure, prepare everything, tick until idle
        self.worker.scheduler.on_os_pressure(None)
        self.engine.faults = {}
        for _ in range(5000):
            self.do_prepare()
            self.collect()
            pq = self.worker._prepare_queue
            if self.worker.scheduler.idle and not self.worker.contexts and (pq is None or pq.empty()):
                break
            self.clock.advance(0.01)
            self.do_tick()
            self.collect()
        # one more tick for pending releases
        self.do_tick()
        self.collect()
        self.final_checks()

    def final_checks(self) -> None:
        w, s, e = self.worker, self.worker.scheduler, self.engine
        if w.contexts or w.preparing or s.jobs:
            self.fail(f"not idle at the end: contexts={list(w.contexts)} preparing={list(w.preparing)} jobs={list(s.jobs)}")
        if any(j is not None for j in s.lanes):
            self.fail(f"lanes busy at the end: {s.lanes}")
        if e.bound_lanes():
            self.fail(f"samplers still bound at the end: {e.bound_lanes()} {e.lane_job}")
        if len(s.queues):
            self.fail("queues not empty at the end")
        for rec in self.jobs.values():
            if rec.dup_pending:
                self.fail(f"{rec.job_id}: duplicate submit never answered")
            if rec.terminal is None and not rec.cancelled:
                self.fail(f"{rec.job_id}: no terminal message (got {rec.messages})")
        self.check_counts()


def _prefix(full: str, got: str) -> bool:
    """``got`` is a prefix of ``full``, or one followed by the U+FFFD a flush makes of a character
    cut short (a cancel, EOG or the length limit in the middle of a character)."""
    return full.startswith(got) or (got.endswith("\ufffd") and full.startswith(got[:-1]))


def _cp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run_seed(seed: int, flags: dict[str, Any], steps: int = 300, verbose: bool = False) -> tuple[str, str] | None:
    f = Fuzz(seed, flags, verbose)
    try:
        f.run(steps)
    except InvariantError as exc:
        return "invariant", f"{exc}"
    except Exception as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)
        where = ";".join(f"{fr.name}:{fr.lineno}" for fr in tb[-3:])
        return "exception", f"seed {seed}: {type(exc).__name__}: {exc} @ {where}"
    return None


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("-")]
    flags: dict[str, Any] = {}
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            flags[k] = float(v)
    verbose = "-v" in argv
    first = int(args[0]) if args else 0
    n = int(args[1]) if len(args) > 1 else 200
    steps = int(flags.get("steps", 300))
    found: dict[str, list[int]] = {}
    for seed in range(first, first + n):
        out = run_seed(seed, flags, steps, verbose)
        if out is not None:
            kind, msg = out
            # a signature: the message without ids/numbers
            import re

            sig = re.sub(r"\d+", "N", msg.split(": ", 1)[1])[:110]
            found.setdefault(sig, []).append(seed)
            if verbose or len(found[sig]) == 1:
                print(f"[{kind}] {msg[:600]}")
    print(f"\n{sum(len(v) for v in found.values())} failing of {n} seeds")
    for sig, seeds in sorted(found.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(seeds):4d}  {sig}   seeds={seeds[:6]}")



def coverage(first: int, n: int, flags: dict[str, Any]) -> None:
    """What the runs exercised (to see the fuzz reaches the paths it means to)."""
    from collections import Counter

    c: Counter[str] = Counter()
    for seed in range(first, first + n):
        f = Fuzz(seed, flags)
        try:
            f.run(int(flags.get("steps", 300)))
        except Exception:  # noqa: BLE001
            c["FAILED"] += 1
        for rec in f.jobs.values():
            t = rec.terminal
            key = type(t).__name__ if t else "none"
            key += ":" + str(getattr(t, "finish_reason", None) or getattr(t, "reason", ""))
            c[key] += 1
        for k, v in f.worker.scheduler.counters.items():
            c["sched." + k] += v
        for k, v in f.worker.scheduler.pool.counters.items():
            c["pool." + k] += v
        for i in f.engine.injected:
            c["inj." + i] += 1
        c["prepare_mode"] += f.prepare_mode
    for k, v in sorted(c.items()):
        print(f"{k:40s} {v}")


if __name__ == "__main__":
    main(sys.argv[1:])
