"""The model router: which waiting request goes next across models, and when to load or swap.

Pure: no Django, no engine, no processes; driven by an injected clock. The web side calls
:meth:`Router.submit` for each request, :meth:`Router.schedule` whenever something changed (and
twice a second, for TTLs: ``TICK_S`` in scheduler/link/pool.py), and carries out the returned
:class:`Actions`: start a model's worker (``load``), stop one (``unload``), send a request to its
model's worker (``dispatch``).
It reports back with :meth:`loaded`, :meth:`load_failed`, :meth:`unloaded` and :meth:`finished`.

Dispatch follows the request-priority seed's serial scheduler, at the level of models:

- score = priority + swap affinity + aging. Swap affinity (``swap_affinity_bonus``, 0..99) is given
  only to a request whose model is resident (loading, loaded or draining); aging is waited seconds
  / ``aging_divisor_s``, unbounded, 0 disables it. Higher scores go first; equal scores keep
  arrival order. The ``fifo`` scheduler scores model priority + request priority instead.
- Waiting requests are taken best first. A request whose model is loaded goes to that model's
  worker when as many of the model's ``lanes`` are free as it runs jobs (``n`` choices of each
  prompt; all the lanes at most), unless a better-scoring request has reserved that model for a
  swap or waits for its lanes; an interactive or completion request also goes when none is free
  (the worker preempts a lower lane for it). Otherwise it waits here, and its model cannot be
  chosen for a swap by a worse request. A request whose model is not resident takes a free model slot (up to
  ``max_loaded_models``) and loads it; with none free it reserves a loaded model no better request
  holds (an idle one first, then the least recently used): that model takes no more work, and once
  its admitted work has finished (nothing is cut) it is unloaded and the slot is used.
  Reservations are recomputed every time, so a better request that arrives meanwhile for the
  reserved model still goes first. A swap, once started (the unload, or the load into a free
  slot), is the pick of the request it was started for and is not taken back: the freed slot
  loads its model, and that model serves it before a request that came meanwhile may reserve it.
- A loaded model whose ``ttl_s`` has passed with nothing running or waiting is unloaded.
- A model whose load failed is backed off: for ``load_backoff_s`` (doubling with each failure in
  a row, up to ``load_backoff_max_s``) :meth:`submit` refuses its requests at once
  (:class:`LoadBackoff`, with the seconds left), so a client retrying a broken model neither
  loads it again nor takes the slot of a model others are served by. A successful load ends it;
  the admin's load (:meth:`request_load`) bypasses and resets it.
- A ``pinned`` model (serve's ``--fim-model``) is resident beside the others: it takes no one of
  the ``max_loaded_models`` slots, is never chosen for a swap and has no TTL; its requests wait
  only for its own lanes.
- After :meth:`drain` (serve's shutdown) nothing is loaded, unloaded or reserved any more: the
  requests waiting for a loaded model are dispatched to it as its lanes free, in the same order,
  and :meth:`drain` returns the others (their model is not loaded, or is being unloaded) for the
  caller to refuse. :meth:`idle` tells when a model has nothing waiting or running, so that its
  worker can be stopped.

``reorders`` counts dispatches (or swaps started) that would not have happened at this moment
without swap affinity, or without aging: the seed's ``reorders_total{reason=...}``.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .qos import band_of

SCHEDULERS = ("serial", "fifo")
BANDS = ("interactive", "normal", "batch")


class ModelState(enum.StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    DRAINING = "draining"  # loaded, takes no new work, unloaded once its admitted work is done
    UNLOADING = "unloading"  # its worker is stopping; its slot is not free yet

    @property
    def resident(self) -> bool:
        return self in (ModelState.LOADING, ModelState.LOADED, ModelState.DRAINING)


@dataclass(frozen=True)
class ModelSpec:
    id: str
    priority: int = 0  # the fifo scheduler's per-model priority
    ttl_s: float = 0.0  # idle seconds before unloading; 0 = never
    lanes: int = 0  # jobs its worker runs at once (its --max-batch); 0 = no bound here
    pinned: bool = False  # resident beside the others (serve --fim-model): no swap slot, never a victim, no TTL


@dataclass(frozen=True)
class RouterConfig:
    max_loaded_models: int = 1
    scheduler: str = "serial"
    aging_divisor_s: float = 60.0
    swap_affinity_bonus: int = 10

    load_backoff_s: float = 5.0  # after a failed load: requests for the model refused this long; 0 = off
    load_backoff_max_s: float = 300.0  # ... doubling with each failure in a row, up to this

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load_backoff_s) and self.load_backoff_s >= 0 and math.isfinite(self.load_backoff_max_s) and self.load_backoff_max_s >= self.load_backoff_s):
            raise ValueError("load_backoff_s must be 0 or more and load_backoff_max_s at least that")
        if self.max_loaded_models < 1:
            raise ValueError("max_loaded_models must be at least 1")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be serial or fifo, got {self.scheduler!r}")
        if not 0 <= self.swap_affinity_bonus <= 99:
            raise ValueError("swapAffinityBonus must be between 0 and 99")
        if not (math.isfinite(self.aging_divisor_s) and self.aging_divisor_s >= 0):
            raise ValueError("agingDivisor must be 0 (off) or a positive number")


class LoadBackoff(Exception):
    """A request for a model whose last load failed, within its backoff: refused at once, with
    nothing evicted and no load started."""

    def __init__(self, model: str, retry_after_s: float, failures: int) -> None:
        super().__init__(f"model {model!r}: load backed off for {retry_after_s:.3f} s more after {failures} failed load(s)")
        self.model = model
        self.retry_after_s = retry_after_s  # seconds until a request may load it again
        self.failures = failures  # failed loads in a row


@dataclass(eq=False)
class Waiting:
    request_id: str
    model: str
    priority: int
    arrival_s: float
    seq: int
    preempts: bool = False  # its class preempts a lower lane (interactive, completion)
    jobs: int = 1  # the jobs it runs at the worker, one lane each (n choices of each prompt)
    chosen: bool = False  # a swap was started for it (counted as a pick then)
    won_with: float | None = None  # its score when that swap started

    @property
    def band(self) -> str:
        return band_of(self.priority)


@dataclass(frozen=True)
class Dispatch:
    request_id: str
    model: str
    priority: int
    band: str
    score: float  # the score it won with: when its swap started, else at dispatch
    wait_s: float

    def serial_fields(self) -> dict[str, object]:
        """The activity row's ``serial_*`` keys (request-priority seed)."""
        return {
            "serial_priority": self.priority,
            "serial_band": self.band,
            "serial_score": round(self.score, 3),
            "serial_queue_wait_ms": int(round(self.wait_s * 1000)),
        }


