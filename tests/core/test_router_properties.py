"""The model router under the races serve meets: loads and unloads that take time,
cancellations while a request waits for a swap or a load, loads that fail, TTLs, the admin's
Load and Unload, and aging against a steady stream of better work. Fake clock only."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.router import Dispatch, LoadBackoff, ModelSpec, ModelState

from .builders import RouterLoop


class World(RouterLoop):
    """Carries out the router's actions the way the pool does: a load or an unload ends later,
    when the test says so."""

    def __init__(self, specs: list[ModelSpec], **config: object) -> None:
        super().__init__(specs, **config)
        self.specs = {s.id: s for s in specs}
        self.max_loaded = self.router.config.max_loaded_models
        self.loading: set[str] = set()
        self.unloading: set[str] = set()
        self.running: dict[str, tuple[str, int, bool]] = {}  # rid -> (model, lanes, preempts)
        self.ended: set[str] = set()  # dropped by a failed load, cancelled, or refused (load backoff)
        self.submitted: dict[str, tuple[str, int, bool]] = {}
        self.n = 0

    def submit(self, model: str, priority: int = 0, *, jobs: int = 1, preempts: bool = False) -> str:
        self.n += 1
        rid = f"r{self.n}"
        try:
            w = self.router.submit(rid, model, priority, preempts=preempts, jobs=jobs)
        except LoadBackoff as refused:  # only a model not resident whose last load failed, and its wait only
            assert refused.retry_after_s > 0 and not self.router.state(model).resident and self.router.models[model].load_failures > 0
            self.submitted[rid] = (model, 0, preempts)
            self.ended.add(rid)
            self.settle()
            return rid
        self.submitted[rid] = (model, self.router.lanes_for(w), preempts)
        self.settle()
        return rid

    def unload(self, model: str) -> None:
        m = self.router.models[model]
        assert m.inflight == 0, f"{model} unloaded with work running: nothing may be cut"
        assert model not in self.loading and model not in self.unloading
        self.unloading.add(model)

    def load(self, model: str) -> None:
        assert model not in self.loading and model not in self.unloading
        until = self.router.models[model].backoff_until_s  # None once a load or the admin's Load reset it
        assert until is None or until <= self.clock(), f"{model} loaded within its load backoff"
        self.loading.add(model)

    def dispatch(self, d: Dispatch) -> None:
        assert self.router.state(d.model) in (ModelState.LOADED, ModelState.DRAINING), (d, self.router.state(d.model))
        assert d.request_id not in self.started and d.request_id not in self.ended
        super().dispatch(d)
        model, lanes, preempts = self.submitted[d.request_id]
        self.running[d.request_id] = (model, lanes, preempts)

    def round_done(self) -> None:
        resident = [m for m, s in self.specs.items() if not s.pinned and self.router.state(m) is not ModelState.UNLOADED]
        assert len(resident) <= self.max_loaded, resident

    def finish(self, rid: str) -> None:
        del self.running[rid]
        self.router.finished(rid)
        self.settle()

    def cancel(self, rid: str) -> None:
        assert self.router.cancel(rid)
        self.ended.add(rid)
        self.settle()

    def load_done(self, model: str, ok: bool = True) -> None:
        self.loading.discard(model)
        if ok:
            self.router.loaded(model)
        else:
            for rid in self.router.load_failed(model):
                assert self.submitted[rid][0] == model
                self.ended.add(rid)
        self.settle()

    def unload_done(self, model: str) -> None:
        self.unloading.discard(model)
        self.router.unloaded(model)
        self.settle()

    def swaps_end(self) -> None:
        """Every unload under way ends, then every load under way succeeds."""
        for model in sorted(self.unloading):
            self.unload_done(model)
        for model in sorted(self.loading):
            self.load_done(model)

    def run_out(self) -> None:
        """Every load succeeds, every unload ends, every request finishes: nothing may be left
        waiting."""
        for _ in range(500):
            if not (self.router.waiting or self.running or self.loading or self.unloading):
                return
            self.swaps_end()
            for rid in list(self.running):
                self.finish(rid)
            self.clock.advance(1)
            self.settle()
        raise AssertionError(f"stuck: waiting {[(w.request_id, w.model) for w in self.router.waiting]}, states {[(m, self.router.state(m).value) for m in self.specs]}")


OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "submit", "finish", "finish", "cancel", "load_ok", "load_ok", "load_fail", "unload_done", "unload_done", "tick", "admin_load", "admin_unload"]),
        st.integers(0, 1_000_000),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(1, 2), st.integers(0, 99), st.integers(0, 2), st.booleans())
def test_through_slow_loads_failures_cancels_ttl_and_the_admin_every_request_ends_once_and_nothing_is_stuck(ops, max_loaded, bonus, lanes, with_pinned) -> None:  # type: ignore[no-untyped-def]
    specs = [ModelSpec(m, lanes=lanes, ttl_s=5 if m == "A" else 0) for m in "ABC"]
    if with_pinned:
        specs.append(ModelSpec("F", lanes=1, pinned=True))
    world = World(specs, max_loaded_models=max_loaded, swap_affinity_bonus=bonus)
    models = [s.id for s in specs]
    for op, seed in ops:
        rnd = random.Random(seed)
        if op == "submit":
            world.submit(rnd.choice(models), rnd.choice([-100, -99, 0, 5, 100]), jobs=rnd.randint(1, 3), preempts=rnd.random() < 0.3)
        elif op == "finish" and world.running:
            world.finish(rnd.choice(sorted(world.running)))
        elif op == "cancel" and world.router.waiting:
            world.cancel(rnd.choice(world.router.waiting).request_id)
        elif op in ("load_ok", "load_fail") and world.loading:
            world.load_done(rnd.choice(sorted(world.loading)), ok=op == "load_ok")
        elif op == "unload_done" and world.unloading:
            world.unload_done(rnd.choice(sorted(world.unloading)))
        elif op == "tick":
            world.clock.advance(rnd.choice([0.5, 3, 10, 120]))
            world.settle()
        elif op == "admin_load":
            world.router.request_load(rnd.choice(models))
            world.settle()
        elif op == "admin_unload":
            world.router.request_unload(rnd.choice(models))
            world.settle()
    world.run_out()
    # every request either ran exactly once or ended (cancelled, or its model's load failed)
    assert set(world.started) | world.ended == set(world.submitted)
    assert not set(world.started) & world.ended
    assert len(set(world.started)) == len(world.started)


# -- a swap while requests of several priorities wait ------------------------------------------


def test_a_swap_with_several_priorities_waiting_serves_them_in_score_order() -> None:
    """One slot, one lane each; A busy. Waiting: a batch request for A, a normal one for B, an
    interactive one for A, a normal+5 one for C. Interactive A goes next (on A, no swap), then C
    (5) beats B (0), then B, and the batch request for A last, each model swapped in once."""
    world = World([ModelSpec(m, lanes=1) for m in "ABC"], max_loaded_models=1, swap_affinity_bonus=10, aging_divisor_s=0)
    a1 = world.submit("A")
    world.load_done("A")
    a_batch = world.submit("A", -100)
    b = world.submit("B", 0)
    a_chat = world.submit("A", 100)
    c = world.submit("C", 5)
    for _ in range(20):
        for rid in list(world.running):
            world.finish(rid)
        world.swaps_end()
    assert world.started == [a1, a_chat, c, b, a_batch]
    assert not world.router.waiting


def test_n_choices_against_a_model_not_loaded_take_its_lanes_once_it_loads() -> None:
    world = World([ModelSpec("A", lanes=2), ModelSpec("B", lanes=2)], max_loaded_models=1)
    busy = world.submit("A")
    world.load_done("A")
    three = world.submit("B", jobs=3)  # more choices than B has lanes
    one = world.submit("B")
    world.finish(busy)
    world.unload_done("A")
    world.load_done("B")
    assert world.started == [busy, three]  # all B's lanes: the one-choice request waits
    world.finish(three)
    assert world.started == [busy, three, one]


# -- aging: a low-priority request for another model is not starved ----------------------------


def test_a_batch_request_for_another_model_runs_behind_a_steady_stream_of_normal_work_once_aged() -> None:
    """One lane, one slot; A always has a normal request running and the next one waiting. A
    batch request for B (-100) must run after about (100 + bonus) x agingDivisor seconds, not
    never."""
    world = World([ModelSpec("A", lanes=1), ModelSpec("B", lanes=1)], max_loaded_models=1, swap_affinity_bonus=10, aging_divisor_s=60)
    first = world.submit("A")
    world.load_done("A")
    assert world.started == [first]
    batch = world.submit("B", -100)
    world.submit("A")
    for _ in range(400):  # a job a minute, each replaced by a fresh one at once
        world.clock.advance(60)
        rid = next(r for r in world.running if world.running[r][0] == "A") if world.running else None
        if rid is not None:
            world.finish(rid)
        world.swaps_end()
        if batch in world.started:
            break
        world.submit("A")
    assert batch in world.started
    waited_min = world.dispatches[batch].wait_s / 60  # type: ignore[attr-defined]
    assert 108 <= waited_min <= 115