@dataclass
class Actions:
    dispatch: list[Dispatch] = field(default_factory=list)
    load: list[str] = field(default_factory=list)
    unload: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.dispatch or self.load or self.unload)


@dataclass
class _Model:
    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    inflight: int = 0  # requests dispatched and not finished
    lanes_taken: int = 0  # the lanes those requests hold at the worker (see Router.lanes_for)
    last_used_s: float | None = None
    load_started_s: float | None = None
    unload_requested: bool = False  # the admin asked: drain, then unload
    loads: int = 0  # loads begun, failed ones too (the snapshot's load_attempts)
    dispatched: int = 0  # requests sent to its worker
    load_failures: int = 0  # failed loads in a row (a successful load, or the admin's Load, resets it)
    backoff_until_s: float | None = None  # no request loads it before this (see load_failed)


@dataclass
class _Plan:
    dispatch: list[Waiting] = field(default_factory=list)
    load: list[tuple[str, Waiting | None]] = field(default_factory=list)
    unload: list[tuple[str, Waiting | None]] = field(default_factory=list)
    draining: set[str] = field(default_factory=set)

    def picked(self) -> set[int]:
        """ids of the requests this plan dispatches or starts a swap for."""
        out = {id(r) for r in self.dispatch}
        out.update(id(r) for _m, r in self.load + self.unload if r is not None)
        return out


class Router:
    def __init__(self, models: Iterable[ModelSpec], config: RouterConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or RouterConfig()
        self.clock = clock
        self.models: dict[str, _Model] = {}
        for spec in models:
            if spec.id in self.models:
                raise ValueError(f"model id {spec.id!r} is configured twice")
            self.models[spec.id] = _Model(spec)
        if not self.models:
            raise ValueError("at least one model is needed")
        self.waiting: list[Waiting] = []
        self._by_id: dict[str, Waiting] = {}
        self._dispatched: dict[str, tuple[str, int]] = {}  # request id -> (model, lanes taken), until finished
        self._seq = itertools.count()
        self.reorders = {"aging": 0, "swap_affinity": 0}
        self.dispatched_by_band = {b: 0 for b in BANDS}
        self.admin_loads: set[str] = set()  # loads asked by the admin, not by a request
        self.draining = False  # shutting down: no loads, unloads or swaps; see drain()

    # -- requests ------------------------------------------------------------------------

    def submit(self, request_id: str, model: str, priority: int = 0, *, preempts: bool = False, jobs: int = 1) -> Waiting:
        """A request waits for its turn; ``jobs``: how many jobs it runs at the worker (a
        completion with ``n`` choices of each of ``k`` prompts runs n × k), one lane each."""
        if model not in self.models:
            raise KeyError(model)
        if jobs < 1:
            raise ValueError("a request runs at least one job")
        if self.draining:
            raise RuntimeError("the router is draining: no new requests")
        if request_id in self._by_id or request_id in self._dispatched:
            raise ValueError(f"request {request_id!r} is already known")
        left = self.backoff_left(model)
        if left > 0:  # refused here: it never waits, so it reserves no model for a swap and loads nothing
            raise LoadBackoff(model, left, self.models[model].load_failures)
        w = Waiting(request_id, model, priority, self.clock(), next(self._seq), preempts, jobs)
        self.waiting.append(w)
        self._by_id[request_id] = w
        return w

    def cancel(self, request_id: str) -> bool:
        """Drop a request still waiting (its client went away). False if it was not waiting."""
        w = self._by_id.pop(request_id, None)
        if w is None:
            return False
        self.waiting.remove(w)
        return True

    def finished(self, request_id: str) -> None:
        """A dispatched request's work ended (done, failed or cancelled at the worker)."""
        taken = self._dispatched.pop(request_id, None)
        if taken is None:
            return
        m = self.models[taken[0]]
        m.inflight = max(0, m.inflight - 1)
        m.lanes_taken = max(0, m.lanes_taken - taken[1])
        m.last_used_s = self.clock()

    def drain(self) -> list[str]:
        """Shutting down: from now on the requests waiting for a loaded model are still
        dispatched to it as its lanes free (they were accepted), but nothing is loaded, unloaded
        or reserved for a swap. Every request that could not run without one (its model is not
        loaded, or the admin is unloading it) is dropped; returns their ids, for the caller to
        refuse. No request may be submitted after this."""
        self.draining = True
        self.admin_loads.clear()
        dropped = [w.request_id for w in self.waiting if self.models[w.model].state not in (ModelState.LOADED, ModelState.DRAINING) or self.models[w.model].unload_requested]
        for rid in dropped:
            self.cancel(rid)
        return dropped

    def idle(self, model: str) -> bool:
        """Nothing of this model's is waiting here or running at its worker."""
        return self.models[model].inflight == 0 and not any(w.model == model for w in self.waiting)

    # -- models --------------------------------------------------------------------------

    def loaded(self, model: str) -> float:
        """The model's worker is ready. Returns the load time in seconds."""
        m = self.models[model]
        now = self.clock()
        took = now - m.load_started_s if m.load_started_s is not None else 0.0
        if m.state is ModelState.LOADING:
            m.state = ModelState.LOADED
            m.last_used_s = now
            m.load_failures, m.backoff_until_s = 0, None
        return took

    def load_failed(self, model: str) -> list[str]:
        """The model could not be loaded: it is unloaded again, and every request waiting for it
        is dropped. Returns their ids, for the caller to answer with an error. Requests for it
        are refused for ``load_backoff_s`` from now, doubled for each earlier failure in a row
        (``load_backoff_max_s`` at most): see :meth:`backoff_left`."""
        m = self.models[model]
        m.load_failures += 1
        base, cap = self.config.load_backoff_s, self.config.load_backoff_max_s
        m.backoff_until_s = self.clock() + min(cap, base * 2.0 ** min(m.load_failures - 1, 62)) if base > 0 else None
        m.state = ModelState.UNLOADED
        m.load_started_s = None
        m.unload_requested = False  # an Unload asked while it loaded: done, it is not loaded
        self.admin_loads.discard(model)
        dropped = [w.request_id for w in self.waiting if w.model == model]
        for rid in dropped:
            self.cancel(rid)
        return dropped

    def unloaded(self, model: str) -> None:
        m = self.models[model]
        m.state = ModelState.UNLOADED
        m.unload_requested = False
        m.load_started_s = None

    def request_load(self, model: str) -> None:
        """The admin's load action: load it as soon as a slot is free or an idle model can go."""
        if model not in self.models:
            raise KeyError(model)
        if self.draining:
            return  # shutting down: nothing is loaded any more
        self.models[model].load_failures, self.models[model].backoff_until_s = 0, None  # tried at once, and afresh
        self.models[model].unload_requested = False
        if self.models[model].state in (ModelState.UNLOADED, ModelState.UNLOADING):
            self.admin_loads.add(model)

    def request_unload(self, model: str) -> None:
        """The admin's unload action: no new work; unloaded once its admitted work is done."""
        m = self.models[model]
        self.admin_loads.discard(model)
        if self.draining:
            return  # shutting down: the requests it has accepted still run, it stops after them
        if m.state in (ModelState.LOADING, ModelState.LOADED, ModelState.DRAINING):
            m.unload_requested = True

    def state(self, model: str) -> ModelState:
        return self.models[model].state

    def backoff_left(self, model: str, now: float | None = None) -> float:
        """Seconds until a request may load the model again after a failed load (0: it may now)."""
        m = self.models[model]
        if m.backoff_until_s is None or m.state.resident:
            return 0.0
        return max(0.0, m.backoff_until_s - (self.clock() if now is None else now))

    # -- order ---------------------------------------------------------------------------

    def score(self, w: Waiting, now: float, *, bonus: int | None = None, divisor: float | None = None) -> float:
        if self.config.scheduler == "fifo":
            return self.models[w.model].spec.priority + w.priority
        bonus = self.config.swap_affinity_bonus if bonus is None else bonus
        divisor = self.config.aging_divisor_s if divisor is None else divisor
        affinity = bonus if self.models[w.model].state.resident else 0
        aging = max(0.0, now - w.arrival_s) / divisor if divisor > 0 else 0.0
        return w.priority + affinity + aging

    def order(self, now: float | None = None, **terms: float) -> list[Waiting]:
        """Waiting requests, best first (equal scores in arrival order)."""
        now = self.clock() if now is None else now
        return sorted(self.waiting, key=lambda w: (-self.score(w, now, **terms), w.seq))  # type: ignore[arg-type]

    def lanes_for(self, w: Waiting) -> int:
        """The lanes a request holds at its model's worker: one per job, all of them at most (a
        request with more jobs than lanes starts once the model is free; its worker queues the
        rest)."""
        lanes = self.models[w.model].spec.lanes
        return min(w.jobs, lanes) if lanes > 0 else w.jobs

    def _plan(self, now: float, **terms: float) -> _Plan:
        plan = _Plan()
        state = {mid: m.state for mid, m in self.models.items()}
        inflight = {mid: m.inflight for mid, m in self.models.items()}
        taken = {mid: m.lanes_taken for mid, m in self.models.items()}
        waited_on: set[str] = set()  # models a better request waits on for lanes: no overtaking

        def may_start(w: Waiting) -> bool:
            """No better request waits for its (loaded) model's lanes, and they are free for all
            its jobs or it preempts a lane at the worker."""
            lanes = self.models[w.model].spec.lanes
            if lanes <= 0 or (w.model not in waited_on and (w.preempts or taken[w.model] + self.lanes_for(w) <= lanes)):
                return True
            waited_on.add(w.model)
            return False

        def start(w: Waiting) -> None:
            plan.dispatch.append(w)
            inflight[w.model] += 1
            taken[w.model] += self.lanes_for(w)

        if self.draining:  # only dispatches, to the models loaded now (a swap's reservation is void)
            for w in self.order(now, **terms):
                m = self.models[w.model]
                if m.state in (ModelState.LOADED, ModelState.DRAINING) and not m.unload_requested and may_start(w):
                    start(w)
            return plan
        for mid, m in self.models.items():
            if m.state is ModelState.DRAINING and not m.unload_requested:
                state[mid] = ModelState.LOADED  # reservations are recomputed every time
            elif m.unload_requested and m.state is ModelState.LOADED:
                state[mid] = ModelState.DRAINING
            if m.unload_requested and state[mid] is ModelState.DRAINING and m.inflight == 0:
                state[mid] = ModelState.UNLOADING  # the admin's unload, once its work is done
                plan.unload.append((mid, None))
        # slots that will be free without a new reservation: models stopping, or drained by the admin
        # (a pinned model's, the FIM model's, frees no slot: it does not count). A model the admin
        # drains frees its slot only once its work ends (a long job: hours), so a request waits for
        # it only when no idle model can go now
        coming = sum(1 for mid, s in state.items() if s is ModelState.UNLOADING and not self.models[mid].spec.pinned)
        drained = sum(1 for mid, s in state.items() if s is ModelState.DRAINING and not self.models[mid].spec.pinned)
        reserved: set[str] = set()  # kept for a better request's swap: takes no more work
        claimed: set[str] = set()  # a better request waits for one of its lanes: not a victim

        def occupied() -> int:
            return sum(1 for mid, s in state.items() if s is not ModelState.UNLOADED and not self.models[mid].spec.pinned)

        def take_slot(model: str, why: Waiting | None) -> bool:
            nonlocal coming, drained
            if self.models[model].spec.pinned or occupied() < self.config.max_loaded_models:
                state[model] = ModelState.LOADING
                plan.load.append((model, why))
                return True
            if coming > 0:
                coming -= 1  # wait for a slot already on its way
                return False
            victims = [v for v, s in state.items() if s is ModelState.LOADED and v not in reserved and v not in claimed and not self.models[v].spec.pinned]
            if why is None:  # the admin's Load: "when a slot is free or an idle model can go", never
                victims = [v for v in victims if inflight[v] == 0]  # a busy one (shown draining, it went on taking work)
            if drained > 0 and not any(inflight[v] == 0 for v in victims):
                drained -= 1  # no idle model can go: wait for the slot the admin frees, reserve no busy one
                return False
            if not victims:
                return False
            # a busy model already reserved stays the victim: its last use moves as its work ends,
            # and a reservation that followed it would flip between busy models forever
            victim = min(victims, key=lambda v: (inflight[v] > 0, self.models[v].state is not ModelState.DRAINING, self.models[v].last_used_s or 0.0, v))
            reserved.add(victim)
            if inflight[victim] == 0:
                state[victim] = ModelState.UNLOADING
                plan.unload.append((victim, why))
            else:
                plan.draining.add(victim)
            return False

        pending: set[str] = set()  # models already waited on in this plan
        # A swap, once started (its victim's unload, or its load), belongs to the request it was
        # started for: the slot freed for it loads its model, and that model serves it first. The
        # swap was its pick, and a pick is not taken back (dispatch is non-preemptive): a better
        # request that came meanwhile reserves the model only once that request runs there (or
        # claims it, below, while it waits for one of its lanes).
        ordered = self.order(now, **terms)
        ordered.sort(key=lambda w: not (w.chosen and state[w.model] in (ModelState.LOADED, ModelState.UNLOADED)))
        for w in ordered:
            s = state[w.model]
            if s is ModelState.LOADED and w.model not in reserved:
                if may_start(w):
                    start(w)
                else:
                    claimed.add(w.model)  # it waits for a lane of its model
            elif s is ModelState.UNLOADED and w.model not in pending:
                pending.add(w.model)
                take_slot(w.model, w)
            # else: loading, draining, stopping or reserved: it waits
        for model in sorted(self.admin_loads):
            if state[model] is ModelState.UNLOADED and model not in pending:
                take_slot(model, None)
        for mid, m in self.models.items():
            if state[mid] is not ModelState.LOADED or m.spec.ttl_s <= 0 or m.spec.pinned or inflight[mid] or mid in pending:
                continue
            if any(w.model == mid for w in self.waiting):
                continue
            if m.last_used_s is not None and now - m.last_used_s >= m.spec.ttl_s:
                state[mid] = ModelState.UNLOADING
                plan.unload.append((mid, None))
        return plan

    def schedule(self) -> Actions:
        """Decide what happens now; the caller carries out the actions."""
        now = self.clock()
        plan = self._plan(now)
        self._count_reorders(plan, now)
        actions = Actions()
        for mid, m in self.models.items():
            if m.state is ModelState.DRAINING and mid not in plan.draining and not m.unload_requested:
                m.state = ModelState.LOADED  # the request that reserved it went elsewhere or left
        for mid in plan.draining:
            self.models[mid].state = ModelState.DRAINING
        for m in self.models.values():
            if m.unload_requested and m.state is ModelState.LOADED:
                m.state = ModelState.DRAINING
        for model, why in plan.unload:
            self.models[model].state = ModelState.UNLOADING
            if why is not None and not why.chosen:
                why.chosen, why.won_with = True, self.score(why, now)
            actions.unload.append(model)
        for model, why in plan.load:
            if why is not None and not why.chosen:  # before the state changes: no swap bonus, its
                why.chosen, why.won_with = True, self.score(why, now)  # model was not loaded
            m = self.models[model]
            m.state = ModelState.LOADING
            m.load_started_s = now
            m.loads += 1
            self.admin_loads.discard(model)
            actions.load.append(model)
        for w in plan.dispatch:
            self.waiting.remove(w)
            del self._by_id[w.request_id]
            self._dispatched[w.request_id] = (w.model, self.lanes_for(w))
            m = self.models[w.model]
            m.inflight += 1
            m.lanes_taken += self.lanes_for(w)
            m.dispatched += 1
            m.last_used_s = now
            self.dispatched_by_band[w.band] += 1
            score = w.won_with if w.won_with is not None else self.score(w, now)
            actions.dispatch.append(Dispatch(w.request_id, w.model, w.priority, w.band, score, now - w.arrival_s))
        return actions

    def _count_reorders(self, plan: _Plan, now: float) -> None:
        """A pick counts as a reorder for a term when, at this moment and with that term off,
        it would not have been made."""
        if self.config.scheduler != "serial":
            return
        picked = [w for w in plan.dispatch if not w.chosen]
        picked += [w for _m, w in plan.load + plan.unload if w is not None and not w.chosen]
        if not picked:
            return
        for reason, terms in (("swap_affinity", {"bonus": 0}), ("aging", {"divisor": 0.0})):
            if reason == "swap_affinity" and self.config.swap_affinity_bonus == 0:
                continue
            if reason == "aging" and self.config.aging_divisor_s == 0:
                continue
            without = self._plan(now, **terms).picked()
            self.reorders[reason] += sum(1 for w in picked if id(w) not in without)

    # -- reading -------------------------------------------------------------------------

    def queue_by_band(self, now: float | None = None) -> dict[str, tuple[int, float]]:
        """(depth, oldest wait in seconds) of the waiting requests, by band."""
        now = self.clock() if now is None else now
        out = {b: (0, 0.0) for b in BANDS}
        for w in self.waiting:
            depth, oldest = out[w.band]
            out[w.band] = (depth + 1, max(oldest, now - w.arrival_s))
        return out

    def snapshot(self) -> dict[str, object]:
        now = self.clock()
        return {
            "max_loaded_models": self.config.max_loaded_models,
            "scheduler": self.config.scheduler,
            "models": {
                mid: {
                    "state": m.state.value,
                    "inflight": m.inflight,
                    "lanes_taken": m.lanes_taken,
                    "waiting": sum(1 for w in self.waiting if w.model == mid),
                    "waiting_by_band": {b: sum(1 for w in self.waiting if w.model == mid and w.band == b) for b in BANDS},
                    "idle_s": None if m.last_used_s is None else round(now - m.last_used_s, 3),
                    # loads begun, failed ones too (the pool's ``loads`` counts those that succeeded)
                    "load_attempts": m.loads,
                    "load_failures": m.load_failures,
                    "load_backoff_s": round(self.backoff_left(mid, now), 3),
                    "dispatched": m.dispatched,
                    "lanes": m.spec.lanes,
                    "pinned": m.spec.pinned,
                    "ttl_s": m.spec.ttl_s,
                    "priority": m.spec.priority,
                }
                for mid, m in self.models.items()
            },
            "queue": {b: {"depth": d, "oldest_wait_s": round(o, 3)} for b, (d, o) in self.queue_by_band(now).items()},
            "dispatched": dict(self.dispatched_by_band),
            "reorders": dict(self.reorders),
        }
